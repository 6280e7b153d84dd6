//! `--pair NAME=COMMAND`: the same measurements against any HBONE gateway
//! pair that a command line starts, side by side in one run.
//!
//! ```text
//! cargo bench -p tidegate-e2e --bench dataplane -- \
//!     --pair 'ztunnel=exec env ... /path/to/ztunnel proxy ztunnel' --pair tidegate
//! ```
//!
//! The topology is a real node pair in network namespaces (the in-pod one of
//! `tidegate_e2e::inpod`): pod A (client) on node A, pod B (echo + sink
//! servers) on node B, the nodes joined by a veth. Both pods get istio-cni's
//! in-pod capture rules (`tidegate_netns::capture`, the rules istio-cni
//! installs), so an application connection from pod A goes to pod A's
//! 15001, over HBONE (mTLS, HTTP/2 CONNECT) to pod B's 15008, and from
//! there to the server: client pod → gateway A → HBONE → gateway B → server.
//!
//! For each pair and each node the bench runs `sh -c COMMAND` inside that
//! node's namespace (its own process group), with:
//!
//! | variable | what |
//! |---|---|
//! | `DP_NODE` | `node-a` or `node-b` |
//! | `DP_ZDS` | the node agent's ZDS socket (ztunnel's `INPOD_UDS`): the bench serves it and hands over the node's pod |
//! | `DP_CA_ADDRESS` | an Istio CA (`tidegate-ca` in this process over the Kubernetes API double; trusts `tidegate-system/tidegate`) |
//! | `DP_CA_ROOT` | its root certificate (PEM) |
//! | `DP_TOKEN` | a token file the CA accepts for this node's gateway |
//! | `DP_XDS_ADDRESS` / `DP_XDS_ROOT` | istiod's delta ADS (the xDS double: workloads, and the Service of `--rollout`) and its root (ztunnel's `XDS_ADDRESS`, `XDS_ROOT_CA`) |
//! | `DP_TRUST_DOMAIN` / `DP_CLUSTER_ID` | `cluster.local` / `Kubernetes` |
//! | `DP_DIR` | `workloads.yaml` (tidegate's workload file) and `local-xds.yaml` (the same two pods in ztunnel's `LOCAL_XDS_PATH` format) |
//! | `DP_LOG` | a file for the gateway's log (access logs on) |
//!
//! `--pair tidegate` (no `=`) is the built-in line: the release `tidegate
//! run` in `capture.mode: inpod` with `zds_socket: $DP_ZDS` and
//! `certificates.source: istio-ca`; its workloads come from the file, or
//! with `--rollout` from the xDS double (with the `recommended` policy).
//! `--rollout` needs every pair to take its workloads from
//! `DP_XDS_ADDRESS`: the replicas change during the run.
//!
//! A pair is up when both have ACKed their pod's `AddWorkload` and the ZDS
//! snapshot, and a 1-byte round trip from pod A to pod B has gone through.
//! Every figure is checked to have crossed HBONE: a counting rule in pod
//! B's mangle INPUT for TCP to 15008 must have seen at least the bytes the
//! throughput run moved. Rounds are interleaved (raw, then every pair,
//! each round starting one pair later: raw, 1, 2; raw, 2, 1; ... 3 rounds,
//! or `DATAPLANE_ROUNDS=N`); each pair is started afresh every round and
//! killed after it. The ratio column gives the ratio of the medians, then
//! the median and the range of the per-round ratios: each round's pairs run
//! seconds apart, so a round's ratio is paired and the machine's drift
//! between rounds cancels out of it.
//! Besides CPU-seconds per GB, both gateways' CPU time is read (from
//! /proc) over each latency phase and divided by the requests served: CPU-µs
//! per warm round trip and per new connection, where a latency gap that is
//! work shows apart from one that is waiting.
//! `DATAPLANE_PERF_STAT=1` adds a `perf stat` of both gateways during each
//! transfer (page faults, context switches, syscalls, futex calls per MB)
//! and during each latency phase (the same counts per request).
//! With `--ipv6` (the data-path figures only), the topology is dual-stack
//! (`InpodTopology::add_ipv6`) and the two pods are workloads by their IPv6
//! addresses alone: every application connection, tunnel and delivery is
//! IPv6 (`[fd00:X:2::2]:15008`), the counting rule is `ip6tables`'; the CA
//! and istiod stay on the nodes' IPv4 addresses. ztunnel needs
//! `IPV6_ENABLED=true` for it. A pair of two different gateways is one
//! command that starts either by `$DP_NODE` (node A is the client's).
//! `DATAPLANE_PERF_RR=<dir>` records a `perf` profile (call graphs) of both
//! gateways during each pair's warm round trips, into `<dir>/<pair>-rr.data`
//! (the last round's); `DATAPLANE_PERF_TP=<dir>` the same during the
//! transfer, into `<dir>/<pair>-tp.data`, and `DATAPLANE_PERF_CONN=<dir>`
//! during the new connections, into `<dir>/<pair>-conn.data`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use prost::Message as _;
use serde_json::json;
use tidegate_e2e::ca::{ca_config, gateway_pod};
use tidegate_e2e::inpod::InpodTopology;
use tidegate_e2e::kube_api::{FakeApiServer, Kind};
use tidegate_e2e::lab::app_server::APP_PORT;
use tidegate_e2e::measure::{
    idle_conns, measure, median, new_conns, servers, throughput, warm_rr, Figures, RR_WARMUP,
};
use tidegate_e2e::netns::NsThread;
use tidegate_e2e::procfs::process_tree;
use tidegate_e2e::xds_double::XdsDouble;
use tidegate_e2e::zds_double::{expect_ack, PodSpec, ZdsConn, ZdsDouble};
use tidegate_xds::client::ADDRESS;
use tidegate_xds::workload::{
    address, Address, Port, PortList, TunnelProtocol, Workload, WorkloadStatus,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "pair_restart.rs"]
