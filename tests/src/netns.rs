//! Network namespaces for end-to-end tests: two "nodes" and two "pods"
//! joined by veth pairs, iptables REDIRECT on the nodes, and threads that
//! run a tokio runtime inside a namespace (sockets are created in the
//! namespace of the thread that creates them).

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::Duration;

use tidegate::app::BoundAddrs;
use tidegate::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

pub const OUTBOUND_PORT: u16 = 15001;
pub const HBONE_PORT: u16 = 15008;

/// Node mode: gateway A's capture listener is on [`OUTBOUND_PORT`] and
/// gateway B's HBONE one on [`HBONE_PORT`] (what the nodes' REDIRECT rules
/// send to).
pub fn assert_node_ports(a: &Gateway, b: &Gateway) {
    let bound = |addr: Option<std::net::SocketAddr>| addr.expect("node listeners").port();
    assert_eq!(bound(a.addrs.outbound), OUTBOUND_PORT);
    assert_eq!(bound(b.addrs.inbound), HBONE_PORT);
}
pub const ECHO_PORT: u16 = 8080;
/// Bound on any single step (a round trip, a gateway start, a metric to settle).
pub const STEP: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// Topology: four namespaces joined by three veth pairs.

/// Names and addresses derived from the process id, so concurrent runs (and
/// leftovers of a killed run) never collide.
pub struct Topology {
    pub na: String,
    pub nb: String,
    pub pa: String,
    pub pb: String,
    /// Second octet of every address: 10.X.{0,1,2}.0/24.
    pub x: u8,
}

impl Topology {
    /// Scenario `k` (0..4) of a test binary whose namespaces start with `tag`.
    pub fn new(tag: &str, k: u8) -> Topology {
        let pid = std::process::id();
        Topology {
            na: format!("{tag}{pid}s{k}na"),
            nb: format!("{tag}{pid}s{k}nb"),
            pa: format!("{tag}{pid}s{k}pa"),
            pb: format!("{tag}{pid}s{k}pb"),
            x: 20 + (pid % 50) as u8 * 4 + (k % 4),
        }
    }

    pub fn all(&self) -> [&str; 4] {
        [&self.na, &self.nb, &self.pa, &self.pb]
    }

    pub fn addr(&self, subnet: u8, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.x, subnet, host)
    }
    /// Node A on the node link.
    pub fn node_a(&self) -> Ipv4Addr {
        self.addr(0, 1)
    }
    /// Node B on the node link.
    pub fn node_b(&self) -> Ipv4Addr {
        self.addr(0, 2)
    }
    /// Node A's side of pod A's veth (pod A's gateway).
    pub fn node_a_to_pod(&self) -> Ipv4Addr {
        self.addr(1, 1)
    }
    pub fn pod_a(&self) -> Ipv4Addr {
        self.addr(1, 2)
    }
    /// Node B's side of pod B's veth: the address gateway B dials pod B from.
    pub fn node_b_to_pod(&self) -> Ipv4Addr {
        self.addr(2, 1)
    }
    pub fn pod_b(&self) -> Ipv4Addr {
        self.addr(2, 2)
    }
}

