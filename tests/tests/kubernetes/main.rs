//! Kubernetes discovery against the wire-level API server double
//! (`tidegate_e2e::kube_api`): kube-rs watchers over real HTTP, the workload
//! store, lifecycle events and drains, watch restarts and 410 relists.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use tidegate::app::App;
use tidegate::config::Config;
use tidegate::drains::{DrainView, Trigger};
use tidegate::workloads::LifecycleState;
use tidegate_e2e::kube_api::{FakeApiServer, Kind};
use tidegate_e2e::{eventually, http_get, init_tracing, ip, metric, metric_or_zero, plugin};

mod authorization;
mod ca;
mod ca_client;
mod ca_server;
mod cluster_ranges;
mod istio_source;
mod membership;
mod waypoints;
mod xds_client;

const WAIT: Duration = Duration::from_secs(10);

/// A gateway on `node` discovering from `api_server`, with two policies:
/// `keep` (the default) and `evict` (evict-on-delete, also on terminating peers).
fn config(dir: &std::path::Path, node: &str, api_server: &str, extra: &str) -> Config {
    let yaml = format!(
        r#"node_name: {node}
trust_domain: cluster.local
listeners:
  outbound: 127.0.0.1:0
  inbound: 0.0.0.0:0
  admin: 127.0.0.1:0
  metrics: 127.0.0.1:0
  readiness: 127.0.0.1:0
certificates: {{source: dev-ca, state_dir: {ca}}}
workloads:
  source: kubernetes
  kubernetes:
    api_server: {api_server}
    debounce: 10ms
drains:
  default_grace: 30s
policies:
  default: keep
  plugins:
    keep: {{file: {keep}}}
    evict:
      file: {evict}
      config: '{{"on-peer-terminating": "evict-when-idle"}}'
{extra}
"#,
        ca = dir.join("ca").display(),
        keep = plugin("keepalive-only").display(),
        evict = plugin("evict-on-delete").display(),
    );
    Config::from_yaml(&yaml).unwrap_or_else(|e| panic!("test config: {e}\n{yaml}"))
}

fn namespace(name: &str, labels: Value) -> Value {
    json!({"metadata": {"name": name, "uid": format!("ns-{name}"), "labels": labels}})
}

fn pod(name: &str, uid: &str, node: &str, pod_ip: std::net::IpAddr) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "demo", "uid": uid, "labels": {"app": name}},
        "spec": {"nodeName": node, "serviceAccountName": name, "containers": [{"name": "app", "image": "app:1"}]},
        "status": {
            "phase": "Running",
            "podIP": pod_ip.to_string(),
            "podIPs": [{"ip": pod_ip.to_string()}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    })
}

fn slice(name: &str, service: &str, endpoints: Value) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "demo", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": endpoints,
    })
}

fn drain_of(app: &App, uid: &str) -> Option<DrainView> {
    app.drains.list().into_iter().find(|d| d.uid == uid)
}

fn phase_of(app: &App, uid: &str) -> Option<String> {
    drain_of(app, uid).map(|d| d.phase.label().to_owned())
}

async fn start(api: &FakeApiServer, dir: &std::path::Path, extra: &str) -> App {
    init_tracing();
    tidegate::app::build(config(dir, "node-a", &api.url(), extra))
        .await
        .unwrap()
}

async fn ready(app: &App) -> bool {
    http_get(app.addrs.readiness, "/healthz/ready").await.0 == 200
}

/// Awaits readiness (polled over HTTP, bounded).
async fn until_ready(app: &App) {
    tidegate_e2e::wait_for("the gateway to become ready", WAIT, || async move {
        ready(app).await.then_some(())
    })
    .await
}

/// Two gateways: node-b serves the echo workload from its workload file;
/// node-a discovers the client pod (with `client_annotations`) and the echo
/// pod (`echo_uid`) from the API server and captures the client's traffic.
struct Peers {
    dir: tempfile::TempDir,
    server: App,
    client: App,
    capture: tidegate_e2e::Capture,
    /// The echo server behind the server gateway (`ip(octet, 2)`).
    echo: std::net::SocketAddr,
}

