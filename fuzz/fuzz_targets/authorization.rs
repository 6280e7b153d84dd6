//! Authorization's inputs from outside, by the first byte:
//!
//! - anything but `{`: an `istio.security.Authorization` resource as istiod
//!   (or anyone on the xDS stream) could send it: any bytes decode to a
//!   policy, a refusal naming the entry, or a decode error;
//! - `{`: a Kubernetes object's `spec`, read as an AuthorizationPolicy and
//!   as a PeerAuthentication (beside a mesh-wide STRICT one) and
//!   converted as istiod does: a policy, a skip, or a refusal naming the
//!   entry.
//!
//! Never a panic; whatever is held is indexed, named by a workload,
//! decided on and removed without one; an IPv4 connection and the same
//! one written IPv4-mapped are decided alike.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use tidegate_authz::kubernetes::resources::{
    AuthorizationPolicySpec, Object, PeerAuthenticationSpec,
};
use tidegate_authz::kubernetes::{Conversion, Outcome};
use tidegate_authz::{xds, Connection, Destination, Identity, Policy, PolicyStore};

fuzz_target!(|data: &[u8]| {
    if data.first() == Some(&b'{') {
        kubernetes(data);
    } else {
        istiod(data);
    }
});

fn istiod(data: &[u8]) {
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
    let mut store = PolicyStore::default();
    store.insert(key.clone(), policy.clone());
    decide_all(&store, &policy.namespace, &[key.clone()]);
    assert!(store.remove(&key));
    assert!(store.is_empty());
}

fn object<S>(namespace: &str, name: &str, spec: S) -> Object<S> {
    Object {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        created: String::new(),
        annotations: BTreeMap::new(),
        spec,
    }
}

fn kubernetes(data: &[u8]) {
    let aps: Vec<_> = serde_json::from_slice::<AuthorizationPolicySpec>(data)
        .map(|s| object("ns", "p", s))
        .into_iter()
        .collect();
    let mut pas = vec![object(
        "istio-system",
        "mesh",
        serde_json::from_str::<PeerAuthenticationSpec>(r#"{"mtls": {"mode": "STRICT"}}"#).unwrap(),
    )];
    if let Ok(s) = serde_json::from_slice::<PeerAuthenticationSpec>(data) {
        pas.push(object("ns", "w", s));
    }
    let first = Conversion::new("istio-system", &aps, pas.clone(), &PolicyStore::default());
    for outcome in first.outcomes.values() {
        if let Outcome::Refused(m) | Outcome::Skipped(m) | Outcome::HttpIgnored(m) = outcome {
            assert!(!m.is_empty());
        }
    }
    // Converted again over what it published: the same store.
    let again = Conversion::new("istio-system", &aps, pas, &first.policies);
    assert!(again.policies == first.policies);
    let labels = BTreeMap::from([("app".to_owned(), "a".to_owned())]);
    let names = first.policies_for("ns", &labels);
    decide_all(&first.policies, "ns", &names);
    let held: Vec<&Policy> = names
        .iter()
        .filter_map(|k| first.policies.get(k).map(|p| &**p))
        .collect();
    let _ = tidegate_authz::store::decide(&held, &conn(None));
}

fn conn(identity: Option<&Identity>) -> Connection<'_> {
    Connection {
        src: "10.0.0.1:4000".parse().unwrap(),
        dst: "10.0.0.2:8080".parse().unwrap(),
        identity,
    }
}

fn decide_all(store: &PolicyStore, namespace: &str, names: &[String]) {
    let id = Identity::new("cluster.local", namespace, "sa");
    let dest = Destination {
        namespace,
        policies: names,
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
    // The same IPv4 connection written IPv4-mapped is decided alike: the
    // way an address is written never gets around a policy.
    let v4 = Connection {
        src: "10.0.0.1:4000".parse().unwrap(),
        dst: "10.0.0.2:8080".parse().unwrap(),
        identity: None,
    };
    let mapped = Connection {
        src: "[::ffff:10.0.0.1]:4000".parse().unwrap(),
        dst: "[::ffff:10.0.0.2]:8080".parse().unwrap(),
        identity: None,
    };
    assert_eq!(store.decide(&dest, &v4), store.decide(&dest, &mapped));
}