/// Runs a command line (arguments separated by whitespace); panics with its
/// stderr when it cannot run or fails.
pub fn run(cmdline: &str) {
    let args: Vec<&str> = cmdline.split_whitespace().collect();
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("netns setup: cannot run `{cmdline}`: {e}"));
    if !out.status.success() {
        panic!(
            "netns setup: `{cmdline}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
}

/// A veth pair created in `ns1` (`if1`, address `a1` with its prefix) with
/// its peer placed directly in `ns2` (`if2`, `a2`), both up: the host
/// namespace is never touched.
pub fn veth(ns1: &str, if1: &str, a1: &str, ns2: &str, if2: &str, a2: &str) {
    run(&format!(
        "ip -n {ns1} link add {if1} type veth peer name {if2} netns {ns2}"
    ));
    run(&format!("ip -n {ns1} addr add {a1} dev {if1}"));
    run(&format!("ip -n {ns2} addr add {a2} dev {if2}"));
    run(&format!("ip -n {ns1} link set {if1} up"));
    run(&format!("ip -n {ns2} link set {if2} up"));
}

/// Deletes the namespaces (their veths go with them) when dropped, panic or not.
#[derive(Default)]
pub struct NetnsGuard {
    names: Vec<String>,
}

impl NetnsGuard {
    /// Creates `names` afresh (deleting any left behind by a killed earlier
    /// process with our pid), each with its loopback up; the guard is armed
    /// before the first exists.
    pub fn fresh<S: AsRef<str>>(names: &[S]) -> NetnsGuard {
        for ns in names {
            let _ = Command::new("ip")
                .args(["netns", "del", ns.as_ref()])
                .output();
        }
        let mut guard = NetnsGuard::default();
        for ns in names.iter().map(AsRef::as_ref) {
            run(&format!("ip netns add {ns}"));
            guard.push(ns);
            run(&format!("ip -n {ns} link set lo up"));
        }
        guard
    }

    /// Deletes `ns` too when dropped.
    pub fn push(&mut self, ns: &str) {
        self.names.push(ns.to_owned());
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        for ns in &self.names {
            let out = Command::new("ip").args(["netns", "del", ns]).output();
            match out {
                Ok(o) if o.status.success() => {}
                Ok(o) => eprintln!(
                    "netns cleanup: `ip netns del {ns}` failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                Err(e) => eprintln!("netns cleanup: cannot run `ip netns del {ns}`: {e}"),
            }
        }
    }
}

/// Creates the namespaces, veths, addresses, routes, forwarding and the two
/// REDIRECT rules. The guard is armed before the first namespace exists.
pub fn build_topology(t: &Topology) -> NetnsGuard {
    let guard = NetnsGuard::fresh(&t.all());
    let (na, nb, pa, pb) = (&t.na, &t.nb, &t.pa, &t.pb);
    let pairs = [
        (na, "to-pa", t.node_a_to_pod(), pa, "eth0", t.pod_a()),
        (nb, "to-pb", t.node_b_to_pod(), pb, "eth0", t.pod_b()),
        (na, "to-nb", t.node_a(), nb, "to-na", t.node_b()),
    ];
    for (ns1, if1, a1, ns2, if2, a2) in pairs {
        veth(ns1, if1, &format!("{a1}/24"), ns2, if2, &format!("{a2}/24"));
    }
    run(&format!(
        "ip -n {pa} route add default via {}",
        t.node_a_to_pod()
    ));
    run(&format!(
        "ip -n {pb} route add default via {}",
        t.node_b_to_pod()
    ));
    run(&format!(
        "ip -n {na} route add {}/24 via {}",
        t.addr(2, 0),
        t.node_b()
    ));
    run(&format!(
        "ip -n {nb} route add {}/24 via {}",
        t.addr(1, 0),
        t.node_a()
    ));
    for ns in [na, nb] {
        run(&format!(
            "ip netns exec {ns} sysctl -q -w net.ipv4.ip_forward=1"
        ));
    }
    // Outbound capture: everything pod A sends over TCP lands on gateway A.
    run(&format!(
        "ip netns exec {na} iptables -t nat -A PREROUTING -i to-pa -p tcp \
         -j REDIRECT --to-ports {OUTBOUND_PORT}"
    ));
    // HBONE to pod B lands on gateway B's inbound listener.
    run(&format!(
        "ip netns exec {nb} iptables -t nat -A PREROUTING -p tcp -d {} --dport {HBONE_PORT} \
         -j REDIRECT --to-ports {HBONE_PORT}",
        t.pod_b()
    ));
    guard
}

// ---------------------------------------------------------------------------
// Threads living in a namespace.

/// Moves the calling thread into the named network namespace and checks that
/// it arrived there.
pub fn enter_netns(ns: &str) -> Result<(), String> {
    let path = format!("/var/run/netns/{ns}");
    let file = std::fs::File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
    // SAFETY: `file` is an open namespace file descriptor for the duration of the call.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(format!(
            "setns({path}): {}",
            std::io::Error::last_os_error()
        ));
    }
    let want = file
        .metadata()
        .map_err(|e| format!("stat {path}: {e}"))?
        .ino();
    let have = std::fs::metadata("/proc/thread-self/ns/net")
        .map_err(|e| format!("stat /proc/thread-self/ns/net: {e}"))?
        .ino();
    if want != have {
        return Err(format!(
            "after setns({path}) the thread is in netns inode {have}, not {want}"
        ));
    }
    Ok(())
}

