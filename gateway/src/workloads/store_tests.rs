use super::*;
use crate::workloads::{services, FormerlyKnown, LifecycleState};
use std::net::IpAddr;
use std::time::Duration;
use tidegate_policy_host::AsSubject;

fn spec(uid: &str, node: &str, protocol: Protocol) -> WorkloadSpec {
    WorkloadSpec::new(uid, node)
        .namespace("ns")
        .service_account("sa")
        .protocol(protocol)
}

#[test]
fn a_workload_lends_the_policy_host_what_resolves_its_policy() {
    let mut s = spec("u", "n1", Protocol::Hbone);
    s.name = "w".into();
    Arc::make_mut(&mut s.labels).insert("app".into(), "web".into());
    Arc::make_mut(&mut s.annotations)
        .insert(tidegate_policy_host::POLICY_ANNOTATION.into(), "a".into());
    s.namespace_policy = Some("d".into());
    let store = WorkloadStore::new("td", "n1");
    store.publish(vec![s.clone()]);
    let snap = store.snapshot();
    let w = snap.by_uid("u").unwrap();
    let got = w.subject();
    assert_eq!(
        (got.uid, got.name, got.namespace, got.namespace_policy),
        ("u", "w", "ns", Some("d"))
    );
    assert_eq!(got.labels, &*s.labels);
    assert_eq!(got.annotations, &*s.annotations);
}

#[test]
fn a_workload_files_local_members_are_its_hbone_workloads() {
    let store = WorkloadStore::new("td", "n1");
    store.publish(vec![
        spec("a", "n1", Protocol::Hbone),
        spec("b", "n1", Protocol::Tcp),
        spec("c", "n2", Protocol::Hbone),
    ]);
    let snap = store.snapshot();
    assert_eq!(snap.membership("a").map(|m| m.member), Some(true));
    assert_eq!(snap.membership("b").map(|m| m.member), Some(false));
    assert_eq!(snap.membership("c"), None, "another node's pod");
}

#[tokio::test]
async fn membership_waits_for_the_pod_to_be_published_and_no_longer() {
    let store = WorkloadStore::new("td", "n1");
    assert_eq!(store.membership("a", Duration::ZERO).await, None);
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move { store.membership("a", Duration::from_secs(60)).await })
    };
    // Published once the waiter is subscribed or not: either way it sees it.
    store.publish(vec![spec("other", "n1", Protocol::Hbone)]);
    store.publish(vec![spec("a", "n1", Protocol::Hbone)]);
    let got = waiting.await.unwrap().expect("published while waiting");
    assert!(got.member);
    assert_eq!(got.reason, membership::Reason::WorkloadFile);
}

#[test]
fn a_removed_workload_leaves_its_services_now_and_stays_out_while_its_source_lists_it() {
    use services::{ServicePort, ServiceSpec};
    let store = WorkloadStore::new("td", "n1");
    let mut a = spec("a", "n1", Protocol::Hbone);
    a.ips = vec![IpAddr::from([10, 0, 0, 1])];
    a.services = vec!["web".into()];
    let mut b = spec("b", "n2", Protocol::Hbone);
    b.ips = vec![IpAddr::from([10, 0, 0, 2])];
    b.services = vec!["web".into()];
    let web = ServiceSpec {
        name: "web".into(),
        namespace: "ns".into(),
        vips: vec![IpAddr::from([10, 96, 0, 1])],
        ports: vec![ServicePort {
            port: 80,
            target_port: None,
            protocol: "TCP".into(),
        }],
        endpoints: None,
        endpoint_targets: Default::default(),
        hostname: None,
        subject_alt_names: vec![],
        waypoints: vec![],
        ip_families: Default::default(),
        canonical: false,
        visibility: Default::default(),
    };
    store.publish(WholeSet::new(vec![a.clone(), b.clone()]).services(vec![web.clone()]));
    let endpoints = |store: &WorkloadStore| -> Vec<String> {
        let snap = store.snapshot();
        let svc = snap
            .service_by_vip(IpAddr::from([10, 96, 0, 1]), 80)
            .unwrap();
        svc.endpoints[&80]
            .iter()
            .map(|e| e.workload.uid().to_owned())
            .collect()
    };
    assert_eq!(endpoints(&store), ["a", "b"]);
    assert!(store.remove("a"));
    assert!(!store.remove("nobody"));
    assert_eq!(
        endpoints(&store),
        ["b"],
        "out of the Service in the same publish"
    );
    // The source still lists it (a changed spec): it stays out, its
    // latest spec kept.
    let mut a2 = a.clone();
    Arc::make_mut(&mut a2.labels).insert("v".into(), "2".into());
    store.publish(WholeSet::new(vec![a2.clone(), b.clone()]).services(vec![web.clone()]));
    assert_eq!(endpoints(&store), ["b"]);
    // Handed over again: back, as the source last listed it.
    store.restore("other-uid", "ns", "a");
    assert_eq!(endpoints(&store), ["a", "b"]);
    assert_eq!(store.snapshot().by_uid("a").unwrap().spec.labels, a2.labels);
    // Removed again, then the source drops it: forgotten (listed
    // again later, it is a new workload and published).
    assert!(store.remove("a"));
    store.publish(WholeSet::new(vec![b.clone()]).services(vec![web.clone()]));
    store.publish(WholeSet::new(vec![a.clone(), b.clone()]).services(vec![web]));
    assert_eq!(endpoints(&store), ["a", "b"]);
}

