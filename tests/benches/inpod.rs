//! In-pod capture benchmark (issue 14): a program that prints figures, not a
//! timed test.
//!
//! ```text
//! cargo bench --workspace --profile dev --bench inpod
//! ```
//!
//! Two nodes in network namespaces with in-process gateways in
//! `capture.mode: inpod` (their node-level listeners bound too:
//! `capture.node_listeners`), pods
//! enrolled by the real `tidegate-cni` ADD:
//!
//! - **data path, same run, same gateways**: per-pod listeners (pod A → pod
//!   B, both enrolled: pod A's 15001 → HBONE from inside pod A → pod B's
//!   15008) against node-level listeners (pod C → pod D, not enrolled;
//!   iptables REDIRECT on the nodes to the gateways' node-level 15001/15008),
//!   each next to raw TCP measured in the same run: loopback inside a pod,
//!   and node A → pod D across the same veths, uncaptured;
//! - **ADD → pod proxied**: 100 more pods on node B, each enrolled by
//!   `tidegate-cni ADD` in turn: the time ADD takes, and the time until a
//!   plain connection from inside the new pod to pod B's app has gone
//!   through the pod's own listener and HBONE (p50/p99);
//! - **memory per pod**: this process's RSS (both gateways live in it) before
//!   and after those 100 pods, divided by 100 — listeners, tasks and state.
//!
//! - **restart** (`-- --restart`, that section alone): pod A opens a new
//!   connection to pod B every 10 ms while node B's gateway is stopped and
//!   a new one started (re-adopting pod B from the state directory), once
//!   with no policy plugin and once with the deploy config's six: failed
//!   connections, the gap pod A saw, and from the old gateway's exit to
//!   pod B served again — the plugins compile while pods are served.
//! - **a node of N pods** (`-- --pods N`, that section alone, N ≤ 2,000;
//!   `--pods 999` is 1,000 pods on node B with pod B, the default
//!   `capture.max_pods`): the time to create the N namespaces; N more pods
//!   enrolled on node B one after another: ADD p50/p99 and the whole; RSS
//!   and descriptors per pod; this process's CPU and wake-ups (context
//!   switches of every thread) over 10 s idle, before and after; then node
//!   B's gateway replaced as on an upgrade — a new one started beside it
//!   (same ports, `SO_REUSEPORT`), re-adopting every pod from the state
//!   directory, then the old one stopped — while pod A opens a new
//!   connection to pod B every 10 ms: how long the re-adoption took, and
//!   the connections that failed (each with its error and when it started,
//!   and node A's failure counters that moved). Both of node B's gateways
//!   live in this process for the hand-over, sharing its one open-file
//!   limit (on a node they are two processes, each with its own; the old
//!   one stays until its tunnels' GOAWAY exchange is done): node B's
//!   inbound cap is set to 1,000 in this section so that the new gateway's
//!   descriptor backstop, which counts the whole process's descriptors,
//!   does not take the old one's pods for its own.
//!
//! Every loop is bounded in count and time; the whole run takes about a
//! minute. Needs root, `ip` and `iptables`; skipped with a note otherwise.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream as StdTcp};
use std::time::{Duration, Instant};

use tidegate_e2e::cni::{inpod_conf, CniPod};
use tidegate_e2e::measure::{
    connection_every, connection_every_why, measure, median, pct, servers, Figures, Restart, ECHO,
};
use tidegate_e2e::netns::{
    enter_netns, gateway_config, run, tool_missing, Gateway, NetnsGuard, NsThread, STEP,
};

/// Extra pods enrolled on node B (`-- --pods N` sets another number and
/// runs the node-of-N-pods section alone).
const PODS: usize = 100;
/// The most `--pods` takes.
const MAX_PODS: usize = 2_000;

struct Net {
    tag: String,
    x: u8,
    /// Extra pods on node B.
    pods: usize,
}

