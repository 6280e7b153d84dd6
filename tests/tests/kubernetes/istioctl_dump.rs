//! What `istioctl ztunnel-config` and Istio's dashboards read, from a
//! gateway fed by "istiod": `/config_dump` decodes into the structs
//! istioctl decodes ztunnel's dump into (istio/istio
//! `istioctl/pkg/writer/ztunnel/configdump/api.go`: the same JSON names
//! and types; a field without `omitempty` there is required here, unknown
//! fields are ignored as Go ignores them) and the fields ztunnel writes
//! beside them (`networkMode`, a workload's `services`, a Service's
//! `canonical` and `visibility`, typed as ztunnel writes them), and
//! `/stats/prometheus` carries every series and label the dashboards
//! query.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use prost::Message as _;
use serde::Deserialize;
use tidegate_authz::xds::{XdsAddress, XdsMatch};
use tidegate_e2e::xds_double::{principal, XdsDouble};
use tidegate_e2e::{echo_server, eventually, http_get, init_tracing, ip, round_trip};
use tidegate_xds::client::{ADDRESS, AUTHORIZATION};
use tidegate_xds::workload::{address, service::Visibility, Address, IpFamilies, WorkloadType};

use super::istio_source::{
    config, encode_workload, gateway_at, serves, service_resource, uid, workload,
};
use super::{two_nodes, TwoNodes, WAIT};

