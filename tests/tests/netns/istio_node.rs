//! An Istio ambient node with tidegate in ztunnel's place, end to end: two
//! node gateways (node-a, node-b) in their own network namespaces, each
//! handed its pod by istio-cni's node agent over ZDS (the ZDS double),
//! istio-cni's in-pod capture rules in both pods and its DNS redirect in
//! the client pod, and
//! workloads, the Service and its VIP from one istiod (the xDS double)
//! listening on node A, reached by node B over the node link.
//!
//! ```text
//!  pa (client)  10.X.1.2 ──veth── 10.X.1.1 ┐                     ┌ 10.X.2.1 ──veth── 10.X.2.2  pb (echo :8080)
//!                                          na 10.X.0.1 ── 10.X.0.2 nb
//!                     istiod 10.X.141.1 on na's lo; Service echo.demo VIP 10.X.141.10:80 → 8080
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Instant;

use hickory_proto::op::ResponseCode;
use prost::Message as _;
use tidegate::config::Config;
use tidegate_e2e::dns_double::{addresses, ask_udp, query};
use tidegate_e2e::inpod::InpodTopology;
use tidegate_e2e::netns::{run, Gateway, NsThread, ECHO_PORT, HBONE_PORT, OUTBOUND_PORT, STEP};
use tidegate_e2e::xds_double::XdsDouble;
use tidegate_e2e::zds_double::{PodSpec, ZdsConn, ZdsDouble};
use tidegate_e2e::{metric_or_zero, metric_sum};
use tidegate_xds::client::ADDRESS;
use tidegate_xds::workload::{
    address, Address, NetworkAddress, Port, PortList, Service, TunnelProtocol, Workload,
};

use super::{echo_on, round_trip, skip, start_echo};

const HOST: &str = "echo.demo.svc.cluster.local";

fn istiod_ip(t: &InpodTopology) -> Ipv4Addr {
    t.addr(141, 1)
}

fn vip(t: &InpodTopology) -> Ipv4Addr {
    t.addr(141, 10)
}

/// What the pods take for their nameserver: nothing listens there, so a
/// query that bypassed the redirect to 15053 would go unanswered.
fn nameserver(t: &InpodTopology) -> SocketAddr {
    SocketAddr::new(t.addr(141, 53).into(), 53)
}

/// istiod's uid of a pod: `<cluster>//Pod/<ns>/<name>`.
fn xds_uid(name: &str) -> String {
    format!("Kubernetes//Pod/demo/{name}")
}

fn workload(
    name: &str,
    node: &str,
    ip: Ipv4Addr,
    services: BTreeMap<String, PortList>,
) -> Workload {
    Workload {
        uid: xds_uid(name),
        name: name.into(),
        namespace: "demo".into(),
        addresses: vec![ip.octets().to_vec().into()],
        tunnel_protocol: TunnelProtocol::Hbone as i32,
        service_account: name.into(),
        node: node.into(),
        cluster_id: "Kubernetes".into(),
        services,
        ..Default::default()
    }
}