mod restart;
#[path = "pair_rollout.rs"]
mod rollout;

/// Rounds unless `DATAPLANE_ROUNDS` says otherwise.
const ROUNDS: usize = 3;
/// The most `DATAPLANE_ROUNDS` may ask for (a round takes about 10 s per pair here).
const MAX_ROUNDS: usize = 50;
const IDLE_CONNS: usize = 2_000;
const IDLE_CONCURRENCY: usize = 100;
const UP_WITHIN: Duration = Duration::from_secs(30);
const PHASE_WITHIN: Duration = Duration::from_secs(90);
const CA_PORT: u16 = 15012;
const NS: &str = "bench";
/// `--rollout`'s Service: `echo.bench.svc.cluster.local`, port 80 → the
/// replicas' app.
const SERVICE_HOST: &str = "echo.bench.svc.cluster.local";
const SERVICE_PORT: u16 = 80;

/// One gateway pair to measure.
pub struct PairSpec {
    pub name: String,
    /// `None`: the built-in `tidegate` line.
    pub command: Option<String>,
}

/// `--pair NAME[=COMMAND]` arguments; `None` when there are none.
pub fn parse_args(args: &[String]) -> anyhow::Result<Option<Vec<PairSpec>>> {
    let mut pairs = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = match a.as_str() {
            "--pair" => it
                .next()
                .context("--pair needs NAME or NAME=COMMAND")?
                .clone(),
            s if s.starts_with("--pair=") => s["--pair=".len()..].to_owned(),
            _ => continue,
        };
        let spec = match v.split_once('=') {
            Some((name, cmd)) if !name.is_empty() && !cmd.trim().is_empty() => PairSpec {
                name: name.into(),
                command: Some(cmd.into()),
            },
            None if v == "tidegate" => PairSpec {
                name: v,
                command: None,
            },
            _ => bail!("--pair {v:?}: expected `tidegate` or NAME=COMMAND"),
        };
        pairs.push(spec);
    }
    Ok((!pairs.is_empty()).then_some(pairs))
}

/// One round of one path.
#[derive(Clone, Debug)]
struct Round {
    fig: Figures,
    /// Both gateways' CPU-seconds per GB moved (NaN for raw).
    cpu_per_gb: f64,
    /// Both gateways' RSS growth per idle connection, KiB (NaN for raw).
    kib_per_conn: f64,
    /// Both gateways' CPU-µs per warm 1 KiB round trip (NaN for raw).
    cpu_us_per_rr: f64,
    /// Both gateways' CPU-µs per new connection with its round trip (NaN for raw).
    cpu_us_per_conn: f64,
}

struct Env {
    topo: InpodTopology,
    dir: PathBuf,
    pod_a: NsThread,
    pod_b: NsThread,
    ca_addr: SocketAddr,
    /// istiod (the xDS double) on node A, reached by node B over the link.
    xds: XdsDouble,
    bin: Option<PathBuf>,
    /// `--ipv6`: the pods are workloads by their IPv6 addresses.
    ipv6: bool,
    /// The CA and the API double (their runtime lives on this thread).
    _na: NsThread,
}

/// What a `--pair` run measures.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The data path's figures (the default).
    DataPath,
    /// `--restart`: node B's gateway restarted under load.
    Restart,
    /// `--rollout`: replicas behind a Service VIP replaced and crashed.
    Rollout,
}

impl Mode {
    pub fn of(args: &[String]) -> Mode {
        let has = |flag: &str| args.iter().any(|a| a == flag);
        match (has("--rollout"), has("--restart")) {
            (true, _) => Mode::Rollout,
            (false, true) => Mode::Restart,
            (false, false) => Mode::DataPath,
        }
    }
}

impl Env {
    /// Pod A's workload address (IPv6 with `--ipv6`).
    fn pod_a(&self) -> IpAddr {
        pod_ip(&self.topo, self.ipv6, 1)
    }
    /// Pod B's workload address (IPv6 with `--ipv6`).
    fn pod_b(&self) -> IpAddr {
        pod_ip(&self.topo, self.ipv6, 2)
    }
}

/// The workload address of the pod on subnet `subnet` (host 2).
fn pod_ip(topo: &InpodTopology, ipv6: bool, subnet: u8) -> IpAddr {
    match ipv6 {
        true => topo.addr6(subnet, 2).into(),
        false => topo.addr(subnet, 2).into(),
    }
}