/// An update of one workload among many shares every other entry with
/// the snapshot before it: the diff lists that one workload, and the
/// others are the same allocations.
#[test]
fn an_update_shares_everything_it_does_not_change() {
    let store = WorkloadStore::new("td", "n1");
    let specs: Vec<WorkloadSpec> = (0..2000u16)
        .map(|i| {
            let mut s = spec(&format!("w{i}"), "n2", Protocol::Hbone);
            let [hi, lo] = i.to_be_bytes();
            s.ips = vec![IpAddr::from([10, 0, hi, lo])];
            s
        })
        .collect();
    store.publish(specs.clone());
    let before = store.snapshot();

    let mut changed = specs[7].clone();
    changed.state = LifecycleState::Terminating;
    store.apply(Delta {
        workloads: vec![changed.clone(), specs[8].clone()],
        removed_workloads: vec!["w9".into()],
        ..Default::default()
    });
    let after = store.snapshot();
    let diff: Vec<(Option<&str>, Option<&str>)> = after
        .changes_from(&before)
        .map(|(o, n)| (o.map(|w| w.uid()), n.map(|w| w.uid())))
        .collect();
    assert_eq!(
        diff,
        [(Some("w7"), Some("w7")), (Some("w9"), None)],
        "an equal spec (w8) is not a change"
    );
    assert!(Arc::ptr_eq(
        before.by_uid("w100").unwrap(),
        after.by_uid("w100").unwrap()
    ));
    assert_eq!(
        after.by_ip(IpAddr::from([10, 0, 0, 9])).map(|w| w.uid()),
        None
    );
    assert_eq!(
        after.by_ip(IpAddr::from([10, 0, 0, 7])).unwrap().spec.state,
        LifecycleState::Terminating
    );

    // A whole set republished with one change: the same diff, the same sharing.
    let mut again = specs.clone();
    again[7] = changed;
    again.remove(9);
    let w11 = again.iter_mut().find(|s| s.uid == "w11").unwrap();
    Arc::make_mut(&mut w11.labels).insert("v".into(), "2".into());
    store.publish(again);
    let whole = store.snapshot();
    let diff: Vec<&str> = whole
        .changes_from(&after)
        .map(|(o, _)| o.unwrap().uid())
        .collect();
    assert_eq!(diff, ["w11"]);
    assert!(Arc::ptr_eq(
        after.by_uid("w7").unwrap(),
        whole.by_uid("w7").unwrap()
    ));
}

/// A pod removed by its node agent keeps its mesh membership (a new
/// sandbox's ADD asks for it) until its source says otherwise.
#[test]
fn a_removed_pod_keeps_its_membership() {
    let store = WorkloadStore::new("td", "n1");
    store.apply(Delta {
        workloads: vec![spec("a", "n1", Protocol::Hbone)],
        ..Default::default()
    });
    assert_eq!(
        store.snapshot().membership("a").map(|m| m.reason),
        Some(membership::Reason::Istio)
    );
    assert!(store.remove("a"));
    assert!(store.snapshot().by_uid("a").is_none());
    assert!(store.snapshot().membership("a").is_some_and(|m| m.member));
    // The source removes it: its membership goes with it.
    store.apply(Delta {
        removed_workloads: vec!["a".into()],
        ..Default::default()
    });
    assert_eq!(store.snapshot().membership("a"), None);
}