/// Go's `string` without `omitempty`: present, `null` read as empty.
fn go_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Option::<String>::deserialize(d).map(Option::unwrap_or_default)
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct ZtunnelDump {
    workloads: Vec<ZtunnelWorkload>,
    services: Vec<ZtunnelService>,
    policies: Vec<ZtunnelPolicy>,
    certificates: Vec<CertsDump>,
    #[serde(rename = "workloadState")]
    workload_state: BTreeMap<String, WorkloadState>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
struct ZtunnelWorkload {
    uid: String,
    workload_ips: Vec<String>,
    #[serde(default)]
    waypoint: Option<GoGatewayAddress>,
    #[serde(default)]
    network_gateway: Option<GoGatewayAddress>,
    protocol: String,
    name: String,
    namespace: String,
    service_account: String,
    workload_name: String,
    workload_type: String,
    canonical_name: String,
    canonical_revision: String,
    cluster_id: String,
    #[serde(default)]
    trust_domain: Option<String>,
    #[serde(default)]
    locality: Option<Locality>,
    node: String,
    #[serde(default)]
    network: Option<String>,
    status: String,
    hostname: String,
    capacity: u32,
    #[serde(default)]
    application_tunnel: Option<ApplicationTunnel>,
    #[serde(default)]
    authorization_policies: Option<Vec<String>>,
    // ztunnel's, beyond istioctl's struct.
    network_mode: String,
    /// `namespace/hostname` of each Service; absent when none.
    #[serde(default)]
    services: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct Locality {
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    zone: Option<String>,
    #[serde(default)]
    subzone: Option<String>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct ApplicationTunnel {
    protocol: String,
    #[serde(default)]
    port: Option<u16>,
}

#[derive(Debug, Deserialize)]
struct GoGatewayAddress {
    destination: String,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
struct LoadBalancer {
    mode: String,
    routing_preferences: Vec<String>,
    health_policy: String,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
struct ZtunnelEndpoint {
    workload_uid: String,
    service: String,
    #[serde(default)]
    address: Option<String>,
    port: BTreeMap<u16, u16>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
struct ZtunnelService {
    name: String,
    namespace: String,
    hostname: String,
    vips: Vec<String>,
    ports: BTreeMap<String, i64>,
    #[serde(default)]
    load_balancer: Option<LoadBalancer>,
    #[serde(default)]
    waypoint: Option<GoGatewayAddress>,
    endpoints: BTreeMap<String, ZtunnelEndpoint>,
    #[serde(default)]
    subject_alt_names: Option<Vec<String>>,
    /// Absent when istiod sent none (AUTOMATIC), as ztunnel writes it.
    #[serde(default)]
    ip_families: Option<String>,
    // ztunnel's, beyond istioctl's struct.
    canonical: bool,
    visibility: String,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
struct PolicyMatch {
    #[serde(default)]
    namespaces: Option<Vec<GoStringMatch>>,
    #[serde(default)]
    not_namespaces: Option<Vec<GoStringMatch>>,
    #[serde(default)]
    principals: Option<Vec<GoStringMatch>>,
    #[serde(default)]
    not_principals: Option<Vec<GoStringMatch>>,
    #[serde(default)]
    source_ips: Option<Vec<String>>,
    #[serde(default)]
    not_source_ips: Option<Vec<String>>,
    #[serde(default)]
    destination_ips: Option<Vec<String>>,
    #[serde(default)]
    not_destination_ips: Option<Vec<String>>,
    #[serde(default)]
    destination_ports: Option<Vec<u16>>,
    #[serde(default)]
    not_destination_ports: Option<Vec<u16>>,
    #[serde(default)]
    service_accounts: Option<Vec<ServiceAccountMatch>>,
    #[serde(default)]
    not_service_accounts: Option<Vec<ServiceAccountMatch>>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct GoStringMatch {
    #[serde(rename = "Exact", default)]
    exact: Option<String>,
    #[serde(rename = "Suffix", default)]
    suffix: Option<String>,
    #[serde(rename = "Prefix", default)]
    prefix: Option<String>,
    #[serde(rename = "Presence", default)]
    presence: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
struct ServiceAccountMatch {
    namespace: String,
    service_account: String,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct ZtunnelPolicy {
    name: String,
    namespace: String,
    scope: String,
    action: String,
    rules: Vec<Vec<Vec<PolicyMatch>>>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct CertsDump {
    identity: String,
    state: String,
    #[serde(rename = "certChain")]
    cert_chain: Vec<Cert>,
    #[serde(rename = "rootCerts")]
    root_certs: Vec<Cert>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
struct Cert {
    pem: String,
    serial_number: String,
    valid_from: String,
    expiration_time: String,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct WorkloadState {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    connections: Option<WorkloadConnections>,
    info: WorkloadInfo,
}

#[derive(Debug, Deserialize)]
struct WorkloadConnections {
    inbound: Vec<Connection>,
    outbound: Vec<Connection>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
struct WorkloadInfo {
    name: String,
    namespace: String,
    trust_domain: String,
    service_account: String,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
struct Connection {
    #[serde(deserialize_with = "go_string")]
    src: String,
    #[serde(deserialize_with = "go_string")]
    original_dst: String,
    #[serde(deserialize_with = "go_string")]
    actual_dst: String,
    protocol: String,
}

/// Every series and label Istio's ztunnel and mesh dashboards
/// (istio/istio `manifests/addons/dashboards/lib/queries.libsonnet`) and
/// Kiali's graph query of a node proxy's TCP traffic. `pod` is the
/// scrape's label, not the exporter's. Not exported, and said so in
/// docs/observability.md: `istio_build` and `istio_dns_requests_total`.
/// `workload_manager_*_proxy_count` exist in in-pod mode only
/// (netns/inpod.rs checks them).
const DASHBOARD_SERIES: &[(&str, &[&str])] = &[
    ("istio_tcp_connections_opened_total", TCP_LABELS),
    ("istio_tcp_connections_closed_total", TCP_LABELS),
    ("istio_tcp_sent_bytes_total", TCP_LABELS),
    ("istio_tcp_received_bytes_total", TCP_LABELS),
    ("istio_xds_connection_terminations_total", &["reason"]),
    ("istio_xds_message_total", &["url"]),
];

/// The labels of `istio_tcp_*` the dashboards and Kiali group or filter by.
const TCP_LABELS: &[&str] = &[
    "reporter",
    "source_workload",
    "source_workload_namespace",
    "source_canonical_service",
    "source_canonical_revision",
    "source_principal",
    "source_app",
    "source_version",
    "source_cluster",
    "destination_service",
    "destination_service_name",
    "destination_service_namespace",
    "destination_workload",
    "destination_workload_namespace",
    "destination_canonical_service",
    "destination_canonical_revision",
    "destination_principal",
    "destination_app",
    "destination_version",
    "destination_cluster",
    "request_protocol",
    "response_flags",
    "connection_security_policy",
];

/// A policy of `namespace demo` with one match; `scope` and `action` as
/// istiod numbers them.
fn authorization(name: &str, scope: i32, action: i32, m: XdsMatch, dry_run: bool) -> bytes::Bytes {
    tidegate_e2e::xds_double::authorization("demo", name, scope, action, m, dry_run)
}

async fn dump(app: &tidegate::app::App) -> (ZtunnelDump, serde_json::Value) {
    let (status, body) = http_get(app.addrs.admin, "/config_dump").await;
    assert_eq!(status, 200, "{body}");
    let typed: ZtunnelDump = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("istioctl's structs refuse the dump: {e}\n{body}"));
    (typed, serde_json::from_str(&body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istioctl_reads_the_dump_and_the_dashboards_find_their_series() {
    init_tracing();
    let octet = 163;
    let vip: IpAddr = format!("10.96.{octet}.1").parse().unwrap();
    let web_vip: IpAddr = format!("10.96.{octet}.2").parse().unwrap();
    let echo = echo_server(ip(octet, 2)).await;
    let double = XdsDouble::start().await;
    let dir = tempfile::tempdir().unwrap();

    let echo_host = "demo/echo.demo.svc.cluster.local".to_string();
    let mut echo_w = workload("echo", "node-b", ip(octet, 2), serves("echo", echo.port()));
    echo_w.capacity = Some(3);
    let mut web_w = workload("web", "node-b", ip(octet, 4), serves("web", 8080));
    web_w.authorization_policies = vec!["demo/broken".into()];
    web_w.workload_type = WorkloadType::Pod as i32;
    for (name, w) in [
        (
            "client",
            workload("client", "node-a", ip(octet, 3), BTreeMap::new()),
        ),
        ("echo", echo_w),
        ("web", web_w),
    ] {
        double.set_quietly(ADDRESS, &uid(name), encode_workload(w));
    }
    let canary = "spiffe://cluster.local/ns/demo/sa/echo-canary";
    double.set_quietly(
        ADDRESS,
        &echo_host,
        service_resource("echo", vip, echo.port(), &[canary], None),
    );
    let wp = Some(gateway_at(ip(octet, 5), 15008, ""));
    // web's Service restricted as istiod can: IPv4 only, its namespace
    // only, canonical.
    let mut web_svc =
        Address::decode(service_resource("web", web_vip, 8080, &[canary], wp)).unwrap();
    if let Some(address::Type::Service(s)) = &mut web_svc.r#type {
        s.ip_families = IpFamilies::Ipv4Only as i32;
        s.visibility = Visibility::Namespace as i32;
        s.canonical = true;
    }
    double.set_quietly(
        ADDRESS,
        "demo/web.demo.svc.cluster.local",
        bytes::Bytes::from(web_svc.encode_to_vec()),
    );
    // Applied: a DENY of an identity nobody has; dry-run: an ALLOW;
    // refused (a five-byte address) and held closed: an ALLOW only web
    // names (it allows nothing to web; the traffic here goes to echo).
    let nobody = principal("cluster.local/ns/demo/sa/nobody");
    double.set_quietly(
        AUTHORIZATION,
        "demo/deny-nobody",
        authorization("deny-nobody", 1, 1, nobody, false),
    );
    let client_only = principal("cluster.local/ns/demo/sa/client");
    double.set_quietly(
        AUTHORIZATION,
        "demo/trial",
        authorization("trial", 1, 0, client_only, true),
    );
    let bad = XdsMatch {
        source_ips: vec![XdsAddress {
            address: vec![1, 2, 3, 4, 5].into(),
            length: 32,
        }],
        ..Default::default()
    };
    double.set_quietly(
        AUTHORIZATION,
        "demo/broken",
        authorization("broken", 2, 0, bad, false),
    );

    let TwoNodes {
        server,
        client,
        capture,
    } = two_nodes(
        |node, extra| config(dir.path(), node, &double, extra),
        SocketAddr::new(vip, 80),
    )
    .await;
    // A connection held open while the dumps are read.
    let mut conn = capture.connect(ip(octet, 3)).await;
    assert_eq!(round_trip(&mut conn, b"ping").await.unwrap(), b"ping");

    let (zc, raw) = dump(&client).await;

    // Workloads: ztunnel's fields beside tidegate's own.
    let by_uid = |uid: &str| zc.workloads.iter().find(|w| w.uid == uid).unwrap();
    let echo_z = by_uid(&uid("echo"));
    assert_eq!(echo_z.workload_ips, [ip(octet, 2).to_string()]);
    assert_eq!(
        (echo_z.protocol.as_str(), echo_z.status.as_str()),
        ("HBONE", "Healthy")
    );
    assert_eq!(echo_z.service_account, "echo");
    assert_eq!(echo_z.capacity, 3, "istiod's capacity");
    assert_eq!(echo_z.cluster_id, "Kubernetes");
    assert_eq!(echo_z.trust_domain.as_deref(), Some("cluster.local"));
    let web_z = by_uid(&uid("web"));
    assert_eq!(
        web_z.authorization_policies.as_deref(),
        Some(&["demo/broken".to_string()][..])
    );
    assert_eq!(by_uid(&uid("client")).capacity, 1, "in no Service: 1");
    // istiod's kind, network mode and Services, as ztunnel writes them.
    assert_eq!(echo_z.workload_type, "deployment", "istiod's default");
    assert_eq!(web_z.workload_type, "pod");
    assert_eq!(echo_z.network_mode, "Standard");
    assert_eq!(
        echo_z.services.as_deref(),
        Some(&[echo_host.clone()][..]),
        "namespace/hostname"
    );
    assert_eq!(by_uid(&uid("client")).services, None, "none: absent");
    let echo_raw = raw["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "echo")
        .unwrap();
    assert_eq!(
        echo_raw["service_account"], "echo",
        "tidegate's own fields stay"
    );
    assert_eq!(echo_raw["service_keys"], serde_json::json!(["demo/echo"]));

    // Services: waypoint, hostname, SANs, endpoints with their ports.
    let web = zc.services.iter().find(|s| s.name == "web").unwrap();
    assert_eq!(web.hostname, "web.demo.svc.cluster.local");
    assert_eq!(web.vips, [format!("/{web_vip}")]);
    assert_eq!(
        web.waypoint.as_ref().unwrap().destination,
        format!("/{}", ip(octet, 5))
    );
    assert_eq!(
        web.subject_alt_names.as_deref(),
        Some(&[canary.to_string()][..])
    );
    assert_eq!(web.ports, BTreeMap::from([("80".to_string(), 8080)]));
    assert_eq!(web.ip_families.as_deref(), Some("IPv4"));
    assert_eq!(
        (web.canonical, web.visibility.as_str()),
        (true, "Namespace")
    );
    let echo_svc = zc.services.iter().find(|s| s.name == "echo").unwrap();
    let ep = &echo_svc.endpoints[&uid("echo")];
    assert_eq!(ep.port, BTreeMap::from([(80, echo.port())]));
    assert_eq!(ep.service, echo_host);
    assert!(echo_svc.waypoint.is_none());
    assert_eq!(echo_svc.ip_families, None, "AUTOMATIC: not written");
    assert_eq!(
        (echo_svc.canonical, echo_svc.visibility.as_str()),
        (false, "Public")
    );
    let echo_svc_raw = raw["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "echo")
        .unwrap();
    assert_eq!(echo_svc_raw["endpoints"][uid("echo")]["capacity"], 3);
    assert_eq!(
        echo_svc_raw["endpoint_choice"][0]["skipped"],
        serde_json::Value::Null
    );

    // Policies: as istiod sent them, and how each is held.
    let policy = |name: &str| {
        let p = zc
            .policies
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("{name}: {raw}"));
        let held = raw["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap();
        (p, held.clone())
    };
    let (deny, held) = policy("deny-nobody");
    assert_eq!(
        (deny.scope.as_str(), deny.action.as_str()),
        ("Namespace", "Deny")
    );
    let principals = deny.rules[0][0][0].principals.as_ref().unwrap();
    assert_eq!(
        principals[0].exact.as_deref(),
        Some("cluster.local/ns/demo/sa/nobody")
    );
    assert_eq!(held["held"], "applied");
    assert_eq!(policy("trial").1["held"], "dry-run");
    assert_eq!(policy("trial").1["dryRun"], true);
    let (broken, held) = policy("broken");
    assert_eq!(
        (broken.scope.as_str(), broken.action.as_str()),
        ("WorkloadSelector", "Allow")
    );
    assert!(broken.rules.is_empty(), "held closed: an ALLOW of nothing");
    assert_eq!(held["held"], "closed");
    assert!(
        held["refused"].as_str().unwrap().contains("source_ips"),
        "{held}"
    );

    // Certificates: the local identity, its chain and the roots.
    let cert = zc
        .certificates
        .iter()
        .find(|c| c.identity.ends_with("/sa/client"))
        .unwrap();
    assert_eq!(cert.state, "Available");
    assert!(!cert.cert_chain[0].serial_number.is_empty());
    assert!(cert.cert_chain[0].expiration_time.ends_with('Z'));
    assert!(!cert.root_certs.is_empty());

    // Connections, one entry each as ztunnel lists them: the client's
    // out (to the VIP, gone to echo's endpoint), the echo's in.
    let echo_at = SocketAddr::new(ip(octet, 2), echo.port()).to_string();
    let client_state = &zc.workload_state[&uid("client")];
    assert_eq!(client_state.info.service_account, "client");
    let out = &client_state.connections.as_ref().unwrap().outbound;
    assert_eq!(out.len(), 1, "{raw}");
    let c = &out[0];
    assert_eq!(c.src, conn.local_addr().unwrap().to_string());
    assert_eq!(c.original_dst, SocketAddr::new(vip, 80).to_string());
    assert_eq!(
        (c.actual_dst.as_str(), c.protocol.as_str()),
        (&*echo_at, "HBONE")
    );
    assert_eq!(
        raw["workloadState"][uid("client")]["tunnels"]["outbound"][0]["streams"],
        1,
        "tidegate's own: the tunnel carrying it"
    );
    let (zs, _) = dump(&server).await;
    let echo_state = &zs.workload_state[&uid("echo")];
    let inbound = &echo_state.connections.as_ref().unwrap().inbound;
    assert_eq!(inbound.len(), 1, "{:?}", zs.workload_state);
    let c = &inbound[0];
    assert_eq!(
        (c.actual_dst.as_str(), c.protocol.as_str()),
        (&*echo_at, "HBONE")
    );
    assert_eq!(c.original_dst, "", "null: no waypoint asked for a Service");
    assert!(c.src.parse::<SocketAddr>().is_ok(), "the peer: {}", c.src);
    assert!(
        !zs.workload_state.contains_key(&uid("client")),
        "another node's"
    );
    // A second connection: a second entry; both closed: none.
    let mut conn2 = capture.connect(ip(octet, 3)).await;
    assert_eq!(round_trip(&mut conn2, b"ping").await.unwrap(), b"ping");
    let outbound_of = |d: &ZtunnelDump| {
        d.workload_state[&uid("client")]
            .connections
            .as_ref()
            .map_or(0, |c| c.outbound.len())
    };
    assert_eq!(outbound_of(&dump(&client).await.0), 2);
    drop(conn2);

    // Dashboards: every series and label they query, at ztunnel's path,
    // once the connection has closed and istiod's stream has been cut.
    drop(conn);
    for (app, uid) in [(&client, uid("client")), (&server, uid("echo"))] {
        let gone = tidegate_e2e::poll_within(WAIT, || {
            let uid = uid.clone();
            async move {
                let c = dump(app).await.0.workload_state.remove(&uid)?.connections?;
                (c.inbound.is_empty() && c.outbound.is_empty()).then_some(())
            }
        })
        .await;
        assert!(
            gone.is_some(),
            "closed connections still listed: {}",
            dump(app).await.1["workloadState"]
        );
    }
    double.cut();
    for app in [&client, &server] {
        eventually("a close and a stream's end counted", WAIT, || {
            let text = app.metrics_text();
            text.contains("istio_tcp_connections_closed_total{")
                && text.contains("istio_xds_connection_terminations_total{")
        })
        .await;
        let (status, text) = http_get(app.addrs.metrics, "/stats/prometheus").await;
        assert_eq!(status, 200, "{text}");
        for (series, labels) in DASHBOARD_SERIES {
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("{series}{{")))
                .collect();
            assert!(!lines.is_empty(), "{series} not exported:\n{text}");
            for label in *labels {
                assert!(
                    lines.iter().all(|l| l.contains(&format!("{label}=\""))),
                    "{series} without label {label}:\n{lines:?}"
                );
            }
        }
    }
    client.shutdown().await;
    server.shutdown().await;
}
