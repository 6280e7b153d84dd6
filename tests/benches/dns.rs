//! DNS proxy benchmark: a program that prints figures, not a timed test.
//!
//! ```text
//! cargo bench --profile dev -p tidegate-e2e --bench dns
//! ```
//!
//! Node A's gateway in `capture.mode: inpod` in a network namespace, pod A
//! enrolled by the real `tidegate-cni` ADD, istio-cni's DNS redirect (port
//! 53, UDP and TCP, not the mesh mark → 15053) installed in pod A as
//! istio-cni does with DNS capture on, the upstream DNS double
//! (`tidegate_e2e::dns_double`) on node A at 10.139.134.53:53. A client in
//! pod A keeps 16 A queries outstanding over one UDP socket until 20,000
//! were answered, on each of:
//!
//! - **store via 15053**: `web.demo.svc.cluster.local.` to port 53 of the
//!   upstream's address, redirected to the pod's 15053, answered by the
//!   proxy from the workload store;
//! - **forwarded via 15053, cached**: `outside.example.` (TTL 5) the same
//!   way: forwarded by the proxy from pod A's namespace to the double once,
//!   then answered from pod A's cache until the TTL runs out (one forward
//!   each 5 s);
//! - **forwarded via 15053, TTL 0**: `outside.nocache.`, which the double
//!   answers with TTL 0, so no cache keeps it: every query forwarded (a new
//!   marked socket per query) and its reply relayed — the proxy without a
//!   cache, in the same run;
//! - **direct**, the baseline: the same three queries straight to the
//!   double from the same pod, on a socket carrying the mesh mark so the
//!   redirect lets it through (the double knows every name).
//!
//! The client accepts a reply from any source, as the DNS e2e tests do:
//! the proxy's replies leave from the pod's address and port 15053, not
//! from the address asked (the bench prints it when so), and a client that
//! checks the source (a connected socket) never sees them. Each client
//! socket has a port of its own below the ephemeral range
//! ([`client_port`]).
//!
//! Queries per second and the p50 / p99 of each query's round trip; five
//! interleaved rounds, medians, and the ratios to the direct path of the
//! same name. The gateway runs on one thread (a current-thread runtime, as
//! every in-process gateway of the netns harness), beside the client's and
//! the double's, on what cores the machine has. Every loop is bounded;
//! the run takes well under a minute. Needs root, `ip` and `iptables`;
//! skipped with a note otherwise.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use tidegate_e2e::cni::{inpod_conf, CniPod};
use tidegate_e2e::dns_double::{self, addresses, ask_udp, query};
use tidegate_e2e::inpod::InpodTopology;
use tidegate_e2e::measure::{median, pct};
use tidegate_e2e::netns::{gateway_config, run, tool_missing, Gateway, NsThread, STEP};

/// Queries per path and round, unless `DNS_QUERIES` (1 to 65,536: one
/// query id each) says otherwise.
const QUERIES: usize = 20_000;
/// Queries outstanding at once.
const WINDOW: usize = 16;
const ROUNDS: usize = 5;
/// The second octet of every address: 10.139.*.*.
const OCTET: u8 = 139;
/// A reply not come within this is counted lost (its window slot freed).
const LOST_AFTER: Duration = Duration::from_millis(500);
const MESH_MARK: u32 = 0x539;

const SERVICE: &str = "web.demo.svc.cluster.local.";
const OUTSIDE: &str = "outside.example.";
/// Answered with TTL 0 by the double: never cached.
const NOCACHE: &str = "outside.nocache.";

fn vip(t: &InpodTopology) -> Ipv4Addr {
    t.addr(135, 10)
}

fn outside(t: &InpodTopology) -> Ipv4Addr {
    t.addr(135, 7)
}

/// The upstream double, on node A's loopback, reached from the pod through
/// its default route; also the pod's nameserver.
fn upstream(t: &InpodTopology) -> SocketAddr {
    SocketAddr::new(t.addr(134, 53).into(), 53)
}

fn workloads(t: &InpodTopology) -> String {
    format!(
        r#"workloads:
- {{uid: pa-uid, name: client, namespace: demo, service_account: client, ips: [{a}], node: node-a}}
- {{uid: pb-uid, name: echo, namespace: demo, service_account: echo, ips: [{b}], node: node-b, services: [web]}}
services:
- {{name: web, namespace: demo, vips: [{vip}], ports: [{{port: 80, target_port: 8080}}]}}
"#,
        a = t.pod_a(),
        b = t.pod_b(),
        vip = vip(t),
    )
}

