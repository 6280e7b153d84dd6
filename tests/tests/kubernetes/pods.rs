//! Local pods and peers discovered from the API server: a pod's lifecycle
//! and its drains, the namespace label's policy, two pods on one address,
//! an address reused, a peer recreated, a pod already terminating at start.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_lifecycle_create_terminate_delete_recreate() {
    let (api, dir) = demo_cluster(json!({"tidegate.io/mesh": "enabled"})).await;
    api.apply(Kind::Pod, pod("web-0", "uid-1", "node-a", ip(61, 2)));
    api.apply(Kind::Pod, pod("db-0", "uid-db", "node-b", ip(61, 3)));
    let app = discovering(&api, dir.path(), "").await;

    let snap = app.workloads.snapshot();
    let w = snap.by_ip(ip(61, 2)).expect("local pod discovered");
    assert_eq!(w.uid(), "uid-1");
    assert!(w.local);
    assert_eq!(
        w.identity.to_string(),
        "spiffe://cluster.local/ns/demo/sa/web-0"
    );
    assert_eq!(w.spec.state, LifecycleState::Running);
    assert_eq!(w.spec.protocol, tidegate::workloads::Protocol::Hbone);
    let peer = snap.by_ip(ip(61, 3)).expect("remote pod discovered");
    assert!(!peer.local);
    // Local pods are watched with the node's field selector, the rest with its negation.
    let text = app.metrics_text();
    assert_eq!(
        metric(
            &text,
            r#"tidegate_kubernetes_objects{resource="local-pods"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            r#"tidegate_kubernetes_objects{resource="remote-pods"}"#
        ),
        1.0
    );
    assert_eq!(metric(&text, "tidegate_kubernetes_workloads"), 2.0);
    assert_eq!(metric(&text, "tidegate_kubernetes_synced"), 1.0);

    // kubectl delete: deletionTimestamp = now + 120 s → shutdown-started with that deadline.
    let deadline = api.start_pod_deletion("demo", "web-0", Duration::from_secs(120));
    eventually("shutdown-started drain", WAIT, || {
        phase_of(&app, "uid-1").as_deref() == Some("shutting-down")
    })
    .await;
    let d = drain_of(&app, "uid-1").unwrap();
    assert_eq!(d.trigger, Trigger::Kubernetes);
    let want = deadline
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i128;
    let got = d.deadline_unix_ms.unwrap() as i128;
    // The pod's deadline, not drains.default_grace (30 s): within the ms the event took.
    assert!(
        (got - want).abs() < 5_000,
        "deadline {got} vs deletionTimestamp {want}"
    );
    assert_eq!(
        app.workloads.snapshot().by_uid("uid-1").unwrap().spec.state,
        LifecycleState::Terminating
    );

    // The pod object goes away → deleted.
    api.delete(Kind::Pod, "demo", "web-0");
    eventually("deleted", WAIT, || {
        phase_of(&app, "uid-1").as_deref() == Some("deleted")
    })
    .await;
    assert!(app.workloads.snapshot().by_uid("uid-1").is_none());
    assert_eq!(drain_of(&app, "uid-1").unwrap().ended, Some("completed"));

    // A StatefulSet recreates web-0: same name and IP, new UID → a new workload.
    api.apply(Kind::Pod, pod("web-0", "uid-2", "node-a", ip(61, 2)));
    eventually("recreated pod", WAIT, || {
        app.workloads.snapshot().by_uid("uid-2").is_some()
    })
    .await;
    let snap = app.workloads.snapshot();
    assert_eq!(snap.by_ip(ip(61, 2)).unwrap().uid(), "uid-2");
    assert_eq!(
        snap.by_uid("uid-2").unwrap().spec.state,
        LifecycleState::Running
    );
    assert!(
        drain_of(&app, "uid-2").is_none(),
        "the old pod's drain is not the new pod's"
    );
    assert_eq!(phase_of(&app, "uid-1").as_deref(), Some("deleted"));
    let text = app.metrics_text();
    assert_eq!(
        metric(
            &text,
            r#"tidegate_drain_started_total{policy="keep",trigger="kubernetes"}"#
        ),
        1.0
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_label_binds_policy_below_the_pod_annotation() {
    let (api, dir) = demo_cluster(json!({"tidegate.io/drain-policy": "evict"})).await;
    api.apply(Kind::Pod, pod("a", "uid-a", "node-a", ip(62, 2)));
    let mut b = pod("b", "uid-b", "node-a", ip(62, 3));
    b["metadata"]["annotations"] = json!({"tidegate.io/drain-policy": "keep"});
    api.apply(Kind::Pod, b);
    let app = discovering(&api, dir.path(), "").await;
    let snap = app.workloads.snapshot();
    let a = snap.by_uid("uid-a").unwrap();
    assert_eq!(a.spec.namespace_policy.as_deref(), Some("evict"));
    assert_eq!(app.policies.select(a).name, "evict");
    assert_eq!(
        app.policies.select(snap.by_uid("uid-b").unwrap()).name,
        "keep"
    );
    app.shutdown().await;
}

/// Two running pods on one IP: neither is served on it, the address is
/// held closed (counted, in `/config_dump`), until one starts terminating.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_running_pods_on_one_ip_hold_it_closed_until_one_terminates() {
    use tidegate::workloads::FormerlyKnown;
    let (api, dir) = demo_cluster(json!({})).await;
    api.apply(Kind::Pod, pod("old", "uid-old", "node-b", ip(63, 7)));
    let app = discovering(&api, dir.path(), "").await;
    api.apply(Kind::Pod, pod("new", "uid-new", "node-b", ip(63, 7)));
    eventually("the address held closed", WAIT, || {
        matches!(
            app.workloads.snapshot().formerly_known(ip(63, 7)),
            Some(FormerlyKnown::Refused { .. })
        )
    })
    .await;
    let snap = app.workloads.snapshot();
    assert!(snap.by_ip(ip(63, 7)).is_none(), "neither pod has it");
    assert!(snap.by_uid("uid-old").unwrap().spec.ips.is_empty());
    assert!(snap.by_uid("uid-new").unwrap().spec.ips.is_empty());
    assert_eq!(
        metric(&app.metrics_text(), "tidegate_kubernetes_address_conflicts"),
        1.0
    );
    let (_, dump) = http_get(app.addrs.admin, "/config_dump").await;
    let dump: Value = serde_json::from_str(&dump).unwrap();
    assert_eq!(dump["outbound"]["formerly_known"]["refused"], 1, "{dump}");
    api.start_pod_deletion("demo", "old", Duration::from_secs(30));
    eventually("the running pod has the address", WAIT, || {
        app.workloads
            .snapshot()
            .by_ip(ip(63, 7))
            .is_some_and(|w| w.uid() == "uid-new")
    })
    .await;
    assert_eq!(
        metric(&app.metrics_text(), "tidegate_kubernetes_address_conflicts"),
        0.0
    );
    assert_eq!(app.workloads.snapshot().formerly_known(ip(63, 7)), None);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ip_reuse_goes_to_the_running_pod() {
    let (api, dir) = demo_cluster(json!({})).await;
    api.apply(Kind::Pod, pod("old", "uid-old", "node-b", ip(63, 2)));
    let app = discovering(&api, dir.path(), "").await;
    api.start_pod_deletion("demo", "old", Duration::from_secs(30));
    // The CNI hands the IP to a new pod before the old pod object is gone.
    api.apply(Kind::Pod, pod("new", "uid-new", "node-b", ip(63, 2)));
    eventually("new pod owns the IP", WAIT, || {
        app.workloads
            .snapshot()
            .by_ip(ip(63, 2))
            .is_some_and(|w| w.uid() == "uid-new")
    })
    .await;
    let snap = app.workloads.snapshot();
    let old = snap
        .by_uid("uid-old")
        .expect("the terminating pod stays known");
    assert_eq!(old.spec.state, LifecycleState::Terminating);
    assert!(
        old.spec.ips.is_empty(),
        "the reused IP never resolves to the old pod"
    );
    assert_eq!(
        snap.by_ip(ip(63, 2)).unwrap().spec.protocol,
        tidegate::workloads::Protocol::Tcp
    );
    api.delete(Kind::Pod, "demo", "old");
    eventually("old pod gone", WAIT, || {
        app.workloads.snapshot().by_uid("uid-old").is_none()
    })
    .await;
    assert_eq!(
        app.workloads.snapshot().by_ip(ip(63, 2)).unwrap().uid(),
        "uid-new"
    );
    app.shutdown().await;
}

/// A StatefulSet pod recreated with the same name, IP and service account
/// (so the same pool key) is a new workload: the tunnel pooled for the old
/// one is retired, whatever the policy (here `keep`, which does nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreated_peer_with_the_same_ip_never_reuses_old_tunnels() {
    use tidegate_e2e::round_trip;
    let octet = 70;
    let api = FakeApiServer::start().await;
    let Peers {
        dir: _dir,
        server,
        client,
        capture,
        ..
    } = peers(&api, octet, json!({}), "echo-uid-1").await;
    let mut conn = capture.connect(ip(octet, 3)).await;
    assert_eq!(round_trip(&mut conn, b"one").await.unwrap(), b"one");
    drop(conn);
    eventually("one idle pooled tunnel", WAIT, || {
        client.pool.tunnels().len() == 1
    })
    .await;
    let old_tunnel = client.pool.tunnels()[0].clone();

    // Deleted, then recreated: same name, IP and service account, new UID.
    api.delete(Kind::Pod, "demo", "echo");
    eventually("old echo gone", WAIT, || {
        client.workloads.snapshot().by_uid("echo-uid-1").is_none()
    })
    .await;
    assert_eq!(
        client.pool.tunnels().len(),
        1,
        "the keep policy leaves it pooled"
    );
    api.apply(Kind::Pod, pod("echo", "echo-uid-2", "node-b", ip(octet, 2)));
    eventually("old tunnel retired", WAIT, || {
        client.pool.tunnels().is_empty()
    })
    .await;
    let mut conn = capture.connect(ip(octet, 3)).await;
    assert_eq!(round_trip(&mut conn, b"two").await.unwrap(), b"two");
    let now = client.pool.tunnels();
    assert_eq!(now.len(), 1);
    assert!(
        !Arc::ptr_eq(&now[0], &old_tunnel),
        "a new tunnel for the new workload"
    );
    assert_eq!(
        metric(
            &client.metrics_text(),
            r#"tidegate_drain_actions_total{action="evict-reused-ip",result="executed"}"#
        ),
        1.0
    );
    drop(conn);
    client.shutdown().await;
    server.shutdown().await;
}

/// A gateway (re)started while a local pod is already terminating drains it:
/// the first snapshot counts as a change from nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_already_terminating_at_start_drains() {
    let (api, dir) = demo_cluster(json!({})).await;
    api.apply(Kind::Pod, pod("a", "uid-a", "node-a", ip(71, 2)));
    api.start_pod_deletion("demo", "a", Duration::from_secs(90));
    let app = discovering(&api, dir.path(), "").await;
    eventually("drain of the terminating pod", WAIT, || {
        phase_of(&app, "uid-a").as_deref() == Some("shutting-down")
    })
    .await;
    app.shutdown().await;
}
