//! The DNS proxy on 15053 inside captured pods, end to end: pods enrolled
//! by `tidegate-cni`, istio-cni's DNS redirect (port 53, UDP and TCP, not
//! the mesh mark → 15053) installed in them as istio-cni does with DNS
//! capture on, a fake upstream server in node A's namespace. A pod asks
//! "its nameserver" on port 53 and the gateway answers.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use tidegate_e2e::dns_double::{self, addresses, ask_tcp, ask_udp, query, Seen};
use tidegate_e2e::inpod::InpodTopology;
use tidegate_e2e::metric_or_zero;
use tidegate_e2e::netns::{run, NsThread, STEP};
use tokio::sync::mpsc;

use super::*;

/// The workload file of these tests: pod C a mesh member too, and the
/// Service `web.demo` (VIP 10.X.135.10, pod B behind it).
fn workloads_with_a_service(t: &InpodTopology) -> String {
    format!(
        r#"workloads:
- {{uid: {CLIENT_UID}, name: client, namespace: demo, service_account: client, ips: [{a}], node: node-a}}
- {{uid: {SERVER_UID}, name: echo, namespace: demo, service_account: echo, ips: [{b}], node: node-b, services: [web]}}
- {{uid: pc-uid, name: legacy, namespace: demo, service_account: legacy, ips: [{c}], node: node-a}}
services:
- {{name: web, namespace: demo, vips: [{vip}], ports: [{{port: 80, target_port: 8080}}]}}
"#,
        a = t.pod_a(),
        b = t.pod_b(),
        c = t.pod_c(),
        vip = web_vip(t),
    )
}

fn web_vip(t: &InpodTopology) -> Ipv4Addr {
    t.addr(135, 10)
}

/// The fake upstream server: on node A's loopback, reached from the pods
/// through their default route.
fn upstream(t: &InpodTopology) -> SocketAddr {
    SocketAddr::new(t.addr(134, 53).into(), 53)
}

/// What the pods take for their nameserver: the fake upstream too, so a
/// query that bypassed the proxy would be answered by it (and not know
/// `web.demo.svc.cluster.local`).
fn nameserver(t: &InpodTopology) -> SocketAddr {
    upstream(t)
}

fn outside(t: &InpodTopology) -> Ipv4Addr {
    t.addr(135, 7)
}

/// istio-cni's DNS redirect inside pod `ns` (its rules 6 and 7), ahead of
/// the capture rules `tidegate-cni` installed.
pub(crate) fn redirect_dns(ns: &str) {
    run(&format!(
        "ip netns exec {ns} iptables -t nat -I ISTIO_OUTPUT 1 ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-port 15053"
    ));
    run(&format!(
        "ip netns exec {ns} iptables -t nat -I ISTIO_OUTPUT 2 ! -d 127.0.0.1/32 -p tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053"
    ));
}

/// Node A's gateway with `dns` settings, the upstream double in node A,
/// pods A and C enrolled with the DNS redirect.
async fn start(k: u8, dns: &str) -> (Scenario, mpsc::UnboundedReceiver<Seen>) {
    start_to(k, dns, upstream).await
}

