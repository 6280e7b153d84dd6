//! `--pair NAME=COMMAND`: the same set applied by another gateway that a
//! command line starts, side by side with tidegate in one run.
//!
//! ```text
//! XDS_WORKLOADS=100000 cargo bench -p tidegate-e2e --bench xds -- \
//!     --pair 'ztunnel=exec env PROXY_MODE=shared NODE_NAME=$XDS_PAIR_NODE ... /path/to/ztunnel proxy ztunnel'
//! ```
//!
//! The bench runs `sh -c COMMAND` in a network namespace of its own (only
//! its loopback; its own process group, killed at the end), fed by a
//! second xDS double holding the same set. In that namespace, on
//! 127.0.0.1, with these variables:
//!
//! | variable | what |
//! |---|---|
//! | `XDS_PAIR_ADDRESS` / `XDS_PAIR_ROOT` | the xDS double (`https://127.0.0.1:port`, delta ADS) and its root (PEM file) |
//! | `XDS_PAIR_TOKEN` | a token file (the doubles accept any) |
//! | `XDS_PAIR_NODE` | the node name: about 30 of the pods are on it |
//! | `XDS_PAIR_CA_ADDRESS` / `XDS_PAIR_CA_ROOT` | an Istio CA double (`CreateCertificate`, a leaf for any identity, valid 24 h) and its root |
//! | `XDS_PAIR_ZDS` | a node agent's ZDS socket (ztunnel's `INPOD_UDS`): the bench answers the hello with an empty snapshot |
//! | `XDS_PAIR_TRUST_DOMAIN` / `XDS_PAIR_CLUSTER_ID` | `cluster.local` / `Kubernetes` |
//!
//! The gateway is ready when `http://127.0.0.1:15021/healthz/ready`
//! answers 200 in the namespace (ztunnel's readiness, which waits for
//! both subscriptions' answers to be ACKed and the ZDS snapshot). Read
//! from /proc for the command's process tree: its RSS (`VmRSS`) and its
//! CPU time (user + system at ready, in clock ticks, exited threads
//! included; over the update phase, its threads' run time in
//! nanoseconds). A NACK from it stops the bench with its
//! message.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tidegate_e2e::ca_double::{Answer, CaDouble};
use tidegate_e2e::netns::{NetnsGuard, NsThread};
use tidegate_e2e::procfs::{process_tree, stat_fields};
use tidegate_e2e::xds_double::XdsDouble;
use tidegate_e2e::zds_double::ZdsDouble;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// ztunnel's readiness port (not configurable there).
const READY_PORT: u16 = 15021;
const CA_VALIDITY: Duration = Duration::from_secs(24 * 3600);

/// The gateway a command line starts.
pub struct PairSpec {
    pub name: String,
    pub command: String,
}

/// The `--pair NAME=COMMAND` argument; `None` when there is none.
pub fn parse_args(args: &[String]) -> anyhow::Result<Option<PairSpec>> {
    let mut found = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = match a.as_str() {
            "--pair" => it.next().context("--pair needs NAME=COMMAND")?.clone(),
            s if s.starts_with("--pair=") => s["--pair=".len()..].to_owned(),
            _ => continue,
        };
        let Some((name, cmd)) = v
            .split_once('=')
            .filter(|(n, c)| !n.is_empty() && !c.trim().is_empty())
        else {
            bail!("--pair {v:?}: expected NAME=COMMAND");
        };
        if found.is_some() {
            bail!("--pair: one gateway beside tidegate, not several");
        }
        found = Some(PairSpec {
            name: name.into(),
            command: cmd.into(),
        });
    }
    Ok(found)
}

/// The namespace, the CA double in it, and the files the command reads.
pub struct PairEnv {
    pub spec: PairSpec,
    ns: String,
    dir: tempfile::TempDir,
    ca: CaDouble,
    starts: usize,
    /// The doubles' runtime (inside the namespace).
    thread: NsThread,
    _guard: NetnsGuard,
}

