//! Transparent capture end to end across two gateways, with real network
//! namespaces, veth pairs and iptables REDIRECT (issue 2).
//!
//! ```text
//!  pa (client app)          na (node A)                      nb (node B)             pb (echo :8080)
//!  eth0 10.X.1.2 ──veth── to-pa 10.X.1.1                                    to-pb 10.X.2.1 ──veth── eth0 10.X.2.2
//!                           PREROUTING -i to-pa -p tcp        PREROUTING -d 10.X.2.2 --dport 15008
//!                             REDIRECT :15001                   REDIRECT :15008
//!                           gateway A   to-nb 10.X.0.1 ──veth── to-na 10.X.0.2   gateway B
//! ```
//!
//! Pod A dials pod B's IP directly; node A's iptables redirects the connection
//! to gateway A's outbound listener, which reads `SO_ORIGINAL_DST`, opens (or
//! reuses) a pooled mTLS + HTTP/2 tunnel to `10.X.2.2:15008`; node B's iptables
//! redirects that to gateway B's inbound listener, which dials the echo server
//! from node B. Each gateway, the echo server and the client run on their own
//! OS thread that entered its namespace with `setns()` before creating a
//! current-thread tokio runtime, so every socket lives where it should.
//!
//! Needs root, `ip` and `iptables`; skipped (with a message) otherwise.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tidegate_e2e::{metric, metric_or_zero};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use tidegate_e2e::netns::{
    build_topology, gateway_config, tool_missing, Gateway, NsThread, Topology, ECHO_PORT,
    HBONE_PORT, OUTBOUND_PORT, STEP,
};

// ---------------------------------------------------------------------------
// Gateways and the echo server.

/// Echoes every byte back and half-closes when the client does; records the
/// peer address of every accepted connection.
async fn start_echo(pod: &NsThread) -> Arc<Mutex<Vec<SocketAddr>>> {
    start_echo_on(pod, SocketAddr::from(([0, 0, 0, 0], ECHO_PORT))).await
}

