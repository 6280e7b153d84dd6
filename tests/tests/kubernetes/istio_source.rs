//! `workloads.source: istio` against the xDS server double: two gateways
//! take their workloads, a Service and authorization policies from the
//! same "istiod"; a Service VIP routes, a DENY from xDS refuses, a bad
//! resource is NACKed while the rest serves, an unhealthy workload drains
//! and a removed one is deleted, and an istiod restart (the stream cut)
//! loses no traffic and duplicates no drain.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use prost::Message as _;
use tidegate::app::App;
use tidegate::config::Config;
use tidegate_e2e::xds_double::{authorization, principal, XdsDouble};
use tidegate_e2e::{
    echo_server, eventually, init_tracing, ip, metric_or_zero, metric_sum, round_trip, Capture,
};
use tidegate_xds::client::{ADDRESS, AUTHORIZATION};
use tidegate_xds::workload::{
    address, gateway_address, Address, GatewayAddress, NetworkAddress, Port, PortList, Service,
    TunnelProtocol, Workload, WorkloadStatus,
};

use super::{config_head, drain_of, phase_of, two_nodes, TwoNodes, WAIT};

const HOST: &str = "echo.demo.svc.cluster.local";

pub(super) fn ip_bytes(ip: IpAddr) -> bytes::Bytes {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec().into(),
        IpAddr::V6(v6) => v6.octets().to_vec().into(),
    }
}

pub(super) fn uid(name: &str) -> String {
    format!("Kubernetes//Pod/demo/{name}")
}

pub(super) fn workload(
    name: &str,
    node: &str,
    addr: IpAddr,
    services: BTreeMap<String, PortList>,
) -> Workload {
    Workload {
        uid: uid(name),
        name: name.into(),
        namespace: "demo".into(),
        addresses: vec![ip_bytes(addr)],
        tunnel_protocol: TunnelProtocol::Hbone as i32,
        service_account: name.into(),
        node: node.into(),
        cluster_id: "Kubernetes".into(),
        services,
        ..Default::default()
    }
}

pub(super) fn encode_workload(w: Workload) -> bytes::Bytes {
    Address {
        r#type: Some(address::Type::Workload(w)),
    }
    .encode_to_vec()
    .into()
}

/// The `services` entry of a workload behind Service `name` (in `demo`):
/// port 80 to `target`.
pub(super) fn serves(name: &str, target: u16) -> BTreeMap<String, PortList> {
    [(
        format!("demo/{name}.demo.svc.cluster.local"),
        PortList {
            ports: vec![Port {
                service_port: 80,
                target_port: u32::from(target),
                app_protocol: 0,
            }],
        },
    )]
    .into()
}

/// Service `name` of `demo` at `vip`, port 80 to `target` (0: each
/// endpoint's own mapping), with these `subject_alt_names` and waypoint.
pub(super) fn service_resource(
    name: &str,
    vip: IpAddr,
    target: u16,
    sans: &[&str],
    waypoint: Option<GatewayAddress>,
) -> bytes::Bytes {
    Address {
        r#type: Some(address::Type::Service(Service {
            name: name.into(),
            namespace: "demo".into(),
            hostname: format!("{name}.demo.svc.cluster.local"),
            addresses: vec![NetworkAddress {
                network: String::new(),
                address: ip_bytes(vip),
                length: None,
            }],
            ports: vec![Port {
                service_port: 80,
                target_port: u32::from(target),
                app_protocol: 0,
            }],
            subject_alt_names: sans.iter().map(ToString::to_string).collect(),
            waypoint,
            ..Default::default()
        })),
    }
    .encode_to_vec()
    .into()
}

/// A waypoint (or network gateway) at `ip` with HBONE on `port`, in
/// `network` ("" is the local one).
pub(super) fn gateway_at(ip: IpAddr, port: u32, network: &str) -> GatewayAddress {
    GatewayAddress {
        destination: Some(gateway_address::Destination::Address(NetworkAddress {
            network: network.into(),
            address: ip_bytes(ip),
            length: None,
        })),
        hbone_mtls_port: port,
    }
}