/// An OS thread inside a network namespace driving a current-thread tokio
/// runtime. Futures given to [`NsThread::spawn`] run on that thread, so the
/// sockets they create belong to the namespace.
pub struct NsThread {
    ns: String,
    /// The runtime inside the namespace: spawn work there to stay in it.
    pub handle: tokio::runtime::Handle,
    stop: Option<oneshot::Sender<()>>,
    join: Option<std::thread::JoinHandle<()>>,
}

impl NsThread {
    /// Starts the thread; it runs `main(stop)` until that returns (`stop`
    /// fires when the `NsThread` is dropped). `main`'s future need not be `Send`.
    pub fn start<F, Fut>(ns: &str, main: F) -> NsThread
    where
        F: FnOnce(oneshot::Receiver<()>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let name = ns.to_owned();
        let join = std::thread::Builder::new()
            .name(format!("netns-{ns}"))
            .spawn(move || {
                if let Err(e) = enter_netns(&name) {
                    let _ = handle_tx.send(Err(e));
                    return;
                }
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(format!("tokio runtime: {e}")));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(rt.handle().clone()));
                rt.block_on(main(stop_rx));
            })
            .expect("spawn namespace thread");
        let handle = match handle_rx.recv_timeout(STEP) {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => panic!("thread for netns {ns}: {e}"),
            Err(e) => panic!("thread for netns {ns} did not start: {e}"),
        };
        NsThread {
            ns: ns.to_owned(),
            handle,
            stop: Some(stop_tx),
            join: Some(join),
        }
    }

    /// A thread that only runs what is spawned on it.
    pub fn idle(ns: &str) -> NsThread {
        Self::start(ns, |stop| async move {
            let _ = stop.await;
        })
    }

    /// Runs `fut` inside the namespace; panics (naming the namespace) if it
    /// panicked or did not finish within `within`.
    pub async fn run<T: Send + 'static>(
        &self,
        what: &str,
        within: Duration,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> T {
        let task = self.handle.spawn(fut);
        match tokio::time::timeout(within, task).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => panic!("{what} (in netns {}): task failed: {e}", self.ns),
            Err(_) => panic!("{what} (in netns {}): timed out after {within:?}", self.ns),
        }
    }
}

impl Drop for NsThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(join) = self.join.take() {
            if join.join().is_err() {
                eprintln!("thread for netns {} panicked", self.ns);
            }
        }
    }
}

/// Whether `cmd arg` fails to run (a missing tool).
pub fn tool_missing(cmd: &str, arg: &str) -> bool {
    !matches!(Command::new(cmd).arg(arg).output(), Ok(o) if o.status.success())
}

// ---------------------------------------------------------------------------
// Gateways.

pub enum GatewayCmd {
    Metrics(oneshot::Sender<String>),
}

/// An in-process gateway on its own thread inside a node namespace. The
/// `App` never leaves that thread; its metrics come back over a channel and
/// other work (admin requests) runs as tasks on the same thread.
pub struct Gateway {
    pub name: &'static str,
    pub addrs: BoundAddrs,
    pub cmds: mpsc::UnboundedSender<GatewayCmd>,
    /// Stops the gateway and joins its thread when dropped.
    pub thread: NsThread,
}

