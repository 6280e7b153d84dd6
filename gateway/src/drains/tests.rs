//! The engine without the network: a workload store, an empty registry and
//! pool, the built-in fallback policy.

use std::sync::Arc;
use std::time::Duration;

use super::DrainEngine;
use crate::config::DrainsConfig;
use crate::proxy::pool::Pool;
use crate::proxy::tunnels::InboundTunnels;
use crate::workloads::{Workload, WorkloadSpec, WorkloadStore};
use tidegate_policy_host::config::PoliciesConfig;
use tidegate_policy_host::{PolicyEngine, PolicyMetrics};
use tidegate_protocol::tls::{DevCa, TlsContext, TlsMetrics};

pub(super) fn spec(uid: &str, node: &str, ip: [u8; 4]) -> WorkloadSpec {
    WorkloadSpec::new(uid, node).ips([std::net::IpAddr::from(ip)])
}

/// A pool with no tunnel (nothing is dialed until a connection asks).
pub(super) fn pool(reg: &mut prometheus_client::registry::Registry) -> Arc<Pool> {
    let ca = DevCa::new(Duration::from_secs(3600)).unwrap();
    let tls = Arc::new(TlsContext::new(
        Arc::new(ca),
        "td",
        TlsMetrics::register(reg),
    ));
    Pool::new(
        tls,
        Default::default(),
        Default::default(),
        Default::default(),
        None,
        reg,
    )
}

/// An engine on node `n1` with a local workload `local-uid` and a peer
/// `peer-uid` on another node.
pub(super) fn engine() -> (Arc<DrainEngine>, Arc<WorkloadStore>) {
    let mut reg = prometheus_client::registry::Registry::default();
    let pool = pool(&mut reg);
    let policies = PolicyEngine::new(
        &PoliciesConfig::default(),
        PolicyMetrics::register(&mut reg),
    )
    .unwrap();
    let store = WorkloadStore::new("td", "n1");
    store.publish(vec![
        spec("local-uid", "n1", [10, 0, 0, 1]),
        spec("peer-uid", "n2", [10, 0, 0, 2]),
    ]);
    let engine = DrainEngine::new(super::DrainDeps {
        workloads: store.clone(),
        tunnels: Arc::new(InboundTunnels::default()),
        pool,
        policies,
        cfg: DrainsConfig::default(),
        metrics: super::DrainMetrics::register(&mut reg),
        oci: None,
        added_by_node_agent: false,
    });
    (engine, store)
}

pub(super) fn local(store: &WorkloadStore) -> Arc<Workload> {
    store.snapshot().by_uid("local-uid").unwrap().clone()
}

/// Runs `f` on its own thread; panics if it does not return within 10 s
/// (a deadlock fails the test instead of hanging it).
pub(super) fn within_10s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("did not return within 10 s (deadlock?)")
}

#[tokio::test]
async fn a_timer_about_a_peer_or_a_destination_is_decided_without_deadlock() {
    let (engine, store) = engine();
    let source = local(&store);
    // Neither has a drain record nor is a local workload.
    for subject in ["peer-uid", "10.0.0.9:8080"] {
        let (e, s) = (engine.clone(), source.clone());
        let rt = tokio::runtime::Handle::current();
        within_10s(move || {
            let _guard = rt.enter();
            e.timer_fired(subject.to_owned(), "t".to_owned(), s)
        });
    }
    // The engine is still usable: its lock was released.
    assert!(within_10s(move || engine.list()).is_empty());
}

#[tokio::test]
async fn the_same_transition_from_two_sources_drains_once() {
    use super::{Lifecycle, Trigger};
    let (engine, _store) = engine();
    let shutdown = Lifecycle::ShutdownStarted {
        grace: Duration::from_secs(30),
    };
    let first = engine
        .on_lifecycle("local-uid", shutdown, Trigger::Admin)
        .await
        .unwrap();
    assert!(!first.duplicate);
    let again = engine
        .on_lifecycle("local-uid", shutdown, Trigger::WorkloadFile)
        .await
        .unwrap();
    assert!(again.duplicate);
    let drains = engine.list();
    assert_eq!(drains.len(), 1);
    // The first source started it.
    assert_eq!(drains[0].trigger, Trigger::Admin);
    let deleted = engine
        .on_lifecycle("local-uid", Lifecycle::Deleted, Trigger::Kubernetes)
        .await
        .unwrap();
    assert!(!deleted.duplicate);
    assert_eq!(engine.list()[0].ended, Some("completed"));
}

