//! A Cilium node with tidegate in ztunnel's place, end to end: two node
//! gateways configured as Cilium's DaemonSet configures ztunnel (its
//! environment, `control_plane: cilium`), each handed its pod by the
//! Cilium agent double over ZDS after the test installed Cilium's in-pod
//! rules in the pod, workloads over the agent's plaintext Unix socket and
//! certificates from its CA (RSA root, leaves without key usage or EKU).
//!
//! ```text
//!  pa (client)  10.X.1.2 ──veth── 10.X.1.1 ┐                     ┌ 10.X.2.1 ──veth── 10.X.2.2  pb (echo :8080)
//!                                          na 10.X.0.1 ── 10.X.0.2 nb
//!                  the agent's CA 10.X.141.1 on na's lo; xDS and ZDS on Unix sockets a node
//! ```

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Instant;

use tidegate::config::{Config, ControlPlaneKind};
use tidegate_e2e::cilium_double::{self, CiliumAgent, CiliumNode, CiliumPod};
use tidegate_e2e::inpod::InpodTopology;
use tidegate_e2e::netns::{run, Gateway, NsThread, ECHO_PORT, STEP};
use tidegate_e2e::zds_double::{Request, ZdsConn};
use tidegate_e2e::{metric_or_zero, metric_sum};
use tidegate_xds::client::ADDRESS;

use super::{echo_on, round_trip, skip, start_echo};

fn agent_ip(t: &InpodTopology) -> Ipv4Addr {
    t.addr(141, 1)
}

/// What the test sets beside Cilium's environment: ephemeral control
/// ports (two gateways share the host's loopback view in the test) and
/// a short shutdown.
fn config(dir: &Path, agent: &CiliumAgent, node: &CiliumNode, host_ip: Ipv4Addr) -> Config {
    let file = dir.join(format!("{host_ip}.yaml"));
    std::fs::write(
        &file,
        "listeners: {admin: 127.0.0.1:0, metrics: 127.0.0.1:0, readiness: 127.0.0.1:0}\nshutdown: {deadline: 2s}\n",
    )
    .unwrap();
    Config::load_as(
        Some(&file),
        agent.env(node, host_ip),
        &[],
        ControlPlaneKind::Cilium,
    )
    .unwrap_or_else(|e| panic!("Cilium's environment: {e}"))
}

fn netns(ns: &str) -> OwnedFd {
    OwnedFd::from(std::fs::File::open(InpodTopology::netns_path(ns)).unwrap())
}

/// The agent on a node: its rules in the pod first, then the gateway's
/// connection and the snapshot (the pod with its namespace).
async fn hand_over(node: &CiliumNode, pod: &CiliumPod, pod_ns: &str) -> ZdsConn {
    let conn = tokio::time::timeout(STEP, node.zds.accept())
        .await
        .expect("the gateway connects to the agent's ZDS socket")
        .expect("hello V1");
    cilium_double::snapshot(&conn, vec![(pod.spec(), netns(pod_ns))])
        .await
        .expect("snapshot acked");
    conn
}

