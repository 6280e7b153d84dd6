//! Drain policies end to end in real network namespaces (issue 4, acceptance
//! tests): two nodes, a client pod and a server pod, iptables REDIRECT on
//! both nodes, two in-process gateways on `setns()` threads (the topology and
//! helpers of `netns.rs`), lifecycle events through the server gateway's
//! admin API and the real `tidegate-cni` binary.
//!
//! ```text
//!  pa (client app)          na (node A)                      nb (node B)             pb (echo :8080)
//!  eth0 10.X.1.2 ──veth── to-pa 10.X.1.1                                    to-pb 10.X.2.1 ──veth── eth0 10.X.2.2
//!                           gateway A   to-nb 10.X.0.1 ──veth── to-na 10.X.0.2   gateway B
//! ```
//!
//! In every scenario the client pod keeps opening short request/response
//! connections to the server pod and holds one long-lived stream; the server
//! pod goes through shutdown starting (admin POST) → the app keeps serving →
//! network teardown (`tidegate-cni` DEL over the gateway's Unix socket) →
//! deleted (admin DELETE). One test per reference policy; each asserts
//! counts and orderings only and prints its figures.
//!
//! Needs root, `ip` and `iptables`; skipped (with a message) otherwise.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidegate_e2e::{metric, metric_or_zero, metric_sum, plugin, write_atomically};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use tidegate_e2e::netns::{
    build_topology, gateway_config, tool_missing, Gateway, NetnsGuard, NsThread, Topology,
    ECHO_PORT, HBONE_PORT, STEP,
};

/// The server pod's workload uid (what `K8S_POD_UID` names on CNI DEL).
const ECHO_UID: &str = "echo-uid";

// ---------------------------------------------------------------------------
// Gateways and the echo server.

const OPENED: &str = "tidegate_pool_tunnels_opened_total";
const GOAWAYS: &str = "tidegate_pool_goaways_received_total";
const POOLED: &str = "tidegate_pool_tunnels";
const CLOSED: &str = "tidegate_pool_tunnels_closed_total";

/// `reason=count` of every pooled tunnel closed so far.
fn closed_reasons(text: &str) -> String {
    let prefix = format!("{CLOSED}{{reason=\"");
    let v: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (reason, value) = rest.split_once("\"} ")?;
            Some(format!("{reason}={value}"))
        })
        .collect();
    v.join(",")
}

/// Echoes every byte back and half-closes when the client does.
async fn start_echo(pod: &NsThread) {
    pod.run("echo server bind", STEP, async move {
        let l = TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], ECHO_PORT)))
            .await
            .expect("echo server: bind 0.0.0.0:8080");
        tidegate_e2e::serve_echo(l);
    })
    .await;
}

/// One short application connection: writes `data`, half-closes, reads to
/// EOF, compares. Runs inside pod A's namespace.
async fn echo_round_trip(dst: SocketAddr, data: Vec<u8>) -> Result<(), String> {
    let io = async move {
        let mut tcp = TcpStream::connect(dst)
            .await
            .map_err(|e| format!("connect {dst}: {e}"))?;
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        tcp.write_all(&data)
            .await
            .map_err(|e| format!("write to {dst}: {e}"))?;
        tcp.shutdown()
            .await
            .map_err(|e| format!("shutdown to {dst}: {e}"))?;
        let mut back = Vec::new();
        tcp.read_to_end(&mut back)
            .await
            .map_err(|e| format!("read from {dst}: {e}"))?;
        if back != data {
            return Err(format!(
                "echo from {dst}: {} bytes back, want the {} sent",
                back.len(),
                data.len()
            ));
        }
        Ok(())
    };
    tokio::time::timeout(STEP, io)
        .await
        .unwrap_or_else(|_| Err(format!("round trip to {dst} timed out after {STEP:?}")))
}