/// A started gateway: its process group, killed on drop.
pub struct PairStarted {
    proc: Proc,
    /// Its process tree at ready (read once: a walk of /proc costs
    /// milliseconds of this process's CPU).
    tree: Vec<u32>,
    /// Spawn → readiness 200.
    pub to_ready: Duration,
    /// Stream open → the Address subscription's answer ACKed.
    pub open_to_ack: Duration,
    /// The command's CPU time at ready.
    pub cpu_at_ready: Duration,
    /// This process's CPU time over the same (the double's share).
    pub double_cpu: Duration,
    /// The command's RSS once ready (plus a 500 ms settle), bytes.
    pub rss: u64,
    /// The node agent double's task (aborted on drop).
    zds: tokio::task::JoinHandle<()>,
}

impl PairStarted {
    /// The command's CPU time so far, to the nanosecond: its live
    /// threads' run time (/proc/<pid>/task/*/schedstat).
    pub fn cpu(&self) -> Duration {
        tree_run_time(&self.tree)
    }

    /// Lines of its log that say WARN or ERROR: how many, and the first.
    pub fn log_warnings(&self) -> (usize, Option<String>) {
        let s = std::fs::read_to_string(&self.proc.log).unwrap_or_default();
        let mut w = s.lines().filter(|l| {
            l.split_whitespace()
                .any(|t| t.eq_ignore_ascii_case("warn") || t.eq_ignore_ascii_case("error"))
        });
        let first = w.next().map(str::to_owned);
        (first.is_some() as usize + w.count(), first)
    }
}

impl PairEnv {
    pub async fn new(spec: PairSpec) -> anyhow::Result<PairEnv> {
        let ns = format!("xdsp-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let mut guard = NetnsGuard::default();
        tidegate_e2e::netns::run(&format!("ip netns add {ns}"));
        guard.push(&ns);
        tidegate_e2e::netns::run(&format!("ip -n {ns} link set lo up"));
        let thread = NsThread::idle(&ns);
        let ca = thread
            .run("CA double", super::WAIT, async {
                CaDouble::start_valid_for(Answer::Good, CA_VALIDITY).await
            })
            .await;
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("ca-root.pem"), &ca.root_pem)?;
        std::fs::write(dir.path().join("token"), "tok")?;
        Ok(PairEnv {
            spec,
            ns,
            dir,
            ca,
            starts: 0,
            thread,
            _guard: guard,
        })
    }

    /// An xDS double in the namespace.
    pub async fn double(&self) -> Arc<XdsDouble> {
        let double = self
            .thread
            .run("xDS double", super::WAIT, async {
                XdsDouble::start_on([127, 0, 0, 1].into()).await
            })
            .await;
        Arc::new(double)
    }

    /// `GET path` of `addr` from inside the namespace: status and body.
    pub async fn get(&self, addr: SocketAddr, path: &str) -> (u16, String) {
        let path = path.to_owned();
        let task = self
            .thread
            .handle
            .spawn(async move { tidegate_e2e::http_get(addr, &path).await });
        task.await.unwrap_or((0, String::new()))
    }