/// An echo server on `addr` in `pod` recording each peer (`[::]:8080`
/// serves both families).
async fn start_echo_on(pod: &NsThread, addr: SocketAddr) -> Arc<Mutex<Vec<SocketAddr>>> {
    let peers = Arc::new(Mutex::new(Vec::new()));
    let seen = peers.clone();
    pod.run("echo server bind", STEP, async move {
        let l = TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("echo server: bind {addr}: {e}"));
        tokio::spawn(async move {
            loop {
                let Ok((tcp, peer)) = l.accept().await else {
                    return;
                };
                seen.lock().unwrap().push(peer);
                tokio::spawn(async move {
                    let (mut r, mut w) = tcp.into_split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
    })
    .await;
    peers
}

/// Pattern bytes that differ at every offset modulo small powers of two, so a
/// dropped, duplicated or reordered chunk changes the result.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// One application connection from pod A to `dst`: writes `data`, half-closes,
/// reads to EOF. Writing and reading run concurrently (the payload is larger
/// than any socket buffer). Runs inside pod A's namespace.
async fn echo_round_trip(dst: SocketAddr, data: Arc<Vec<u8>>) -> Result<Vec<u8>, String> {
    let io = async move {
        let tcp = TcpStream::connect(dst)
            .await
            .map_err(|e| format!("connect {dst}: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let (mut r, mut w) = tcp.into_split();
        let writer = async move {
            w.write_all(&data).await?;
            w.shutdown().await
        };
        let reader = async move {
            let mut back = Vec::new();
            r.read_to_end(&mut back).await.map(|_| back)
        };
        let (wrote, back) = tokio::join!(writer, reader);
        wrote.map_err(|e| format!("write to {dst}: {e}"))?;
        back.map_err(|e| format!("read from {dst}: {e}"))
    };
    tokio::time::timeout(STEP, io)
        .await
        .unwrap_or_else(|_| Err(format!("round trip to {dst} timed out after {STEP:?}")))
}

/// A round trip of `len` bytes from `from` (a thread in some namespace) to
/// `dst`, byte-exact.
async fn round_trip(from: &NsThread, dst: SocketAddr, len: usize, seed: u64) -> Result<(), String> {
    let data = Arc::new(pattern(len, seed));
    let back = from
        .run("round trip", STEP, echo_round_trip(dst, data.clone()))
        .await?;
    (back == *data).then_some(()).ok_or_else(|| {
        format!(
            "{} bytes sent, {} different came back",
            data.len(),
            back.len()
        )
    })
}

/// One exchange on a held connection: `msg` out, the same back.
fn echo_on(held: &mut std::net::TcpStream, msg: &[u8]) -> std::io::Result<()> {
    use std::io::{Read, Write};
    held.write_all(msg)?;
    let mut back = vec![0u8; msg.len()];
    held.read_exact(&mut back)?;
    assert_eq!(back, msg, "the held connection echoed something else");
    Ok(())
}

// ---------------------------------------------------------------------------

#[path = "netns/pod_sockets.rs"]
mod pod_sockets;

#[path = "netns/inpod.rs"]
mod inpod;

#[path = "netns/istio_node.rs"]
mod istio_node;

#[path = "netns/cilium_node.rs"]
mod cilium_node;

#[path = "netns/ipv6.rs"]
mod ipv6;

#[path = "netns/capture_families.rs"]
mod capture_families;

/// The congestion control algorithms `ss -ti` reports for the established
/// TCP sockets in namespace `ns` that match `filter` (ss's filter syntax).
fn congestion_controls(ns: &str, filter: &str) -> Vec<String> {
    let known = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .expect("the host's congestion controls");
    let known: Vec<&str> = known.split_whitespace().collect();
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-tinH", "state", "established"])
        .arg(filter)
        .output()
        .expect("run ss");
    assert!(
        out.status.success(),
        "ss in {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|w| known.contains(w))
        .map(str::to_owned)
        .collect()
}

/// The host's default congestion control; the one the tests give tunnel
/// sockets (whichever of cubic and bbr is not the host's); and the `tcp`
/// configuration that gives app-side sockets `reno`, nobody's default.
fn host_congestion() -> (String, &'static str, String) {
    let host = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control").unwrap();
    let host = host.trim().to_owned();
    assert_ne!(
        host, "reno",
        "the test needs a host default other than reno"
    );
    let tunnel = if host == "cubic" { "bbr" } else { "cubic" };
    let tcp =
        format!("tcp: {{app_congestion_control: reno, tunnel_congestion_control: {tunnel}}}\n");
    (host, tunnel, tcp)
}

/// An app connection from `pod` to `dst`, held open after a one-byte round trip.
async fn hold_connection(pod: &NsThread, dst: SocketAddr) -> std::net::TcpStream {
    pod.run("hold a connection", STEP, async move {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect_timeout(&dst, STEP).expect("connect");
        c.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b).unwrap();
        c
    })
    .await
}

/// Root, `ip` and `iptables` are needed; says why when skipping.
fn skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED netns test: needs root for network namespaces and iptables");
        return true;
    }
    if tool_missing("ip", "-V") || tool_missing("iptables", "--version") {
        println!("SKIPPED netns test: `ip` (iproute2) or `iptables` is not installed");
        return true;
    }
    false
}

#[tokio::test]
async fn transparent_capture_across_two_gateways_in_network_namespaces() {
    if skip() {
        return;
    }
    tidegate_e2e::init_tracing();
    tidegate_e2e::raise_fd_limit();
    let started = Instant::now();

    // Drop order is the reverse of declaration: threads (and their sockets)
    // go first, then the namespaces, then the temporary directory.
    let dir = tempfile::tempdir().unwrap();
    let t = Topology::new("tg", 0);
    let _netns = build_topology(&t);

    let workloads = dir.path().join("workloads.yaml");
    std::fs::write(
        &workloads,
        format!(
            "workloads:\n\
             - {{uid: client-uid, name: client, namespace: demo, service_account: client, ips: [{}], node: node-a}}\n\
             - {{uid: echo-uid, name: echo, namespace: demo, service_account: echo, ips: [{}], node: node-b}}\n",
            t.pod_a(),
            t.pod_b(),
        ),
    )
    .unwrap();
    let ca = dir.path().join("ca");

    // Gateway A first: it creates the shared dev CA that gateway B then opens.
    let (host, tunnel, tcp) = host_congestion();
    let gw_a = Gateway::start("A", &t.na, gateway_config("node-a", &ca, &workloads, &tcp)).await;
    let gw_b = Gateway::start("B", &t.nb, gateway_config("node-b", &ca, &workloads, &tcp)).await;
    tidegate_e2e::netns::assert_node_ports(&gw_a, &gw_b);
    let pod_b = NsThread::idle(&t.pb);
    let peers = start_echo(&pod_b).await;
    let pod_a = NsThread::idle(&t.pa);
    let echo = SocketAddr::new(IpAddr::V4(t.pod_b()), ECHO_PORT);

    // 1. One MiB from pod A to pod B's IP, half-closed, comes back intact.
    let big = Arc::new(pattern(1 << 20, 0x7de6_a7e0));
    let back = pod_a
        .run("1 MiB round trip", STEP, echo_round_trip(echo, big.clone()))
        .await
        .unwrap_or_else(|e| panic!("pod A -> pod B: {e}"));
    assert_eq!(back.len(), big.len(), "echoed length");
    assert!(back == *big, "echoed bytes differ from the bytes sent");
    let first = peers.lock().unwrap().first().copied();
    assert_eq!(
        first.map(|p| p.ip()),
        Some(IpAddr::V4(t.node_b_to_pod())),
        "pod B must see the connection from node B (gateway B dialed it); pod A is {}: \
         the connection bypassed the gateways",
        t.pod_a()
    );

    // A few more connections: they must reuse the pooled tunnel.
    for i in 0..4u64 {
        let data = Arc::new(pattern(4096, i + 1));
        let back = pod_a
            .run(
                "small round trip",
                STEP,
                echo_round_trip(echo, data.clone()),
            )
            .await
            .unwrap_or_else(|e| panic!("pod A -> pod B, connection {i}: {e}"));
        assert!(back == *data, "connection {i}: echoed bytes differ");
    }
    let mut conns = 5.0;

    // 2. The bytes went through both gateways over one pooled HBONE tunnel.
    let a = gw_a
        .wait_metrics("5 outbound streams ended ok", |m| {
            metric_or_zero(
                m,
                r#"tidegate_streams_ended_total{direction="outbound",reason="ok"}"#,
            ) == conns
        })
        .await;
    assert_eq!(
        metric(
            &a,
            r#"tidegate_connections_opened_total{direction="outbound"}"#
        ),
        conns,
        "gateway A captured every app connection\n{a}"
    );
    assert_eq!(
        metric(&a, "tidegate_pool_tunnels_opened_total"),
        1.0,
        "one pooled tunnel\n{a}"
    );
    assert_eq!(
        metric(&a, r#"tidegate_tls_handshakes_total{direction="outbound"}"#),
        1.0,
        "gateway A: one client handshake\n{a}"
    );
    assert!(
        metric(
            &a,
            r#"tidegate_bytes_total{direction="outbound",flow="tcp_to_tunnel"}"#
        ) >= big.len() as f64,
        "gateway A tunneled the payload\n{a}"
    );
    let b = gw_b
        .wait_metrics(
            "5 inbound streams ended ok and the payload forwarded",
            |m| {
                metric_or_zero(
                    m,
                    r#"tidegate_streams_ended_total{direction="inbound",reason="ok"}"#,
                ) == conns
                    && metric_or_zero(
                        m,
                        r#"tidegate_bytes_total{direction="inbound",flow="tunnel_to_tcp"}"#,
                    ) >= big.len() as f64
            },
        )
        .await;
    assert_eq!(
        metric(
            &b,
            r#"tidegate_connections_opened_total{direction="inbound"}"#
        ),
        1.0,
        "gateway B: one HBONE tunnel\n{b}"
    );
    assert_eq!(
        metric(&b, r#"tidegate_tls_handshakes_total{direction="inbound"}"#),
        1.0,
        "gateway B: one server handshake\n{b}"
    );
    assert!(
        metric(
            &b,
            r#"tidegate_bytes_total{direction="inbound",flow="tcp_to_tunnel"}"#
        ) >= big.len() as f64,
        "gateway B carried the echo back\n{b}"
    );

    // 3. Twenty sequential, then fifty concurrent connections.
    for i in 0..20u64 {
        let data = Arc::new(pattern(16 << 10, 100 + i));
        let back = pod_a
            .run(
                "sequential round trip",
                STEP,
                echo_round_trip(echo, data.clone()),
            )
            .await
            .unwrap_or_else(|e| panic!("sequential connection {i}: {e}"));
        assert!(
            back == *data,
            "sequential connection {i}: echoed bytes differ"
        );
    }
    conns += 20.0;
    let results = pod_a
        .run("50 concurrent round trips", STEP * 2, async move {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..50u64 {
                set.spawn(async move {
                    let data = Arc::new(pattern(64 << 10, 1000 + i));
                    let back = echo_round_trip(echo, data.clone()).await?;
                    if back != *data {
                        return Err(format!("concurrent connection {i}: echoed bytes differ"));
                    }
                    Ok(())
                });
            }
            let mut out = Vec::new();
            while let Some(r) = set.join_next().await {
                out.push(r.map_err(|e| e.to_string()).and_then(|r| r));
            }
            out
        })
        .await;
    let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of 50 concurrent connections failed: {failed:#?}",
        failed.len()
    );
    assert_eq!(results.len(), 50);
    conns += 50.0;

    let a = gw_a
        .wait_metrics("all outbound streams ended ok", |m| {
            metric_or_zero(
                m,
                r#"tidegate_streams_ended_total{direction="outbound",reason="ok"}"#,
            ) == conns
        })
        .await;
    assert_eq!(
        metric(
            &a,
            r#"tidegate_connections_opened_total{direction="outbound"}"#
        ),
        conns,
        "{a}"
    );
    assert_eq!(
        metric(&a, "tidegate_pool_tunnels_opened_total"),
        1.0,
        "still one pooled tunnel\n{a}"
    );
    assert_eq!(
        metric(&a, r#"tidegate_tls_handshakes_total{direction="outbound"}"#),
        1.0,
        "{a}"
    );
    let b = gw_b
        .wait_metrics("all inbound streams ended ok", |m| {
            metric_or_zero(
                m,
                r#"tidegate_streams_ended_total{direction="inbound",reason="ok"}"#,
            ) == conns
        })
        .await;
    assert_eq!(
        metric(
            &b,
            r#"tidegate_connections_opened_total{direction="inbound"}"#
        ),
        1.0,
        "still one tunnel\n{b}"
    );
    assert_eq!(
        metric(&b, r#"tidegate_tls_handshakes_total{direction="inbound"}"#),
        1.0,
        "{b}"
    );

    // 4. Pod B saw every connection coming from node B (gateway B dialed it),
    //    never from pod A.
    let peers = peers.lock().unwrap().clone();
    assert_eq!(
        peers.len() as f64,
        conns,
        "echo server accepted one connection per app connection: {peers:?}"
    );
    let node_b = IpAddr::V4(t.node_b_to_pod());
    let strays: Vec<_> = peers.iter().filter(|p| p.ip() != node_b).collect();
    assert!(
        strays.is_empty(),
        "echo server saw connections not coming from node B ({node_b}): {strays:?} (pod A is {})",
        t.pod_a()
    );

    // 5. The gateways' app-side sockets (the captured connection on node
    //    A, the delivery on node B) use `tcp.app_congestion_control`, the
    //    tunnel's ends `tcp.tunnel_congestion_control`, the apps' own
    //    sockets the host's default.
    let held = hold_connection(&pod_a, echo).await;
    assert_eq!(
        congestion_controls(&t.na, &format!("sport = :{OUTBOUND_PORT}")),
        ["reno"]
    );
    assert_eq!(
        congestion_controls(&t.na, &format!("dport = :{HBONE_PORT}")),
        [tunnel]
    );
    assert_eq!(
        congestion_controls(&t.nb, &format!("sport = :{HBONE_PORT}")),
        [tunnel]
    );
    assert_eq!(
        congestion_controls(&t.nb, &format!("dport = :{ECHO_PORT}")),
        ["reno"]
    );
    let local = held.local_addr().unwrap().port();
    assert_eq!(
        congestion_controls(&t.pa, &format!("sport = :{local}")),
        [host.as_str()]
    );
    drop(held);

    println!(
        "netns: {conns} connections pod A ({}) -> gateway A ({}) => gateway B ({}) -> pod B ({}) over 1 tunnel in {:?}",
        t.pod_a(),
        t.na,
        t.nb,
        t.pod_b(),
        started.elapsed()
    );
    drop((pod_a, pod_b, gw_b, gw_a));
}