#[tokio::test]
async fn a_peer_is_not_drained_as_a_local_workload() {
    use super::{DrainError, Lifecycle, Trigger};
    let (engine, _store) = engine();
    let r = engine
        .on_lifecycle("peer-uid", Lifecycle::Teardown, Trigger::Cni)
        .await;
    assert!(matches!(r, Err(DrainError::UnknownWorkload(_))));
}

/// CNI DEL names a pod by its Kubernetes uid; istiod's workload of the
/// same pod is `<cluster>//Pod/<ns>/<name>`: the teardown finds it by
/// namespace and name, on this node only, and only when one matches.
#[tokio::test]
async fn a_teardown_finds_istiods_workload_of_the_pod_by_namespace_and_name() {
    use super::{Lifecycle, Trigger};
    let (engine, store) = engine();
    let istio = |name: &str, node: &str, ip| WorkloadSpec {
        name: name.into(),
        namespace: "lab".into(),
        ..spec(&format!("Kubernetes//Pod/lab/{name}"), node, ip)
    };
    let mut twins = [
        istio("twin", "n1", [10, 0, 0, 5]),
        istio("twin", "n1", [10, 0, 0, 6]),
    ];
    twins[1].uid = "Kubernetes//Pod/lab/twin-again".into();
    let [t0, t1] = twins;
    store.publish(vec![
        spec("local-uid", "n1", [10, 0, 0, 1]),
        istio("server", "n1", [10, 0, 0, 3]),
        istio("remote", "n2", [10, 0, 0, 4]),
        t0,
        t1,
    ]);
    let of = |uid: &str, ns: &str, name: &str| engine.workload_of_pod(uid, ns, name);
    assert_eq!(
        of("k8s-uid-1", "lab", "server"),
        "Kubernetes//Pod/lab/server"
    );
    // Its own uid first; a peer's name, an ambiguous name or no name: as given.
    assert_eq!(of("local-uid", "lab", "server"), "local-uid");
    assert_eq!(of("k8s-uid-2", "lab", "remote"), "k8s-uid-2");
    assert_eq!(of("k8s-uid-3", "lab", "twin"), "k8s-uid-3");
    assert_eq!(of("k8s-uid-4", "", ""), "k8s-uid-4");
    assert_eq!(of("k8s-uid-5", "other", "server"), "k8s-uid-5");
    let teardown = engine
        .on_lifecycle(
            &of("k8s-uid-1", "lab", "server"),
            Lifecycle::Teardown,
            Trigger::Cni,
        )
        .await
        .unwrap();
    assert_eq!(teardown.uid, "Kubernetes//Pod/lab/server");
    assert!(teardown.teardown.is_some(), "a teardown is acknowledged");
}

#[tokio::test]
async fn shutdown_cancels_pending_timers() {
    use tidegate_sdk as sdk;
    let (engine, store) = engine();
    let source = local(&store);
    let timer = sdk::Action::SetTimer(sdk::SetTimer {
        subject: "local-uid".into(),
        tag: "later".into(),
        after_ms: 3_600_000,
    });
    let done = engine.execute(&source, &[timer], tokio::time::Instant::now());
    assert_eq!(done.descriptions.len(), 1);
    assert_eq!(engine.pending_tasks(), 1);
    // The pending timer holds the engine; a detached one would keep it forever.
    assert_eq!(Arc::strong_count(&engine), 2);
    engine.shutdown().await;
    assert_eq!(engine.pending_tasks(), 0);
    assert_eq!(Arc::strong_count(&engine), 1);
}