/// istio-cni's DNS redirect inside pod `ns` (its rules 6 and 7), ahead of
/// the capture rules `tidegate-cni` installed.
fn redirect_dns(ns: &str) {
    run(&format!(
        "ip netns exec {ns} iptables -t nat -I ISTIO_OUTPUT 1 ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 -j REDIRECT --to-port 15053"
    ));
    run(&format!(
        "ip netns exec {ns} iptables -t nat -I ISTIO_OUTPUT 2 ! -d 127.0.0.1/32 -p tcp --dport 53 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15053"
    ));
}

/// One path's figures in one round.
#[derive(Clone, Debug)]
struct Figures {
    qps: f64,
    p50_us: f64,
    p99_us: f64,
    lost: usize,
    /// Replies that were not NOERROR with an answer.
    bad: usize,
    /// A reply's source when it was not the address asked.
    other_source: Option<SocketAddr>,
}

/// `queries` queries for `name` to `server` from the calling thread's
/// namespace, `WINDOW` outstanding, over one UDP socket bound to `port`
/// (with `mark`, when given), accepting replies from any source.
async fn load(
    server: SocketAddr,
    name: &'static str,
    mark: Option<u32>,
    port: u16,
    queries: usize,
) -> Result<Figures, String> {
    let e = |what: &'static str| move |err: std::io::Error| format!("{what}: {err}");
    let s = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )
    .map_err(e("socket"))?;
    if let Some(mark) = mark {
        s.set_mark(mark).map_err(e("SO_MARK"))?;
    }
    s.bind(&SocketAddr::from(([0, 0, 0, 0], port)).into())
        .map_err(e("bind"))?;
    s.set_nonblocking(true).map_err(e("nonblocking"))?;
    let sock = tokio::net::UdpSocket::from_std(s.into()).map_err(e("register"))?;
    let mut q = query(name).to_vec().map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 4096];
    let mut sent_at: Vec<Option<Instant>> = vec![None; queries];
    let mut lat = Vec::with_capacity(queries);
    let (mut next, mut outstanding, mut lost, mut bad) = (0usize, 0usize, 0usize, 0usize);
    let mut other_source = None;
    let started = Instant::now();
    // The last reply: a query lost at the end does not add its wait.
    let mut last = started;
    loop {
        while outstanding < WINDOW && next < queries {
            q[..2].copy_from_slice(&(next as u16).to_be_bytes());
            sent_at[next] = Some(Instant::now());
            sock.send_to(&q, server).await.map_err(e("send"))?;
            next += 1;
            outstanding += 1;
        }
        if outstanding == 0 {
            break;
        }
        match tokio::time::timeout(LOST_AFTER, sock.recv_from(&mut buf)).await {
            Err(_) => {
                lost += outstanding;
                outstanding = 0;
                for at in &mut sent_at[..next] {
                    *at = None;
                }
            }
            Ok(Err(err)) => return Err(format!("receive from {server}: {err}")),
            Ok(Ok((n, _))) if n < 12 => bad += 1,
            Ok(Ok((_, from))) => {
                if from != server {
                    other_source = Some(from);
                }
                let id = u16::from_be_bytes([buf[0], buf[1]]) as usize;
                let Some(at) = sent_at.get_mut(id).and_then(Option::take) else {
                    continue;
                };
                last = Instant::now();
                lat.push(last - at);
                outstanding -= 1;
                let rcode = buf[3] & 0x0f;
                let answers = u16::from_be_bytes([buf[6], buf[7]]);
                if rcode != 0 || answers == 0 {
                    bad += 1;
                }
            }
        }
    }
    let secs = (last - started).as_secs_f64();
    lat.sort();
    Ok(Figures {
        qps: lat.len() as f64 / secs,
        p50_us: pct(&lat, 0.5),
        p99_us: pct(&lat, 0.99),
        lost,
        bad,
        other_source,
    })
}

