//! The admin API's `/config_dump` query: any query is a selection or a
//! refusal naming the key, never a panic; a selection names only known
//! sections and non-empty values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate::admin::dump_query::{parse, MAX_QUERY, SECTIONS};

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    match parse(Some(query)) {
        Ok(q) => {
            assert!(query.len() <= MAX_QUERY);
            for s in q.only.iter().flatten() {
                assert!(SECTIONS.contains(s), "{s}");
            }
            assert!(q.workload.as_ref().is_none_or(|w| !w.is_empty()));
            if let Some((ns, name)) = &q.service {
                assert!(!ns.is_empty() && !name.is_empty() && !name.contains('/'));
            }
        }
        Err(e) => assert!(e.to_string().contains("query"), "{e}"),
    }
});