impl Gateway {
    pub async fn start(name: &'static str, ns: &str, config: Config) -> Gateway {
        let (ready_tx, ready_rx) = oneshot::channel::<Result<BoundAddrs, String>>();
        let (cmds, mut cmd_rx) = mpsc::unbounded_channel();
        let thread = NsThread::start(ns, move |mut stop| async move {
            let app = match tidegate::app::build(config).await {
                Ok(app) => app,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("{e:#}")));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(app.addrs));
            loop {
                tokio::select! {
                    _ = &mut stop => break,
                    cmd = cmd_rx.recv() => match cmd {
                        Some(GatewayCmd::Metrics(reply)) => {
                            let _ = reply.send(app.metrics_text());
                        }
                        None => break,
                    },
                }
            }
            // Bounded by `shutdown.deadline` in the config; this is a backstop.
            let _ = tokio::time::timeout(Duration::from_secs(10), app.shutdown()).await;
        });
        let addrs = match tokio::time::timeout(STEP, ready_rx).await {
            Ok(Ok(Ok(addrs))) => addrs,
            Ok(Ok(Err(e))) => panic!("gateway {name} in netns {ns} failed to start: {e}"),
            Ok(Err(_)) => panic!("gateway {name} in netns {ns} exited before it was ready"),
            Err(_) => panic!("gateway {name} in netns {ns} not ready within {STEP:?}"),
        };
        Gateway {
            name,
            addrs,
            cmds,
            thread,
        }
    }

    pub async fn metrics(&self) -> String {
        let (tx, rx) = oneshot::channel();
        self.cmds
            .send(GatewayCmd::Metrics(tx))
            .unwrap_or_else(|_| panic!("gateway {} is gone", self.name));
        tokio::time::timeout(STEP, rx)
            .await
            .unwrap_or_else(|_| panic!("gateway {} did not answer for metrics", self.name))
            .unwrap_or_else(|_| panic!("gateway {} dropped the metrics request", self.name))
    }

    /// Waits (at most `within`) until `check` holds on this gateway's
    /// metrics; on timeout panics with `what` and the full metrics text.
    pub async fn wait_metrics_within(
        &self,
        what: &str,
        within: Duration,
        check: impl Fn(&str) -> bool,
    ) -> String {
        let check = &check;
        let seen = crate::poll_within(within, || async move {
            let text = self.metrics().await;
            check(&text).then_some(text)
        })
        .await;
        if let Some(text) = seen {
            return text;
        }
        let text = self.metrics().await;
        panic!(
            "gateway {}: timed out after {within:?} waiting for: {what}\n--- metrics ---\n{text}",
            self.name
        );
    }

    pub async fn wait_metrics(&self, what: &str, check: impl Fn(&str) -> bool) -> String {
        self.wait_metrics_within(what, Duration::from_secs(10), check)
            .await
    }

    /// One admin request (`method path`) to this gateway, made from a task on
    /// its own thread: the admin listener is 127.0.0.1 of the node namespace.
    /// Returns the status code and the JSON body (`null` if not JSON).
    pub async fn admin(&self, method: &str, path: &str) -> (u16, serde_json::Value) {
        self.http(self.addrs.admin, method, path).await
    }

    /// `GET /healthz/ready` on the readiness listener: its status code.
    pub async fn readiness(&self) -> u16 {
        self.http(self.addrs.readiness, "GET", "/healthz/ready")
            .await
            .0
    }

    async fn http(&self, addr: SocketAddr, method: &str, path: &str) -> (u16, serde_json::Value) {
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        );
        let what = format!("admin {method} {path} on gateway {}", self.name);
        let out = self
            .thread
            .run(&what, STEP, async move {
                let mut tcp = TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("connect {addr}: {e}"))?;
                tcp.write_all(request.as_bytes())
                    .await
                    .map_err(|e| format!("write: {e}"))?;
                let mut out = String::new();
                tcp.read_to_string(&mut out)
                    .await
                    .map_err(|e| format!("read: {e}"))?;
                Ok::<String, String>(out)
            })
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let status: u16 = out
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{what}: not an HTTP response: {out:?}"));
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (
            status,
            serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
        )
    }

    /// Like [`Gateway::admin`]; panics unless the answer is 200.
    pub async fn admin_ok(&self, method: &str, path: &str) -> serde_json::Value {
        let (status, body) = self.admin(method, path).await;
        assert_eq!(
            status, 200,
            "admin {method} {path} on gateway {}: {body}",
            self.name
        );
        body
    }
}

/// A gateway inside a namespace: the ztunnel ports, the shared dev CA, the
/// watched workload file, then `extra` (YAML appended as is).
pub fn gateway_config(
    node: &str,
    ca: &std::path::Path,
    workloads: &std::path::Path,
    extra: &str,
) -> Config {
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
  file: {workloads}
  reload_interval: 50ms
hbone:
  port: {HBONE_PORT}
shutdown:
  deadline: 2s
{extra}"#,
        ca = ca.display(),
        workloads = workloads.display(),
    );
    Config::from_yaml(&yaml).unwrap_or_else(|e| panic!("test config: {e}\n{yaml}"))
}