/// The client's port for path `i` in `round`: below the ephemeral range,
/// and a new one each time. A UDP flow's NAT is decided by its first
/// packet, and the pod's conntrack keeps flows for seconds: a client on an
/// ephemeral port could take one the proxy's forwards just used (no NAT,
/// so its queries would go straight upstream), or a direct client one a
/// redirected client used.
fn client_port(round: usize, i: usize) -> u16 {
    20_000 + (round * PATHS.len() + i) as u16
}

struct Path {
    what: &'static str,
    name: &'static str,
    mark: Option<u32>,
    /// The index of the direct path this one is compared to.
    base: usize,
}

const PATHS: [Path; 6] = [
    Path {
        what: "store via 15053",
        name: SERVICE,
        mark: None,
        base: 3,
    },
    Path {
        what: "forwarded via 15053, cached",
        name: OUTSIDE,
        mark: None,
        base: 4,
    },
    Path {
        what: "forwarded via 15053, TTL 0",
        name: NOCACHE,
        mark: None,
        base: 5,
    },
    Path {
        what: "direct, Service name",
        name: SERVICE,
        mark: Some(MESH_MARK),
        base: 3,
    },
    Path {
        what: "direct, outside name",
        name: OUTSIDE,
        mark: Some(MESH_MARK),
        base: 4,
    },
    Path {
        what: "direct, TTL-0 name",
        name: NOCACHE,
        mark: Some(MESH_MARK),
        base: 5,
    },
];

fn queries_total(m: &str, source: &str) -> f64 {
    tidegate_e2e::metric_or_zero(
        m,
        &format!(
            r#"tidegate_dns_queries_total{{source="{source}",rcode="noerror",protocol="udp"}}"#
        ),
    )
}

fn main() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0
        || tool_missing("ip", "-V")
        || tool_missing("iptables", "--version")
    {
        println!("SKIPPED: needs root, `ip` and `iptables`");
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(bench())
}