/// Whether a tunnel accepted for `uid` now is told to go away at once.
fn a_new_tunnel_is_turned_away(engine: &DrainEngine, uid: &str) -> bool {
    let peer = tidegate_protocol::identity::SpiffeId::new("td", "default", "client");
    let r = engine
        .registry
        .register(uid, peer, "10.0.0.9:40000".parse().unwrap());
    let turned_away = r.tunnel.goaway_commands().borrow().is_some();
    turned_away
}

/// A workload deleted (gone from the store) and added again with the same
/// uid starts afresh: no GOAWAY for its new tunnels, no drain in `/drains`.
#[tokio::test]
async fn a_workload_added_again_with_the_same_uid_is_not_turned_away() {
    let (engine, store) = engine();
    let full = store.snapshot();
    engine.on_snapshot(&Default::default(), &full, super::Trigger::WorkloadFile);
    store.publish(vec![spec("peer-uid", "n2", [10, 0, 0, 2])]);
    let without = store.snapshot();
    engine.on_snapshot(&full, &without, super::Trigger::WorkloadFile);
    engine.tasks.settle().await;
    let drains = engine.list();
    assert_eq!(
        (drains[0].phase, drains[0].ended),
        (super::Phase::Deleted, Some("completed"))
    );
    assert!(!a_new_tunnel_is_turned_away(&engine, "other-uid"));

    store.publish(vec![
        spec("local-uid", "n1", [10, 0, 0, 1]),
        spec("peer-uid", "n2", [10, 0, 0, 2]),
    ]);
    engine.on_snapshot(&without, &store.snapshot(), super::Trigger::WorkloadFile);
    engine.tasks.settle().await;
    assert!(engine.list().is_empty(), "{:?}", engine.list());
    assert_eq!(engine.phase_of("local-uid").0, super::Phase::Running);
    assert!(!a_new_tunnel_is_turned_away(&engine, "local-uid"));
}

/// The store shows a workload gone and back before the deletion's task ran:
/// the deletion was about the earlier workload and is dropped, not applied
/// to the one now listed.
#[tokio::test]
async fn a_deletion_handled_after_the_workload_came_back_is_dropped() {
    let (engine, store) = engine();
    let full = store.snapshot();
    engine.on_snapshot(&Default::default(), &full, super::Trigger::WorkloadFile);
    store.publish(vec![spec("peer-uid", "n2", [10, 0, 0, 2])]);
    let without = store.snapshot();
    store.publish(vec![
        spec("local-uid", "n1", [10, 0, 0, 1]),
        spec("peer-uid", "n2", [10, 0, 0, 2]),
    ]);
    // Both snapshots before the deletion's task runs (a current-thread
    // runtime runs it only when this test awaits).
    engine.on_snapshot(&full, &without, super::Trigger::WorkloadFile);
    engine.on_snapshot(&without, &store.snapshot(), super::Trigger::WorkloadFile);
    engine.tasks.settle().await;
    assert!(engine.list().is_empty(), "{:?}", engine.list());
    assert!(!a_new_tunnel_is_turned_away(&engine, "local-uid"));
}

#[tokio::test]
async fn an_admin_deletion_takes_the_workload_out_of_the_store_now() {
    use super::{Lifecycle, Trigger};
    let (engine, store) = engine();
    engine
        .on_lifecycle("local-uid", Lifecycle::Deleted, Trigger::Admin)
        .await
        .unwrap();
    assert!(
        store.snapshot().by_uid("local-uid").is_none(),
        "deleted is deleted, whatever the source still lists"
    );
    // The source publishes again still listing it: it stays out.
    store.publish(vec![
        spec("local-uid", "n1", [10, 0, 0, 1]),
        spec("peer-uid", "n2", [10, 0, 0, 2]),
    ]);
    assert!(store.snapshot().by_uid("local-uid").is_none());
    assert!(store.snapshot().by_uid("peer-uid").is_some());
    // A deletion from a source leaves the store to its source.
    engine
        .on_lifecycle("peer-uid", Lifecycle::Deleted, Trigger::Kubernetes)
        .await
        .ok();
    assert!(store.snapshot().by_uid("peer-uid").is_some());
}