    /// Starts the command against `double` and waits until it is ready.
    pub async fn start(&mut self, double: &Arc<XdsDouble>) -> anyhow::Result<PairStarted> {
        self.starts += 1;
        let n = self.starts;
        let d = self.dir.path();
        let root = d.join(format!("xds-root-{n}.pem"));
        std::fs::write(&root, &double.root_pem)?;
        let zds_path = d.join(format!("zds-{n}.sock"));
        let zds = ZdsDouble::bind(&zds_path)?;
        let zds = tokio::spawn(async move {
            let conn = match tokio::time::timeout(super::WAIT, zds.accept()).await {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => return eprintln!("ZDS: {e:#}"),
                Err(_) => return eprintln!("ZDS: no client within {:?}", super::WAIT),
            };
            if let Err(e) = conn.snapshot(vec![], &[]).await {
                eprintln!("ZDS snapshot: {e:#}");
            }
            // Held open as a node agent holds it.
            std::future::pending::<()>().await;
            drop((conn, zds));
        });
        let watcher = super::watch_next_stream(double);
        let log = d.join(format!("{}-{n}.log", self.spec.name));
        let c0 = super::cpu_time();
        let t0 = Instant::now();
        let mut proc = self.spawn(double.addr, &root, &zds_path, &log)?;
        let ready = SocketAddr::from(([127, 0, 0, 1], READY_PORT));
        loop {
            let probe = self.thread.handle.spawn(ready_200(ready));
            if probe.await.unwrap_or(false) {
                break;
            }
            if let Some(status) = proc.child.try_wait()? {
                bail!(
                    "{} exited ({status}) before it was ready:\n{}",
                    self.spec.name,
                    proc.log_tail()
                );
            }
            if t0.elapsed() > super::WAIT {
                bail!(
                    "{} not ready within {:?}:\n{}",
                    self.spec.name,
                    super::WAIT,
                    proc.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let to_ready = t0.elapsed();
        let tree = process_tree(proc.child.id());
        let cpu_at_ready = tree_cpu(&tree);
        let double_cpu = super::cpu_time() - c0;
        let (open_to_ack, nack) = tokio::time::timeout(super::WAIT, watcher)
            .await
            .context("the Address answer ACKed")??;
        if let Some(nack) = nack {
            bail!("{} NACKed the set: {nack}", self.spec.name);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss = tree_rss(&tree);
        Ok(PairStarted {
            proc,
            tree,
            to_ready,
            open_to_ack,
            cpu_at_ready,
            double_cpu,
            rss,
            zds,
        })
    }

    fn spawn(
        &self,
        xds: SocketAddr,
        root: &std::path::Path,
        zds: &std::path::Path,
        log: &std::path::Path,
    ) -> anyhow::Result<Proc> {
        let line = &self.spec.command;
        let out = std::fs::File::create(log)?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, "sh", "-c", line])
            .env("XDS_PAIR_ADDRESS", format!("https://{xds}"))
            .env("XDS_PAIR_ROOT", root)
            .env("XDS_PAIR_TOKEN", self.dir.path().join("token"))
            .env("XDS_PAIR_NODE", super::GATEWAY_NODE)
            .env("XDS_PAIR_CA_ADDRESS", format!("https://{}", self.ca.addr))
            .env("XDS_PAIR_CA_ROOT", self.dir.path().join("ca-root.pem"))
            .env("XDS_PAIR_ZDS", zds)
            .env("XDS_PAIR_TRUST_DOMAIN", "cluster.local")
            .env("XDS_PAIR_CLUSTER_ID", "Kubernetes")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0);
        // SAFETY: the pre_exec hook only calls prctl(2), which is
        // async-signal-safe and allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("spawn {line}"))?;
        Ok(Proc {
            child,
            log: log.to_owned(),
        })
    }
}

impl Drop for PairStarted {
    fn drop(&mut self) {
        self.zds.abort();
    }
}

/// The command's process group.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Proc {
    /// Kills the whole group and reaps the leader.
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's process group.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// Whether `GET /healthz/ready` on `addr` answers 200 (false while nothing listens).
async fn ready_200(addr: SocketAddr) -> bool {
    let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    let req = format!("GET /healthz/ready HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if tcp.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut out = Vec::new();
    let _ = tcp.read_to_end(&mut out).await;
    out.starts_with(b"HTTP/1.1 200")
}

/// User + system CPU time of the processes of `tree`.
fn tree_cpu(tree: &[u32]) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let ticks: u64 = tree
        .iter()
        .filter_map(|p| stat_fields(*p))
        .map(|f| f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0))
        .sum();
    Duration::from_secs_f64(ticks as f64 / hz)
}

/// The run time of every live thread of the processes of `tree`.
fn tree_run_time(tree: &[u32]) -> Duration {
    let ns: u64 = tree
        .iter()
        .filter_map(|p| std::fs::read_dir(format!("/proc/{p}/task")).ok())
        .flat_map(|tasks| tasks.flatten())
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

/// `VmRSS` of the processes of `tree`, bytes.
fn tree_rss(tree: &[u32]) -> u64 {
    tree.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .filter_map(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .sum::<u64>()
        * 1024
}