/// The client pod's stream of short connections, one after the other.
struct Loader {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failures: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Loader {
    fn start(pod_a: &NsThread, dst: SocketAddr) -> Loader {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let (s, o, f) = (stop.clone(), ok.clone(), failures.clone());
        let task = pod_a.handle.spawn(async move {
            let mut i = 0u32;
            while !s.load(Ordering::Acquire) {
                let data = format!("request {i}\n").into_bytes();
                match echo_round_trip(dst, data).await {
                    Ok(()) => {
                        o.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(e) => f.lock().unwrap().push(format!("request {i}: {e}")),
                }
                i += 1;
                // Pacing (a client doing requests now and then), not a wait.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Loader {
            stop,
            ok,
            failures,
            task,
        }
    }

    fn ok(&self) -> usize {
        self.ok.load(Ordering::Acquire)
    }

    /// Waits (bounded) until `n` more requests than now succeeded; panics
    /// with the failures seen if they do not.
    async fn wait_more_ok(&self, n: usize, what: &str) {
        let want = self.ok() + n;
        let done = tidegate_e2e::poll_within(STEP, || {
            std::future::ready((self.ok() >= want).then_some(()))
        })
        .await;
        if done.is_none() {
            panic!(
                "{what}: only {} of {want} requests succeeded within {STEP:?}; failures: {:#?}",
                self.ok(),
                self.failures.lock().unwrap()
            );
        }
    }

    /// Stops after the request in flight; returns (succeeded, failures).
    async fn stop(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Release);
        match tokio::time::timeout(STEP * 2, self.task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("client loader task failed: {e}"),
            Err(_) => panic!("client loader did not stop within {:?}", STEP * 2),
        }
        let failures = self.failures.lock().unwrap().clone();
        (self.ok.load(Ordering::Acquire), failures)
    }
}

/// The client pod's long-lived stream; all I/O on it runs on pod A's thread.
struct Held {
    tcp: Option<TcpStream>,
    rounds: u32,
}

impl Held {
    async fn open(pod_a: &NsThread, dst: SocketAddr) -> Held {
        let tcp = pod_a
            .run("open the long-lived stream", STEP, async move {
                let tcp = TcpStream::connect(dst).await?;
                tcp.set_nodelay(true)?;
                Ok::<_, std::io::Error>(tcp)
            })
            .await
            .unwrap_or_else(|e| panic!("long-lived stream to {dst}: {e}"));
        let mut held = Held {
            tcp: Some(tcp),
            rounds: 0,
        };
        held.round_trip(pod_a, "first round").await;
        held
    }

    /// One request/response on the stream; panics if it fails.
    async fn round_trip(&mut self, pod_a: &NsThread, what: &str) {
        let mut tcp = self.tcp.take().expect("long-lived stream already closed");
        self.rounds += 1;
        let data = format!("held round {}\n", self.rounds).into_bytes();
        let (tcp, r) = pod_a
            .run("long-lived stream round trip", STEP, async move {
                let r = async {
                    tcp.write_all(&data).await?;
                    let mut back = vec![0; data.len()];
                    tcp.read_exact(&mut back).await?;
                    Ok::<_, std::io::Error>(back == data)
                }
                .await;
                (tcp, r)
            })
            .await;
        match r {
            Ok(true) => {}
            Ok(false) => panic!("long-lived stream ({what}): echoed bytes differ"),
            Err(e) => panic!("long-lived stream ({what}): {e}"),
        }
        self.tcp = Some(tcp);
    }

    /// Half-closes and reads to EOF (the stream ends cleanly).
    async fn close(&mut self, pod_a: &NsThread) {
        let mut tcp = self.tcp.take().expect("long-lived stream already closed");
        pod_a
            .run("close the long-lived stream", STEP, async move {
                tcp.shutdown().await?;
                let mut rest = Vec::new();
                tcp.read_to_end(&mut rest).await?;
                Ok::<_, std::io::Error>(rest.len())
            })
            .await
            .unwrap_or_else(|e| panic!("closing the long-lived stream: {e}"));
    }

    /// Waits (at most `within`) for the gateway to end the stream: EOF or an
    /// error (reset). Panics if it stays open.
    async fn wait_ended(&mut self, pod_a: &NsThread, within: Duration) -> String {
        let mut tcp = self.tcp.take().expect("long-lived stream already closed");
        pod_a
            .run("the long-lived stream ends", within, async move {
                let mut rest = Vec::new();
                match tcp.read_to_end(&mut rest).await {
                    Ok(n) => format!("EOF after {n} bytes"),
                    Err(e) => format!("error: {e}"),
                }
            })
            .await
    }
}

// ---------------------------------------------------------------------------
// tidegate-cni, the real binary.

/// `tidegate-cni` DEL for `uid`, run on a background OS thread (it only
/// talks to the Unix socket, so the namespace of the thread does not matter).
struct CniDel {
    started: Instant,
    join: std::thread::JoinHandle<(Output, Instant)>,
}

impl CniDel {
    fn start(socket: &Path, uid: &str, timeout_ms: u64) -> CniDel {
        let bin = tidegate_e2e::cni::binary();
        let conf = tidegate_e2e::cni::del_conf(socket, u128::from(timeout_ms));
        let uid = uid.to_owned();
        let started = Instant::now();
        let join = std::thread::spawn(move || {
            let child = tidegate_e2e::cni::spawn_del(&bin, "demo", "echo", &uid, &conf)
                .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
            let out = child.wait_with_output().unwrap();
            (out, Instant::now())
        });
        CniDel { started, join }
    }

    fn exited(&self) -> bool {
        self.join.is_finished()
    }

    /// Waits (bounded) for the process to exit; returns its output, its
    /// stderr and how long it ran.
    async fn wait(self, within: Duration) -> (Output, String, Duration) {
        tidegate_e2e::wait_for("tidegate-cni DEL to exit", within, || {
            std::future::ready(self.join.is_finished().then_some(()))
        })
        .await;
        let (out, ended) = self.join.join().expect("tidegate-cni thread panicked");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out, stderr, ended.duration_since(self.started))
    }
}

/// Runs DEL to completion; panics unless it exits 0 and reached the gateway.
async fn cni_del(socket: &Path) -> (String, Duration) {
    let (out, stderr, took) = CniDel::start(socket, ECHO_UID, 15_000).wait(STEP).await;
    assert!(out.status.success(), "tidegate-cni DEL failed: {stderr}");
    assert!(
        stderr.contains("drained") && !stderr.contains("not drained"),
        "tidegate-cni DEL did not get the gateway's acknowledgement: {stderr}"
    );
    (stderr, took)
}

// ---------------------------------------------------------------------------
// A scenario: topology, gateways, pods.

/// `policies:` YAML binding every local workload to `name` (with `config`).
fn policy_yaml(name: &str, config: &str) -> String {
    let config = if config.is_empty() {
        String::new()
    } else {
        format!("\n      config: '{config}'")
    };
    format!(
        "policies:\n  default: p\n  plugins:\n    p:\n      file: {}{config}\n",
        plugin(name).display()
    )
}

fn workloads_yaml(t: &Topology, with_echo: bool) -> String {
    let mut s = format!(
        "workloads:\n\
         - {{uid: client-uid, name: client, namespace: demo, service_account: client, ips: [{}], node: node-a}}\n",
        t.pod_a()
    );
    if with_echo {
        s.push_str(&format!(
            "- {{uid: {ECHO_UID}, name: echo, namespace: demo, service_account: echo, ips: [{}], node: node-b}}\n",
            t.pod_b()
        ));
    }
    s
}

/// Everything one scenario runs on. Fields drop in declaration order:
/// threads (and their sockets) first, then the namespaces, then the files.
struct Scenario {
    pod_a: NsThread,
    _pod_b: NsThread,
    gw_b: Gateway,
    gw_a: Gateway,
    _netns: NetnsGuard,
    dir: tempfile::TempDir,
    echo: SocketAddr,
    cni_socket: PathBuf,
    client_workloads: PathBuf,
    t: Topology,
}

impl Scenario {
    /// Builds scenario `k`'s topology and starts both gateways: gateway B
    /// (node B, hosting the echo pod) with `server_policy`, the CNI socket
    /// enabled; gateway A (node A, hosting the client pod) with `client_policy`.
    async fn start(k: u8, server_policy: &str, client_policy: &str) -> Scenario {
        tidegate_e2e::init_tracing();
        tidegate_e2e::raise_fd_limit();
        let dir = tempfile::tempdir().unwrap();
        let t = Topology::new("tgd", k);
        let netns = build_topology(&t);
        let server_workloads = dir.path().join("server-workloads.yaml");
        let client_workloads = dir.path().join("client-workloads.yaml");
        std::fs::write(&server_workloads, workloads_yaml(&t, true)).unwrap();
        std::fs::write(&client_workloads, workloads_yaml(&t, true)).unwrap();
        let ca = dir.path().join("ca");
        let cni_socket = dir.path().join("cni.sock");
        // Gateway A first: it creates the shared dev CA that gateway B then opens.
        let gw_a = Gateway::start(
            "A",
            &t.na,
            gateway_config("node-a", &ca, &client_workloads, client_policy),
        )
        .await;
        let server_extra = format!(
            "{server_policy}drains: {{cni_socket: {}}}\n",
            cni_socket.display()
        );
        let gw_b = Gateway::start(
            "B",
            &t.nb,
            gateway_config("node-b", &ca, &server_workloads, &server_extra),
        )
        .await;
        tidegate_e2e::netns::assert_node_ports(&gw_a, &gw_b);
        let pod_b = NsThread::idle(&t.pb);
        start_echo(&pod_b).await;
        let pod_a = NsThread::idle(&t.pa);
        let echo = SocketAddr::new(IpAddr::V4(t.pod_b()), ECHO_PORT);
        Scenario {
            pod_a,
            _pod_b: pod_b,
            gw_b,
            gw_a,
            _netns: netns,
            dir,
            echo,
            cni_socket,
            client_workloads,
            t,
        }
    }