/// `ipv6`: `--ipv6` (the data-path figures only).
pub fn run(pairs: Vec<PairSpec>, mode: Mode, ipv6: bool) -> anyhow::Result<()> {
    if ipv6 && mode != Mode::DataPath {
        bail!("--ipv6 with --pair measures the data path only (not --restart or --rollout)");
    }
    let rounds = tidegate_e2e::env_count("DATAPLANE_ROUNDS", ROUNDS, MAX_ROUNDS)
        .map_err(anyhow::Error::msg)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: --pair needs root (network namespaces, iptables)");
        return Ok(());
    }
    tidegate_e2e::raise_fd_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(bench(pairs, rounds, mode, ipv6))
}

async fn bench(pairs: Vec<PairSpec>, rounds: usize, mode: Mode, ipv6: bool) -> anyhow::Result<()> {
    let topo = InpodTopology::new("dp", 0);
    let _guard = topo.build();
    if ipv6 {
        topo.add_ipv6();
    }
    let dir = tempfile::tempdir()?;
    let bin = match pairs.iter().any(|p| p.command.is_none()) {
        true => Some(super::gateway_binary()?),
        false => None,
    };
    let env = setup(topo, dir.path(), bin, mode, ipv6).await?;
    match mode {
        Mode::Restart => return restart::bench(&env, &pairs, rounds).await,
        Mode::Rollout => return rollout::bench(&env, &pairs, rounds).await,
        Mode::DataPath => {}
    }
    println!(
        "gateway pairs side by side: {} rounds, interleaved; pod A {} → pod B {} (in-pod capture, HBONE across two nodes); load {}",
        rounds,
        env.pod_a(),
        env.pod_b(),
        super::loadavg()
    );
    for p in &pairs {
        println!(
            "  {}: {}",
            p.name,
            p.command
                .as_deref()
                .unwrap_or("built-in: tidegate run (inpod, zds, istio-ca)")
        );
    }
    let mut raw = Vec::new();
    let mut results: Vec<Vec<Round>> = pairs.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        raw.push(raw_round(&env).await?);
        println!(
            "round {round}: raw loopback TCP {:.0} MB/s",
            raw[round].fig.mb_s
        );
        // Each round starts with another pair, so no pair always runs
        // right after raw TCP's load (or always last).
        for k in 0..pairs.len() {
            let i = (k + round) % pairs.len();
            let p = &pairs[i];
            let r = pair_round(&env, p)
                .await
                .with_context(|| format!("{}, round {round}", p.name))?;
            println!(
                "round {round}: {:<10} {:.0} MB/s, {:.2} CPU-s/GB, RR p50 {:.0} µs, {:.0} conns/s, {:.2} KiB/conn",
                p.name, r.fig.mb_s, r.cpu_per_gb, r.fig.rr_p50_us, r.fig.conns_s, r.kib_per_conn
            );
            results[i].push(r);
        }
    }
    print_table(&pairs, &raw, &results);
    Ok(())
}

/// Runs `once` for every round, pair and variant: each round starts one
/// pair later, each pair runs every variant in turn, and `print` shows
/// each result as it comes. The results by pair, then by variant.
async fn interleaved<V: Copy, M>(
    pairs: &[PairSpec],
    variants: &[V],
    rounds: usize,
    name: impl Fn(V) -> String,
    once: impl AsyncFn(&PairSpec, V) -> anyhow::Result<M>,
    print: impl Fn(usize, &PairSpec, V, &M),
) -> anyhow::Result<Vec<Vec<Vec<M>>>> {
    let mut results: Vec<Vec<Vec<M>>> = pairs
        .iter()
        .map(|_| variants.iter().map(|_| Vec::new()).collect())
        .collect();
    for round in 0..rounds {
        for k in 0..pairs.len() {
            let i = (k + round) % pairs.len();
            for (v, variant) in variants.iter().enumerate() {
                let m = once(&pairs[i], *variant).await.with_context(|| {
                    format!("{}, {}, round {round}", pairs[i].name, name(*variant))
                })?;
                print(round, &pairs[i], *variant, &m);
                results[i][v].push(m);
            }
        }
    }
    Ok(results)
}