impl Net {
    fn ns(&self, name: &str) -> String {
        format!("{}{name}", self.tag)
    }
    fn ip(&self, subnet: u8, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.x, subnet, host)
    }
    /// Pod A (enrolled, node A), B (enrolled, node B), C (node-level, node
    /// A), D (node-level, node B); node link 10.x.0.0/24.
    fn pod_ip(&self, pod: char) -> Ipv4Addr {
        self.ip(pod_subnet(pod), 2)
    }
    /// Extra pod `i` on node B: 10.x.(10+i/240).(10+i%240)/32 behind its
    /// own veth.
    fn extra_ip(&self, i: usize) -> Ipv4Addr {
        self.ip(10 + (i / 240) as u8, 10 + (i % 240) as u8)
    }
}

fn pod_subnet(pod: char) -> u8 {
    match pod {
        'a' => 1,
        'b' => 2,
        'c' => 3,
        _ => 5,
    }
}

fn build(net: &Net) -> NetnsGuard {
    let started = Instant::now();
    let guard = build_namespaces(net);
    println!(
        "  {} namespaces and their links made in {:.1} s",
        6 + net.pods,
        started.elapsed().as_secs_f64()
    );
    guard
}

fn build_namespaces(net: &Net) -> NetnsGuard {
    let mut guard = NetnsGuard::default();
    let (na, nb) = (net.ns("na"), net.ns("nb"));
    let mut all = vec![na.clone(), nb.clone()];
    all.extend("abcd".chars().map(|p| net.ns(&format!("p{p}"))));
    all.extend((0..net.pods).map(|i| net.ns(&format!("x{i}"))));
    for ns in &all {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", ns])
            .output();
        run(&format!("ip netns add {ns}"));
        guard.push(ns);
        run(&format!("ip -n {ns} link set lo up"));
    }
    let veth = |n1: &str, if1: &str, a1: String, n2: &str, if2: &str, a2: String| {
        tidegate_e2e::netns::veth(n1, if1, &a1, n2, if2, &a2)
    };
    veth(
        &na,
        "to-nb",
        format!("{}/24", net.ip(0, 1)),
        &nb,
        "to-na",
        format!("{}/24", net.ip(0, 2)),
    );
    for pod in ['a', 'b', 'c', 'd'] {
        let node = if pod == 'a' || pod == 'c' { &na } else { &nb };
        let s = pod_subnet(pod);
        let ns = net.ns(&format!("p{pod}"));
        veth(
            node,
            &format!("to-p{pod}"),
            format!("{}/24", net.ip(s, 1)),
            &ns,
            "eth0",
            format!("{}/24", net.ip(s, 2)),
        );
        run(&format!(
            "ip -n {ns} route add default via {}",
            net.ip(s, 1)
        ));
    }
    for i in 0..net.pods {
        let ns = net.ns(&format!("x{i}"));
        veth(
            &nb,
            &format!("x{i}"),
            format!("{}/32", net.ip(4, 1)),
            &ns,
            "eth0",
            format!("{}/32", net.extra_ip(i)),
        );
        run(&format!(
            "ip -n {ns} route add {}/32 dev eth0",
            net.ip(4, 1)
        ));
        run(&format!(
            "ip -n {ns} route add default via {} dev eth0",
            net.ip(4, 1)
        ));
        run(&format!(
            "ip -n {nb} route add {}/32 dev x{i}",
            net.extra_ip(i)
        ));
    }
    for s in [2, 5] {
        run(&format!(
            "ip -n {na} route add {}/24 via {}",
            net.ip(s, 0),
            net.ip(0, 2)
        ));
    }
    for s in [1, 3] {
        run(&format!(
            "ip -n {nb} route add {}/24 via {}",
            net.ip(s, 0),
            net.ip(0, 1)
        ));
    }
    for n in [&na, &nb] {
        run(&format!(
            "ip netns exec {n} sysctl -q -w net.ipv4.ip_forward=1"
        ));
    }
    // Node-level capture for pods C and D (node mode, on the same gateways).
    run(&format!(
        "ip netns exec {na} iptables -t nat -A PREROUTING -i to-pc -p tcp -j REDIRECT --to-ports 15001"
    ));
    run(&format!(
        "ip netns exec {nb} iptables -t nat -A PREROUTING -d {} -p tcp --dport 15008 -j REDIRECT --to-ports 15008",
        net.pod_ip('d')
    ));
    guard
}