    /// The common beginning: the long-lived stream, then the client's
    /// requests flowing over one pooled tunnel.
    async fn serving(&self) -> (Held, Loader) {
        let held = Held::open(&self.pod_a, self.echo).await;
        let loader = Loader::start(&self.pod_a, self.echo);
        loader.wait_more_ok(5, "before the shutdown starts").await;
        let a = self.gw_a.metrics().await;
        assert_eq!(metric(&a, OPENED), 1.0, "one pooled tunnel so far\n{a}");
        assert_eq!(metric(&a, GOAWAYS), 0.0, "{a}");
        (held, loader)
    }

    async fn shutdown_starting(&self) -> serde_json::Value {
        let out = self
            .gw_b
            .admin_ok(
                "POST",
                &format!("/workloads/{ECHO_UID}/shutdown-starting?grace=30s"),
            )
            .await;
        assert_eq!(out["duplicate"], false, "{out}");
        assert_eq!(out["event"], "shutdown-started", "{out}");
        out
    }

    async fn delete(&self) {
        let out = self
            .gw_b
            .admin_ok("DELETE", &format!("/workloads/{ECHO_UID}"))
            .await;
        assert_eq!(out["duplicate"], false, "{out}");
        assert_eq!(out["event"], "workload-deleted", "{out}");
    }
}

fn skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED netns drain test: needs root for network namespaces and iptables");
        return true;
    }
    if tool_missing("ip", "-V") || tool_missing("iptables", "--version") {
        println!("SKIPPED netns drain test: `ip` (iproute2) or `iptables` is not installed");
        return true;
    }
    false
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The server's own measure of event → first GOAWAY on the wire (mean).
fn wire_goaway(b: &str) -> String {
    let n = metric(b, "tidegate_drain_event_to_goaway_seconds_count");
    if n == 0.0 {
        return "none".into();
    }
    let sum = metric(b, "tidegate_drain_event_to_goaway_seconds_sum");
    format!("{:.3} ms (server, {n} GOAWAY)", sum / n * 1e3)
}

// ---------------------------------------------------------------------------
// The scenarios.

/// Option 1: GOAWAY as soon as the shutdown starts.
#[tokio::test]
async fn goaway_on_term_start_in_network_namespaces() {
    if skip() {
        return;
    }
    let s = Scenario::start(
        0,
        &policy_yaml("goaway-on-term-start", r#"{"deadline-margin-ms": 2000}"#),
        "",
    )
    .await;
    let (mut held, loader) = s.serving().await;

    let event = Instant::now();
    let out = s.shutdown_starting().await;
    let actions = out["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 1, "{out}");
    assert!(actions[0].as_str().unwrap().contains("goaway"), "{out}");
    s.gw_a
        .wait_metrics("gateway A receives GOAWAY after the shutdown starts", |m| {
            metric(m, GOAWAYS) == 1.0
        })
        .await;
    let goaway_seen = event.elapsed();

    // The app keeps serving: later connections ride a new tunnel, the held
    // stream goes on on the old one.
    loader.wait_more_ok(10, "after the GOAWAY").await;
    let a = s
        .gw_a
        .wait_metrics("a new tunnel for connections after the GOAWAY", |m| {
            metric(m, OPENED) >= 2.0
        })
        .await;
    let opened_during = metric(&a, OPENED) - 1.0;
    held.round_trip(&s.pod_a, "after the GOAWAY").await;
    held.close(&s.pod_a).await;
    // The old tunnel closes on the client side once its last stream ended.
    s.gw_a
        .wait_metrics("the GOAWAYed tunnel closes once idle", |m| {
            metric_sum(m, CLOSED) >= 1.0
        })
        .await;
    let drained = event.elapsed();
    let (ok, failures) = loader.stop().await;
    assert!(
        failures.is_empty(),
        "{} of {} requests failed while the app served: {failures:#?}",
        failures.len(),
        ok + failures.len()
    );
    // The drain applies to the workload: every tunnel accepted after the
    // GOAWAY got one too (after the stream it was dialed for), so none is
    // left pooled to the terminating pod.
    let a = s
        .gw_a
        .wait_metrics("every tunnel to the draining pod gets a GOAWAY", |m| {
            metric(m, GOAWAYS) == metric(m, OPENED)
        })
        .await;
    let goaways = metric(&a, GOAWAYS);

    // Teardown through the real CNI plugin, then deleted.
    let teardown = Instant::now();
    let (stderr, del_took) = cni_del(&s.cni_socket).await;
    s.delete().await;
    let a = s
        .gw_a
        .wait_metrics("no tunnel to the deleted pod is left on A", |m| {
            metric(m, POOLED) == 0.0
        })
        .await;
    assert_eq!(
        metric(&a, GOAWAYS),
        goaways,
        "no further GOAWAY at teardown\n{a}"
    );
    let b = s.gw_b.metrics().await;
    assert_eq!(
        metric(&b, "tidegate_drain_goaways_sent_total"),
        goaways,
        "{b}"
    );
    let drains = s.gw_b.admin_ok("GET", "/drains").await;
    assert_eq!(drains["drains"][0]["phase"], "deleted", "{drains}");
    assert_eq!(drains["drains"][0]["tunnels_remaining"], 0, "{drains}");
    assert_eq!(
        metric(
            &b,
            r#"tidegate_drain_started_total{policy="p",trigger="admin"}"#
        ),
        1.0,
        "{b}"
    );
    assert!(goaway_seen < teardown.duration_since(event));
    println!(
        "netns_drains goaway-on-term-start ({}/{}): failed requests {} of {}; tunnels opened during termination {}; \
         event -> first GOAWAY {} (observed on gateway A: {}), before teardown; time to drain (event -> old tunnel closed on A) {}; tunnels closed on A [{}]; \
         CNI DEL {}: {}",
        s.t.na,
        s.t.nb,
        failures.len(),
        ok + failures.len(),
        opened_during,
        wire_goaway(&b),
        ms(goaway_seen),
        ms(drained),
        closed_reasons(&a),
        ms(del_took),
        stderr.trim()
    );
    let _ = &s.dir;
}

/// Option 2: nothing at shutdown start; GOAWAY at teardown, whose
/// acknowledgement (CNI DEL) waits for the last stream.
#[tokio::test]
async fn drain_at_teardown_in_network_namespaces() {
    if skip() {
        return;
    }
    let s = Scenario::start(
        1,
        &policy_yaml("drain-at-teardown", r#"{"hold-ms": 20000}"#),
        "",
    )
    .await;
    let (mut held, loader) = s.serving().await;

    let event = Instant::now();
    let out = s.shutdown_starting().await;
    assert_eq!(out["actions"].as_array().unwrap().len(), 0, "{out}");
    // The pooled tunnel keeps being reused until teardown.
    loader.wait_more_ok(10, "after the shutdown started").await;
    held.round_trip(&s.pod_a, "after the shutdown started")
        .await;
    let (ok, failures) = loader.stop().await;
    let a = s.gw_a.metrics().await;
    assert_eq!(
        metric(&a, OPENED),
        1.0,
        "one tunnel, reused until teardown\n{a}"
    );
    assert_eq!(metric(&a, GOAWAYS), 0.0, "no GOAWAY before teardown\n{a}");
    assert!(
        failures.is_empty(),
        "{} of {} requests failed while the app served: {failures:#?}",
        failures.len(),
        ok + failures.len()
    );

    // Teardown: the real CNI plugin, in the background.
    let del = CniDel::start(&s.cni_socket, ECHO_UID, 15_000);
    let teardown = del.started;
    s.gw_a
        .wait_metrics("gateway A receives GOAWAY at teardown", |m| {
            metric(m, GOAWAYS) == 1.0
        })
        .await;
    let goaway_seen = teardown.elapsed();
    // The stream still works and DEL is still held by the gateway.
    held.round_trip(&s.pod_a, "after the teardown GOAWAY").await;
    let drains = s.gw_b.admin_ok("GET", "/drains").await;
    assert_eq!(drains["drains"][0]["uid"], ECHO_UID, "{drains}");
    assert_eq!(drains["drains"][0]["streams_remaining"], 1, "{drains}");
    assert!(
        !del.exited(),
        "tidegate-cni DEL returned while the long-lived stream was open: {drains}"
    );
    // The last stream ends: the teardown is acknowledged, DEL returns.
    let closed = Instant::now();
    held.close(&s.pod_a).await;
    let (out, stderr, del_took) = del.wait(STEP).await;
    let after_close = closed.elapsed();
    assert!(out.status.success(), "tidegate-cni DEL failed: {stderr}");
    assert!(
        stderr.contains("drained") && stderr.contains(r#""result":"idle""#),
        "DEL must return after the drain, with result idle: {stderr}"
    );
    // GOAWAY then close (close_notify): the client's pool lets the tunnel go.
    let a = s
        .gw_a
        .wait_metrics("gateway A's tunnel closed after the drain", |m| {
            metric_sum(m, CLOSED) >= 1.0 && metric(m, POOLED) == 0.0
        })
        .await;
    let tunnel_closed = teardown.elapsed();
    assert_eq!(metric(&a, OPENED), 1.0, "{a}");
    // A clean end (GOAWAY, then TLS close_notify): without close_notify the
    // TLS read fails and the pool counts the close as an error.
    // The `error` label set is encoded only once used; the family itself was
    // required above (`CLOSED` summed to at least 1), so absence is its zero.
    assert_eq!(
        metric_or_zero(&a, &format!("{CLOSED}{{reason=\"error\"}}")),
        0.0,
        "the tunnel ended cleanly\n{a}"
    );
    s.delete().await;
    let b = s.gw_b.metrics().await;
    assert_eq!(
        metric(
            &b,
            r#"tidegate_drain_ended_total{policy="p",result="completed"}"#
        ),
        1.0,
        "{b}"
    );
    assert_eq!(
        metric(&b, "tidegate_drain_teardown_timeouts_total"),
        0.0,
        "{b}"
    );
    println!(
        "netns_drains drain-at-teardown ({}/{}): failed requests {} of {}; tunnels opened during termination {}; \
         shutdown start -> teardown {}; teardown -> first GOAWAY {} (observed on gateway A: {}); \
         time to drain (CNI DEL ran {}, returned {} after the last stream closed); teardown -> tunnel closed on A {} [{}]; \
         CNI DEL: {}",
        s.t.na,
        s.t.nb,
        failures.len(),
        ok + failures.len(),
        metric(&a, OPENED) - 1.0,
        ms(teardown.duration_since(event)),
        wire_goaway(&b),
        ms(goaway_seen),
        ms(del_took),
        ms(after_close),
        ms(tunnel_closed),
        closed_reasons(&a),
        stderr.trim()
    );
    let _ = &s.dir;
}

/// Option 4: nothing proactive; the pooled tunnel outlives the teardown (the
/// PING timeout that eventually closes it is covered elsewhere).
#[tokio::test]
async fn keepalive_only_in_network_namespaces() {
    if skip() {
        return;
    }
    let s = Scenario::start(2, &policy_yaml("keepalive-only", ""), "").await;
    let (mut held, loader) = s.serving().await;

    let out = s.shutdown_starting().await;
    assert_eq!(out["actions"].as_array().unwrap().len(), 0, "{out}");
    loader.wait_more_ok(10, "after the shutdown started").await;
    let (ok, failures) = loader.stop().await;
    assert!(
        failures.is_empty(),
        "{} of {} requests failed while the app served: {failures:#?}",
        failures.len(),
        ok + failures.len()
    );
    let (stderr, del_took) = cni_del(&s.cni_socket).await;
    assert!(
        stderr.contains(r#""actions":[]"#),
        "no action at teardown: {stderr}"
    );
    // A round trip on the held stream after the teardown: any GOAWAY sent
    // before it would have reached gateway A before this data.
    held.round_trip(&s.pod_a, "after the teardown").await;
    let a = s.gw_a.metrics().await;
    assert_eq!(metric(&a, GOAWAYS), 0.0, "nothing proactive\n{a}");
    assert_eq!(
        metric(&a, POOLED),
        1.0,
        "the pool still holds its tunnel\n{a}"
    );
    assert_eq!(metric(&a, OPENED), 1.0, "{a}");
    assert_eq!(metric_sum(&a, CLOSED), 0.0, "{a}");
    let drains = s.gw_b.admin_ok("GET", "/drains").await;
    let list = drains["drains"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{drains}");
    assert_eq!(list[0]["uid"], ECHO_UID, "{drains}");
    assert_eq!(
        list[0]["actions_taken"].as_array().unwrap().len(),
        0,
        "{drains}"
    );
    let b = s.gw_b.metrics().await;
    assert_eq!(metric(&b, "tidegate_drain_goaways_sent_total"), 0.0, "{b}");
    // Deleted: whatever the policy, the workload's tunnels are closed (the
    // app is gone), so the held stream ends.
    s.delete().await;
    let ended = held.wait_ended(&s.pod_a, STEP).await;
    let drains = s.gw_b.admin_ok("GET", "/drains").await;
    assert_eq!(drains["drains"][0]["tunnels_remaining"], 0, "{drains}");
    println!("netns_drains keepalive-only: after the deletion, the held stream: {ended}");
    println!(
        "netns_drains keepalive-only ({}/{}): failed requests {} of {}; tunnels opened during termination 0; \
         event -> first GOAWAY: none (by design); tunnel still pooled on A after teardown; time to drain: left to keepalive; \
         CNI DEL {}: {}",
        s.t.na,
        s.t.nb,
        failures.len(),
        ok + failures.len(),
        ms(del_took),
        stderr.trim()
    );
    let _ = &s.dir;
}

/// Option 3, bound on the client gateway: a deleted peer's pooled tunnels
/// are evicted at once, long before keepalive (10 s + 20 s) could notice.
#[tokio::test]
async fn evict_on_delete_in_network_namespaces() {
    if skip() {
        return;
    }
    let s = Scenario::start(
        3,
        &policy_yaml("keepalive-only", ""),
        &policy_yaml("evict-on-delete", ""),
    )
    .await;
    let (mut held, loader) = s.serving().await;

    let out = s.shutdown_starting().await;
    assert_eq!(out["actions"].as_array().unwrap().len(), 0, "{out}");
    loader.wait_more_ok(10, "after the shutdown started").await;
    let (ok, failures) = loader.stop().await;
    assert!(
        failures.is_empty(),
        "{} of {} requests failed while the app served: {failures:#?}",
        failures.len(),
        ok + failures.len()
    );
    let (stderr, del_took) = cni_del(&s.cni_socket).await;
    held.round_trip(&s.pod_a, "after the teardown").await;
    let a = s.gw_a.metrics().await;
    assert_eq!(metric(&a, POOLED), 1.0, "{a}");
    assert_eq!(metric(&a, GOAWAYS), 0.0, "{a}");

    // The client node learns that the server pod is gone.
    let deleted = Instant::now();
    write_atomically(&s.client_workloads, &workloads_yaml(&s.t, false));
    let a = s
        .gw_a
        .wait_metrics_within(
            "gateway A evicts its pooled tunnel to the deleted peer",
            Duration::from_secs(5),
            |m| {
                metric(m, POOLED) == 0.0
                    && metric_or_zero(
                        m,
                        r#"tidegate_pool_tunnels_closed_total{reason="evicted_now"}"#,
                    ) == 1.0
            },
        )
        .await;
    let evicted = deleted.elapsed();
    assert_eq!(
        metric(&a, GOAWAYS),
        0.0,
        "evicted by gateway A, not closed by the server\n{a}"
    );
    assert_eq!(
        metric(
            &a,
            r#"tidegate_drain_actions_total{action="evict",result="executed"}"#
        ),
        1.0,
        "{a}"
    );
    let ended = held.wait_ended(&s.pod_a, Duration::from_secs(5)).await;
    s.delete().await;
    println!(
        "netns_drains evict-on-delete ({}/{}): failed requests {} of {}; tunnels opened during termination {}; \
         event -> first GOAWAY: none from the server (client-side eviction); peer deleted (file rewritten) -> pooled tunnel evicted on A {} [{}] \
         (bounded at 5 s; keepalive needs 10 s + 20 s); long-lived stream: {ended}; CNI DEL {}: {}",
        s.t.na,
        s.t.nb,
        failures.len(),
        ok + failures.len(),
        metric(&a, OPENED) - 1.0,
        ms(evicted),
        closed_reasons(&a),
        ms(del_took),
        stderr.trim()
    );
    let _ = &s.dir;
}

/// The replacement of the server pod: same service account (so the same
/// identity), a new uid and IP (a second address in pod B's namespace).
const REPLACEMENT_UID: &str = "echo-2-uid";

/// Peer events on the client node are decided by the *server's* policy (its
/// annotation names `p`, configured on gateway A; gateway A's clients carry
/// no annotation and there is no default), act on the deleted pod's tunnels
/// only — never on the replacement with the same identity — and show in
/// gateway A's `GET /drains`; a tunnel evicted "when idle" is listed as
/// draining while its stream runs.
#[tokio::test]
async fn peer_events_follow_the_servers_policy_and_spare_its_replacement() {
    if skip() {
        return;
    }
    let plugins = format!(
        "policies:\n  plugins:\n    p:\n      file: {}\n      config: '{{\"on-peer-terminating\": \"evict-when-idle\"}}'\n",
        plugin("evict-on-delete").display()
    );
    let s = Scenario::start(4, &plugins, &plugins).await;
    let replacement = std::net::Ipv4Addr::new(10, s.t.x, 2, 3);
    tidegate_e2e::netns::run(&format!(
        "ip -n {} addr add {replacement}/24 dev eth0",
        s.t.pb
    ));
    tidegate_e2e::netns::run(&format!(
        "ip netns exec {} iptables -t nat -A PREROUTING -p tcp -d {replacement} --dport {HBONE_PORT} \
         -j REDIRECT --to-ports {HBONE_PORT}",
        s.t.nb
    ));
    let annotated = |state: &str| {
        format!(
            "workloads:\n\
             - {{uid: client-uid, name: client, namespace: demo, service_account: client, ips: [{}], node: node-a}}\n\
             - {{uid: {ECHO_UID}, name: echo, namespace: demo, service_account: echo, ips: [{}], node: node-b, \
                 state: {state}, annotations: {{tidegate.io/drain-policy: p}}}}\n\
             - {{uid: {REPLACEMENT_UID}, name: echo-2, namespace: demo, service_account: echo, ips: [{replacement}], \
                 node: node-b, annotations: {{tidegate.io/drain-policy: p}}}}\n",
            s.t.pod_a(),
            s.t.pod_b()
        )
    };
    write_atomically(
        &s.dir.path().join("server-workloads.yaml"),
        &annotated("running"),
    );
    write_atomically(&s.client_workloads, &annotated("running"));
    for gw in [&s.gw_a, &s.gw_b] {
        tidegate_e2e::wait_for("both gateways know the replacement", STEP, || async {
            let dump = gw.admin_ok("GET", "/config_dump").await;
            dump.to_string().contains(REPLACEMENT_UID).then_some(())
        })
        .await;
    }
    let mut old = Held::open(&s.pod_a, s.echo).await;
    let mut new = Held::open(&s.pod_a, SocketAddr::new(replacement.into(), ECHO_PORT)).await;
    let pooled = |dump: &serde_json::Value, ip: std::net::Ipv4Addr| -> Vec<String> {
        dump["pool"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| {
                t["dst_addr"]
                    .as_str()
                    .unwrap()
                    .starts_with(&format!("{ip}:"))
            })
            .map(|t| t["state"].as_str().unwrap().to_owned())
            .collect()
    };
    let dump = s.gw_a.admin_ok("GET", "/config_dump").await;
    assert_eq!(pooled(&dump, s.t.pod_b()), ["active"], "{dump}");
    assert_eq!(pooled(&dump, replacement), ["active"], "{dump}");

    // The old pod terminates: its policy (evict when idle) decides on A.
    write_atomically(&s.client_workloads, &annotated("terminating"));
    let drains = tidegate_e2e::wait_for("A shows the peer-terminating decision", STEP, || async {
        let d = s.gw_a.admin_ok("GET", "/drains").await;
        (d["peer_drains"].as_array().is_some_and(|p| !p.is_empty())).then_some(d)
    })
    .await;
    let peer = &drains["peer_drains"][0];
    assert_eq!(peer["peer"], ECHO_UID, "{drains}");
    assert_eq!(peer["workload"], "demo/echo", "{drains}");
    let d = &peer["decisions"][0];
    assert_eq!(d["event"], "peer-terminating", "{drains}");
    assert_eq!(d["policy"], "p", "{drains}");
    assert_eq!(d["selected_by"], "annotation", "{drains}");
    assert_eq!(d["tunnels_evicted"], 1, "{drains}");
    // Evicted when idle: no longer pooled for new streams, listed as
    // draining while the held stream runs on it.
    let dump = s.gw_a.admin_ok("GET", "/config_dump").await;
    assert_eq!(pooled(&dump, s.t.pod_b()), ["draining"], "{dump}");
    assert_eq!(pooled(&dump, replacement), ["active"], "{dump}");
    old.round_trip(&s.pod_a, "old pod, draining tunnel").await;

    // The old pod is deleted: its tunnel is cut; the replacement's, with
    // the same identity, is untouched.
    write_atomically(
        &s.client_workloads,
        &annotated("running")
            .lines()
            .filter(|l| !l.contains(&format!("uid: {ECHO_UID},")))
            .map(|l| format!("{l}\n"))
            .collect::<String>(),
    );
    let ended = old.wait_ended(&s.pod_a, STEP).await;
    new.round_trip(&s.pod_a, "replacement after the old pod's deletion")
        .await;
    let drains = s.gw_a.admin_ok("GET", "/drains").await;
    let d = &drains["peer_drains"][0]["decisions"][1];
    assert_eq!(d["event"], "peer-deleted", "{drains}");
    assert_eq!(d["selected_by"], "annotation", "{drains}");
    let dump = s.gw_a.admin_ok("GET", "/config_dump").await;
    assert_eq!(pooled(&dump, replacement), ["active"], "{dump}");
    assert!(pooled(&dump, s.t.pod_b()).is_empty(), "{dump}");
    new.close(&s.pod_a).await;
    println!("netns_drains peer events: old pod's held stream after its deletion: {ended}; replacement untouched");
}
