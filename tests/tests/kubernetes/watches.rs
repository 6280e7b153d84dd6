//! Discovery's watches against the API server: restarts and 410 relists,
//! bookmarks, bursts coalesced, an unreachable or TLS API server, and
//! readiness after the first full sync.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_restart_and_410_relist_neither_lose_nor_duplicate_drains() {
    let (api, dir) = demo_cluster(json!({})).await;
    for i in 1..=4u8 {
        api.apply(
            Kind::Pod,
            pod(&format!("p{i}"), &format!("uid-p{i}"), "node-a", ip(65, i)),
        );
    }
    let app = discovering(&api, dir.path(), "").await;
    api.start_pod_deletion("demo", "p1", Duration::from_secs(60));
    eventually("p1 drains", WAIT, || phase_of(&app, "uid-p1").is_some()).await;

    // A plain watch restart: clients resume from their resourceVersion.
    let watches_before = api.requests(Kind::Pod, "watch");
    api.drop_watches();
    eventually("pod watches resumed", WAIT, || {
        api.requests(Kind::Pod, "watch") >= watches_before + 2 && api.watches(Kind::Pod) == 2
    })
    .await;
    api.start_pod_deletion("demo", "p2", Duration::from_secs(60));
    eventually("p2 drains after the resume", WAIT, || {
        phase_of(&app, "uid-p2").is_some()
    })
    .await;

    // An outage during which history is compacted: the resume gets 410 Gone
    // and the watcher relists. Changes made meanwhile are seen exactly once.
    let lists_before = api.requests(Kind::Pod, "list");
    api.set_unavailable(true);
    api.drop_watches();
    api.start_pod_deletion("demo", "p3", Duration::from_secs(60));
    api.delete(Kind::Pod, "demo", "p4");
    api.apply(Kind::Pod, pod("p5", "uid-p5", "node-a", ip(65, 5)));
    api.compact();
    api.set_unavailable(false);
    eventually("relisted and reconciled", WAIT, || {
        phase_of(&app, "uid-p3").as_deref() == Some("shutting-down")
            && phase_of(&app, "uid-p4").as_deref() == Some("deleted")
            && app.workloads.snapshot().by_uid("uid-p5").is_some()
            // Both pod watches relisted (the remote one holds nothing that changed).
            && api.requests(Kind::Pod, "list") >= lists_before + 2
    })
    .await;
    let text = app.metrics_text();
    assert!(
        metric(
            &text,
            r#"tidegate_kubernetes_lists_total{resource="local-pods"}"#
        ) >= 2.0
    );
    assert!(
        metric(
            &text,
            r#"tidegate_kubernetes_watch_errors_total{resource="local-pods"}"#
        ) >= 1.0
    );
    // p1, p2, p3 shutting down and p4 deleted: four drains, none twice.
    assert_eq!(
        metric(
            &text,
            r#"tidegate_drain_started_total{policy="keep",trigger="kubernetes"}"#
        ),
        4.0
    );
    // No duplicate, so the label set was never used and is not encoded;
    // hbone/drains.rs asserts this very series at 1 (a rename fails there).
    assert_eq!(
        metric_or_zero(
            &text,
            r#"tidegate_drain_duplicate_events_total{event="shutdown-started"}"#
        ),
        0.0
    );
    let phases: Vec<(String, String)> = app
        .drains
        .list()
        .into_iter()
        .map(|d| (d.uid, d.phase.label().to_owned()))
        .collect();
    assert_eq!(
        phases,
        [
            ("uid-p1".into(), "shutting-down".into()),
            ("uid-p2".into(), "shutting-down".into()),
            ("uid-p3".into(), "shutting-down".into()),
            ("uid-p4".into(), "deleted".into()),
        ]
    );
    assert!(drain_of(&app, "uid-p5").is_none());
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_api_server_backs_off_and_the_gateway_serves_unready() {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let app = tidegate::app::build(config(dir.path(), "node-a", &url, ""))
        .await
        .unwrap();
    eventually("watch errors counted", WAIT, || {
        metric_or_zero(
            &app.metrics_text(),
            r#"tidegate_kubernetes_watch_errors_total{resource="local-pods"}"#,
        ) >= 2.0
    })
    .await;
    assert!(!ready(&app).await, "not ready before the first sync");
    let (status, _) = http_get(app.addrs.admin, "/drains").await;
    assert_eq!(status, 200, "the admin API keeps serving");
    assert_eq!(
        metric(&app.metrics_text(), "tidegate_kubernetes_synced"),
        0.0
    );
    app.shutdown().await;

    // A URL that is not one is a config error naming the key.
    let e =
        Config::from_yaml("workloads: {source: kubernetes, kubernetes: {api_server: 'not a url'}}")
            .unwrap_err()
            .to_string();
    assert!(e.contains("workloads.kubernetes.api_server"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_first_full_sync() {
    let (api, dir) = demo_cluster(json!({})).await;
    api.apply(Kind::Pod, pod("a", "uid-a", "node-a", ip(69, 2)));
    api.set_unavailable(true);
    let app = start(&api, dir.path(), "").await;
    eventually("500s seen and counted", WAIT, || {
        metric_or_zero(
            &app.metrics_text(),
            r#"tidegate_kubernetes_watch_errors_total{resource="local-pods"}"#,
        ) >= 1.0
    })
    .await;
    assert!(!ready(&app).await, "not ready while the API server fails");
    assert!(
        app.workloads.snapshot().is_empty(),
        "nothing published before the sync"
    );
    api.set_unavailable(false);
    until_ready(&app).await;
    assert!(app.workloads.snapshot().by_uid("uid-a").is_some());
    // Ready stays ready through a later outage: the last set keeps serving.
    api.set_unavailable(true);
    api.drop_watches();
    let errors = |app: &App| {
        metric(
            &app.metrics_text(),
            r#"tidegate_kubernetes_watch_errors_total{resource="local-pods"}"#,
        )
    };
    let before = errors(&app);
    eventually("the outage is noticed", WAIT, || errors(&app) > before).await;
    assert!(ready(&app).await);
    assert!(app.workloads.snapshot().by_uid("uid-a").is_some());
    app.shutdown().await;
}

/// Bookmarks keep a quiet watch's resourceVersion current: after one, a
/// compaction and a dropped connection resume without 410 and without a
/// relist; without one, the stale resume gets 410 and relists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_spare_quiet_watches_a_relist() {
    let (api, dir) = demo_cluster(json!({})).await;
    api.apply(Kind::Pod, pod("a", "uid-a", "node-a", ip(72, 2)));
    let app = discovering(&api, dir.path(), "").await;
    let churn = |n: u32| {
        for i in 0..n {
            api.modify(Kind::Namespace, "", "demo", |ns| {
                ns["metadata"]["labels"]["churn"] = json!(i.to_string());
            });
        }
    };
    let resumed = |watches: u64| api.requests(Kind::Pod, "watch") >= watches + 2;

    // Other resources move the resourceVersion on; pods stay quiet.
    churn(3);
    api.bookmark_all();
    api.compact();
    let (lists, watches) = (
        api.requests(Kind::Pod, "list"),
        api.requests(Kind::Pod, "watch"),
    );
    api.drop_watches();
    eventually("pod watches resumed", WAIT, || {
        resumed(watches) && api.watches(Kind::Pod) == 2
    })
    .await;
    assert_eq!(
        api.requests(Kind::Pod, "list"),
        lists,
        "no relist after a bookmark"
    );

    // The same without a bookmark: the resume is too old and relists.
    churn(3);
    api.compact();
    let watches = api.requests(Kind::Pod, "watch");
    api.drop_watches();
    eventually("pod watches relisted", WAIT, || {
        api.requests(Kind::Pod, "list") >= lists + 2 && resumed(watches)
    })
    .await;
    assert!(app.workloads.snapshot().by_uid("uid-a").is_some());
    app.shutdown().await;
}

/// As on a real cluster: HTTPS (rustls with ring) verified against the
/// kubeconfig's CA, a bearer token on every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_over_tls_with_a_bearer_token() {
    let api = FakeApiServer::start_tls().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(Kind::Namespace, namespace("demo", json!({})));
    api.apply(Kind::Pod, pod("a", "uid-a", "node-a", ip(73, 2)));
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, api.ca_pem.as_ref().unwrap()).unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\n    certificate-authority: {ca}\nusers:\n- name: u\n  user:\n    token: t0ken\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
            url = api.url(),
            ca = ca.display(),
        ),
    )
    .unwrap();
    let mut cfg = config(dir.path(), "node-a", "http://unused", "");
    cfg.workloads.kubernetes.api_server = None;
    cfg.workloads.kubernetes.kubeconfig = Some(kubeconfig);
    init_tracing();
    let app = tidegate::app::build(cfg).await.unwrap();
    until_ready(&app).await;
    assert!(app.workloads.snapshot().by_uid("uid-a").is_some());
    let auth = api.authorizations();
    assert!(!auth.is_empty());
    assert!(auth.iter().all(|a| a == "Bearer t0ken"), "{auth:?}");
    app.shutdown().await;
}

/// A rollout's burst of events is coalesced into few snapshots, never one per event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_events_is_published_as_few_snapshots() {
    let (api, dir) = demo_cluster(json!({})).await;
    let mut cfg = config(dir.path(), "node-a", &api.url(), "");
    cfg.workloads.kubernetes.debounce = Duration::from_millis(200);
    init_tracing();
    let app = tidegate::app::build(cfg).await.unwrap();
    until_ready(&app).await;
    let publishes = || metric(&app.metrics_text(), "tidegate_kubernetes_publishes_total");
    let before = publishes();
    for i in 0..50u8 {
        let node = if i % 2 == 0 { "node-a" } else { "node-b" };
        api.apply(
            Kind::Pod,
            pod(&format!("p{i}"), &format!("u{i}"), node, ip(74, i + 1)),
        );
    }
    eventually("all 50 published", WAIT, || {
        app.workloads.snapshot().len() == 50
    })
    .await;
    let n = publishes() - before;
    assert!((1.0..50.0).contains(&n), "{n} snapshots for 50 events");
    app.shutdown().await;
}