fn workloads(net: &Net) -> String {
    let mut y = String::from("workloads:\n");
    for (pod, node) in [
        ('a', "node-a"),
        ('b', "node-b"),
        ('c', "node-a"),
        ('d', "node-b"),
    ] {
        y += &format!(
            "- {{uid: p{pod}, name: p{pod}, namespace: bench, service_account: p{pod}, ips: [{}], node: {node}}}\n",
            net.pod_ip(pod)
        );
    }
    for i in 0..net.pods {
        y += &format!(
            "- {{uid: x{i}, name: x{i}, namespace: bench, service_account: x, ips: [{}], node: node-b}}\n",
            net.extra_ip(i)
        );
    }
    y
}

/// `tidegate-cni ADD` of pod `uid` (namespace `ns`) on `node`, run from
/// the node's namespace; when it started and when it returned.
async fn enroll(
    sh: &NsThread,
    bin: &std::path::Path,
    dir: &std::path::Path,
    node: &'static str,
    uid: String,
    ns: String,
    ip: Ipv4Addr,
) -> (Instant, Instant) {
    let conf = inpod_conf(
        &dir.join(format!("{node}.sock")),
        &dir.join(format!("{node}-pods")),
        ip.into(),
    );
    let bin = bin.to_owned();
    sh.run("tidegate-cni ADD", STEP, async move {
        let netns = format!("/var/run/netns/{ns}");
        let pod = CniPod {
            namespace: "bench",
            name: &uid,
            uid: &uid,
            netns: &netns,
        };
        let started = Instant::now();
        let out = tidegate_e2e::cni::run(&bin, "ADD", &pod, &conf).expect("run tidegate-cni");
        assert!(
            out.status.success(),
            "ADD {uid}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        (started, Instant::now())
    })
    .await
}

/// Raises this process's open-file limit (soft and hard) to `n` — as root
/// with CAP_SYS_RESOURCE; otherwise the soft limit to the hard one.
fn raise_nofile(n: u64) {
    let want = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit reads the `rlimit` passed by pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } != 0 {
        eprintln!(
            "cannot raise the open-file limit to {n}: {} (the hard limit stays)",
            std::io::Error::last_os_error()
        );
        tidegate_e2e::raise_fd_limit();
    }
}

/// The open-file limit in force.
fn nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the `rlimit` passed by pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    r.rlim_cur
}

/// What this process does while nothing happens.
struct Idle {
    cpu_percent: f64,
    wakeups_per_s: f64,
}

/// CPU time (user + system) and context switches (voluntary and not, every
/// thread: each is a wake-up) of this process over `window`.
async fn idle(window: Duration) -> Idle {
    fn sample() -> (u64, u64) {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
        let mut switches = 0;
        for t in std::fs::read_dir("/proc/self/task")
            .into_iter()
            .flatten()
            .flatten()
        {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            switches += status
                .lines()
                .filter(|l| l.contains("ctxt_switches"))
                .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                .sum::<u64>();
        }
        (ticks, switches)
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let (t0, s0) = sample();
    tokio::time::sleep(window).await;
    let (t1, s1) = sample();
    let secs = window.as_secs_f64();
    Idle {
        cpu_percent: (t1 - t0) as f64 / hz / secs * 100.0,
        // Less the two samples' own reads.
        wakeups_per_s: s1.saturating_sub(s0) as f64 / secs,
    }
}

/// The deploy config's six reference plugins (`policies:`).
fn six_plugins() -> String {
    let mut y = String::from("policies:\n  default: recommended\n  plugins:\n");
    for name in [
        "recommended",
        "goaway-on-term-start",
        "drain-at-teardown",
        "evict-on-delete",
        "keepalive-only",
        "oci-drain",
    ] {
        y += &format!(
            "    {name}: {{file: {}}}\n",
            tidegate_e2e::plugin(name).display()
        );
    }
    y
}

/// Stops `old` (its whole shutdown), starts a gateway from `config` in its
/// place, while pod A's thread opens a connection to `dst` every 10 ms.
async fn restart(
    pod_a: &NsThread,
    dst: SocketAddr,
    (old, ns): (Gateway, &str),
    config: tidegate::config::Config,
) -> (Gateway, Restart) {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let load = pod_a.run("restart load", Duration::from_secs(60), async move {
        connection_every(dst, Duration::from_millis(10), stop_rx).await
    });
    let restart = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // Blocks this thread until the old gateway's thread is joined:
        // the load runs on pod A's own thread meanwhile.
        drop(old);
        let gone = Instant::now();
        let new = Gateway::start("node-b", ns, config).await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let _ = stop_tx.send(true);
        (new, gone)
    };
    let (seen, (new, gone)) = tokio::join!(load, restart);
    (new, Restart::from_load(&seen, gone))
}