async fn peers(api: &FakeApiServer, octet: u8, client_annotations: Value, echo_uid: &str) -> Peers {
    use tidegate_e2e::{echo_server, gateway_config, workloads_yaml, Capture};
    let dir = tempfile::tempdir().unwrap();
    let server_wl = dir.path().join("server-workloads.yaml");
    std::fs::write(&server_wl, workloads_yaml(octet, "echo")).unwrap();
    let echo = echo_server(ip(octet, 2)).await;
    init_tracing();
    let server = tidegate::app::build(gateway_config(
        "node-b",
        &dir.path().join("ca"),
        &server_wl,
        15008,
        "",
    ))
    .await
    .unwrap();
    api.apply(
        Kind::Namespace,
        namespace("demo", json!({"tidegate.io/mesh": "enabled"})),
    );
    let mut client_pod = pod("client", "client-uid", "node-a", ip(octet, 3));
    client_pod["metadata"]["annotations"] = client_annotations;
    api.apply(Kind::Pod, client_pod);
    api.apply(Kind::Pod, pod("echo", echo_uid, "node-b", ip(octet, 2)));
    let extra = format!(
        "hbone:\n  port: {}\n",
        server.addrs.inbound.expect("node listeners").port()
    );
    let client = tidegate::app::build(config(dir.path(), "node-a", &api.url(), &extra))
        .await
        .unwrap();
    until_ready(&client).await;
    let capture = Capture::start(client.outbound.clone(), echo).await;
    Peers {
        dir,
        server,
        client,
        capture,
        echo,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_lifecycle_create_terminate_delete_recreate() {
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(
        Kind::Namespace,
        namespace("demo", json!({"tidegate.io/mesh": "enabled"})),
    );
    api.apply(Kind::Pod, pod("web-0", "uid-1", "node-a", ip(61, 2)));
    api.apply(Kind::Pod, pod("db-0", "uid-db", "node-b", ip(61, 3)));
    let app = start(&api, dir.path(), "").await;
    until_ready(&app).await;

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
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(
        Kind::Namespace,
        namespace("demo", json!({"tidegate.io/drain-policy": "evict"})),
    );
    api.apply(Kind::Pod, pod("a", "uid-a", "node-a", ip(62, 2)));
    let mut b = pod("b", "uid-b", "node-a", ip(62, 3));
    b["metadata"]["annotations"] = json!({"tidegate.io/drain-policy": "keep"});
    api.apply(Kind::Pod, b);
    let app = start(&api, dir.path(), "").await;
    until_ready(&app).await;
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
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(Kind::Namespace, namespace("demo", json!({})));
    api.apply(Kind::Pod, pod("old", "uid-old", "node-b", ip(63, 7)));
    let app = start(&api, dir.path(), "").await;
    until_ready(&app).await;
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
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(Kind::Namespace, namespace("demo", json!({})));
    api.apply(Kind::Pod, pod("old", "uid-old", "node-b", ip(63, 2)));
    let app = start(&api, dir.path(), "").await;
    until_ready(&app).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informer_skew_is_counted_then_resolved_and_oci_service_marks_pods() {
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(Kind::Namespace, namespace("demo", json!({})));
    api.apply(
        Kind::Service,
        json!({"metadata": {"name": "web", "namespace": "demo",
            "annotations": {"tidegate.io/oci-backend-draining": "true"}},
            "spec": {"selector": {"app": "web"}}}),
    );
    // The slice names a pod the pod watch has not delivered yet.
    api.apply(
        Kind::EndpointSlice,
        slice(
            "web-x1",
            "web",
            json!([{"addresses": [ip(64, 2).to_string()], "conditions": {"ready": true},
                "targetRef": {"kind": "Pod", "namespace": "demo", "name": "web", "uid": "uid-web"}}]),
        ),
    );
    let app = start(&api, dir.path(), "").await;
    until_ready(&app).await;
    eventually("skew counted", WAIT, || {
        metric(&app.metrics_text(), "tidegate_kubernetes_unknown_endpoints") == 1.0
    })
    .await;
    api.apply(Kind::Pod, pod("web", "uid-web", "node-a", ip(64, 2)));
    eventually("skew resolved", WAIT, || {
        metric(&app.metrics_text(), "tidegate_kubernetes_unknown_endpoints") == 0.0
    })
    .await;
    let snap = app.workloads.snapshot();
    assert!(snap.by_uid("uid-web").unwrap().spec.oci_backend_draining);
    // Namespaces are watched metadata-only; pods, Services and slices in full.
    assert_eq!(api.requests(Kind::Service, "list"), 1);
    let all = api.requests(Kind::Namespace, "list") + api.requests(Kind::Namespace, "watch");
    assert_eq!(api.metadata_only_requests(Kind::Namespace), all);
    for kind in [Kind::Pod, Kind::Service, Kind::EndpointSlice] {
        assert_eq!(api.metadata_only_requests(kind), 0, "{kind:?}");
    }
    assert_eq!(
        metric(
            &app.metrics_text(),
            r#"tidegate_kubernetes_objects{resource="services"}"#
        ),
        1.0
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_restart_and_410_relist_neither_lose_nor_duplicate_drains() {
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(Kind::Namespace, namespace("demo", json!({})));
    for i in 1..=4u8 {
        api.apply(
            Kind::Pod,
            pod(&format!("p{i}"), &format!("uid-p{i}"), "node-a", ip(65, i)),
        );
    }
    let app = start(&api, dir.path(), "").await;
    until_ready(&app).await;
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
async fn peer_endpointslice_terminating_evicts_pooled_tunnels() {
    use tidegate_e2e::round_trip;
    let octet = 66;
    let api = FakeApiServer::start().await;
    // The client pod overrides its peers' policy (the echo pod names none)
    // with one that evicts tunnels to terminating peers.
    let Peers {
        dir: _dir,
        server,
        client,
        capture,
        ..
    } = peers(
        &api,
        octet,
        json!({"tidegate.io/peer-drain-policy": "evict"}),
        "echo-uid",
    )
    .await;
    let mut conn = capture.connect(ip(octet, 3)).await;
    assert_eq!(round_trip(&mut conn, b"ping").await.unwrap(), b"ping");
    drop(conn);
    eventually("one idle pooled tunnel", WAIT, || {
        let t = client.pool.tunnels();
        t.len() == 1 && t[0].streams() == 0
    })
    .await;

    // The peer's EndpointSlice says terminating before its pod object does.
    api.apply(
        Kind::EndpointSlice,
        slice(
            "echo-x1",
            "echo",
            json!([{"addresses": [ip(octet, 2).to_string()],
                "conditions": {"ready": false, "serving": true, "terminating": true},
                "targetRef": {"kind": "Pod", "namespace": "demo", "name": "echo", "uid": "echo-uid"}}]),
        ),
    );
    eventually(
        "pooled tunnel to the terminating peer evicted",
        WAIT,
        || client.pool.tunnels().is_empty(),
    )
    .await;
    assert_eq!(
        client
            .workloads
            .snapshot()
            .by_uid("echo-uid")
            .unwrap()
            .spec
            .state,
        LifecycleState::Terminating
    );
    assert_eq!(
        metric(
            &client.metrics_text(),
            r#"tidegate_drain_actions_total{action="evict",result="executed"}"#
        ),
        1.0
    );
    let peers = client.drains.peer_drains();
    assert_eq!(peers.len(), 1, "{peers:?}");
    let d = &peers[0].decisions[0];
    assert_eq!(
        (d.event, d.policy.as_str(), d.selected_by, d.tunnels_evicted),
        ("peer-terminating", "evict", "client-override", 1),
        "{peers:?}"
    );
    client.shutdown().await;
    server.shutdown().await;
}

/// A Service from the API: its ClusterIP routes to the endpoints its
/// EndpointSlices list, a named targetPort resolves from the pod's container
/// port, a not-ready endpoint is never chosen while a ready one is, a Service
/// whose every endpoint is terminating still answers, and a deleted
/// Service's VIP is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_and_endpointslices_route_a_vip_to_usable_endpoints() {
    use tidegate_e2e::{round_trip, Capture};
    let octet = 76;
    let api = FakeApiServer::start().await;
    let p = peers(&api, octet, json!({}), "echo-uid").await;
    let vip: std::net::IpAddr = format!("10.96.{octet}.1").parse().unwrap();
    // The echo pod names its port; a second pod ("ghost", where nothing
    // listens) is a not-ready endpoint: choosing it would fail the connection.
    let http = json!([{"name": "http", "containerPort": p.echo.port()}]);
    api.modify(Kind::Pod, "demo", "echo", |pod| {
        pod["spec"]["containers"][0]["ports"] = http.clone();
    });
    let mut ghost = pod("ghost", "ghost-uid", "node-b", ip(octet, 4));
    ghost["spec"]["containers"][0]["ports"] = http;
    api.apply(Kind::Pod, ghost);
    api.apply(
        Kind::Service,
        json!({"metadata": {"name": "echo", "namespace": "demo"},
            "spec": {"clusterIP": vip.to_string(), "clusterIPs": [vip.to_string()],
                "selector": {"app": "echo"},
                "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
                          {"name": "dns", "port": 53, "protocol": "UDP"}]}}),
    );
    let endpoint = |name: &str, octet_host: u8, conditions: Value| {
        json!({"addresses": [ip(octet, octet_host).to_string()], "conditions": conditions,
            "targetRef": {"kind": "Pod", "namespace": "demo", "name": name, "uid": format!("{name}-uid")}})
    };
    api.apply(
        Kind::EndpointSlice,
        slice(
            "echo-a1",
            "echo",
            json!([
                endpoint("echo", 2, json!({"ready": true})),
                endpoint(
                    "ghost",
                    4,
                    json!({"ready": false, "serving": false, "terminating": true})
                ),
            ]),
        ),
    );
    let client = &p.client;
    let endpoints = || {
        let snap = client.workloads.snapshot();
        let svc = snap.service_by_vip(vip, 80)?;
        Some(
            svc.endpoints[&80]
                .iter()
                .map(|e| {
                    (
                        e.workload.uid().to_owned(),
                        e.target_port,
                        e.conditions.ready,
                    )
                })
                .collect::<Vec<_>>(),
        )
    };
    eventually("the Service with both endpoints", WAIT, || {
        endpoints().is_some_and(|e| e.len() == 2)
    })
    .await;
    assert_eq!(
        endpoints().unwrap(),
        [
            ("echo-uid".to_owned(), p.echo.port(), true),
            ("ghost-uid".to_owned(), p.echo.port(), false),
        ],
        "named targetPort from the pod's container port; conditions from the slice"
    );
    assert!(
        client
            .workloads
            .snapshot()
            .service_by_vip(vip, 53)
            .is_none(),
        "UDP ports are not routed"
    );
    assert_eq!(
        metric(&client.metrics_text(), "tidegate_kubernetes_services"),
        1.0
    );

    let capture = Capture::start(client.outbound.clone(), std::net::SocketAddr::new(vip, 80)).await;
    for i in 0..20u8 {
        let mut conn = capture.connect(ip(octet, 3)).await;
        assert_eq!(
            round_trip(&mut conn, &[i; 64]).await.unwrap(),
            [i; 64],
            "connection {i}"
        );
    }
    let text = client.metrics_text();
    assert_eq!(
        metric_or_zero(
            &text,
            r#"tidegate_service_endpoint_choices_total{reason="ready"}"#
        ),
        20.0,
        "{text}"
    );

    // Every endpoint terminating: the serving one still answers.
    api.modify(Kind::EndpointSlice, "demo", "echo-a1", |s| {
        s["endpoints"][0]["conditions"] =
            json!({"ready": false, "serving": true, "terminating": true});
    });
    eventually("echo no longer ready", WAIT, || {
        endpoints().is_some_and(|e| e.iter().all(|(_, _, ready)| !ready))
    })
    .await;
    for i in 0..10u8 {
        let mut conn = capture.connect(ip(octet, 3)).await;
        assert_eq!(
            round_trip(&mut conn, &[i; 64]).await.unwrap(),
            [i; 64],
            "fallback {i}"
        );
    }
    assert_eq!(
        metric_or_zero(
            &client.metrics_text(),
            r#"tidegate_service_endpoint_choices_total{reason="terminating_fallback"}"#
        ),
        10.0
    );

    // The Service goes: so does its VIP.
    api.delete(Kind::Service, "demo", "echo");
    eventually("the VIP is gone", WAIT, || endpoints().is_none()).await;
    assert_eq!(
        metric(&client.metrics_text(), "tidegate_kubernetes_services"),
        0.0
    );
    // Watched in full now (routing needs spec.clusterIPs and ports).
    assert_eq!(api.metadata_only_requests(Kind::Service), 0);
    p.client.shutdown().await;
    p.server.shutdown().await;
}

/// The double itself, driven by kube's client directly: selectors,
/// pagination, metadata-only lists, 400 on selectors it cannot evaluate,
/// 410 on an exact list from a compacted resourceVersion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_double_speaks_the_list_protocol() {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use kube::api::{ListParams, VersionMatch};
    use kube::core::PartialObjectMeta;
    let api = FakeApiServer::start().await;
    for i in 1..=5u8 {
        let node = if i <= 3 { "node-a" } else { "node-b" };
        let mut p = pod(&format!("p{i}"), &format!("u{i}"), node, ip(68, i));
        if i % 2 == 0 {
            p["metadata"]["labels"]["tier"] = json!("db");
        }
        api.apply(Kind::Pod, p);
    }
    api.apply(Kind::Namespace, namespace("demo", json!({"team": "x"})));
    let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let pods: kube::Api<Pod> = kube::Api::all(client.clone());
    let names = |l: kube::core::ObjectList<Pod>| -> Vec<String> {
        l.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect()
    };
    let on_a = pods
        .list(&ListParams::default().fields("spec.nodeName=node-a"))
        .await
        .unwrap();
    assert_eq!(names(on_a), ["p1", "p2", "p3"]);
    let not_a = pods
        .list(&ListParams::default().fields("spec.nodeName!=node-a"))
        .await
        .unwrap();
    assert_eq!(names(not_a), ["p4", "p5"]);
    let one = pods
        .list(&ListParams::default().fields("metadata.name=p5"))
        .await
        .unwrap();
    assert_eq!(names(one), ["p5"]);
    let db = pods
        .list(&ListParams::default().labels("tier=db,app"))
        .await
        .unwrap();
    assert_eq!(names(db), ["p2", "p4"]);
    let not_db = pods
        .list(&ListParams::default().labels("!tier"))
        .await
        .unwrap();
    assert_eq!(names(not_db), ["p1", "p3", "p5"]);
    // Pagination: limit + continue.
    let first = pods.list(&ListParams::default().limit(2)).await.unwrap();
    let token = first.metadata.continue_.clone().expect("a continue token");
    let rest = pods
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(
        [names(first), names(rest)].concat(),
        ["p1", "p2", "p3", "p4", "p5"]
    );
    // Metadata only.
    let ns: kube::Api<PartialObjectMeta<Namespace>> = kube::Api::all(client.clone());
    let meta = ns.list(&ListParams::default()).await.unwrap();
    assert_eq!(meta.items[0].metadata.labels.as_ref().unwrap()["team"], "x");
    assert_eq!(api.metadata_only_requests(Kind::Namespace), 1);
    // Errors are Status objects with the right code.
    let e = pods
        .list(&ListParams::default().labels("tier in (db)"))
        .await
        .unwrap_err();
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 400), "{e}");
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.apply(Kind::Pod, pod("p6", "u6", "node-b", ip(68, 6)));
    api.compact();
    let stale = ListParams::default().at(&rv).matching(VersionMatch::Exact);
    let e = pods.list(&stale).await.unwrap_err();
    assert!(
        matches!(&e, kube::Error::Api(s) if s.code == 410 && s.reason == "Expired"),
        "{e}"
    );
}

/// Watch streams, driven by kube's client directly: ADDED / MODIFIED /
/// DELETED (also when a change moves an object out of the selector), and
/// the stream ends after `timeoutSeconds`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_double_speaks_the_watch_protocol() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{WatchEvent, WatchParams};
    let api = FakeApiServer::start().await;
    api.apply(Kind::Pod, pod("a", "ua", "node-a", ip(75, 2)));
    let client = kube::Client::try_from(kube::Config::new(api.url().parse().unwrap())).unwrap();
    let pods: kube::Api<Pod> = kube::Api::all(client);
    let rv = pods
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let params = WatchParams::default().labels("app").timeout(1);
    let mut events = pods.watch(&params, &rv).await.unwrap().boxed();
    api.apply(Kind::Pod, pod("b", "ub", "node-a", ip(75, 3)));
    api.modify(Kind::Pod, "demo", "b", |p| {
        p["metadata"]["annotations"] = json!({"x": "1"});
    });
    api.modify(Kind::Pod, "demo", "a", |p| {
        p["metadata"]["labels"] = json!({});
    });
    api.delete(Kind::Pod, "demo", "b");
    let mut seen = Vec::new();
    // Ends by itself after timeoutSeconds=1.
    while let Some(e) = tokio::time::timeout(WAIT, events.next()).await.unwrap() {
        seen.push(match e.unwrap() {
            WatchEvent::Added(p) => format!("ADDED {}", p.metadata.name.unwrap()),
            WatchEvent::Modified(p) => format!("MODIFIED {}", p.metadata.name.unwrap()),
            WatchEvent::Deleted(p) => format!("DELETED {}", p.metadata.name.unwrap()),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(s) => panic!("{s:?}"),
        });
    }
    assert_eq!(seen, ["ADDED b", "MODIFIED b", "DELETED a", "DELETED b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_first_full_sync() {
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(Kind::Namespace, namespace("demo", json!({})));
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
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(Kind::Namespace, namespace("demo", json!({})));
    api.apply(Kind::Pod, pod("a", "uid-a", "node-a", ip(71, 2)));
    api.start_pod_deletion("demo", "a", Duration::from_secs(90));
    let app = start(&api, dir.path(), "").await;
    until_ready(&app).await;
    eventually("drain of the terminating pod", WAIT, || {
        phase_of(&app, "uid-a").as_deref() == Some("shutting-down")
    })
    .await;
    app.shutdown().await;
}

/// Bookmarks keep a quiet watch's resourceVersion current: after one, a
/// compaction and a dropped connection resume without 410 and without a
/// relist; without one, the stale resume gets 410 and relists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookmarks_spare_quiet_watches_a_relist() {
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(Kind::Namespace, namespace("demo", json!({})));
    api.apply(Kind::Pod, pod("a", "uid-a", "node-a", ip(72, 2)));
    let app = start(&api, dir.path(), "").await;
    until_ready(&app).await;
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
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(Kind::Namespace, namespace("demo", json!({})));
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