/// The namespaces' servers, the CA, and the files every pair reads.
async fn setup(
    topo: InpodTopology,
    dir: &Path,
    bin: Option<PathBuf>,
    mode: Mode,
    ipv6: bool,
) -> anyhow::Result<Env> {
    let pod_a = NsThread::idle(&topo.pa);
    let pod_b = NsThread::idle(&topo.pb);
    servers(&pod_b).await;
    // Tens of thousands of short connections per run from one client
    // address: without TIME_WAIT in the pods (no bucket for it) a later
    // round's ports never collide with an earlier round's closing
    // connections, which otherwise stalls SYNs for a second at a time on
    // every path alike. The range stays above the gateways' 150xx ports.
    for pod in [&topo.pa, &topo.pb] {
        super::run(
            "ip",
            &[
                "netns",
                "exec",
                pod,
                "sysctl",
                "-q",
                "-w",
                "net.ipv4.tcp_max_tw_buckets=0",
                "net.ipv4.ip_local_port_range=20000 64999",
            ],
        )?;
    }
    for pod in [&topo.pa, &topo.pb] {
        tidegate_netns::capture::install(
            Path::new(&InpodTopology::netns_path(pod)),
            Default::default(),
        )
        .with_context(|| format!("capture rules in {pod}"))?;
    }
    // Counts what reaches pod B's HBONE port.
    iptables(
        &topo.pb,
        ipv6,
        &[
            "-t", "mangle", "-I", "INPUT", "1", "-p", "tcp", "--dport", "15008",
        ],
    )?;

    let ca_ip = topo.addr(0, 1);
    let ca_addr = SocketAddr::new(ca_ip.into(), CA_PORT);
    let na = NsThread::idle(&topo.na);
    let (a_ip, b_ip) = (pod_ip(&topo, ipv6, 1), pod_ip(&topo, ipv6, 2));
    let root_pem = na
        .run("tidegate-ca", PHASE_WITHIN, async move {
            let api = FakeApiServer::start().await;
            gateway_pod(&api, "tidegate-node-a", "node-a", "token-a");
            gateway_pod(&api, "tidegate-node-b", "node-b", "token-b");
            for (name, node, ip) in [("client", "node-a", a_ip), ("server", "node-b", b_ip)] {
                api.apply(
                    Kind::Pod,
                    json!({
                        "metadata": {"name": name, "namespace": NS, "uid": format!("{name}-uid")},
                        "spec": {"nodeName": node, "serviceAccountName": name, "containers": [{"name": "app", "image": "app:1"}]},
                        "status": {"phase": "Running", "podIP": ip.to_string()},
                    }),
                );
            }
            let mut cfg = ca_config(&api, ca_addr, Duration::from_secs(24 * 3600));
            cfg.serving_names = vec![ca_ip.to_string()];
            let (trigger, drain) = tidegate_base::shutdown::channel();
            let ca = tidegate_ca::server::start(cfg, drain).await.map_err(|e| e.to_string())?;
            // Both live as long as the namespace thread's runtime.
            tokio::spawn(async move {
                let _keep = (api, trigger);
                std::future::pending::<()>().await
            });
            Ok::<_, String>(ca.root_pem)
        })
        .await
        .map_err(|e| anyhow::anyhow!("tidegate-ca: {e}"))?;
    std::fs::write(dir.join("ca-root.pem"), root_pem)?;
    // istiod on node A's loopback; node B routes to it over the node link.
    let istiod = topo.addr(141, 1);
    super::run(
        "ip",
        &[
            "-n",
            &topo.na,
            "addr",
            "add",
            &format!("{istiod}/32"),
            "dev",
            "lo",
        ],
    )?;
    super::run(
        "ip",
        &[
            "-n",
            &topo.nb,
            "route",
            "add",
            &format!("{istiod}/32"),
            "via",
            &topo.addr(0, 1).to_string(),
        ],
    )?;
    let xds = na
        .run("xds double", PHASE_WITHIN, async move {
            Ok::<_, String>(XdsDouble::start_on(istiod.into()).await)
        })
        .await
        .map_err(|e| anyhow::anyhow!("xds double: {e}"))?;
    std::fs::write(dir.join("xds-root.pem"), &xds.root_pem)?;
    for (name, ip, node) in [("client", a_ip, "node-a"), ("server", b_ip, "node-b")] {
        xds.set(
            ADDRESS,
            &xds_uid(name),
            encode_workload(&xds_workload(name, node, ip, true, false)),
        );
    }
    for node in ["a", "b"] {
        std::fs::write(
            dir.join(format!("node-{node}.token")),
            format!("token-{node}"),
        )?;
    }
    let pods = [("client", a_ip, "node-a"), ("server", b_ip, "node-b")];
    let mut wl = String::from("workloads:\n");
    let mut local_xds = String::from("workloads:\n");
    for (name, ip, node) in pods {
        wl += &format!(
            "- {{uid: {name}-uid, name: {name}, namespace: {NS}, service_account: {name}, ips: ['{ip}'], node: {node}}}\n"
        );
        local_xds += &format!(
            "- {{uid: {name}-uid, name: {name}, namespace: {NS}, serviceAccount: {name}, workloadIps: [\"{ip}\"], protocol: HBONE, node: {node}, network: \"\", trustDomain: cluster.local, services: {{}}}}\n"
        );
    }
    std::fs::write(dir.join("workloads.yaml"), wl)?;
    std::fs::write(dir.join("local-xds.yaml"), local_xds)?;
    if bin.is_some() {
        for node in ["node-a", "node-b"] {
            std::fs::write(
                dir.join(format!("tidegate-{node}.yaml")),
                tidegate_config(dir, node, ca_addr, &topo, xds.addr, mode),
            )?;
        }
    }
    Ok(Env {
        topo,
        dir: dir.to_owned(),
        pod_a,
        pod_b,
        ca_addr,
        xds,
        bin,
        ipv6,
        _na: na,
    })
}

