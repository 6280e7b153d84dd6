//! The real `tidegate` binary as each node's gateway: one process per node
//! (started inside the node's namespace), its configuration, its admin and
//! metrics endpoints, and the signals the scenarios send it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::params::REFERENCE_POLICIES;
use super::probes::HttpProbe;
use super::process::Proc;
use super::LabError;
use crate::netns::{HBONE_PORT, OUTBOUND_PORT};

/// Files of one node's gateway.
pub struct NodeFiles {
    pub node: char,
    pub workloads: PathBuf,
    pub cni_socket: PathBuf,
    /// `--source istio`: the double instead of the workload file.
    pub istio: Option<IstioSource>,
    /// How long it may take to be ready.
    pub ready_within: Duration,
}

/// `workloads.source: istio` against the lab's double.
#[derive(Clone)]
pub struct IstioSource {
    /// `https://ip:port`.
    pub address: String,
    pub roots: PathBuf,
    pub token: PathBuf,
    /// The gateway's own address (its node's).
    pub pod_ip: std::net::IpAddr,
    /// `policies.default`: istiod carries no annotations, so the run's
    /// policy is every pod's through the default.
    pub policy: String,
}

/// `target/<profile>/<name>`, beside this executable.
pub fn sibling_binary(name: &str) -> Result<PathBuf, LabError> {
    let exe = std::env::current_exe().map_err(|e| LabError::Setup(format!("current_exe: {e}")))?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    // A test binary lives in target/<profile>/deps.
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join(name);
    if !bin.exists() {
        return Err(LabError::Setup(format!(
            "{} missing: build it with `cargo build --workspace --bins --tests`",
            bin.display()
        )));
    }
    Ok(bin)
}

/// The config of node `files.node`'s gateway, generation `gen` (a restarted
/// gateway runs beside the old one, so its control ports differ).
fn config_yaml(files: &NodeFiles, ca: &Path, gen: u16) -> String {
    let mut plugins = String::new();
    for name in REFERENCE_POLICIES {
        let file = crate::plugin(name);
        let config = if *name == "recommended" {
            ", config: {hold-ms: 10000, failure-threshold: 3}"
        } else {
            ""
        };
        plugins.push_str(&format!(
            "    {name}: {{file: {}{config}}}\n",
            file.display()
        ));
    }
    let (workloads, default) = match &files.istio {
        None => (
            format!(
                "  file: {}\n  reload_interval: 10ms",
                files.workloads.display()
            ),
            "recommended",
        ),
        Some(i) => (
            format!(
                "  source: istio\n  istio:\n    address: {}\n    roots: {}\n    token: {}\n    \
                 pod_ip: {}\n    pod_name: tidegate-node-{}\n    pod_namespace: istio-system",
                i.address,
                i.roots.display(),
                i.token.display(),
                i.pod_ip,
                files.node
            ),
            i.policy.as_str(),
        ),
    };
    format!(
        r#"node_name: node-{node}
trust_domain: cluster.local
listeners:
  outbound: '[::]:{OUTBOUND_PORT}'
  inbound: '[::]:{HBONE_PORT}'
  admin: 127.0.0.1:{admin}
  metrics: 127.0.0.1:{metrics}
  readiness: 127.0.0.1:{ready}
certificates:
  source: dev-ca
  state_dir: {ca}
workloads:
{workloads}
hbone:
  port: {HBONE_PORT}
drains:
  cni_socket: {socket}
policies:
  default: {default}
  fallback: keepalive-only
  plugins:
{plugins}"#,
        node = files.node,
        admin = 16000 + gen,
        metrics = 16100 + gen,
        ready = 16200 + gen,
        ca = ca.display(),
        socket = files
            .cni_socket
            .with_extension(format!("{gen}.sock"))
            .display(),
    )
}

/// One gateway process.
pub struct Gateway {
    pub proc: Proc,
    pub admin: HttpProbe,
    pub metrics: HttpProbe,
    pub log: PathBuf,
    pub cni_socket: PathBuf,
    /// Spawn → ready.
    pub ready_after: Duration,
}

impl Gateway {
    /// Starts generation `gen` of node `files.node`'s gateway in `ns` and
    /// waits (at most `files.ready_within`) until it answers ready.
    /// `probe_rt` runs inside `ns`.
    pub async fn start(
        ns: &str,
        probe_rt: tokio::runtime::Handle,
        files: &NodeFiles,
        dir: &Path,
        gen: u16,
    ) -> Result<Gateway, LabError> {
        let bin = sibling_binary("tidegate")?;
        let config = dir.join(format!("gateway-{}-{gen}.yaml", files.node));
        let log = dir.join(format!("gateway-{}-{gen}.log", files.node));
        std::fs::write(&config, config_yaml(files, &dir.join("ca"), gen))
            .map_err(|e| LabError::Setup(format!("write {}: {e}", config.display())))?;
        let log_file = std::fs::File::create(&log)
            .map_err(|e| LabError::Setup(format!("create {}: {e}", log.display())))?;
        let mut cmd = Command::new(bin);
        // The gateway reads TIDEGATE_* as config keys: pass none but the log filter.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TIDEGATE_") {
                cmd.env_remove(k);
            }
        }
        cmd.args(["run", "--config"])
            .arg(&config)
            .env("TIDEGATE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        let name = format!("gateway {} (generation {gen})", files.node);
        let spawned = std::time::Instant::now();
        let (proc, _child) = Proc::spawn(&name, ns, cmd)?;
        let lo = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let mut gw = Gateway {
            proc,
            admin: HttpProbe::new(probe_rt.clone(), lo(16000 + gen)),
            metrics: HttpProbe::new(probe_rt.clone(), lo(16100 + gen)),
            log,
            cni_socket: files.cni_socket.with_extension(format!("{gen}.sock")),
            ready_after: Duration::ZERO,
        };
        let ready = HttpProbe::new(probe_rt, lo(16200 + gen));
        let deadline = tokio::time::Instant::now() + files.ready_within;
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tick.tick().await;
            if let Some((what, _)) = gw.proc.exit() {
                return Err(LabError::Gateway(format!(
                    "{name} exited ({what}) before it was ready:\n{}",
                    gw.log_tail()
                )));
            }
            if let Ok((200, _)) = ready.request("GET", "/healthz/ready").await {
                gw.ready_after = spawned.elapsed();
                return Ok(gw);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(LabError::Gateway(format!(
                    "{name} not ready within {:?}:\n{}",
                    files.ready_within,
                    gw.log_tail()
                )));
            }
        }
    }

    pub async fn metrics_text(&self) -> Result<String, LabError> {
        self.metrics.get_ok("/metrics").await
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}
