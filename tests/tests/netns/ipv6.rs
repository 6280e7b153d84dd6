//! IPv6 and dual-stack on the data path: two nodes and two pods, as the
//! IPv4 tests build them, with IPv6 addresses (`fd7e:X:subnet::host/64`)
//! beside IPv4 ones (dual-stack) or alone (IPv6-only), in node mode
//! (ip6tables REDIRECT on the nodes) and in in-pod mode (pods handed over
//! by the ZDS double; the in-pod capture rules, ip6tables' as istio-cni
//! writes them, installed by the test).
//!
//! Each asserts what the IPv4 gateway did not do: an IPv6 destination
//! captured and carried byte-exact over HBONE between nodes on IPv6; a
//! Service whose endpoint has an IPv6 address only reached through either
//! of its VIPs; in a pod, the app seeing the client's own IPv6 address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidegate_e2e::inpod::InpodTopology;
use tidegate_e2e::netns::{
    gateway_config, run, Gateway, NetnsGuard, NsThread, ECHO_PORT, HBONE_PORT, OUTBOUND_PORT, STEP,
};
use tidegate_e2e::zds_double::{PodSpec, ZdsDouble};
use tidegate_e2e::{metric, metric_or_zero};

use super::{echo_round_trip, pattern, skip, start_echo_on};

const VIP_PORT: u16 = 80;

/// Dual-stack (both families on every link) or IPv6 only.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stack {
    Dual,
    V6Only,
}

struct V6Topology {
    na: String,
    nb: String,
    pa: String,
    pb: String,
    x: u16,
    stack: Stack,
}

impl V6Topology {
    fn new(k: u8, stack: Stack) -> V6Topology {
        let pid = std::process::id();
        let name = |n: &str| format!("v6p{pid}s{k}{n}");
        V6Topology {
            na: name("na"),
            nb: name("nb"),
            pa: name("pa"),
            pb: name("pb"),
            x: (pid % 0xfff) as u16 * 16 + u16::from(k),
            stack,
        }
    }