fn tidegate_config(
    dir: &Path,
    node: &str,
    ca: SocketAddr,
    topo: &InpodTopology,
    istiod: SocketAddr,
    mode: Mode,
) -> String {
    let d = dir.display();
    let mut yaml = format!(
        "node_name: {node}
trust_domain: cluster.local
capture: {{mode: inpod, zds_socket: {d}/{node}.sock, state_dir: {d}/{node}-pods}}
certificates: {{source: istio-ca, address: 'https://{ca}', roots: {d}/ca-root.pem, token: {d}/{node}.token, validity: 24h}}
shutdown: {{deadline: 1s}}
"
    );
    if mode != Mode::Rollout {
        yaml += &format!("workloads: {{file: {d}/workloads.yaml, reload_interval: 1s}}\n");
        return yaml;
    }
    // The rollout: workloads and the Service from istiod, as on an Istio
    // node, and the recommended policy (the drain lab's settings).
    let node_ip = if node == "node-a" {
        topo.addr(0, 1)
    } else {
        topo.addr(0, 2)
    };
    yaml += &format!(
        "workloads:
  source: istio
  istio: {{address: 'https://{istiod}', roots: {d}/xds-root.pem, token: {d}/{node}.token, pod_ip: {node_ip}, pod_name: tidegate-{node}}}
policies:
  default: recommended
  fallback: keepalive-only
  plugins:
    recommended: {{file: {}, config: {{hold-ms: 10000, failure-threshold: 3}}}}
",
        tidegate_e2e::plugin("recommended").display()
    );
    yaml
}

/// istiod's uid of a pod: `<cluster>//Pod/<namespace>/<name>`.
fn xds_uid(name: &str) -> String {
    format!("Kubernetes//Pod/{NS}/{name}")
}

