//! The drainer's decisions without the API: which backends a load balancer
//! view names for a workload, what each needs, which write a read asks
//! for, and which errors are retried.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{plan, retry_reason, targets_of, write_for, AtCapacity, Plan, Target, Write};
use crate::workloads::{WorkloadSnapshot, WorkloadSpec, WorkloadStore};
use tidegate_oci::model::{Backend, BackendSet, LoadBalancer, UpdateBackendDetails};
use tidegate_oci::OciError;

fn spec(uid: &str, ips: &[&str]) -> WorkloadSpec {
    WorkloadSpec::new(uid, "n1")
        .ips(ips.iter().map(|ip| ip.parse().unwrap()))
        .oci_backend_draining(true)
}

fn snapshot(workloads: Vec<WorkloadSpec>) -> Arc<WorkloadSnapshot> {
    let store = WorkloadStore::new("td", "n1");
    store.publish(workloads);
    store.snapshot()
}

fn backend(ip: &str, drain: bool) -> Backend {
    Backend {
        name: format!("{ip}:8080"),
        ip_address: ip.to_owned(),
        port: 8080,
        weight: 3,
        backup: false,
        drain,
        offline: false,
        max_connections: Some(100),
    }
}

fn lb(sets: &[(&str, Vec<Backend>)]) -> LoadBalancer {
    LoadBalancer {
        id: "lb1".into(),
        backend_sets: sets
            .iter()
            .map(|(name, backends)| {
                let set = BackendSet {
                    name: (*name).to_owned(),
                    backends: backends.clone(),
                    ..Default::default()
                };
                ((*name).to_owned(), set)
            })
            .collect::<BTreeMap<_, _>>(),
        ..Default::default()
    }
}

fn keys(targets: &[Target]) -> Vec<String> {
    targets.iter().map(Target::key).collect()
}

#[test]
fn only_the_exact_workloads_own_ips_are_targets() {
    let snap = snapshot(vec![
        spec("pod", &["10.1.0.5", "10.1.0.6"]),
        spec("neighbour", &["10.1.0.7"]),
    ]);
    let view = lb(&[
        (
            "web",
            vec![
                backend("10.1.0.5", false), // the pod
                backend("10.1.0.7", false), // another pod
                backend("10.9.0.1", false), // a node IP (NodePort)
                backend("not-an-ip", false),
            ],
        ),
        ("api", vec![backend("10.1.0.6", true)]), // the pod's second IP, drained already
    ]);
    let ips = ["10.1.0.5".parse().unwrap(), "10.1.0.6".parse().unwrap()];
    let nodes = ["10.9.0.0/16".parse().unwrap()];
    let targets = targets_of("lb1", &view, "pod", &ips, &snap, &nodes);
    assert_eq!(
        keys(&targets),
        ["lb1/api/10.1.0.6:8080", "lb1/web/10.1.0.5:8080"]
    );
    let (api, web) = (&targets[0], &targets[1]);
    assert!(
        api.drain && !web.drain,
        "each target carries its backend's drain as read"
    );
    assert_eq!((web.set_len, api.set_len), (4, 1));
    assert_eq!((web.lb_len, api.lb_len), (5, 5));
}

#[test]
fn a_node_network_backend_is_never_a_target_even_with_the_pods_ip() {
    // A host-network pod: its IP is in a node network.
    let snap = snapshot(vec![spec("host-pod", &["10.9.0.4"])]);
    let view = lb(&[("web", vec![backend("10.9.0.4", false)])]);
    let ips = ["10.9.0.4".parse().unwrap()];
    let nodes = ["10.9.0.0/16".parse().unwrap()];
    assert!(targets_of("lb1", &view, "host-pod", &ips, &snap, &nodes).is_empty());
    assert_eq!(
        targets_of("lb1", &view, "host-pod", &ips, &snap, &[]).len(),
        1
    );
}

#[test]
fn an_ip_now_owned_by_another_uid_is_not_a_target() {
    // The pod's IP was reused by a new pod: the store maps it to the new uid.
    let snap = snapshot(vec![spec("new-pod", &["10.1.0.5"])]);
    let view = lb(&[("web", vec![backend("10.1.0.5", false)])]);
    let ips = ["10.1.0.5".parse().unwrap()];
    assert!(targets_of("lb1", &view, "old-pod", &ips, &snap, &[]).is_empty());
}

