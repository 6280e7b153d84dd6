//! The config loader: a YAML document, then `--set key=value` overrides (one
//! per line after a `---` line), is a config or an error naming the key.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (yaml, sets) = text.split_once("\n---\n").unwrap_or((text, ""));
    let _ = tidegate::config::Config::from_yaml(yaml);
    let sets: Vec<String> = sets.lines().map(str::to_owned).collect();
    let _ = tidegate::config::Config::load(None, Vec::new(), &sets);
    for s in &sets {
        let _ = tidegate_base::duration::parse(s);
        let _ = tidegate_base::size::parse_u32(s);
    }
});