/// A pod as istiod's WDS sends it; `ready` is its readiness (a pod not
/// ready or being deleted is UNHEALTHY); `in_service`: an endpoint of the
/// Service `echo`.
fn xds_workload(
    name: &str,
    node: &str,
    ip: impl Into<IpAddr>,
    ready: bool,
    in_service: bool,
) -> Workload {
    let address = match ip.into() {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    let services = match in_service {
        true => [(
            format!("{NS}/{SERVICE_HOST}"),
            PortList {
                ports: vec![Port {
                    service_port: u32::from(SERVICE_PORT),
                    target_port: u32::from(APP_PORT),
                    app_protocol: 0,
                }],
            },
        )]
        .into(),
        false => Default::default(),
    };
    Workload {
        uid: xds_uid(name),
        name: name.into(),
        namespace: NS.into(),
        addresses: vec![address.into()],
        tunnel_protocol: TunnelProtocol::Hbone as i32,
        trust_domain: "cluster.local".into(),
        service_account: name.split('-').next().unwrap_or(name).into(),
        node: node.into(),
        cluster_id: "Kubernetes".into(),
        status: match ready {
            true => WorkloadStatus::Healthy,
            false => WorkloadStatus::Unhealthy,
        } as i32,
        services,
        ..Default::default()
    }
}

fn encode_workload(w: &Workload) -> bytes::Bytes {
    Address {
        r#type: Some(address::Type::Workload(w.clone())),
    }
    .encode_to_vec()
    .into()
}

/// `iptables` (`ip6tables` with `ipv6`) in `ns`.
fn iptables(ns: &str, ipv6: bool, args: &[&str]) -> anyhow::Result<String> {
    let tool = if ipv6 { "ip6tables" } else { "iptables" };
    let out = Command::new("ip")
        .args(["netns", "exec", ns, tool, "-w"])
        .args(args)
        .output()
        .context("run iptables")?;
    if !out.status.success() {
        bail!(
            "{tool} {args:?} in {ns}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Bytes pod B's HBONE counting rule has seen; `zero` resets it.
fn hbone_bytes(env: &Env, zero: bool) -> anyhow::Result<u64> {
    let out = iptables(
        &env.topo.pb,
        env.ipv6,
        &["-t", "mangle", "-L", "INPUT", "1", "-v", "-x", "-n"],
    )?;
    let bytes = out
        .split_whitespace()
        .nth(1)
        .and_then(|b| b.parse().ok())
        .with_context(|| format!("counting rule: {out:?}"))?;
    if zero {
        iptables(
            &env.topo.pb,
            env.ipv6,
            &["-t", "mangle", "-Z", "INPUT", "1"],
        )?;
    }
    Ok(bytes)
}

async fn raw_round(env: &Env) -> anyhow::Result<Round> {
    let loopback: IpAddr = match env.ipv6 {
        true => std::net::Ipv6Addr::LOCALHOST.into(),
        false => Ipv4Addr::LOCALHOST.into(),
    };
    let fig = env
        .pod_b
        .run("raw loopback", PHASE_WITHIN, measure(loopback))
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    Ok(Round {
        fig,
        cpu_per_gb: f64::NAN,
        kib_per_conn: f64::NAN,
        cpu_us_per_rr: f64::NAN,
        cpu_us_per_conn: f64::NAN,
    })
}

/// One node's gateway: its process group, killed on drop.
struct NodeProc {
    child: Child,
    log: PathBuf,
}

impl NodeProc {
    fn start(env: &Env, pair: &PairSpec, node: &str, ns: &str) -> anyhow::Result<NodeProc> {
        let dir = &env.dir;
        let line = match (&pair.command, &env.bin) {
            (Some(c), _) => c.clone(),
            (None, Some(bin)) => format!(
                "exec '{}' run --config \"$DP_DIR/tidegate-$DP_NODE.yaml\"",
                bin.display()
            ),
            (None, None) => bail!("no tidegate binary"),
        };
        let log = dir.join(format!("{}-{node}.log", pair.name));
        let out = std::fs::File::create(&log)?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, "sh", "-c", &line]);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("TIDEGATE_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("DP_NODE", node)
            .env("DP_ZDS", dir.join(format!("{node}.sock")))
            .env("DP_CA_ADDRESS", format!("https://{}", env.ca_addr))
            .env("DP_CA_ROOT", dir.join("ca-root.pem"))
            .env("DP_XDS_ADDRESS", format!("https://{}", env.xds.addr))
            .env("DP_XDS_ROOT", dir.join("xds-root.pem"))
            .env("DP_TOKEN", dir.join(format!("{node}.token")))
            .env("DP_TRUST_DOMAIN", "cluster.local")
            .env("DP_CLUSTER_ID", "Kubernetes")
            .env("DP_DIR", dir)
            .env("DP_LOG", &log)
            .env("TIDEGATE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0);
        // SAFETY: prctl only sets this child's parent-death signal.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().with_context(|| format!("spawn {line}"))?;
        Ok(NodeProc { child, log })
    }

    fn pids(&self) -> Vec<u32> {
        process_tree(self.child.id())
    }

    fn log_tail(&self) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl NodeProc {
    /// Sends `signal` to the whole group and waits (at most `within`, then
    /// SIGKILL) until every process of it is gone; true when it went by
    /// itself.
    fn stop(&mut self, signal: i32, within: Duration) -> bool {
        let tree = self.pids();
        // SAFETY: kill(2) on our own child's process group.
        unsafe { libc::kill(-(self.child.id() as i32), signal) };
        let deadline = Instant::now() + within;
        // Polls /proc: the group's other processes are not our children.
        while Instant::now() < deadline && tree.iter().any(|p| alive(*p)) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let went = !tree.iter().any(|p| alive(*p));
        if !went {
            // SAFETY: as above.
            unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        }
        let _ = self.child.wait();
        went
    }
}

impl Drop for NodeProc {
    /// Kills the whole group and waits until every process of it is gone
    /// (the next pair binds the same ports).
    fn drop(&mut self) {
        self.stop(libc::SIGKILL, Duration::from_secs(10));
    }
}

/// Whether any thread of `pid` still runs: a killed process's leader turns
/// zombie while its other threads may still be closing its sockets.
fn alive(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("stat"))
            .ok()
            .and_then(|s| s[s.rfind(')')? + 2..].chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X')
    })
}

/// CPU seconds of every process in `pids` (NaN if one is gone).
fn cpu_secs(pids: &[u32]) -> f64 {
    pids.iter().map(|p| super::cpu_secs(*p)).sum()
}

/// VmRSS of every process in `pids`, KiB (a process gone counts 0).
fn rss_kib(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|p| super::vm_rss_kib(*p).ok()).sum()
}

/// Serves one node's ZDS socket: hands over `pods` (each namespace by
/// descriptor) and the snapshot end, and returns the connection (dropping
/// it would tell the gateway the node agent went away).
async fn node_agent(zds: &ZdsDouble, pods: Vec<(PodSpec, String)>) -> anyhow::Result<ZdsConn> {
    let conn = tokio::time::timeout(UP_WITHIN, zds.accept())
        .await
        .with_context(|| {
            format!(
                "no ZDS client on {} within {UP_WITHIN:?}",
                zds.path.display()
            )
        })??;
    for (pod, netns) in pods {
        let fd = std::fs::File::open(&netns).with_context(|| format!("open {netns}"))?;
        expect_ack("AddWorkload", conn.add(pod, fd.into()).await?)?;
    }
    expect_ack("SnapshotSent", conn.snapshot_sent().await?)?;
    Ok(conn)
}

fn pod_spec(name: &str) -> PodSpec {
    PodSpec {
        uid: format!("{name}-uid"),
        name: name.into(),
        namespace: NS.into(),
        service_account: name.split('-').next().unwrap_or(name).into(),
    }
}

/// `app-server --name NAME --app-drain-ms MS`: a replica's app (the drain
/// lab's), started by `--rollout` in the replica's namespace.
pub fn app_server(args: &[String]) -> anyhow::Result<()> {
    let arg = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .with_context(|| format!("app-server: {flag} missing"))
    };
    let name = arg("--name")?;
    let drain: u64 = arg("--app-drain-ms")?.parse().context("--app-drain-ms")?;
    tidegate_e2e::lab::app_server::serve(name, Duration::from_millis(drain))
        .map_err(|e| anyhow::anyhow!("{e}"))
}

async fn pair_round(env: &Env, pair: &PairSpec) -> anyhow::Result<Round> {
    let zds_a = ZdsDouble::bind(&env.dir.join("node-a.sock"))?;
    let zds_b = ZdsDouble::bind(&env.dir.join("node-b.sock"))?;
    let a = NodeProc::start(env, pair, "node-a", &env.topo.na)?;
    let b = NodeProc::start(env, pair, "node-b", &env.topo.nb)?;
    let up = async {
        let agents = tokio::try_join!(
            node_agent(
                &zds_a,
                vec![(pod_spec("client"), InpodTopology::netns_path(&env.topo.pa))]
            ),
            node_agent(
                &zds_b,
                vec![(pod_spec("server"), InpodTopology::netns_path(&env.topo.pb))]
            ),
        )?;
        first_round_trip(env).await?;
        Ok::<_, anyhow::Error>(agents)
    };
    let _agents = match up.await {
        Ok(x) => x,
        Err(e) => bail!(
            "not up: {e:#}\n--- node-a log ---\n{}\n--- node-b log ---\n{}",
            a.log_tail(),
            b.log_tail()
        ),
    };
    let pids: Vec<u32> = a.pids().into_iter().chain(b.pids()).collect();
    let dst = env.pod_b();

    hbone_bytes(env, true)?;
    let stat = PerfStat::start(&pids, &env.dir.join(format!("{}.perf-stat", pair.name)));
    let profile = perf_record_to("DATAPLANE_PERF_TP", &pids, &pair.name, "tp");
    let c0 = cpu_secs(&pids);
    let (bytes, secs) = env
        .pod_a
        .run(
            "throughput",
            PHASE_WITHIN,
            async move { throughput(dst).await },
        )
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    let cpu = cpu_secs(&pids) - c0;
    super::stop_perf(profile);
    if let Some(stat) = stat {
        stat.report(&pair.name, "the transfer", bytes as f64 / 1e6, "MB");
    }
    let over_hbone = hbone_bytes(env, false)?;
    if over_hbone < bytes {
        bail!("only {over_hbone} bytes reached pod B's 15008 for {bytes} moved: not over HBONE");
    }
    // Per request: both gateways' CPU time over each latency phase, divided
    // by the requests it served (warm-up round trips included: they cost
    // the same work).
    let stat = PerfStat::start(&pids, &env.dir.join(format!("{}-rr.perf-stat", pair.name)));
    let profile = perf_record_to("DATAPLANE_PERF_RR", &pids, &pair.name, "rr");
    let c0 = cpu_secs(&pids);
    let rr = env
        .pod_a
        .run("rr", PHASE_WITHIN, async move { warm_rr(dst).await })
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    let rr_served = (rr.len() + RR_WARMUP) as f64;
    let cpu_us_per_rr = (cpu_secs(&pids) - c0) * 1e6 / rr_served;
    super::stop_perf(profile);
    if let Some(stat) = stat {
        stat.report(&pair.name, "the warm round trips", rr_served, "round trip");
    }
    let stat = PerfStat::start(
        &pids,
        &env.dir.join(format!("{}-conn.perf-stat", pair.name)),
    );
    let profile = perf_record_to("DATAPLANE_PERF_CONN", &pids, &pair.name, "conn");
    let c0 = cpu_secs(&pids);
    let (conns_s, conns) = env
        .pod_a
        .run("new connections", PHASE_WITHIN, async move {
            new_conns(dst).await
        })
        .await
        .map_err(|e| anyhow::anyhow!(e))?;
    let cpu_us_per_conn = (cpu_secs(&pids) - c0) * 1e6 / conns.len() as f64;
    super::stop_perf(profile);
    if let Some(stat) = stat {
        stat.report(
            &pair.name,
            "the new connections",
            conns.len() as f64,
            "connection",
        );
    }

    // Memory: idle connections held from pod A, both gateways' RSS growth.
    let pids: Vec<u32> = a.pids().into_iter().chain(b.pids()).collect();
    let before = rss_kib(&pids);
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let (open_tx, open_rx) = tokio::sync::oneshot::channel();
    let holder = env.pod_a.handle.spawn(async move {
        let r = idle_conns(dst, IDLE_CONNS, IDLE_CONCURRENCY).await;
        let n = r.as_ref().map(Vec::len).map_err(Clone::clone);
        let _ = open_tx.send(n);
        let _ = held_rx.await;
        drop(r);
    });
    let opened = tokio::time::timeout(PHASE_WITHIN, open_rx)
        .await
        .context("idle connections: timed out")??
        .map_err(|e| anyhow::anyhow!("idle connections: {e}"))?;
    let after = rss_kib(&pids);
    let _ = held_tx.send(());
    let _ = holder.await;
    Ok(Round {
        fig: Figures::new((bytes, secs), &rr, (conns_s, &conns)),
        cpu_per_gb: cpu / (bytes as f64 / 1e9),
        kib_per_conn: after.saturating_sub(before) as f64 / opened as f64,
        cpu_us_per_rr,
        cpu_us_per_conn,
    })
}

/// `perf record` of both gateways into `$var/<pair>-<phase>.data` when the
/// variable `var` names a directory.
fn perf_record_to(var: &str, pids: &[u32], pair: &str, phase: &str) -> Option<Child> {
    let dir = std::env::var_os(var)?;
    super::start_perf_to(pids, &Path::new(&dir).join(format!("{pair}-{phase}.data")))
}

/// `DATAPLANE_PERF_STAT=1`: `perf stat` of both gateways (every thread)
/// during the throughput run — page faults, context switches, syscalls,
/// futex calls and CPU time, to compare gateways per MB moved.
struct PerfStat {
    child: Child,
    out: PathBuf,
}

/// CPU time, faults and switches, then every syscall and the ones that
/// carry the bytes (socket reads and writes, epoll waits) one by one: how
/// many bytes each read and write moves shows in their count per MB. Last,
/// the high-resolution timers armed: TCP's internal pacing arms one per
/// burst it holds back (BBR on a device without the `fq` qdisc).
const PERF_EVENTS: &str = "task-clock,page-faults,context-switches,raw_syscalls:sys_enter,\
    syscalls:sys_enter_futex,syscalls:sys_enter_recvfrom,syscalls:sys_enter_read,\
    syscalls:sys_enter_sendto,syscalls:sys_enter_write,syscalls:sys_enter_writev,\
    syscalls:sys_enter_epoll_wait,timer:hrtimer_start";

impl PerfStat {
    fn start(pids: &[u32], out: &Path) -> Option<PerfStat> {
        std::env::var_os("DATAPLANE_PERF_STAT")?;
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let child = Command::new("perf")
            .args(["stat", "-x", ",", "-e", PERF_EVENTS, "-o"])
            .arg(out)
            .args(["-p", &pids.join(",")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| eprintln!("DATAPLANE_PERF_STAT: cannot run perf: {e}"))
            .ok()?;
        // perf attaches to every thread before the transfer starts.
        std::thread::sleep(Duration::from_millis(300));
        Some(PerfStat {
            child,
            out: out.to_owned(),
        })
    }

    /// Stops perf and prints each count, and per `unit` (`units` of them
    /// in the phase).
    fn report(self, pair: &str, phase: &str, units: f64, unit: &str) {
        println!("  {pair} perf stat during {phase}, per {unit} ({units:.0} in all):");
        for (event, count) in self.stop() {
            println!(
                "    {event:<32} {count:>12.0}  ({:.2} per {unit})",
                count / units
            );
        }
    }

    /// Stops perf; (event, count) as it wrote them.
    fn stop(mut self) -> Vec<(String, f64)> {
        // SAFETY: kill(2) on the pid of a child this program spawned and has not reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                Some((f.get(2)?.to_string(), f.first()?.parse().ok()?))
            })
            .collect()
    }
}

