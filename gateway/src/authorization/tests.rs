//! The decision point over a workload store: admitted, refused by a
//! policy, refused because the workload left between routing and the
//! check; a later change closes what it now refuses.

use std::net::SocketAddr;

use super::*;
use crate::workloads::parse_file;

const WORKLOADS: &str =
    "workloads:\n- {uid: web-uid, name: web, namespace: shop, ips: [10.0.0.1], node: n}\n";
const DENY_ALL: &str = "authorization:\n- {name: closed, namespace: shop, scope: namespace, action: deny, rules: [{}]}\n";

fn facts(uid: &str) -> Facts {
    Facts {
        src: SocketAddr::from(([10, 0, 0, 9], 40000)),
        dst: SocketAddr::from(([10, 0, 0, 1], 8080)),
        identity: Some(Arc::new(Identity::new("cluster.local", "shop", "client"))),
        workload_uid: uid.to_owned(),
        transport: Transport::Hbone,
    }
}

fn authorizer(file: &str) -> (Arc<WorkloadStore>, Arc<Authorizer>) {
    let store = WorkloadStore::new("cluster.local", "n");
    store.publish(parse_file(file).unwrap());
    let authz = Authorizer::new(store.clone(), AuthorizationMetrics::default());
    (store, authz)
}

#[test]
fn a_workload_gone_since_routing_is_refused_not_allowed() {
    let (_, authz) = authorizer(WORKLOADS);
    assert!(authz.admit(facts("web-uid")).is_ok());
    assert!(matches!(
        authz.admit(facts("gone-uid")),
        Err(NotAdmitted::WorkloadGone)
    ));
}

#[test]
fn a_policy_refuses_at_admission_and_a_change_closes_the_live_ones() {
    let (_, authz) = authorizer(&format!("{WORKLOADS}{DENY_ALL}"));
    assert!(matches!(
        authz.admit(facts("web-uid")),
        Err(NotAdmitted::Policy(Denial::ExplicitlyDenied { .. }))
    ));
    let (store, authz) = authorizer(WORKLOADS);
    let live = authz.admit(facts("web-uid")).unwrap();
    assert_eq!(authz.recheck(), 0, "nothing changed");
    store.publish(parse_file(&format!("{WORKLOADS}{DENY_ALL}")).unwrap());
    assert_eq!(authz.recheck(), 1);
    let denial = futures::executor::block_on(live.refused());
    assert_eq!(denial.to_string(), "explicitly denied by: shop/closed");
}

/// A publish that changes only other workloads checks no live connection;
/// one that changes the workload a connection goes to (here, the policies
/// it names) checks that connection, and closes it when now refused.
#[test]
fn a_change_rechecks_only_the_connections_it_concerns() {
    let file = "workloads:\n\
         - {uid: web-uid, name: web, namespace: shop, ips: [10.0.0.1], node: n}\n\
         - {uid: db-uid, name: db, namespace: shop, ips: [10.0.0.2], node: n}\n\
         authorization:\n\
         - {name: web-closed, namespace: shop, scope: workload_selector, action: deny, rules: [{}]}\n";
    let parsed = parse_file(file).unwrap();
    let (web, db) = (parsed.workloads[0].clone(), parsed.workloads[1].clone());
    let (store, authz) = authorizer(file);
    let live = authz.admit(facts("web-uid")).unwrap();
    let publish = |spec: crate::workloads::WorkloadSpec| {
        let before = store.snapshot();
        store.apply(crate::workloads::Delta {
            workloads: vec![spec],
            ..Default::default()
        });
        authz.on_change(&before, &store.snapshot())
    };
    let mut db_moved = db;
    db_moved.ips = vec!["10.0.0.3".parse().unwrap()];
    assert_eq!(publish(db_moved), Rechecked::default(), "another workload");
    let mut web_closed = web;
    web_closed.authorization_policies = vec!["shop/web-closed".into()];
    let done = publish(web_closed);
    assert_eq!((done.checked, done.closed), (1, 1));
    let denial = futures::executor::block_on(live.refused());
    assert_eq!(denial.to_string(), "explicitly denied by: shop/web-closed");
}