async fn bench() -> anyhow::Result<()> {
    let queries =
        tidegate_e2e::env_count("DNS_QUERIES", QUERIES, 1 << 16).map_err(|e| anyhow::anyhow!(e))?;
    let mut t = InpodTopology::new("bd", 0);
    t.x = OCTET;
    println!(
        "DNS benchmark: {queries} queries per path and round, {WINDOW} outstanding over UDP, \
         {ROUNDS} rounds; namespaces {}",
        t.na.trim_end_matches("na")
    );
    let guard = t.build();
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("workloads.yaml"), workloads(&t))?;
    let (socket, state) = (
        dir.path().join("node-a.sock"),
        dir.path().join("node-a-pods"),
    );
    let extra = format!(
        "capture:\n  mode: inpod\n  state_dir: {}\ndrains:\n  cni_socket: {}\ndns:\n  upstream: [{}]\n",
        state.display(),
        socket.display(),
        upstream(&t)
    );
    let cfg = gateway_config(
        "node-a",
        &dir.path().join("ca"),
        &dir.path().join("workloads.yaml"),
        &extra,
    );
    let gw = Gateway::start("node-a", &t.na, cfg).await;
    let node = NsThread::idle(&t.na);
    run(&format!(
        "ip -n {} addr add {}/32 dev lo",
        t.na,
        upstream(&t).ip()
    ));
    let addr = upstream(&t);
    let table = HashMap::from([
        (OUTSIDE.to_owned(), vec![outside(&t)]),
        (NOCACHE.to_owned(), vec![outside(&t)]),
        (SERVICE.to_owned(), vec![vip(&t)]),
    ]);
    // What the double saw is not needed: its reports are dropped.
    drop(
        node.run("the upstream DNS double", STEP, async move {
            dns_double::serve(addr, table).await
        })
        .await,
    );
    let conf = inpod_conf(&socket, &state, t.pod_a().into());
    let netns = InpodTopology::netns_path(&t.pa);
    let out = node
        .run("tidegate-cni ADD", STEP, async move {
            let pod = CniPod {
                namespace: "demo",
                name: "client",
                uid: "pa-uid",
                netns: &netns,
            };
            tidegate_e2e::cni::run(&tidegate_e2e::cni::binary(), "ADD", &pod, &conf)
                .expect("run tidegate-cni")
        })
        .await;
    anyhow::ensure!(
        out.status.success(),
        "ADD pod A: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    redirect_dns(&t.pa);
    let pod = NsThread::idle(&t.pa);

    // Each path answered as it should before anything is timed: the proxy
    // authoritative from the store, the double otherwise.
    let (service_vip, outside_ip) = (vip(&t), outside(&t));
    pod.run("a query on each path", STEP, async move {
        let m = ask_udp(addr, &query(SERVICE)).await.unwrap();
        assert!(m.metadata.authoritative, "the store answered");
        assert_eq!(addresses(&m), [service_vip]);
        for name in [OUTSIDE, NOCACHE] {
            let m = ask_udp(addr, &query(name)).await.unwrap();
            assert!(!m.metadata.authoritative, "the upstream answered");
            assert_eq!(addresses(&m), [outside_ip]);
        }
    })
    .await;
    let before = gw.metrics().await;
    let (store0, fwd0, hits0) = (
        queries_total(&before, "store"),
        queries_total(&before, "forwarded"),
        tidegate_e2e::metric(&before, "tidegate_dns_cache_hits_total"),
    );

    let mut results: Vec<Vec<Figures>> = PATHS.iter().map(|_| Vec::new()).collect();
    let started = Instant::now();
    for round in 0..ROUNDS {
        for (i, p) in PATHS.iter().enumerate() {
            let (name, mark) = (p.name, p.mark);
            let port = client_port(round, i);
            let f = pod
                .run(p.what, Duration::from_secs(60), async move {
                    load(addr, name, mark, port, queries).await
                })
                .await
                .map_err(|e| anyhow::anyhow!("{}, round {round}: {e}", p.what))?;
            results[i].push(f);
        }
    }
    let elapsed = started.elapsed();
    let after = gw.metrics().await;
    let (store, fwd, hits) = (
        queries_total(&after, "store") - store0,
        queries_total(&after, "forwarded") - fwd0,
        tidegate_e2e::metric(&after, "tidegate_dns_cache_hits_total") - hits0,
    );

    println!(
        "\nDNS over UDP from pod A ({:.0} s of load; medians of {ROUNDS} interleaved rounds; \
         ratios to the direct path of the same name):",
        elapsed.as_secs_f64()
    );
    println!("| path | queries/s | p50 µs | p99 µs | lost | not NOERROR |");
    println!("|---|---|---|---|---|---|");
    let med = |v: &[Figures], f: fn(&Figures) -> f64| median(v, f);
    for (i, p) in PATHS.iter().enumerate() {
        let (r, b) = (&results[i], &results[p.base]);
        let ratio = |f: fn(&Figures) -> f64| {
            if i == p.base {
                String::new()
            } else {
                format!(" ({:.2}×)", med(r, f) / med(b, f))
            }
        };
        println!(
            "| {} | {:.0}{} | {:.0}{} | {:.0}{} | {} | {} |",
            p.what,
            med(r, |f| f.qps),
            ratio(|f| f.qps),
            med(r, |f| f.p50_us),
            ratio(|f| f.p50_us),
            med(r, |f| f.p99_us),
            ratio(|f| f.p99_us),
            r.iter().map(|f| f.lost).sum::<usize>(),
            r.iter().map(|f| f.bad).sum::<usize>(),
        );
    }
    let per_round = |i: usize| {
        results[i]
            .iter()
            .map(|f| format!("{:.0}", f.qps))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (i, p) in PATHS.iter().enumerate() {
        let from = results[i]
            .iter()
            .find_map(|f| f.other_source)
            .map(|a| format!("; replies came from {a}, not {addr}"))
            .unwrap_or_default();
        println!("  {} queries/s per round: {}{from}", p.what, per_round(i));
    }
    let qps = |i: usize| med(&results[i], |f| f.qps);
    println!(
        "store via 15053 / direct: {:.2}×; forwarded, cached / direct: {:.2}×; \
         forwarded, TTL 0 / direct: {:.2}× (queries/s)",
        qps(0) / qps(3),
        qps(1) / qps(4),
        qps(2) / qps(5),
    );
    println!(
        "a repeated forwarded name, cached / not cached (TTL 0), same run: {:.2}× (queries/s)",
        qps(1) / qps(2),
    );
    println!(
        "the gateway counted {store} store and {fwd} forwarded NOERROR answers over UDP \
         during the load, {hits} of them from the cache ({} sent each way)",
        ROUNDS * queries
    );
    drop(pod);
    drop((node, gw));
    drop(dir);
    drop(guard);
    Ok(())
}