/// Starts a gateway from `config` beside `old` (it re-adopts the pods
/// from the state directory before it returns), then stops `old`, while
/// pod A's thread opens a connection to `dst` every 10 ms; how long the
/// new one took to start, and each failed connection's error with when it
/// started against the old gateway's stop (ms, negative: before).
async fn handover(
    pod_a: &NsThread,
    dst: SocketAddr,
    old: Gateway,
    ns: &str,
    config: tidegate::config::Config,
) -> (Gateway, Restart, Duration, Vec<(f64, String)>) {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let load = pod_a.run("upgrade load", Duration::from_secs(120), async move {
        connection_every_why(dst, Duration::from_millis(10), stop_rx).await
    });
    let upgrade = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t0 = Instant::now();
        let new = Gateway::start("node-b", ns, config).await;
        let readopted = t0.elapsed();
        let stopping = Instant::now();
        // Blocks this thread until the old gateway's thread is joined:
        // the load runs on pod A's own thread meanwhile.
        drop(old);
        let gone = Instant::now();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let _ = stop_tx.send(true);
        (new, stopping, gone, readopted)
    };
    let (seen, (new, stopping, gone, readopted)) = tokio::join!(load, upgrade);
    let ms = |at: Instant| match at.checked_duration_since(stopping) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(stopping.duration_since(at).as_secs_f64() * 1e3),
    };
    let failures = seen
        .iter()
        .filter_map(|(at, r)| r.as_ref().err().map(|e| (ms(*at), e.clone())))
        .collect();
    let seen: Vec<(Instant, bool)> = seen.iter().map(|(at, r)| (*at, r.is_ok())).collect();
    (new, Restart::from_load(&seen, gone), readopted, failures)
}

/// A gateway's metric lines that count failures (to compare before and after).
fn failure_lines(metrics: &str) -> Vec<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            ["failed", "refus", "tunnels_closed", "dials", "goaway"]
                .iter()
                .any(|w| l.contains(w))
        })
        .filter(|l| !l.ends_with(" 0"))
        .map(str::to_owned)
        .collect()
}

