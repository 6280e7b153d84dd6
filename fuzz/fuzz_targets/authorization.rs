//! An `istio.security.Authorization` resource as istiod (or anyone on the
//! xDS stream) could send it: any bytes decode to a policy, a refusal
//! naming the entry, or a decode error — never a panic — and a policy
//! read is indexed, decided on and removed without one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate_authz::{xds, Connection, Destination, Identity, PolicyStore};

fuzz_target!(|data: &[u8]| {
    let Ok(resource) = xds::decode(data) else {
        return;
    };
    let policy = match resource.to_policy() {
        Ok(p) => p,
        Err(e) => {
            let _ = e.to_string();
            match e.closed() {
                Some(p) => p,
                None => return,
            }
        }
    };
    let key = policy.key();
    let namespace = policy.namespace.clone();
    let mut store = PolicyStore::default();
    store.insert(key.clone(), policy);
    let id = Identity::new("cluster.local", &namespace, "sa");
    let picked = [key.clone()];
    let dest = Destination {
        namespace: &namespace,
        policies: &picked,
    };
    for (src, dst, identity) in [
        ("10.0.0.1:4000", "10.0.0.2:8080", Some(&id)),
        ("[2001:db8::1]:4000", "[2001:db8::2]:80", None),
    ] {
        let conn = Connection {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            identity,
        };
        let _ = store.decide(&dest, &conn).is_allow();
    }
    assert!(store.remove(&key));
    assert!(store.is_empty());
});