/// An address a workload gave up is formerly known until another claims
/// it; a refused resource's addresses are held until it is lifted.
#[test]
fn departed_and_refused_addresses_are_formerly_known() {
    let store = WorkloadStore::new("td", "n1");
    let at = |last: u8| IpAddr::from([10, 0, 0, last]);
    let mut a = spec("a", "n2", Protocol::Hbone);
    a.ips = vec![at(1), at(2)];
    store.apply(Delta {
        workloads: vec![a.clone()],
        ..Default::default()
    });
    assert_eq!(store.snapshot().formerly_known(at(1)), None);
    // a keeps .2 and gives .1 up: .1 departed.
    a.ips = vec![at(2)];
    store.apply(Delta {
        workloads: vec![a.clone()],
        ..Default::default()
    });
    let snap = store.snapshot();
    assert!(matches!(
        snap.formerly_known(at(1)),
        Some(FormerlyKnown::Departed { ref uid, .. }) if &**uid == "a"
    ));
    assert_eq!(snap.formerly_known(at(2)), None, "still held");
    // Removed: .2 departed too; b claims .1 again: no longer departed.
    let mut b = spec("b", "n2", Protocol::Hbone);
    b.ips = vec![at(1)];
    store.apply(Delta {
        workloads: vec![b],
        removed_workloads: vec!["a".into()],
        ..Default::default()
    });
    let snap = store.snapshot();
    assert_eq!(snap.formerly_known(at(1)), None);
    assert_eq!(snap.by_ip(at(1)).map(|w| w.uid()), Some("b"));
    assert_eq!(
        snap.formerly_known(at(2)).map(|k| k.label()),
        Some("departed")
    );
    assert_eq!(snap.formerly_known_len(), (1, 0));

    // Refused: held under the resource's name until lifted.
    store.apply(Delta {
        refused: vec![("bad".into(), vec![at(9)])],
        ..Default::default()
    });
    assert_eq!(
        store.snapshot().formerly_known(at(9)),
        Some(FormerlyKnown::Refused {
            resource: Arc::from("bad")
        })
    );
    store.apply(Delta {
        refused: vec![("bad".into(), vec![])],
        ..Default::default()
    });
    assert_eq!(store.snapshot().formerly_known(at(9)), None);
}

/// Departed addresses are bounded: past [`DEPARTED_MAX`] the oldest go.
#[test]
fn departed_addresses_are_bounded() {
    let store = WorkloadStore::new("td", "n1");
    let ip = |i: usize| IpAddr::from((0x0a00_0000u32 + i as u32).to_be_bytes());
    let total = crate::workloads::DEPARTED_MAX + 10;
    let specs: Vec<WorkloadSpec> = (0..total)
        .map(|i| {
            let mut s = spec(&format!("w{i}"), "n2", Protocol::Hbone);
            s.ips = vec![ip(i)];
            s
        })
        .collect();
    store.publish(specs);
    store.publish(vec![]);
    // One more publish forgets what is over the bound.
    store.publish(vec![]);
    let snap = store.snapshot();
    assert_eq!(snap.formerly_known_len().0, crate::workloads::DEPARTED_MAX);
    assert_eq!(snap.formerly_known(ip(0)), None, "the oldest forgotten");
    assert!(snap.formerly_known(ip(total - 1)).is_some());
}

/// An update of a workload on another node leaves the local workloads
/// shared with the snapshot before (what lets the certificates skip a
/// walk); one of a local workload does not.
#[test]
fn only_a_local_update_changes_the_local_workloads() {
    let store = WorkloadStore::new("td", "n1");
    let put = |spec: WorkloadSpec| {
        let before = store.snapshot();
        store.apply(Delta {
            workloads: vec![spec],
            ..Default::default()
        });
        store.snapshot().same_locals(&before)
    };
    assert!(!put(spec("local", "n1", Protocol::Hbone)));
    assert!(put(spec("remote", "n2", Protocol::Hbone)));
    assert!(put(spec("remote", "n2", Protocol::Tcp)));
    assert!(!put(spec("local", "n1", Protocol::Tcp)));
}
