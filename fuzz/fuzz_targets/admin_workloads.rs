//! The admin API's `/workloads/<uid>/…` request parsing: any method, path and
//! query is a request or an answer, never a panic; a shutdown's grace never
//! exceeds `drains::MAX_GRACE`. The workload reference in it (uid,
//! namespace/name, IP, bare name) parses or is refused with a 4xx.
#![no_main]

use std::time::Duration;

use http::{Method, StatusCode};
use libfuzzer_sys::fuzz_target;
use tidegate::admin::workload_ref::WorkloadRef;
use tidegate::admin::workloads::{parse, WorkloadRequest};
use tidegate::drains::{Lifecycle, MAX_GRACE};

fuzz_target!(|data: &[u8]| {
    let Some((&m, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let method = [Method::GET, Method::POST, Method::PUT, Method::DELETE][m as usize % 4].clone();
    let (path, query) = match text.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (text, None),
    };
    match parse(&method, path, query, Duration::from_secs(30)) {
        WorkloadRequest::Lifecycle(uid, Lifecycle::ShutdownStarted { grace }) => {
            assert!(grace <= MAX_GRACE, "{grace:?} from {query:?}");
            assert!(path.starts_with(uid));
            let _ = WorkloadRef::parse(uid, |_| false);
        }
        WorkloadRequest::Lifecycle(uid, _)
        | WorkloadRequest::Bind(uid)
        | WorkloadRequest::Unbind(uid) => {
            assert!(path.starts_with(uid));
            match WorkloadRef::parse(uid, |u| u == "known/uid") {
                Ok(WorkloadRef::Bare(v)) => {
                    assert!(!v.contains('/') && v.parse::<std::net::IpAddr>().is_err())
                }
                Ok(WorkloadRef::Named { namespace, name }) => {
                    assert!(!namespace.is_empty() && !name.is_empty() && !name.contains('/'))
                }
                Ok(_) => {}
                Err(e) => assert!(e.status().is_client_error(), "{e}"),
            }
        }
        WorkloadRequest::Refused(status, body) => {
            assert!(status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND);
            assert!(!body.is_empty());
        }
    }
});
