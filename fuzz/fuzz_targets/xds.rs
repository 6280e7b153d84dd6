//! istiod's delta xDS as the istio source receives it: any bytes are a
//! `DeltaDiscoveryResponse` or, failing that, one resource, applied as an
//! `istio.workload.Address` and as an `istio.security.Authorization`.
//! Never a panic; every refusal names a resource of the response and
//! says why; no more workloads are published than were accepted; the same
//! response applied again changes no workload (an update is applied as
//! what it changed, and it changed nothing the second time). A response
//! is first sorted as the client sorts it ([`triage`]: another type than
//! the response's, no resource, past the resource limit): every resource
//! is either applied or refused by name, and one past the limit is never
//! applied.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use tidegate::workloads::istio::IstioSource;
use tidegate::workloads::WorkloadStore;
use tidegate_xds::client::{triage, Limits, ADDRESS, AUTHORIZATION};
use tidegate_xds::envelope::DeltaDiscoveryResponse;
use tidegate_xds::{Handler, Update};

fuzz_target!(|data: &[u8]| {
    let (updates, removed) = match DeltaDiscoveryResponse::decode(data) {
        Ok(r) => {
            check_triage(&r);
            (
                r.resources
                    .into_iter()
                    .map(|r| Update {
                        name: r.name,
                        version: r.version,
                        value: r.resource.map(|a| a.value).unwrap_or_default(),
                    })
                    .collect::<Vec<_>>(),
                r.removed_resources,
            )
        }
        Err(_) => (
            vec![Update {
                name: "fuzz".into(),
                version: "1".into(),
                value: bytes::Bytes::copy_from_slice(data),
            }],
            Vec::new(),
        ),
    };
    for type_url in [ADDRESS, AUTHORIZATION] {
        let store = WorkloadStore::new("cluster.local", "node-a");
        let mut source = IstioSource::new(store.clone());
        let refused = source.handle(type_url, updates.clone(), removed.clone());
        for r in &refused {
            assert!(
                updates.iter().any(|u| u.name == r.name),
                "refused {:?}, not in the response",
                r.name
            );
            assert!(!r.reason.is_empty());
        }
        if type_url == ADDRESS {
            // Only what was accepted is published.
            let accepted = updates.len() - refused.len();
            assert!(store.snapshot().len() <= accepted);
        }
        let before = store.snapshot();
        let again = source.handle(type_url, updates.clone(), removed.clone());
        assert_eq!(
            again.len(),
            refused.len(),
            "refused differently the second time"
        );
        let after = store.snapshot();
        assert_eq!(
            after.changes_from(&before).count(),
            0,
            "the same response again changed workloads"
        );
    }
});

/// The client's sorting of `r`, with a resource limit small enough for
/// the fuzzer to cross.
fn check_triage(r: &DeltaDiscoveryResponse) {
    const LIMIT: usize = 512;
    let limits = Limits {
        max_resource: LIMIT,
        ..Limits::default()
    };
    let t = triage(r.clone(), limits);
    assert_eq!(t.updates.len() + t.rejected.len(), r.resources.len());
    assert_eq!(t.removed, r.removed_resources);
    assert!(t.oversized <= t.rejected.len());
    for u in &t.updates {
        assert!(u.value.len() <= LIMIT, "{} applied past the limit", u.name);
    }
    for x in &t.rejected {
        assert!(r.resources.iter().any(|res| res.name == x.name));
        assert!(!x.reason.is_empty());
    }
}