    fn v6(&self, subnet: u16, host: u16) -> Ipv6Addr {
        Ipv6Addr::new(0xfd7e, self.x, subnet, 0, 0, 0, 0, host)
    }
    fn v4(&self, subnet: u8, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, subnet, host)
    }
    fn pod_a6(&self) -> Ipv6Addr {
        self.v6(1, 2)
    }
    fn pod_b6(&self) -> Ipv6Addr {
        self.v6(2, 2)
    }
    /// Node B's side of pod B's link: what node mode delivers from.
    fn node_b_to_pod6(&self) -> Ipv6Addr {
        self.v6(2, 1)
    }
    fn vip6(&self) -> Ipv6Addr {
        self.v6(9, 1)
    }
    fn vip4(&self) -> Ipv4Addr {
        self.v4(9, 1)
    }

    /// Namespaces, veths (IPv6 without duplicate address detection, so an
    /// address is usable at once), routes and forwarding; no capture rule.
    fn build(&self) -> NetnsGuard {
        let all = [&self.na, &self.nb, &self.pa, &self.pb];
        let guard = NetnsGuard::fresh(&all);
        let (na, nb, pa, pb) = (&self.na, &self.nb, &self.pa, &self.pb);
        let links = [
            (na, "to-pa", pa, "eth0", 1u8),
            (nb, "to-pb", pb, "eth0", 2),
            (na, "to-nb", nb, "to-na", 0),
        ];
        for (ns1, if1, ns2, if2, subnet) in links {
            run(&format!(
                "ip -n {ns1} link add {if1} type veth peer name {if2} netns {ns2}"
            ));
            let s = u16::from(subnet);
            let (a1, a2) = (self.v6(s, 1), self.v6(s, 2));
            run(&format!("ip -n {ns1} addr add {a1}/64 dev {if1} nodad"));
            run(&format!("ip -n {ns2} addr add {a2}/64 dev {if2} nodad"));
            if self.stack == Stack::Dual {
                let (b1, b2) = (self.v4(subnet, 1), self.v4(subnet, 2));
                run(&format!("ip -n {ns1} addr add {b1}/24 dev {if1}"));
                run(&format!("ip -n {ns2} addr add {b2}/24 dev {if2}"));
            }
            run(&format!("ip -n {ns1} link set {if1} up"));
            run(&format!("ip -n {ns2} link set {if2} up"));
        }
        for (pod, subnet) in [(pa, 1u8), (pb, 2)] {
            run(&format!(
                "ip -n {pod} -6 route add default via {}",
                self.v6(u16::from(subnet), 1)
            ));
            if self.stack == Stack::Dual {
                run(&format!(
                    "ip -n {pod} route add default via {}",
                    self.v4(subnet, 1)
                ));
            }
        }
        for (node, far, via) in [(na, 2u8, 2u16), (nb, 1, 1)] {
            run(&format!(
                "ip -n {node} -6 route add {}/64 via {}",
                self.v6(u16::from(far), 0),
                self.v6(0, via)
            ));
            if self.stack == Stack::Dual {
                run(&format!(
                    "ip -n {node} route add {}/24 via {}",
                    self.v4(far, 0),
                    self.v4(0, via as u8)
                ));
            }
            run(&format!(
                "ip netns exec {node} sysctl -q -w net.ipv6.conf.all.forwarding=1"
            ));
            run(&format!(
                "ip netns exec {node} sysctl -q -w net.ipv4.ip_forward=1"
            ));
        }
        if self.stack == Stack::V6Only {
            // No IPv4 but loopback's own: the pods cannot reach anything on IPv4.
            for ns in all {
                let out = Command::new("ip")
                    .args(["-n", ns, "-4", "route", "show", "default"])
                    .output()
                    .unwrap();
                assert!(out.stdout.is_empty(), "{ns} has an IPv4 default route");
            }
        }
        guard
    }

    /// `iptables` and `ip6tables` (or only the latter, IPv6-only) in `ns`.
    fn tables(&self, ns: &str, rule: &str) {
        run(&format!("ip netns exec {ns} ip6tables {rule}"));
        if self.stack == Stack::Dual {
            run(&format!("ip netns exec {ns} iptables {rule}"));
        }
    }

    /// Node mode: pod A's TCP lands on node A's outbound listener; HBONE to
    /// pod B on node B's inbound one.
    fn node_capture(&self) {
        self.tables(
            &self.na,
            &format!("-t nat -A PREROUTING -i to-pa -p tcp -j REDIRECT --to-ports {OUTBOUND_PORT}"),
        );
        self.tables(
            &self.nb,
            &format!(
                "-t nat -A PREROUTING -i to-na -p tcp --dport {HBONE_PORT} -j REDIRECT --to-ports {HBONE_PORT}"
            ),
        );
    }

    /// In-pod: istio-cni's rules in the pod (the client side's outbound
    /// redirect, the server side's return route for transparent delivery),
    /// for each family of the topology.
    fn inpod_capture(&self, pod: &str) {
        let rules = [
            "-t mangle -A PREROUTING -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff",
            "-t mangle -A OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff",
            "-t nat -A OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT",
            "-t nat -A OUTPUT -o lo -j ACCEPT",
            "-t nat -A OUTPUT -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001",
        ];
        for rule in rules {
            self.tables(pod, rule);
        }
        run(&format!(
            "ip -n {pod} -6 rule add fwmark 0x111/0xfff pref 32764 lookup 100"
        ));
        run(&format!(
            "ip -n {pod} -6 route add local ::/0 dev lo table 100"
        ));
        if self.stack == Stack::Dual {
            run(&format!(
                "ip -n {pod} rule add fwmark 0x111/0xfff pref 32764 lookup 100"
            ));
            run(&format!(
                "ip -n {pod} route add local 0.0.0.0/0 dev lo table 100"
            ));
        }
    }

    /// Client on node A, echo on node B (IPv6 only: pod B's IPv4 is not
    /// in its workload, so the Service's IPv4 VIP must reach its IPv6);
    /// Service `web` with a VIP of each family of the topology.
    fn workloads(&self) -> String {
        let (vips, client_ips) = match self.stack {
            Stack::Dual => (
                format!("[{}, '{}']", self.vip4(), self.vip6()),
                format!("[{}, '{}']", self.v4(1, 2), self.pod_a6()),
            ),
            Stack::V6Only => (
                format!("['{}']", self.vip6()),
                format!("['{}']", self.pod_a6()),
            ),
        };
        format!(
            "workloads:\n\
             - {{uid: pa-uid, name: client, namespace: demo, service_account: client, ips: {client_ips}, node: node-a}}\n\
             - {{uid: pb-uid, name: echo, namespace: demo, service_account: echo, ips: ['{b}'], node: node-b, services: [web]}}\n\
             services:\n\
             - {{name: web, namespace: demo, vips: {vips}, ports: [{{port: {VIP_PORT}, target_port: {ECHO_PORT}}}]}}\n",
            b = self.pod_b6(),
        )
    }

    /// The VIPs of `web` a client can dial.
    fn vips(&self) -> Vec<SocketAddr> {
        let mut v = vec![SocketAddr::new(self.vip6().into(), VIP_PORT)];
        if self.stack == Stack::Dual {
            v.push(SocketAddr::new(self.vip4().into(), VIP_PORT));
        }
        v
    }

    fn echo(&self) -> SocketAddr {
        SocketAddr::new(self.pod_b6().into(), ECHO_PORT)
    }
}