/// A namespace-wide DENY of the client's identity.
fn deny_client() -> bytes::Bytes {
    let client = principal("cluster.local/ns/demo/sa/client");
    authorization("demo", "deny-client", 1, 1, client, false)
}

pub(super) fn config(dir: &std::path::Path, node: &str, double: &XdsDouble, extra: &str) -> Config {
    let roots = dir.join("xds-root.pem");
    std::fs::write(&roots, &double.root_pem).unwrap();
    let token = dir.join("istio-token");
    std::fs::write(&token, "tok").unwrap();
    let yaml = format!(
        r#"{head}workloads:
  source: istio
  istio:
    address: https://{addr}
    roots: {roots}
    token: {token}
    pod_ip: 10.0.0.1
    pod_name: tidegate-{node}
drains:
  default_grace: 30s
{extra}
"#,
        head = config_head(dir, node),
        addr = double.addr,
        roots = roots.display(),
        token = token.display(),
    );
    Config::from_yaml(&yaml).unwrap_or_else(|e| panic!("test config: {e}\n{yaml}"))
}

struct Node {
    server: App,
    client: App,
    capture: Capture,
    _dir: tempfile::TempDir,
}

/// node-b serves the echo workload; node-a captures the client's traffic
/// to the Service VIP. Both learn everything from `double`.
async fn nodes(double: &XdsDouble, octet: u8, vip: IpAddr, echo: SocketAddr) -> Node {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let ports = serves("echo", echo.port());
    double.set_quietly(
        ADDRESS,
        &uid("client"),
        encode_workload(workload("client", "node-a", ip(octet, 3), BTreeMap::new())),
    );
    double.set_quietly(
        ADDRESS,
        &uid("echo"),
        encode_workload(workload("echo", "node-b", ip(octet, 2), ports)),
    );
    double.set_quietly(
        ADDRESS,
        &format!("demo/{HOST}"),
        service_resource("echo", vip, 0, &[], None),
    );
    let TwoNodes {
        server,
        client,
        capture,
    } = two_nodes(
        |node, extra| config(dir.path(), node, double, extra),
        SocketAddr::new(vip, 80),
    )
    .await;
    Node {
        server,
        client,
        capture,
        _dir: dir,
    }
}

async fn answers(n: &Node, octet: u8) -> bool {
    answered(&n.capture, octet).await
}