fn target(drain: bool, set_len: usize, lb_len: usize) -> Target {
    Target {
        lb: "lb1".into(),
        set: "web".into(),
        name: "10.1.0.5:8080".into(),
        drain,
        set_len,
        lb_len,
    }
}

#[test]
fn what_each_backend_needs() {
    use AtCapacity::{Keep, RemoveEarly};
    let change = |full, remove| Plan::Change { full, remove };
    let limit = 16;
    let table = [
        // (backend drained, set len, lb len, wanted drain, at capacity) → plan
        ((false, 3, 3, true, RemoveEarly), change(false, false)),
        ((true, 3, 3, true, RemoveEarly), Plan::Keep),
        ((false, 3, 3, false, RemoveEarly), Plan::Keep),
        ((true, 3, 3, false, Keep), change(false, false)),
        // Its set is full: remove it early, or drain and keep it.
        ((false, 16, 16, true, RemoveEarly), change(true, true)),
        ((false, 16, 16, true, Keep), change(true, false)),
        // The load balancer is full though the set is not.
        ((false, 2, 16, true, RemoveEarly), change(true, true)),
        ((false, 15, 15, true, RemoveEarly), change(false, false)),
        // An un-drain never counts as at capacity, never removes.
        ((true, 16, 16, false, RemoveEarly), change(false, false)),
        // Already drained in a full set: nothing to do, nothing removed.
        ((true, 16, 16, true, RemoveEarly), Plan::Keep),
    ];
    for ((drained, set_len, lb_len, drain, at_capacity), want) in table {
        let t = target(drained, set_len, lb_len);
        assert_eq!(
            plan(&t, drain, at_capacity, limit),
            want,
            "drained={drained} set={set_len} lb={lb_len} drain={drain} {at_capacity:?}"
        );
    }
}

#[test]
fn a_read_backend_is_written_back_as_read_with_drain_set() {
    let read = Backend {
        weight: 7,
        backup: true,
        offline: true,
        max_connections: None,
        ..backend("10.1.0.5", false)
    };
    assert_eq!(
        write_for(&read, true, false),
        Some(Write::Update(UpdateBackendDetails {
            weight: 7,
            backup: true,
            drain: true,
            offline: true,
            max_connections: None,
        }))
    );
    // Already as wanted (another writer got there first): no write.
    assert_eq!(write_for(&read, false, false), None);
    let drained = backend("10.1.0.5", true);
    assert_eq!(write_for(&drained, true, false), None);
    assert_eq!(
        write_for(&drained, false, false),
        Some(Write::Update(UpdateBackendDetails::with_drain(
            &drained, false
        )))
    );
    // Removal deletes, whatever the backend's drain.
    assert_eq!(write_for(&read, true, true), Some(Write::Delete));
    assert_eq!(write_for(&drained, true, true), Some(Write::Delete));
}

fn status(status: u16, code: &str) -> OciError {
    OciError::Status {
        operation: "UpdateBackend",
        status,
        code: code.into(),
        message: String::new(),
        request_id: "r".into(),
    }
}

#[test]
fn transient_errors_are_retried_and_permanent_ones_stop_the_drain() {
    let transport = OciError::Transport {
        operation: "GetBackend",
        endpoint: "https://lb".into(),
        message: "connection refused".into(),
    };
    let decode = OciError::Decode {
        operation: "GetBackend",
        message: "eof".into(),
    };
    let table = [
        (status(409, "IncorrectState"), Some("conflict")),
        (status(409, "Conflict"), Some("conflict")),
        (status(409, "InvalidParameter"), None),
        (status(429, "TooManyRequests"), Some("throttled")),
        (status(500, "InternalServerError"), Some("server")),
        (status(503, "ServiceUnavailable"), Some("server")),
        (transport, Some("transport")),
        (status(400, "InvalidParameter"), None),
        (status(401, "NotAuthenticated"), None),
        (status(404, "NotAuthorizedOrNotFound"), None),
        (decode, None),
    ];
    for (e, want) in table {
        assert_eq!(retry_reason(&e), want, "{e}");
    }
}