/// [`start`], with `dns.upstream` at `to` (the double still at [`upstream`]).
async fn start_to(
    k: u8,
    dns: &str,
    to: fn(&InpodTopology) -> SocketAddr,
) -> (Scenario, mpsc::UnboundedReceiver<Seen>) {
    let t = InpodTopology::new("ip", k);
    let yaml = workloads_with_a_service(&t);
    let extra = format!("dns:\n{dns}  upstream: [{}]\n", to(&t));
    let s = Scenario::start_with_both(
        k,
        |a| {
            // The scenario's workload file, replaced before the gateways start.
            let dir = a.socket.parent().unwrap();
            std::fs::write(dir.join("workloads.yaml"), &yaml).unwrap();
            a.extra = extra;
        },
        |_| {},
    )
    .await;
    run(&format!(
        "ip -n {} addr add {}/32 dev lo",
        s.t.na,
        upstream(&s.t).ip()
    ));
    let (addr, table) = (
        upstream(&s.t),
        HashMap::from([
            ("outside.example.".to_owned(), vec![outside(&s.t)]),
            ("tcp.example.".to_owned(), vec![outside(&s.t)]),
        ]),
    );
    let seen =
        s.a.shell
            .run("the upstream DNS double", STEP, async move {
                dns_double::serve(addr, table).await
            })
            .await;
    // Pod C has no IPv6 (nothing on its loopback but 127.0.0.1).
    run(&format!(
        "ip netns exec {} sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.lo.disable_ipv6=1",
        s.t.pc
    ));
    for (pod, ip, ns) in [
        (pa_pod(&s.t), s.t.pod_a(), s.t.pa.clone()),
        (pc_pod(&s.t), s.t.pod_c(), s.t.pc.clone()),
    ] {
        ok("ADD", &s.a.cni("ADD", pod, ip.into()).await);
        redirect_dns(&ns);
    }
    (s, seen)
}

/// Whether namespace `ns` has ::1 on its loopback.
fn has_ipv6_loopback(ns: &str) -> bool {
    let out = std::process::Command::new("ip")
        .args(["-n", ns, "-6", "addr", "show", "dev", "lo"])
        .output()
        .expect("run ip");
    String::from_utf8_lossy(&out.stdout).contains("::1/128")
}