/// A round trip through `capture` from the client (.3); a refusal — even
/// one that resets the connection before its connect completes — is no.
async fn answered(capture: &Capture, octet: u8) -> bool {
    let Ok(mut conn) = capture.try_connect(ip(octet, 3)).await else {
        return false;
    };
    matches!(round_trip(&mut conn, b"ping").await, Ok(b) if b == b"ping")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiods_workloads_services_and_policies_route_refuse_and_survive_a_restart() {
    let octet = 136;
    let vip: IpAddr = format!("10.96.{octet}.1").parse().unwrap();
    let echo = echo_server(ip(octet, 2)).await;
    let double = XdsDouble::start().await;
    let n = nodes(&double, octet, vip, echo).await;

    // The VIP routes to the endpoint istiod names, at its own target port.
    for _ in 0..5 {
        assert!(answers(&n, octet).await, "routed through the Service");
    }
    let snap = n.client.workloads.snapshot();
    let svc = snap.service_by_vip(vip, 80).expect("the Service's VIP");
    assert_eq!(svc.endpoints[&80].len(), 1);
    assert_eq!(svc.endpoints[&80][0].target_port, echo.port());
    drop(snap);

    // A bad resource is refused by name; the good one beside it applies.
    let mut broken = workload("broken", "node-b", ip(octet, 9), BTreeMap::new());
    broken.addresses = vec![vec![1, 2, 3, 4, 5].into()];
    let nonce = double
        .set_all(
            ADDRESS,
            [
                (uid("broken"), encode_workload(broken)),
                (
                    uid("other"),
                    encode_workload(workload("other", "node-b", ip(octet, 8), BTreeMap::new())),
                ),
            ],
        )
        .expect("subscribed");
    let r = tokio::time::timeout(WAIT, double.reply(&nonce))
        .await
        .unwrap();
    let nack = r.nack.expect("a NACK");
    assert!(nack.starts_with(&format!("{}: ", uid("broken"))), "{nack}");
    assert!(!nack.contains("other"), "{nack}");
    eventually("the good workload applied", WAIT, || {
        n.client
            .workloads
            .snapshot()
            .by_uid(&uid("other"))
            .is_some()
    })
    .await;
    assert!(answers(&n, octet).await, "the rest still serves");

    // istiod's DENY of the client's identity refuses new connections.
    let nonce = double
        .set(AUTHORIZATION, "demo/deny-client", deny_client())
        .unwrap();
    assert_eq!(
        tokio::time::timeout(WAIT, double.reply(&nonce))
            .await
            .unwrap()
            .nack,
        None
    );
    eventually("the DENY enforced at the destination", WAIT, || {
        n.server.workloads.snapshot().policies.len() == 1
    })
    .await;
    assert!(!answers(&n, octet).await, "denied by istiod's policy");
    assert!(
        metric_sum(
            &n.server.metrics_text(),
            "tidegate_authorization_denied_total"
        ) >= 1.0,
        "counted"
    );
    double.remove(AUTHORIZATION, "demo/deny-client");
    eventually("the DENY removed", WAIT, || {
        n.server.workloads.snapshot().policies.is_empty()
    })
    .await;
    assert!(answers(&n, octet).await, "allowed again");

    // The echo pod becomes unhealthy (istiod: not ready or being deleted):
    // its own gateway drains it, once.
    let echo_uid = uid("echo");
    let mut unhealthy = workload("echo", "node-b", ip(octet, 2), BTreeMap::new());
    unhealthy.status = WorkloadStatus::Unhealthy as i32;
    double.set(ADDRESS, &echo_uid, encode_workload(unhealthy));
    eventually("the echo pod draining", WAIT, || {
        drain_of(&n.server, &echo_uid).is_some()
    })
    .await;
    let drains_before = n.server.drains.list().len();

    // istiod restarts: the stream is cut, the gateways reconnect with what
    // they hold, nothing is cleared, no drain is raised twice.
    let streams = double.opened().len();
    double.cut();
    tokio::time::timeout(WAIT, double.opened_at_least(streams + 2))
        .await
        .unwrap();
    for i in [streams, streams + 1] {
        // Answered: its subscription, with what it holds, has arrived.
        let nonce = tokio::time::timeout(WAIT, double.answered(i, ADDRESS))
            .await
            .unwrap();
        let held = double.opened()[i].initial[ADDRESS].clone();
        assert!(held.contains_key(&echo_uid), "held across the restart");
        assert!(
            !held.contains_key(&uid("broken")),
            "a refused one is not claimed"
        );
        tokio::time::timeout(WAIT, double.reply(&nonce))
            .await
            .unwrap();
    }
    assert_eq!(
        n.server.drains.list().len(),
        drains_before,
        "no drain duplicated"
    );
    assert!(n
        .client
        .workloads
        .snapshot()
        .by_uid(&uid("other"))
        .is_some());

    // Removed: gone from the store, its one drain kept.
    double.remove(ADDRESS, &echo_uid);
    eventually("the echo pod deleted", WAIT, || {
        n.server.workloads.snapshot().by_uid(&echo_uid).is_none()
    })
    .await;
    let echo_drains = n
        .server
        .drains
        .list()
        .into_iter()
        .filter(|d| d.uid == echo_uid)
        .count();
    assert_eq!(
        echo_drains,
        1,
        "one drain for the echo pod: {:?}",
        phase_of(&n.server, &echo_uid)
    );

    let text = n.client.metrics_text();
    assert!(
        text.contains(
            "istio_xds_message_total{url=\"type.googleapis.com/istio.workload.Address\"}"
        ),
        "{text}"
    );
    assert_eq!(
        metric_or_zero(
            &text,
            "istio_xds_connection_terminations_total{reason=\"Complete\"}"
        ),
        1.0
    );
    n.client.shutdown().await;
    n.server.shutdown().await;
}

/// istiod's Service `subject_alt_names`: the endpoint presents an identity
/// its workload does not say — the client's istiod has the echo workload
/// run as `echo`, the server's as `echo-v2` (the certificate it presents)
/// — so its tunnel is refused as `unexpected_identity`, until the Service
/// names `echo-v2` among its SANs: then the same endpoint is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_services_subject_alt_names_are_accepted_as_its_endpoints_identity() {
    init_tracing();
    let octet = 142;
    let vip: IpAddr = format!("10.96.{octet}.1").parse().unwrap();
    let echo = echo_server(ip(octet, 2)).await;
    let (to_server, to_client) = (XdsDouble::start().await, XdsDouble::start().await);
    let ports = serves("echo", echo.port());
    let mut as_v2 = workload("echo", "node-b", ip(octet, 2), ports.clone());
    as_v2.service_account = "echo-v2".into();
    let as_echo = workload("echo", "node-b", ip(octet, 2), ports);
    for (double, echo_workload) in [(&to_server, as_v2), (&to_client, as_echo)] {
        let client = workload("client", "node-a", ip(octet, 3), BTreeMap::new());
        double.set_quietly(ADDRESS, &uid("client"), encode_workload(client));
        double.set_quietly(ADDRESS, &uid("echo"), encode_workload(echo_workload));
        double.set_quietly(
            ADDRESS,
            &format!("demo/{HOST}"),
            service_resource("echo", vip, 0, &[], None),
        );
    }
    // One development CA for both (each gateway's directory has its own
    // istiod root and token).
    let (server_dir, client_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::os::unix::fs::symlink(server_dir.path().join("ca"), client_dir.path().join("ca")).unwrap();
    let TwoNodes {
        server: _server,
        client,
        capture,
    } = two_nodes(
        |node, extra| match node {
            "node-b" => config(server_dir.path(), node, &to_server, extra),
            _ => config(client_dir.path(), node, &to_client, extra),
        },
        SocketAddr::new(vip, 80),
    )
    .await;
    let answers = || answered(&capture, octet);
    let unexpected = r#"tidegate_tls_handshake_failures_total{direction="outbound",reason="unexpected_identity"}"#;

    assert!(!answers().await, "echo-v2 is not who the client expects");
    assert!(metric_or_zero(&client.metrics_text(), unexpected) >= 1.0);

    let v2 = "spiffe://cluster.local/ns/demo/sa/echo-v2";
    let with_sans = service_resource("echo", vip, 0, &[v2, "not a SPIFFE id"], None);
    let nonce = to_client
        .set(ADDRESS, &format!("demo/{HOST}"), with_sans)
        .expect("subscribed");
    let r = tokio::time::timeout(WAIT, to_client.reply(&nonce))
        .await
        .unwrap();
    assert_eq!(
        r.nack, None,
        "a SAN that is no SPIFFE id is ignored, not refused"
    );
    eventually("the Service's SANs applied", WAIT, || {
        let snap = client.workloads.snapshot();
        snap.service_by_vip(vip, 80)
            .is_some_and(|s| s.spec.subject_alt_names.len() == 1)
    })
    .await;
    let refused = metric_or_zero(&client.metrics_text(), unexpected);
    for _ in 0..3 {
        assert!(
            answers().await,
            "echo-v2 is one of the Service's identities"
        );
    }
    assert_eq!(metric_or_zero(&client.metrics_text(), unexpected), refused);
}