fn encode(r: address::Type) -> bytes::Bytes {
    Address { r#type: Some(r) }.encode_to_vec().into()
}

fn echo_service(vip: Ipv4Addr) -> bytes::Bytes {
    encode(address::Type::Service(Service {
        name: "echo".into(),
        namespace: "demo".into(),
        hostname: HOST.into(),
        addresses: vec![NetworkAddress {
            network: String::new(),
            address: vip.octets().to_vec().into(),
            length: None,
        }],
        ports: vec![Port {
            service_port: 80,
            target_port: u32::from(ECHO_PORT),
            app_protocol: 0,
        }],
        ..Default::default()
    }))
}

/// A node gateway: in-pod capture with its pods from istio-cni over ZDS,
/// workloads from istiod, the DNS proxy on 15053.
fn config(dir: &Path, node: &str, t: &InpodTopology, double: &XdsDouble, zds: &Path) -> Config {
    let roots = dir.join("istiod-root.pem");
    std::fs::write(&roots, &double.root_pem).unwrap();
    let token = dir.join("istio-token");
    std::fs::write(&token, "tok").unwrap();
    let yaml = format!(
        r#"node_name: {node}
trust_domain: cluster.local
listeners:
  outbound: 0.0.0.0:{OUTBOUND_PORT}
  inbound: 0.0.0.0:{HBONE_PORT}
  admin: 127.0.0.1:0
  metrics: 127.0.0.1:0
  readiness: 127.0.0.1:0
certificates:
  source: dev-ca
  state_dir: {ca}
workloads:
  source: istio
  istio:
    address: https://{istiod}
    roots: {roots}
    token: {token}
    pod_ip: 10.{x}.0.{host}
    pod_name: tidegate-{node}
hbone:
  port: {HBONE_PORT}
capture:
  mode: inpod
  zds_socket: {zds}
dns:
  upstream: [{upstream}]
shutdown:
  deadline: 2s
"#,
        ca = dir.join("ca").display(),
        istiod = double.addr,
        roots = roots.display(),
        token = token.display(),
        x = t.x,
        host = if node == "node-a" { 1 } else { 2 },
        zds = zds.display(),
        upstream = nameserver(t),
    );
    Config::from_yaml(&yaml).unwrap_or_else(|e| panic!("test config: {e}\n{yaml}"))
}

fn netns(ns: &str) -> OwnedFd {
    OwnedFd::from(std::fs::File::open(InpodTopology::netns_path(ns)).unwrap())
}

/// istio-cni on a node: accepts the gateway's connection, sends its
/// snapshot (one pod), installs its in-pod rules in that pod.
async fn hand_over(zds: &ZdsDouble, shell: &NsThread, pod: PodSpec, pod_ns: &str) -> ZdsConn {
    let conn = tokio::time::timeout(STEP, zds.accept())
        .await
        .expect("the gateway connects to the node agent")
        .expect("hello V1");
    conn.snapshot(vec![(pod, netns(pod_ns))], &[])
        .await
        .expect("snapshot acked");
    let path = InpodTopology::netns_path(pod_ns);
    shell
        .run("istio-cni's in-pod rules", STEP, async move {
            tidegate_netns::capture::install(
                Path::new(&path),
                tidegate_netns::capture::CapturePorts::default(),
            )
        })
        .await
        .expect("rules installed");
    conn
}

async fn ready(gw: &Gateway) {
    tidegate_e2e::wait_for(
        &format!("gateway {} ready (ZDS snapshot, istiod's answers)", gw.name),
        STEP,
        || async { (gw.readiness().await == 200).then_some(()) },
    )
    .await;
}

/// A gateway's drains (`GET /drains`) and the drains it ever started.
async fn drains_of(gw: &Gateway) -> (serde_json::Value, f64) {
    let list = gw.admin_ok("GET", "/drains").await;
    let m = gw.metrics().await;
    (list, metric_sum(&m, "tidegate_drain_started_total"))
}

#[tokio::test]
async fn istio_node_pods_from_zds_and_workloads_from_istiod_route_resolve_and_survive_an_istiod_restart(
) {
    if skip() {
        return;
    }
    tidegate_e2e::init_tracing();
    let started = Instant::now();
    // Drop order is the reverse of declaration: threads and gateways
    // first, then the files, then the namespaces.
    let t = InpodTopology::new("isn", 0);
    let _guard = t.build();
    let dir = tempfile::tempdir().unwrap();
    let (shell_a, shell_b) = (NsThread::idle(&t.na), NsThread::idle(&t.nb));

    // istiod on node A's loopback, node B routing to it over the node link.
    run(&format!(
        "ip -n {} addr add {}/32 dev lo",
        t.na,
        istiod_ip(&t)
    ));
    run(&format!(
        "ip -n {} route add {}/32 via {}",
        t.nb,
        istiod_ip(&t),
        t.addr(0, 1)
    ));
    let ip = IpAddr::V4(istiod_ip(&t));
    let double = shell_a
        .run("the xDS double", STEP, XdsDouble::start_on(ip))
        .await;
    let ports: BTreeMap<String, PortList> = [(
        format!("demo/{HOST}"),
        PortList {
            ports: vec![Port {
                service_port: 80,
                target_port: u32::from(ECHO_PORT),
                app_protocol: 0,
            }],
        },
    )]
    .into();
    double.set_quietly(
        ADDRESS,
        &xds_uid("client"),
        encode(address::Type::Workload(workload(
            "client",
            "node-a",
            t.pod_a(),
            BTreeMap::new(),
        ))),
    );
    double.set_quietly(
        ADDRESS,
        &xds_uid("echo"),
        encode(address::Type::Workload(workload(
            "echo",
            "node-b",
            t.pod_b(),
            ports,
        ))),
    );
    double.set_quietly(ADDRESS, &format!("demo/{HOST}"), echo_service(vip(&t)));

    // istio-cni's node agents, one a node.
    let zds_a = ZdsDouble::bind(&dir.path().join("node-a-ztunnel.sock")).unwrap();
    let zds_b = ZdsDouble::bind(&dir.path().join("node-b-ztunnel.sock")).unwrap();
    // Node A first: it creates the dev CA node B then opens.
    let gw_a = Gateway::start(
        "node-a",
        &t.na,
        config(dir.path(), "node-a", &t, &double, &zds_a.path),
    )
    .await;
    let gw_b = Gateway::start(
        "node-b",
        &t.nb,
        config(dir.path(), "node-b", &t, &double, &zds_b.path),
    )
    .await;
    let (pa, pb) = (NsThread::idle(&t.pa), NsThread::idle(&t.pb));
    let peers = start_echo(&pb).await;
    let pod = |uid: &str, name: &str| PodSpec {
        uid: uid.into(),
        name: name.into(),
        namespace: "demo".into(),
        service_account: name.into(),
    };
    // Handed over as istio-cni names pods, by their Kubernetes
    // `metadata.uid`; istiod names the same pods
    // `<cluster>//Pod/<ns>/<name>`: the gateway matches them by namespace
    // and name on its node.
    let client_uid = "4c1e2a7e-5b1f-4f0e-9d43-2a1f0c6b7a01";
    let echo_uid = "9b7d3c52-0e8a-4a6f-8f2e-6d5c4b3a2f10";
    let _conn_a = hand_over(&zds_a, &shell_a, pod(client_uid, "client"), &t.pa).await;
    let _conn_b = hand_over(&zds_b, &shell_b, pod(echo_uid, "echo"), &t.pb).await;
    super::inpod::dns::redirect_dns(&t.pa);
    ready(&gw_a).await;
    ready(&gw_b).await;
    // Both subscribed and ACKed istiod's first answer.
    for i in 0..2 {
        let nonce = tokio::time::timeout(STEP, double.answered(i, ADDRESS))
            .await
            .expect("a subscription answered");
        let r = tokio::time::timeout(STEP, double.reply(&nonce))
            .await
            .expect("the answer replied to");
        assert_eq!(r.nack, None, "stream {i} NACKed istiod's first answer");
    }

    // 1. The Service VIP, from pod A through its in-pod capture and HBONE
    //    to node B's gateway in pod B: the echo answers, byte-exact.
    let svc = SocketAddr::new(vip(&t).into(), 80);
    for (len, seed) in [(1, 1), (64 << 10, 2), (1 << 20, 3)] {
        round_trip(&pa, svc, len, seed)
            .await
            .unwrap_or_else(|e| panic!("pod A -> the VIP, {len} bytes: {e}"));
        let last = *peers.lock().unwrap().last().unwrap();
        assert_eq!(
            last.ip(),
            IpAddr::V4(t.pod_a()),
            "pod B's app sees pod A's own address"
        );
    }
    let ma = gw_a.metrics().await;
    assert_eq!(
        metric_or_zero(
            &ma,
            r#"tidegate_connections_opened_total{direction="outbound"}"#
        ),
        3.0,
        "each connection captured in pod A\n{ma}"
    );
    let dump_b = gw_b.admin_ok("GET", "/config_dump").await;
    let tunnels = dump_b["inbound_tunnels"].as_array().unwrap();
    assert_eq!(tunnels.len(), 1, "{dump_b}");
    assert_eq!(
        tunnels[0]["peer_identity"],
        "spiffe://cluster.local/ns/demo/sa/client"
    );
    assert_eq!(dump_b["capture"]["pods"][0]["source"], "zds", "{dump_b}");

    // 2. The Service's hostname from pod A's nameserver (port 53,
    //    redirected to 15053): the VIP, answered by the gateway; then a
    //    connection to that address.
    let ns = nameserver(&t);
    let q = query(&format!("{HOST}."));
    let m = pa
        .run("DNS over UDP", STEP, async move { ask_udp(ns, &q).await })
        .await
        .unwrap_or_else(|e| panic!("{HOST} from pod A: {e}"));
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.metadata.authoritative, "answered by the gateway's proxy");
    let resolved = addresses(&m);
    assert_eq!(resolved, [vip(&t)]);
    round_trip(&pa, SocketAddr::new(resolved[0].into(), 80), 4096, 4)
        .await
        .expect("pod A -> the resolved address");

    // 3. istiod restarts. A connection held open across it keeps echoing;
    //    both gateways reconnect with what they hold and ACK the answers;
    //    new connections work; no drain is raised.
    let drains = (drains_of(&gw_a).await, drains_of(&gw_b).await);
    let mut held = pa
        .run("a long connection to the VIP", STEP, async move {
            let c = std::net::TcpStream::connect_timeout(&svc, STEP).expect("connect");
            c.set_read_timeout(Some(STEP)).unwrap();
            c
        })
        .await;
    echo_on(&mut held, b"before the cut").expect("held connection, before the cut");
    let streams = double.opened().len();
    double.cut();
    echo_on(&mut held, b"while istiod is away").expect("held connection, during the reconnect");
    tokio::time::timeout(STEP, double.opened_at_least(streams + 2))
        .await
        .expect("both gateways reconnect");
    for i in [streams, streams + 1] {
        let nonce = tokio::time::timeout(STEP, double.answered(i, ADDRESS))
            .await
            .expect("the new stream answered");
        let held_versions = double.opened()[i].initial[ADDRESS].clone();
        for name in [xds_uid("client"), xds_uid("echo"), format!("demo/{HOST}")] {
            assert!(
                held_versions.contains_key(&name),
                "stream {i}: {name} held across the restart: {held_versions:?}"
            );
        }
        let r = tokio::time::timeout(STEP, double.reply(&nonce))
            .await
            .expect("the new answer replied to");
        assert_eq!(
            r.nack, None,
            "stream {i} NACKed the answer after the restart"
        );
    }
    echo_on(&mut held, b"after the reconnect").expect("held connection, after the reconnect");
    for i in 0..5 {
        round_trip(&pa, svc, 16 << 10, 10 + i)
            .await
            .unwrap_or_else(|e| panic!("new connection {i} after the restart: {e}"));
    }
    drop(held);
    assert_eq!(
        (drains_of(&gw_a).await, drains_of(&gw_b).await),
        drains,
        "the reconnect raised a drain"
    );
    let ma = gw_a.metrics().await;
    assert_eq!(
        metric_or_zero(
            &ma,
            "istio_xds_connection_terminations_total{reason=\"Complete\"}"
        ),
        1.0,
        "{ma}"
    );

    println!(
        "istio node: VIP, DNS and an istiod restart across {} -> {} in {:?}",
        t.na,
        t.nb,
        started.elapsed()
    );
    drop((pa, pb, gw_a, gw_b, shell_a, shell_b));
}