/// Listening UDP sockets on `port` in namespace `ns` (`ss -lunH`).
fn udp_listeners(ns: &str, port: u16) -> usize {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-lunH"])
        .arg(format!("sport = :{port}"))
        .output()
        .expect("run ss");
    assert!(out.status.success(), "ss in {ns}");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

fn dns_queries(m: &str, source: &str, rcode: &str, protocol: &str) -> f64 {
    metric_or_zero(
        m,
        &format!(
            r#"tidegate_dns_queries_total{{source="{source}",rcode="{rcode}",protocol="{protocol}"}}"#
        ),
    )
}

/// A query from `pod` to its nameserver (port 53, redirected to 15053).
async fn ask(
    pod: &NsThread,
    server: SocketAddr,
    name: &str,
    tcp: bool,
) -> hickory_proto::op::Message {
    let q = query(name);
    let what = format!("{name} over {}", if tcp { "TCP" } else { "UDP" });
    let m = pod
        .run(&what, STEP, async move {
            if tcp {
                ask_tcp(server, &q).await
            } else {
                ask_udp(server, &q).await
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    m
}

#[tokio::test]
async fn inpod_dns_a_pod_resolves_services_from_the_store_and_the_rest_upstream() {
    if skip() {
        return;
    }
    let (s, mut seen) = start(10, "").await;
    let ns = nameserver(&s.t);
    // 127.0.0.1 and ::1 (a host without IPv6 gives its pods none).
    let v6 = has_ipv6_loopback(&s.t.pa);
    let families = 1 + usize::from(v6);
    assert_eq!(listeners(&s.t.pa, 15053), families, "TCP 15053 in pod A");
    assert_eq!(
        udp_listeners(&s.t.pa, 15053),
        families,
        "UDP 15053 in pod A"
    );
    // Pod C, without IPv6, is served on 127.0.0.1 alone.
    assert!(!has_ipv6_loopback(&s.t.pc));
    assert_eq!(listeners(&s.t.pc, 15053), 1, "TCP 15053 in pod C");
    assert_eq!(udp_listeners(&s.t.pc, 15053), 1, "UDP 15053 in pod C");
    let vip = web_vip(&s.t);
    // A Service: by its full name, and by the short names a pod of its
    // namespace uses — answered by the proxy (the upstream has never
    // heard of it).
    for (name, tcp) in [
        ("web.demo.svc.cluster.local.", false),
        ("web.", false),
        ("web.demo.", false),
        ("web.demo.svc.cluster.local.", true),
    ] {
        let m = ask(&s.pa, ns, name, tcp).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{name}");
        assert!(m.metadata.authoritative, "{name}: answered by the proxy");
        assert_eq!(addresses(&m), [vip], "{name}");
    }
    // A stub resolver's first search expansion of `web.demo` from pod A
    // (namespace demo): a CNAME to `web.demo.` and its address, at once.
    let m = ask(&s.pa, ns, "web.demo.demo.svc.cluster.local.", false).await;
    assert_eq!(addresses(&m), [vip]);
    assert_eq!(m.answers[0].data.to_string(), "web.demo.");
    // Outside names: forwarded from pod A, with the mesh mark (the
    // redirect lets it through to the upstream), over UDP and TCP.
    for (name, tcp) in [("outside.example.", false), ("tcp.example.", true)] {
        let m = ask(&s.pa, ns, name, tcp).await;
        assert_eq!(addresses(&m), [outside(&s.t)]);
        assert!(!m.metadata.authoritative);
        let got = seen.recv().await.unwrap();
        assert_eq!(got.name, name);
        assert_eq!(got.tcp, tcp);
        assert_eq!(
            got.from.ip(),
            IpAddr::from(s.t.pod_a()),
            "forwarded from pod A's own namespace"
        );
    }
    // Asked again, over UDP and TCP: from pod A's cache. The double
    // reports a query before it answers, so one asked would be seen.
    for tcp in [false, true] {
        let m = ask(&s.pa, ns, "outside.example.", tcp).await;
        assert_eq!(addresses(&m), [outside(&s.t)]);
        assert!(
            m.answers[0].ttl <= 5,
            "the double's TTL, less the time held"
        );
    }
    assert!(seen.try_recv().is_err(), "the upstream was not asked again");
    let m = ask(&s.pa, ns, "nowhere.example.", false).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(seen.recv().await.unwrap().name, "nowhere.example.");
    let m = s.gw_a.metrics().await;
    assert_eq!(dns_queries(&m, "store", "noerror", "udp"), 4.0, "{m}");
    assert_eq!(dns_queries(&m, "store", "noerror", "tcp"), 1.0, "{m}");
    assert_eq!(dns_queries(&m, "forwarded", "noerror", "udp"), 2.0, "{m}");
    assert_eq!(dns_queries(&m, "forwarded", "noerror", "tcp"), 2.0, "{m}");
    assert_eq!(dns_queries(&m, "forwarded", "nxdomain", "udp"), 1.0, "{m}");
    assert_eq!(
        tidegate_e2e::metric(&m, "tidegate_dns_cache_hits_total"),
        2.0,
        "{m}"
    );
    // The double's NXDOMAIN has no SOA: not kept (RFC 2308).
    assert_eq!(
        metric_or_zero(
            &m,
            r#"tidegate_dns_cache_not_stored_total{reason="no_soa"}"#
        ),
        1.0,
        "{m}"
    );
    // What an IPv6 query redirected in the pod reaches: [::1]:15053, UDP
    // and TCP, answered from the store (the answer from ::1, where the
    // resolver asked: `ask_udp` refuses any other source).
    if v6 {
        let at = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 15053));
        for tcp in [false, true] {
            let m = ask(&s.pa, at, "web.demo.svc.cluster.local.", tcp).await;
            assert!(m.metadata.authoritative, "answered by the proxy");
            assert_eq!(addresses(&m), [vip], "over [::1], tcp: {tcp}");
        }
    }
    // Pod A removed: its DNS listeners close with the others.
    ok(
        "DEL pod A",
        &s.a.cni("DEL", pa_pod(&s.t), s.t.pod_a().into()).await,
    );
    assert_eq!(listeners(&s.t.pa, 15053), 0);
    assert_eq!(udp_listeners(&s.t.pa, 15053), 0);
    // Pod C's are still there.
    assert_eq!(udp_listeners(&s.t.pc, 15053), 1);
    assert_eq!(listeners(&s.t.pc, 15053), 1);
    assert_eq!(addresses(&ask(&s.pc, ns, "web.", false).await), [vip]);
}

/// A pod flooding names its upstream never answers holds its share of
/// forwards in flight and is refused past it; the store keeps answering it,
/// and another pod on the node is answered, store and upstream alike.
#[tokio::test]
async fn inpod_dns_a_query_flood_leaves_store_answers_and_other_pods_answered() {
    if skip() {
        return;
    }
    const SHARE: usize = 4;
    const FLOOD: usize = 200;
    let dns = format!("  timeout: 30s\n  max_in_flight_per_pod: {SHARE}\n");
    let (s, mut seen) = start(11, &dns).await;
    let ns = nameserver(&s.t);
    // The flood: one socket, names that never come back.
    let flood =
        s.pa.run("the flood", STEP, async move {
            let c = tokio::net::UdpSocket::bind("0.0.0.0:0").await.unwrap();
            for i in 0..FLOOD {
                let q = query(&format!("n{i}.blackhole."));
                c.send_to(&q.to_vec().unwrap(), ns).await.unwrap();
            }
            c
        })
        .await;
    for _ in 0..SHARE {
        assert!(seen.recv().await.unwrap().name.ends_with("blackhole."));
    }
    let refused = |m: &str| metric_or_zero(m, r#"tidegate_dns_refused_total{limit="pod"}"#);
    let m = s
        .gw_a
        .wait_metrics("the flood refused past pod A's share", |m| {
            refused(m) == (FLOOD - SHARE) as f64
        })
        .await;
    assert_eq!(
        tidegate_e2e::metric(&m, "tidegate_dns_forwards_in_flight"),
        SHARE as f64,
        "{m}"
    );
    let vip = web_vip(&s.t);
    // Under the flood: the store answers pod A; pod C gets the store and
    // the upstream.
    assert_eq!(addresses(&ask(&s.pa, ns, "web.", false).await), [vip]);
    assert_eq!(addresses(&ask(&s.pc, ns, "web.", true).await), [vip]);
    let m = ask(&s.pc, ns, "outside.example.", false).await;
    assert_eq!(addresses(&m), [outside(&s.t)]);
    let got = seen.recv().await.unwrap();
    assert_eq!(
        (got.name.as_str(), got.from.ip()),
        ("outside.example.", IpAddr::from(s.t.pod_c()))
    );
    // Pod A past its share asks an outside name: refused, not queued.
    let m = ask(&s.pa, ns, "outside.example.", false).await;
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);
    let m = s.gw_a.metrics().await;
    assert_eq!(
        tidegate_e2e::metric(&m, "tidegate_dns_forwards_in_flight"),
        SHARE as f64,
        "the flood was still in flight through all of it\n{m}"
    );
    // What the flooding socket got back: REFUSED for all but its share.
    let refusals =
        s.pa.run("the flood's answers", STEP, async move {
            let mut buf = vec![0u8; 65_535];
            let mut n = 0;
            while n < FLOOD - SHARE {
                let len = flood.recv(&mut buf).await.unwrap();
                let m = hickory_proto::op::Message::from_vec(&buf[..len]).unwrap();
                assert_eq!(m.metadata.response_code, ResponseCode::Refused);
                n += 1;
            }
            n
        })
        .await;
    assert_eq!(refusals, FLOOD - SHARE);
    // Pod A removed: its forwards in flight end with its listeners.
    ok(
        "DEL pod A",
        &s.a.cni("DEL", pa_pod(&s.t), s.t.pod_a().into()).await,
    );
    s.gw_a
        .wait_metrics_within("pod A's forwards ended", Duration::from_secs(10), |m| {
            tidegate_e2e::metric(m, "tidegate_dns_forwards_in_flight") == 0.0
        })
        .await;
}

/// A resolver in pod C (a captured pod) that sends every query on, id and
/// all, to its nameserver; pod C's port 53 is redirected to its 15053.
fn relay_in_pod_c(t: &InpodTopology) -> SocketAddr {
    SocketAddr::new(t.pod_c().into(), 53)
}

/// `dns.upstream` is a resolver in a captured pod of the node, which sends
/// each query on to its own nameserver: redirected to that pod's 15053, the
/// query comes back to the proxy that sent it. Forwarded once more, marked
/// (a pod's query may draw the id of one in flight), it comes back again
/// and is answered SERVFAIL there at once: the pod asking gets SERVFAIL
/// after two rounds, not after the in-flight cap's 65 forwards; the
/// gateway says so.
#[tokio::test]
async fn inpod_dns_a_query_that_loops_back_through_a_captured_pod_ends_in_two_rounds() {
    if skip() {
        return;
    }
    let (s, mut seen) = start_to(12, "", relay_in_pod_c).await;
    let (at, to) = (relay_in_pod_c(&s.t), nameserver(&s.t));
    let mut relayed =
        s.pc.run("the relay in pod C", STEP, async move {
            dns_double::relay(at, to).await
        })
        .await;
    let m = ask(&s.pa, nameserver(&s.t), "loop.example.", false).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    for _ in 0..2 {
        assert_eq!(relayed.recv().await.unwrap(), "loop.example.");
    }
    assert!(relayed.try_recv().is_err(), "relayed twice, not again");
    assert!(
        seen.try_recv().is_err(),
        "the loop never reached the double"
    );
    let m = s
        .gw_a
        .wait_metrics("the loop counted", |m| {
            metric_or_zero(m, r#"tidegate_dns_forward_failures_total{reason="loop"}"#) == 1.0
        })
        .await;
    assert_eq!(
        tidegate_e2e::metric(&m, "tidegate_dns_forwards_in_flight"),
        0.0,
        "{m}"
    );
    // The pods' store names are still answered.
    for pod in [&s.pa, &s.pc] {
        let m = ask(pod, nameserver(&s.t), "web.", false).await;
        assert_eq!(addresses(&m), [web_vip(&s.t)]);
    }
}

const TCP_FLOOD_CHILD: &str = "TIDEGATE_TEST_INPOD_DNS_TCP_FLOOD";

/// At an open-file limit of 2,048, pod C opens 1,500 idle TCP connections
/// to its nameserver (15053) — within its own bound, raised for the test:
/// the node-wide bound, inside the pods' descriptor share, holds what the
/// budget gives the DNS proxy and closes the rest at accept, so pod A's
/// connections to pod B (an inbound tunnel at node B's gateway, in this
/// same process) go on, the workload file is read again, and the store
/// still answers. Before the bound, 24 pods' idle connections took the
/// descriptors an inbound peer's tunnels needed (EMFILE). The limit is the
/// whole process's, so this runs in a child process.
#[tokio::test]
async fn inpod_dns_idle_tcp_connections_stay_inside_the_pods_share() {
    if skip() {
        return;
    }
    if tidegate_e2e::rerun::is_child(TCP_FLOOD_CHILD) {
        return tcp_flood().await;
    }
    tidegate_e2e::rerun::alone(
        "inpod::dns::inpod_dns_idle_tcp_connections_stay_inside_the_pods_share",
        TCP_FLOOD_CHILD,
        "child: DNS TCP flood held inside the pods' share",
    );
}

async fn tcp_flood() {
    const FLOOD: usize = 1_500;
    rlimit::setrlimit(rlimit::Resource::NOFILE, 2_048, 2_048).unwrap();
    let (s, _seen) = start(
        13,
        "  timeout: 30s\n  max_tcp_connections_per_pod: 100000\n",
    )
    .await;
    let ns = nameserver(&s.t);
    let dump = s.gw_a.admin_ok("GET", "/config_dump").await;
    let bound = dump["descriptors"]["dns_tcp"].as_u64().unwrap() as usize;
    assert!(
        (1..FLOOD / 10).contains(&bound),
        "the DNS proxy's TCP bound at this limit: {}",
        dump["descriptors"]
    );
    ok(
        "ADD pod B",
        &s.b.cni("ADD", pb_pod(&s.t), s.t.pod_b().into()).await,
    );
    ten_round_trips(&s, 200).await;
    // The flood: each connection asks once; those the gateway keeps are
    // answered and held idle, the rest are closed at accept.
    let held =
        s.pc.run("the flood", Duration::from_secs(120), async move {
            let mut held = Vec::new();
            let q = query("web.").to_vec().unwrap();
            for _ in 0..FLOOD {
                let Ok(mut c) = tokio::net::TcpStream::connect(ns).await else {
                    continue;
                };
                let mut framed = (q.len() as u16).to_be_bytes().to_vec();
                framed.extend_from_slice(&q);
                let answered = tokio::time::timeout(STEP, async {
                    c.write_all(&framed).await?;
                    let len = c.read_u16().await?;
                    let mut r = vec![0u8; len.into()];
                    c.read_exact(&mut r).await
                })
                .await;
                if matches!(answered, Ok(Ok(_))) {
                    held.push(c.into_std().unwrap());
                }
            }
            held
        })
        .await;
    let refused = |m: &str| metric_or_zero(m, r#"tidegate_dns_refused_total{limit="gateway_tcp"}"#);
    let m = s
        .gw_a
        .wait_metrics("every connection past the bound closed", |m| {
            refused(m) == (FLOOD - bound) as f64
        })
        .await;
    assert_eq!(held.len(), bound);
    assert_eq!(
        tidegate_e2e::metric(&m, "tidegate_dns_tcp_connections"),
        bound as f64,
        "{m}"
    );
    // While they are held: pod A reaches pod B through a new inbound
    // tunnel's streams, the store answers, and the workload file is read.
    ten_round_trips(&s, 220).await;
    let vip = web_vip(&s.t);
    assert_eq!(addresses(&ask(&s.pa, ns, "web.", false).await), [vip]);
    assert_eq!(addresses(&ask(&s.pc, ns, "web.", false).await), [vip]);
    // Over TCP the node-wide bound is full: another pod's connection is
    // closed at accept too (each pod's own bound, 16 by default, keeps one
    // pod from filling it alone).
    let q = query("web.");
    let tcp =
        s.pa.run("pod A over TCP", STEP, async move { ask_tcp(ns, &q).await })
            .await;
    assert!(tcp.is_err(), "{tcp:?}");
    s.gw_a
        .wait_metrics("pod A's TCP connection closed at accept", |m| {
            refused(m) == (FLOOD - bound + 1) as f64
        })
        .await;
    let file = s.dir.path().join("workloads.yaml");
    let mut yaml = std::fs::read_to_string(&file).unwrap();
    yaml = yaml.replacen(
        "\nservices:",
        &format!(
            "\n- {{uid: late-uid, name: late, namespace: demo, service_account: late, ips: [{}], node: node-b}}\nservices:",
            s.t.addr(2, 9)
        ),
        1,
    );
    tidegate_e2e::write_atomically(&file, &yaml);
    tidegate_e2e::wait_for("the workload file read again", STEP, || async {
        let dump = s.gw_a.admin_ok("GET", "/config_dump").await;
        dump["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["uid"] == "late-uid")
            .then_some(())
    })
    .await;
    for gw in [&s.gw_a, &s.gw_b] {
        let m = gw.metrics().await;
        for l in m.lines().filter(|l| {
            l.starts_with("tidegate_workload_file_rejected_total")
                || l.starts_with("tidegate_inbound_limit_refusals_total")
        }) {
            assert!(l.ends_with(" 0"), "{}: {l}", gw.name);
        }
    }
    drop(held);
    println!(
        "child: DNS TCP flood held inside the pods' share ({bound} held, {} closed at accept)",
        FLOOD - bound
    );
}