async fn ready(gw: &Gateway) {
    tidegate_e2e::wait_for(
        &format!(
            "gateway {} ready (ZDS snapshot, the agent's workloads)",
            gw.name
        ),
        STEP,
        || async { (gw.readiness().await == 200).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn cilium_node_pods_enrolled_by_the_agent_talk_hbone_and_survive_an_agent_restart() {
    if skip() {
        return;
    }
    tidegate_e2e::init_tracing();
    let started = Instant::now();
    let t = InpodTopology::new("cil", 0);
    let _guard = t.build();
    let dir = tempfile::tempdir().unwrap();
    let shell_a = NsThread::idle(&t.na);
    // The agent's CA on node A's loopback, node B routing to it over the
    // node link (one CA for both nodes; each node has its own sockets).
    run(&format!(
        "ip -n {} addr add {}/32 dev lo",
        t.na,
        agent_ip(&t)
    ));
    run(&format!(
        "ip -n {} route add {}/32 via {}",
        t.nb,
        agent_ip(&t),
        t.addr(0, 1)
    ));
    let ip = IpAddr::V4(agent_ip(&t));
    let path = dir.path().to_owned();
    let agent = shell_a
        .run("the Cilium agent double", STEP, async move {
            CiliumAgent::start(&path, ip).await
        })
        .await;
    let (node_a, node_b) = (agent.node("node-a"), agent.node("node-b"));
    let (host_a, host_b) = (t.addr(0, 1), t.addr(0, 2));
    let pod = |uid: &str, name: &str, ip, host_ip| CiliumPod {
        uid: uid.into(),
        name: name.into(),
        namespace: "demo".into(),
        service_account: name.into(),
        ip,
        host_ip,
    };
    let client = pod(
        "4c1e2a7e-5b1f-4f0e-9d43-2a1f0c6b7a01",
        "client",
        t.pod_a(),
        host_a,
    );
    let echo = pod(
        "9b7d3c52-0e8a-4a6f-8f2e-6d5c4b3a2f10",
        "echo",
        t.pod_b(),
        host_b,
    );
    agent.set_pod(&client);
    agent.set_pod(&echo);

    let gw_a = Gateway::start("node-a", &t.na, config(dir.path(), &agent, &node_a, host_a)).await;
    let gw_b = Gateway::start("node-b", &t.nb, config(dir.path(), &agent, &node_b, host_b)).await;
    let pb = NsThread::idle(&t.pb);
    let pa = NsThread::idle(&t.pa);
    let peers = start_echo(&pb).await;
    // The agent installs its rules before its Add.
    cilium_double::install_rules(&t.pa).expect("Cilium's rules in pod A");
    cilium_double::install_rules(&t.pb).expect("Cilium's rules in pod B");
    let conn_a = hand_over(&node_a, &client, &t.pa).await;
    let _conn_b = hand_over(&node_b, &echo, &t.pb).await;
    ready(&gw_a).await;
    ready(&gw_b).await;
    // Both streams came over the Unix sockets without a token, and ACKed
    // the agent's Workloads.
    for i in 0..2 {
        let nonce = tokio::time::timeout(STEP, agent.xds.answered(i, ADDRESS))
            .await
            .expect("a subscription answered");
        let r = tokio::time::timeout(STEP, agent.xds.reply(&nonce))
            .await
            .expect("the answer replied to");
        assert_eq!(r.nack, None, "stream {i} NACKed the agent's Workloads");
        assert_eq!(agent.xds.opened()[i].authorization, None, "no token");
    }

    // 1. Bad input on node A's ZDS connection: refused with a reason, the
    //    connection and the pod served on.
    let too_long = cilium_double::request(&conn_a, Request::Raw(vec![0x0a; 1500]), vec![])
        .await
        .expect("an ack for the oversized message");
    assert!(too_long.contains("1024"), "{too_long}");
    let no_netns = cilium_double::request(
        &conn_a,
        Request::Add(pod("0d6f", "stray", t.addr(1, 9), host_a).spec()),
        vec![],
    )
    .await
    .expect("an ack for the Add without a namespace");
    assert!(no_netns.contains("file descriptors"), "{no_netns}");

    // 2. Pod A to pod B's own address: Cilium's rules capture it in pod A,
    //    HBONE with the agent's certificates to node B's gateway in pod B.
    let dst = SocketAddr::new(t.pod_b().into(), ECHO_PORT);
    for (len, seed) in [(1, 1), (64 << 10, 2), (1 << 20, 3)] {
        round_trip(&pa, dst, len, seed)
            .await
            .unwrap_or_else(|e| panic!("pod A -> pod B, {len} bytes: {e}"));
        let last = *peers.lock().unwrap().last().unwrap();
        assert_eq!(last.ip(), IpAddr::V4(t.pod_a()), "pod B's app sees pod A");
    }
    let dump_b = gw_b.admin_ok("GET", "/config_dump").await;
    let tunnels = dump_b["inbound_tunnels"].as_array().unwrap();
    assert_eq!(tunnels.len(), 1, "{dump_b}");
    assert_eq!(
        tunnels[0]["peer_identity"],
        "spiffe://cluster.local/ns/demo/sa/client"
    );
    assert!(agent.ca.requests() >= 2, "each node asked the agent's CA");

    // 3. The agent restarts on node A: the gateway connects again and gets
    //    the whole snapshot; a connection held across it keeps echoing,
    //    new ones work, nothing drains.
    let drains = |m: &str| metric_sum(m, "tidegate_drain_started_total");
    let before = drains(&gw_a.metrics().await);
    let mut held = pa
        .run("a long connection", STEP, async move {
            let c = std::net::TcpStream::connect_timeout(&dst, STEP).expect("connect");
            c.set_read_timeout(Some(STEP)).unwrap();
            c
        })
        .await;
    echo_on(&mut held, b"before the restart").expect("held, before the restart");
    conn_a.drop_connection().await;
    echo_on(&mut held, b"while the agent is away").expect("held, during the restart");
    let _conn_a = hand_over(&node_a, &client, &t.pa).await;
    echo_on(&mut held, b"after the snapshot again").expect("held, after the restart");
    for i in 0..5 {
        round_trip(&pa, dst, 16 << 10, 10 + i)
            .await
            .unwrap_or_else(|e| panic!("new connection {i} after the restart: {e}"));
    }
    drop(held);
    let ma = gw_a.metrics().await;
    assert_eq!(
        drains(&ma),
        before,
        "the agent's restart raised a drain\n{ma}"
    );
    assert_eq!(
        metric_or_zero(
            &ma,
            r#"tidegate_connections_opened_total{direction="outbound"}"#
        ),
        9.0,
        "each connection captured in pod A\n{ma}"
    );
    println!(
        "cilium node: HBONE and an agent restart across {} -> {} in {:?}",
        t.na,
        t.nb,
        started.elapsed()
    );
    drop((pa, pb, gw_a, gw_b, shell_a));
}