/// An echo server on `[::]:8080` (both families) recording each peer.
async fn start_echo6(pod: &NsThread) -> Arc<Mutex<Vec<SocketAddr>>> {
    start_echo_on(pod, SocketAddr::from((Ipv6Addr::UNSPECIFIED, ECHO_PORT))).await
}

/// `len` bytes from `from` to `dst` come back byte-exact.
async fn byte_exact(from: &NsThread, dst: SocketAddr, len: usize, seed: u64) {
    let data = Arc::new(pattern(len, seed));
    let back = from
        .run("round trip", STEP, echo_round_trip(dst, data.clone()))
        .await
        .unwrap_or_else(|e| panic!("{dst}: {e}"));
    assert_eq!(back.len(), data.len(), "{dst}: echoed length");
    assert!(back == *data, "{dst}: echoed bytes differ");
}

/// `[::]` for the node listeners.
fn listening_on_both(mut cfg: tidegate::config::Config) -> tidegate::config::Config {
    cfg.listeners.outbound = SocketAddr::from((Ipv6Addr::UNSPECIFIED, OUTBOUND_PORT));
    cfg.listeners.inbound = SocketAddr::from((Ipv6Addr::UNSPECIFIED, HBONE_PORT));
    cfg
}

async fn node_mode(k: u8, stack: Stack) {
    if skip() || tidegate_e2e::netns::tool_missing("ip6tables", "--version") {
        return;
    }
    tidegate_e2e::init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let t = V6Topology::new(k, stack);
    let _guard = t.build();
    t.node_capture();
    let workloads = dir.path().join("workloads.yaml");
    std::fs::write(&workloads, t.workloads()).unwrap();
    let ca = dir.path().join("ca");
    let cfg = |node| listening_on_both(gateway_config(node, &ca, &workloads, ""));
    let gw_a = Gateway::start("A", &t.na, cfg("node-a")).await;
    let gw_b = Gateway::start("B", &t.nb, cfg("node-b")).await;
    assert!(gw_a.addrs.outbound.unwrap().is_ipv6(), "[::] bound");
    let pod_b = NsThread::idle(&t.pb);
    let peers = start_echo6(&pod_b).await;
    let pod_a = NsThread::idle(&t.pa);

    // 1. Pod A to pod B's IPv6 address: captured, carried over HBONE to
    // [pod B]:15008, byte-exact; node B delivered it.
    byte_exact(&pod_a, t.echo(), 1 << 20, 0x6a).await;
    assert_eq!(
        peers.lock().unwrap().last().map(|p| p.ip()),
        Some(IpAddr::V6(t.node_b_to_pod6())),
        "pod B must see the connection from node B: it bypassed the gateways"
    );
    // 2. The Service through each VIP: its endpoint has an IPv6 address only.
    for (i, vip) in t.vips().into_iter().enumerate() {
        byte_exact(&pod_a, vip, 64 << 10, 0x70 + i as u64).await;
    }
    let conns = 1.0 + t.vips().len() as f64;
    let a = gw_a
        .wait_metrics("every outbound stream ended ok", |m| {
            metric_or_zero(
                m,
                r#"tidegate_streams_ended_total{direction="outbound",reason="ok"}"#,
            ) == conns
        })
        .await;
    assert_eq!(
        metric(&a, "tidegate_pool_tunnels_opened_total"),
        1.0,
        "one tunnel to [pod B]:15008 carried all of them\n{a}"
    );
    let dump = gw_a.admin_ok("GET", "/config_dump").await;
    let text = dump.to_string();
    let hbone = format!("[{}]:{HBONE_PORT}", t.pod_b6());
    assert!(
        text.contains(&hbone),
        "the pool's tunnel is to {hbone}: {text}"
    );
    let b = gw_b
        .wait_metrics("every inbound stream ended ok", |m| {
            metric_or_zero(
                m,
                r#"tidegate_streams_ended_total{direction="inbound",reason="ok"}"#,
            ) == conns
        })
        .await;
    assert_eq!(
        metric_or_zero(&b, r#"tidegate_tls_handshakes_total{direction="inbound"}"#),
        1.0,
        "{b}"
    );
}

#[tokio::test]
async fn ipv6_node_mode_dual_stack_carries_ipv6_and_reaches_an_ipv6_only_endpoint() {
    node_mode(0, Stack::Dual).await;
}

#[tokio::test]
async fn ipv6_node_mode_ipv6_only_carries_hbone_over_ipv6() {
    node_mode(1, Stack::V6Only).await;
}

/// Authorization on IPv6 addresses, end to end: pod A to pod B's IPv6
/// address over HBONE, node B deciding. A DENY of pod B's IPv4 subnet does
/// not match the IPv6 connection (it is served); a DENY of its IPv6
/// subnet does (the CONNECT refused as `explicitly_denied`, pod A's
/// connection closed without its echo, pod B never reached).
#[tokio::test]
async fn ipv6_authorization_ranges_decide_on_the_connections_family() {
    if skip() || tidegate_e2e::netns::tool_missing("ip6tables", "--version") {
        return;
    }
    tidegate_e2e::init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let t = V6Topology::new(5, Stack::Dual);
    let _guard = t.build();
    t.node_capture();
    let deny = |range: String| {
        format!(
            "{}authorization:\n- {{name: no-range, namespace: demo, scope: namespace, action: deny, rules: [{{clauses: [{{matches: [{{destination_ips: ['{range}']}}]}}]}}]}}\n",
            t.workloads()
        )
    };
    let workloads = dir.path().join("workloads.yaml");
    std::fs::write(&workloads, deny(format!("{}/24", t.v4(2, 0)))).unwrap();
    let ca = dir.path().join("ca");
    let cfg = |node| listening_on_both(gateway_config(node, &ca, &workloads, ""));
    let _gw_a = Gateway::start("A", &t.na, cfg("node-a")).await;
    let gw_b = Gateway::start("B", &t.nb, cfg("node-b")).await;
    let pod_b = NsThread::idle(&t.pb);
    let peers = start_echo6(&pod_b).await;
    let pod_a = NsThread::idle(&t.pa);

    byte_exact(&pod_a, t.echo(), 4 << 10, 0xa1).await;
    let served = peers.lock().unwrap().len();
    assert_eq!(served, 1, "an IPv4 range does not match an IPv6 connection");

    let v6_range = format!("{}/64", t.v6(2, 0));
    tidegate_e2e::write_atomically(&workloads, &deny(v6_range.clone()));
    // Node B reads the file again on its change: the new range in its dump.
    tidegate_e2e::wait_for("node B holds the IPv6 range", STEP, || async {
        let dump = gw_b.admin_ok("GET", "/config_dump").await.to_string();
        dump.contains(&v6_range).then_some(())
    })
    .await;
    let data = Arc::new(pattern(1024, 0xa2));
    let refused = pod_a
        .run("round trip", STEP, echo_round_trip(t.echo(), data))
        .await;
    assert!(refused.is_err(), "denied, yet echoed: {refused:?}");
    let b = gw_b
        .wait_metrics("node B counts the refusal", |m| {
            metric_or_zero(
                m,
                r#"tidegate_authorization_denied_total{transport="hbone",reason="explicitly_denied"}"#,
            ) == 1.0
        })
        .await;
    assert_eq!(
        metric_or_zero(
            &b,
            r#"tidegate_authorization_denied_total{transport="hbone",reason="not_allowed"}"#
        ),
        0.0,
        "{b}"
    );
    assert_eq!(
        peers.lock().unwrap().len(),
        served,
        "no connection reached pod B once its IPv6 subnet is denied"
    );
}

/// A node's gateway in in-pod mode fed by its own ZDS double.
struct ZdsNode {
    gw: Gateway,
    double: ZdsDouble,
}

async fn zds_node(dir: &std::path::Path, ns: &str, node: &'static str) -> ZdsNode {
    let socket = dir.join(format!("{node}.zds.sock"));
    let mut double = ZdsDouble::bind(&socket).unwrap();
    double.probe_interval = Duration::from_millis(200);
    let extra = format!(
        "capture:\n  mode: inpod\n  zds_socket: {}\n",
        socket.display()
    );
    let cfg = gateway_config(node, &dir.join("ca"), &dir.join("workloads.yaml"), &extra);
    let gw = Gateway::start(node, ns, cfg).await;
    ZdsNode { gw, double }
}

fn pod(uid: &str, name: &str, sa: &str) -> PodSpec {
    PodSpec {
        uid: uid.into(),
        name: name.into(),
        namespace: "demo".into(),
        service_account: sa.into(),
    }
}

async fn inpod_mode(k: u8, stack: Stack) {
    if skip() || tidegate_e2e::netns::tool_missing("ip6tables", "--version") {
        return;
    }
    tidegate_e2e::init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let t = V6Topology::new(k, stack);
    let _guard = t.build();
    std::fs::write(dir.path().join("workloads.yaml"), t.workloads()).unwrap();
    let a = zds_node(dir.path(), &t.na, "node-a").await;
    let b = zds_node(dir.path(), &t.nb, "node-b").await;
    let fd = |ns: &str| {
        std::os::fd::OwnedFd::from(std::fs::File::open(InpodTopology::netns_path(ns)).unwrap())
    };
    let mut conns = Vec::new();
    for (node, uid, name, sa, ns) in [
        (&a, "pa-uid", "client", "client", &t.pa),
        (&b, "pb-uid", "echo", "echo", &t.pb),
    ] {
        let conn = tokio::time::timeout(STEP, node.double.accept())
            .await
            .expect("the gateway connects to the node agent")
            .expect("hello V1");
        conn.snapshot(vec![(pod(uid, name, sa), fd(ns))], &[])
            .await
            .expect("snapshot acked");
        t.inpod_capture(ns);
        conns.push(conn);
    }
    let pod_b = NsThread::idle(&t.pb);
    let peers = start_echo6(&pod_b).await;
    let pod_a = NsThread::idle(&t.pa);

    // Pod A to pod B's IPv6 address: captured in pod A ([::]:15001,
    // IP6T_SO_ORIGINAL_DST), HBONE from pod A to [pod B]:15008, delivered
    // in pod B from pod A's own IPv6 address.
    byte_exact(&pod_a, t.echo(), 1 << 20, 0x6b).await;
    assert_eq!(
        peers.lock().unwrap().last().map(|p| p.ip()),
        Some(IpAddr::V6(t.pod_a6())),
        "pod B's app sees pod A's own IPv6 address"
    );
    // The Service through each VIP: its only endpoint address is IPv6.
    for (i, vip) in t.vips().into_iter().enumerate() {
        byte_exact(&pod_a, vip, 64 << 10, 0x80 + i as u64).await;
        assert_eq!(
            peers.lock().unwrap().last().map(|p| p.ip()),
            Some(IpAddr::V6(t.pod_a6())),
            "{vip}: delivered from pod A's IPv6 address"
        );
    }
    let m = a.gw.metrics().await;
    assert_eq!(
        metric_or_zero(
            &m,
            r#"tidegate_streams_ended_total{direction="outbound",reason="ok"}"#
        ),
        1.0 + t.vips().len() as f64,
        "{m}"
    );
    drop(conns);
}

#[tokio::test]
async fn ipv6_inpod_dual_stack_keeps_the_clients_ipv6_address() {
    inpod_mode(2, Stack::Dual).await;
}

#[tokio::test]
async fn ipv6_inpod_ipv6_only_keeps_the_clients_address_and_reaches_the_service() {
    inpod_mode(3, Stack::V6Only).await;
}

/// Pods whose namespace has IPv6 off (`disable_ipv6=1`, no `::1`) are
/// served on IPv4 by the same `[::]` listeners: captured (the original
/// destination read as IPv4 from a dual-stack socket), tunneled, and
/// delivered from the client's own IPv4 address; no pod refused.
#[tokio::test]
async fn ipv6_inpod_pods_without_ipv6_are_served_on_ipv4() {
    if skip() {
        return;
    }
    tidegate_e2e::init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let t = V6Topology::new(4, Stack::Dual);
    let _guard = t.build();
    for ns in [&t.pa, &t.pb] {
        for key in ["all", "default", "lo", "eth0"] {
            run(&format!(
                "ip netns exec {ns} sysctl -q -w net.ipv6.conf.{key}.disable_ipv6=1"
            ));
        }
        let out = Command::new("ip")
            .args(["-n", ns, "-6", "addr", "show"])
            .output()
            .unwrap();
        assert!(out.stdout.is_empty(), "{ns} still has IPv6 addresses");
    }
    let (a4, b4) = (t.v4(1, 2), t.v4(2, 2));
    std::fs::write(
        dir.path().join("workloads.yaml"),
        format!(
            "workloads:\n\
             - {{uid: pa-uid, name: client, namespace: demo, service_account: client, ips: [{a4}], node: node-a}}\n\
             - {{uid: pb-uid, name: echo, namespace: demo, service_account: echo, ips: [{b4}], node: node-b}}\n"
        ),
    )
    .unwrap();
    let a = zds_node(dir.path(), &t.na, "node-a").await;
    let b = zds_node(dir.path(), &t.nb, "node-b").await;
    let mut conns = Vec::new();
    for (node, node_ns, uid, name, sa, ns) in [
        (&a, &t.na, "pa-uid", "client", "client", &t.pa),
        (&b, &t.nb, "pb-uid", "echo", "echo", &t.pb),
    ] {
        let conn = tokio::time::timeout(STEP, node.double.accept())
            .await
            .expect("the gateway connects to the node agent")
            .expect("hello V1");
        let netns =
            std::os::fd::OwnedFd::from(std::fs::File::open(InpodTopology::netns_path(ns)).unwrap());
        conn.snapshot(vec![(pod(uid, name, sa), netns)], &[])
            .await
            .expect("snapshot acked: a pod without IPv6 is taken");
        let path = InpodTopology::netns_path(ns);
        NsThread::idle(node_ns)
            .run("istio-cni's IPv4 rules", STEP, async move {
                tidegate_netns::capture::install(
                    std::path::Path::new(&path),
                    tidegate_netns::capture::CapturePorts::default(),
                )
            })
            .await
            .expect("rules installed");
        conns.push(conn);
    }
    let pod_b = NsThread::idle(&t.pb);
    let peers = start_echo6(&pod_b).await;
    let pod_a = NsThread::idle(&t.pa);
    byte_exact(
        &pod_a,
        SocketAddr::new(b4.into(), ECHO_PORT),
        256 << 10,
        0x90,
    )
    .await;
    let peer = peers.lock().unwrap().last().copied().expect("a connection");
    assert_eq!(
        peer.ip().to_canonical(),
        IpAddr::V4(a4),
        "delivered from pod A's own IPv4 address"
    );
    let m = b.gw.metrics().await;
    assert_eq!(
        metric_or_zero(
            &m,
            r#"tidegate_streams_ended_total{direction="inbound",reason="ok"}"#
        ),
        1.0,
        "{m}"
    );
    assert_eq!(metric(&m, "tidegate_inpod_pods"), 1.0, "{m}");
    drop(conns);
}