/// Retries a 1-byte round trip pod A → pod B until one succeeds.
async fn first_round_trip(env: &Env) -> anyhow::Result<()> {
    let dst = SocketAddr::new(env.pod_b(), tidegate_e2e::measure::ECHO);
    let started = Instant::now();
    env.pod_a
        .run(
            "first round trip",
            UP_WITHIN + Duration::from_secs(5),
            async move {
                let mut last = String::new();
                while started.elapsed() < UP_WITHIN {
                    let once = async {
                        let mut tcp = tokio::net::TcpStream::connect(dst).await?;
                        tcp.write_all(b"x").await?;
                        let mut b = [0u8; 1];
                        tcp.read_exact(&mut b).await?;
                        Ok::<_, std::io::Error>(())
                    };
                    match tokio::time::timeout(Duration::from_secs(5), once).await {
                        Ok(Ok(())) => return Ok(()),
                        Ok(Err(e)) => last = e.to_string(),
                        Err(_) => last = "timed out".into(),
                    }
                    // Not an event we can await: the gateway's certificates and
                    // listeners come up on its own schedule.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(anyhow::anyhow!(
                    "no round trip within {UP_WITHIN:?}: {last}"
                ))
            },
        )
        .await
}

fn print_table(pairs: &[PairSpec], raw: &[Round], results: &[Vec<Round>]) {
    let med = |v: &[Round], f: fn(&Round) -> f64| median(v, f);
    type Fig = (&'static str, fn(&Round) -> f64, &'static str);
    let figs: [Fig; 9] = [
        ("single-stream throughput", |r| r.fig.mb_s, "MB/s"),
        ("CPU-seconds per GB, both gateways", |r| r.cpu_per_gb, "s"),
        ("1 KiB RR p50", |r| r.fig.rr_p50_us, "µs"),
        ("1 KiB RR p99", |r| r.fig.rr_p99_us, "µs"),
        ("new connections/s (8 concurrent)", |r| r.fig.conns_s, "/s"),
        ("new connection p99", |r| r.fig.conn_p99_us, "µs"),
        (
            "CPU per warm round trip, both gateways",
            |r| r.cpu_us_per_rr,
            "µs",
        ),
        (
            "CPU per new connection, both gateways",
            |r| r.cpu_us_per_conn,
            "µs",
        ),
        (
            "memory per idle connection, both gateways",
            |r| r.kib_per_conn,
            "KiB",
        ),
    ];
    let rounds = raw.len();
    println!(
        "\nmedians of {rounds} interleaved rounds; ratio of the medians [per-round ratios: median, range]:"
    );
    let mut head = "| figure | raw loopback |".to_string();
    for p in pairs {
        head += &format!(" {} |", p.name);
    }
    for p in &pairs[1..] {
        head += &format!(" {} / {} |", p.name, pairs[0].name);
    }
    println!("{head}");
    println!("{}", "|---".repeat(2 + pairs.len() * 2 - 1) + "|");
    for (what, f, unit) in figs {
        let mut line = format!("| {what} ({unit}) | {:.2} |", med(raw, f));
        for r in results {
            line += &format!(" {:.2} |", med(r, f));
        }
        for r in &results[1..] {
            let ratios: Vec<f64> = r
                .iter()
                .zip(&results[0])
                .map(|(x, y)| f(x) / f(y))
                .collect();
            let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let paired = median(&ratios, |r| *r);
            line += &format!(
                " {:.2} [{paired:.2}, {lo:.2}–{hi:.2}] |",
                med(r, f) / med(&results[0], f)
            );
        }
        println!("{line}");
    }
}