fn vm_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// From inside `ns`, until a 1-byte round trip to `dst` succeeds.
fn first_round_trip(ns: String, dst: SocketAddr, within: Duration) -> Result<Instant, String> {
    std::thread::spawn(move || {
        enter_netns(&ns)?;
        let deadline = Instant::now() + within;
        loop {
            let tried = StdTcp::connect_timeout(&dst, Duration::from_secs(1)).and_then(|mut t| {
                t.set_read_timeout(Some(Duration::from_secs(1)))?;
                t.write_all(b"x")?;
                let mut b = [0u8; 1];
                t.read_exact(&mut b)
            });
            if tried.is_ok() {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no round trip from {ns} within {within:?}: {tried:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    })
    .join()
    .map_err(|_| "round-trip thread panicked".to_string())?
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
    tidegate_e2e::init_tracing();
    let pid = std::process::id();
    let args: Vec<String> = std::env::args().collect();
    let many = args
        .iter()
        .position(|a| a == "--pods")
        .map(|i| {
            args.get(i + 1)
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|n| (1..=MAX_PODS).contains(n))
                .ok_or_else(|| anyhow::anyhow!("--pods takes a number from 1 to {MAX_PODS}"))
        })
        .transpose()?;
    let net = Net {
        tag: format!("bi{}", pid % 10_000),
        x: 200 + (pid % 40) as u8,
        pods: many.unwrap_or(PODS),
    };
    if many.is_some() {
        // Each pod holds eight descriptors, and both gateways of node B
        // hold them all during the hand-over: raise the limit as a node's
        // is (usually 1,048,576) where the process may; here the hard
        // limit (20,000) stays.
        raise_nofile(1 << 20);
    }
    println!(
        "in-pod benchmark: {} pods, namespaces {}*",
        net.pods, net.tag
    );
    let guard = build(&net);
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("workloads.yaml"), workloads(&net))?;
    let node_with = |name: &'static str, more: &str| {
        let extra = format!(
            "capture:\n  mode: inpod\n  node_listeners: true\n  state_dir: {d}/{name}-pods\ndrains:\n  cni_socket: {d}/{name}.sock\n{more}",
            d = dir.path().display()
        );
        gateway_config(
            name,
            &dir.path().join("ca"),
            &dir.path().join("workloads.yaml"),
            &extra,
        )
    };
    let node = |name: &'static str| node_with(name, "");
    // Node B of the many-pods section: see the module doc.
    let many_b = || {
        let mut c = node("node-b");
        c.hbone.max_connections = 1_000;
        c
    };
    let gw_a = Gateway::start("node-a", &net.ns("na"), node("node-a")).await;
    let gw_b = Gateway::start(
        "node-b",
        &net.ns("nb"),
        if many.is_some() {
            many_b()
        } else {
            node("node-b")
        },
    )
    .await;
    let shell = |n: &str| NsThread::idle(&net.ns(n));
    let (sh_a, sh_b) = (shell("na"), shell("nb"));
    let pods: Vec<NsThread> = "abcd".chars().map(|p| shell(&format!("p{p}"))).collect();
    for p in &pods[1..] {
        servers(p).await;
    }
    let bin = tidegate_e2e::cni::binary();
    let add =
        |sh, node, uid: String, ns: String, ip| enroll(sh, &bin, dir.path(), node, uid, ns, ip);
    add(&sh_a, "node-a", "pa".into(), net.ns("pa"), net.pod_ip('a')).await;
    add(&sh_b, "node-b", "pb".into(), net.ns("pb"), net.pod_ip('b')).await;
    // Extra pod `i`, on node B.
    let add_extra = |i: usize| {
        let ns = net.ns(&format!("x{i}"));
        add(&sh_b, "node-b", format!("x{i}"), ns, net.extra_ip(i))
    };
    if many.is_some() {
        let mut gw_b = gw_b;
        let n = net.pods;
        let fds = || std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        let (rss0, fds0) = (vm_rss_kib(), fds());
        let idle0 = idle(Duration::from_secs(10)).await;
        let mut add_ms = Vec::with_capacity(n);
        let all = Instant::now();
        for i in 0..n {
            let (t0, t1) = add_extra(i).await;
            add_ms.push(t1.duration_since(t0));
        }
        let all = all.elapsed();
        let (rss1, fds1) = (vm_rss_kib(), fds());
        let m = gw_b.metrics().await;
        let served = tidegate_e2e::metric(&m, "tidegate_inpod_pods");
        let bound = tidegate_e2e::metric(&m, "tidegate_inpod_max_pods");
        let idle1 = idle(Duration::from_secs(10)).await;
        add_ms.sort();
        println!(
            "\na node of {n} pods (node B; both gateways in this process; open-file limit {}, so at most {bound} pods a gateway):",
            nofile()
        );
        println!(
            "  {served} pods served; tidegate-cni ADD → the pod's listeners up, one after another: p50 {:.1} ms, p99 {:.1} ms, all {n} in {:.1} s",
            pct(&add_ms, 0.5) / 1e3,
            pct(&add_ms, 0.99) / 1e3,
            all.as_secs_f64()
        );
        println!(
            "  per pod: RSS {:.1} KiB ({rss0} → {rss1} KiB), descriptors {:.2} ({fds0} → {fds1})",
            rss1.saturating_sub(rss0) as f64 / n as f64,
            fds1.saturating_sub(fds0) as f64 / n as f64
        );
        println!(
            "  idle, 10 s: CPU {:.2} % → {:.2} % of a core, wake-ups {:.0}/s → {:.0}/s (2 pods → {} pods)",
            idle0.cpu_percent,
            idle1.cpu_percent,
            idle0.wakeups_per_s,
            idle1.wakeups_per_s,
            n + 2
        );
        // The upgrade: a new gateway beside the old one re-adopts every
        // pod from the state directory before it returns; then the old
        // one stops. Pod A connects to pod B all along.
        let dst = SocketAddr::new(net.pod_ip('b').into(), ECHO);
        let failed_a0 = failure_lines(&gw_a.metrics().await);
        let (new_b, r, readopted, failures) =
            handover(&pods[0], dst, gw_b, &net.ns("nb"), many_b()).await;
        gw_b = new_b;
        let m = gw_b.metrics().await;
        let served = tidegate_e2e::metric(&m, "tidegate_inpod_pods");
        let refused: f64 = m
            .lines()
            .filter(|l| l.starts_with("tidegate_inpod_refusals_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
            + 0.0; // an empty sum is -0
        println!(
            "  upgrade (a new gateway beside the old, then the old stopped): {served} pods re-adopted from the state directory in {:.0} ms ({:.2} ms a pod), {refused} refused; pod A → pod B, a new connection every 10 ms: {} connections, {} failed, gap {:.0} ms",
            readopted.as_secs_f64() * 1e3,
            readopted.as_secs_f64() * 1e3 / served.max(1.0),
            r.connections,
            r.failed,
            r.gap.as_secs_f64() * 1e3
        );
        for (at, e) in &failures {
            println!("    failed, started {at:+.0} ms from the old gateway's stop: {e}");
        }
        let failed_a1 = failure_lines(&gw_a.metrics().await);
        for l in failed_a1.iter().filter(|l| !failed_a0.contains(l)) {
            println!("    node A's gateway after the upgrade: {l}");
        }
        drop(pods);
        drop((sh_a, sh_b, gw_a, gw_b));
        drop(guard);
        return Ok(());
    }
    if std::env::args().any(|a| a == "--restart") {
        let dst = SocketAddr::new(net.pod_ip('b').into(), ECHO);
        println!("\nnode B's gateway stopped and started while pod A opens a connection to pod B every 10 ms:");
        println!("| policy plugins | connections | failed | gap pod A saw | old gateway gone → pod B served |\n|---|---|---|---|---|");
        let mut gw_b = gw_b;
        let mut gaps = Vec::new();
        for plugins in [0, 6] {
            let extra = if plugins == 0 {
                String::new()
            } else {
                six_plugins()
            };
            let config = node_with("node-b", &extra);
            let (new_b, r) = restart(&pods[0], dst, (gw_b, &net.ns("nb")), config).await;
            gw_b = new_b;
            println!(
                "| {plugins} | {} | {} | {:.0} ms | {:.0} ms |",
                r.connections,
                r.failed,
                r.gap.as_secs_f64() * 1e3,
                r.served_after.as_secs_f64() * 1e3
            );
            gaps.push(r.served_after.as_secs_f64());
        }
        println!(
            "six plugins / none, old gateway gone → pod B served: {:.2}×",
            gaps[1] / gaps[0].max(1e-6)
        );
        drop(pods);
        drop((sh_a, sh_b, gw_a, gw_b));
        drop(guard);
        return Ok(());
    }

    // ---- data path: raw, node-level, per-pod; interleaved, 3 rounds ----
    let paths: [(&str, &NsThread, Ipv4Addr); 4] = [
        ("raw TCP, loopback in a pod", &pods[3], Ipv4Addr::LOCALHOST),
        ("raw TCP, node A → pod D", &sh_a, net.pod_ip('d')),
        ("node-level listeners (C → D)", &pods[2], net.pod_ip('d')),
        ("per-pod listeners (A → B)", &pods[0], net.pod_ip('b')),
    ];
    let mut results: Vec<Vec<Figures>> = paths.iter().map(|_| Vec::new()).collect();
    for round in 0..3 {
        for (i, (what, from, ip)) in paths.iter().enumerate() {
            let ip = *ip;
            let f = match from
                .run(
                    what,
                    Duration::from_secs(60),
                    async move { measure(ip).await },
                )
                .await
            {
                Ok(f) => f,
                Err(e) => {
                    for gw in [&gw_a, &gw_b] {
                        let m = gw.metrics().await;
                        for l in m.lines().filter(|l| {
                            !l.starts_with('#') && (l.contains("failed") || l.contains("ended"))
                        }) {
                            eprintln!("{}: {l}", gw.name);
                        }
                    }
                    anyhow::bail!("{what}, round {round}: {e}");
                }
            };
            results[i].push(f);
        }
    }
    let med = |v: &[Figures], f: fn(&Figures) -> f64| median(v, f);
    println!("\ndata path (medians of 3 interleaved rounds; ratios to the raw cross-node path):");
    println!("| path | MB/s | 1 KiB RR p50 µs | p99 µs | new conns/s | conn p99 µs |");
    println!("|---|---|---|---|---|---|");
    let base = &results[1];
    for (i, (what, ..)) in paths.iter().enumerate() {
        let r = &results[i];
        println!(
            "| {what} | {:.0} ({:.2}×) | {:.0} ({:.2}×) | {:.0} | {:.0} ({:.2}×) | {:.0} |",
            med(r, |f| f.mb_s),
            med(r, |f| f.mb_s) / med(base, |f| f.mb_s),
            med(r, |f| f.rr_p50_us),
            med(r, |f| f.rr_p50_us) / med(base, |f| f.rr_p50_us),
            med(r, |f| f.rr_p99_us),
            med(r, |f| f.conns_s),
            med(r, |f| f.conns_s) / med(base, |f| f.conns_s),
            med(r, |f| f.conn_p99_us),
        );
    }
    let (node_level, per_pod) = (&results[2], &results[3]);
    println!(
        "per-pod / node-level: throughput {:.2}×, RR p50 {:.2}×, new conns/s {:.2}×",
        med(per_pod, |f| f.mb_s) / med(node_level, |f| f.mb_s),
        med(per_pod, |f| f.rr_p50_us) / med(node_level, |f| f.rr_p50_us),
        med(per_pod, |f| f.conns_s) / med(node_level, |f| f.conns_s),
    );

    // ---- ADD → pod proxied (first half), memory per pod (second half) ----
    let dst = SocketAddr::new(net.pod_ip('b').into(), ECHO);
    let half = PODS / 2;
    let (mut add_ms, mut proxied_ms) = (Vec::new(), Vec::new());
    let rss_start = vm_rss_kib();
    for i in 0..half {
        let (t0, t1) = add_extra(i).await;
        let ns = net.ns(&format!("x{i}"));
        let t2 =
            first_round_trip(ns, dst, Duration::from_secs(10)).map_err(|e| anyhow::anyhow!(e))?;
        add_ms.push(t1.duration_since(t0));
        proxied_ms.push(t2.duration_since(t0));
    }
    let rss_mid = vm_rss_kib();
    for i in half..PODS {
        let (t0, t1) = add_extra(i).await;
        add_ms.push(t1.duration_since(t0));
    }
    let rss_end = vm_rss_kib();
    let m = gw_b.metrics().await;
    let served = tidegate_e2e::metric(&m, "tidegate_inpod_pods");
    add_ms.sort();
    proxied_ms.sort();
    println!("\n{PODS} pods enrolled on node B one after another ({served} pods served, pod B included):");
    println!(
        "  tidegate-cni ADD ({PODS} pods): p50 {:.1} ms, p99 {:.1} ms",
        pct(&add_ms, 0.5) / 1e3,
        pct(&add_ms, 0.99) / 1e3
    );
    println!(
        "  ADD start → first connection from the new pod proxied ({half} pods): p50 {:.1} ms, p99 {:.1} ms",
        pct(&proxied_ms, 0.5) / 1e3,
        pct(&proxied_ms, 0.99) / 1e3
    );
    println!(
        "  memory, pods without traffic ({} pods): RSS {rss_mid} → {rss_end} KiB, {:.1} KiB per pod (three listeners, their tasks, the pod's state)",
        PODS - half,
        rss_end.saturating_sub(rss_mid) as f64 / (PODS - half) as f64
    );
    println!(
        "  memory, pods that made one connection ({half} pods): RSS {rss_start} → {rss_mid} KiB, {:.1} KiB per pod (plus its idle HBONE tunnel, both ends)",
        rss_mid.saturating_sub(rss_start) as f64 / half as f64
    );
    drop(pods);
    drop((sh_a, sh_b, gw_a, gw_b));
    drop(guard);
    Ok(())
}
