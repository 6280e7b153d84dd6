//! Kubernetes discovery, istiod and the CA against the wire-level API server
//! double (`tidegate_e2e::kube_api`), one module per feature: pods and
//! peers (`pods`), Services (`services`), the watches (`watches`), mesh
//! membership, cluster ranges and authorization from Kubernetes, istiod's
//! xDS (`xds_client`, `istio_source`, `waypoints`), what istioctl and the
//! dashboards read of a gateway fed by it (`istioctl_dump`), the CA (`ca`,
//! `ca_client`, `ca_server`) and the double itself (`api_double`). This
//! file holds the rigs they share.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use tidegate::app::App;
use tidegate::config::Config;
use tidegate::drains::{DrainView, Trigger};
use tidegate::workloads::LifecycleState;
use tidegate_e2e::kube_api::{FakeApiServer, Kind};
use tidegate_e2e::{eventually, http_get, init_tracing, ip, metric, metric_or_zero, plugin};

mod api_double;
mod authorization;
mod ca;
mod ca_client;
mod ca_server;
mod cluster_ranges;
mod istio_source;
mod istioctl_dump;
mod membership;
mod pods;
mod services;
mod watches;
mod waypoints;
mod xds_client;

const WAIT: Duration = Duration::from_secs(10);

/// The first lines of a test gateway's config: its node, the trust domain,
/// every listener on port 0, and a development CA under `dir`.
fn config_head(dir: &std::path::Path, node: &str) -> String {
    format!(
        r#"node_name: {node}
trust_domain: cluster.local
listeners:
  outbound: 127.0.0.1:0
  inbound: 0.0.0.0:0
  admin: 127.0.0.1:0
  metrics: 127.0.0.1:0
  readiness: 127.0.0.1:0
certificates: {{source: dev-ca, state_dir: {ca}}}
"#,
        ca = dir.join("ca").display(),
    )
}

/// A gateway on `node` discovering from `api_server`, with two policies:
/// `keep` (the default) and `evict` (evict-on-delete, also on terminating peers).
fn config(dir: &std::path::Path, node: &str, api_server: &str, extra: &str) -> Config {
    let yaml = format!(
        r#"{head}workloads:
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
        head = config_head(dir, node),
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

/// An API server double holding the namespace `demo` with `labels`, and
/// a directory for a gateway's state.
async fn demo_cluster(labels: Value) -> (FakeApiServer, tempfile::TempDir) {
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.apply(Kind::Namespace, namespace("demo", labels));
    (api, dir)
}

/// The node-a gateway discovering from `api` ([`start`]), once ready.
async fn discovering(api: &FakeApiServer, dir: &std::path::Path, extra: &str) -> App {
    let app = start(api, dir, extra).await;
    until_ready(&app).await;
    app
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

/// A gateway built from `config`, once it reports ready.
async fn ready_gateway(config: Config) -> App {
    let app = tidegate::app::build(config).await.unwrap();
    until_ready(&app).await;
    app
}

/// The config lines that send a gateway's tunnels to `server`'s HBONE port.
fn hbone_to(server: &App) -> String {
    hbone_port(server.addrs.inbound.expect("node listeners").port())
}

/// The config lines that send a gateway's tunnels to HBONE port `port`.
fn hbone_port(port: u16) -> String {
    format!("hbone:\n  port: {port}\n")
}

/// A serving gateway (node-b) and a client gateway (node-a) that tunnels
/// to it, with the client's traffic to one destination captured.
struct TwoNodes {
    server: App,
    client: App,
    capture: tidegate_e2e::Capture,
}

/// Starts node-b, then node-a pointed at node-b's HBONE port, each from
/// `config(node, extra)` and each awaited ready; captures node-a's
/// outbound traffic to `target`.
async fn two_nodes(
    config: impl Fn(&str, &str) -> Config,
    target: std::net::SocketAddr,
) -> TwoNodes {
    init_tracing();
    let server = ready_gateway(config("node-b", "")).await;
    let client = ready_gateway(config("node-a", &hbone_to(&server))).await;
    let capture = tidegate_e2e::Capture::start(client.outbound.clone(), target).await;
    TwoNodes {
        server,
        client,
        capture,
    }
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
    let client = ready_gateway(config(dir.path(), "node-a", &api.url(), &hbone_to(&server))).await;
    let capture = Capture::start(client.outbound.clone(), echo).await;
    Peers {
        dir,
        server,
        client,
        capture,
        echo,
    }
}
