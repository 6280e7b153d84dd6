//! `--pair … --rollout`: what replacing the replicas behind a Service VIP
//! costs the clients, pair by pair on the same topology, every step told
//! to both gateways the way a cluster tells them.
//!
//! Node B runs `REPLICAS` server pods (each its own namespace and subnet,
//! istio-cni's in-pod rules, the drain lab's HTTP app on 8080) behind the
//! Service `echo.bench` (VIP port 80). Pod A's load goes to the VIP only:
//! new connections at a rate (one request each) and `LONG_STREAMS`
//! keep-alive connections, so pod A's gateway picks the replica. The
//! gateways learn pods from the ZDS double (node B's node agent) and
//! workloads and the Service from the xDS double (istiod), and each step
//! waits until both gateways have ACKed it.
//!
//! - **rolling restart** (a Deployment's default, `maxSurge` 1,
//!   `maxUnavailable` 0), one replica at a time: the new pod is created
//!   (CNI ADD over ZDS, listed not ready), its app starts, it is listed
//!   ready; the old pod's app gets SIGTERM (it serves `APP_DRAIN` more,
//!   answering `Connection: close`), `ENDPOINT_LAG` later it is listed
//!   not ready (istiod's reading of a pod being deleted); its app exits,
//!   then CNI DEL over ZDS, then it leaves istiod. At 50 and 500 new
//!   connections/s; and at 50/s with an app that stops accepting at
//!   SIGTERM (no `preStop` sleep: istio/istio#58514's case).
//! - **crash**: a replica's app is SIGKILLed (no termination event at
//!   all) and the pod is deleted `CRASH_DELETED_AFTER` later; then its
//!   replacement comes up. Each replica in turn, at 200 new connections/s.
//!
//! The figure is failed requests per replaced (or crashed) pod. Rounds
//! interleave the pairs (each round starting one pair later); each
//! variant starts the pair afresh.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tidegate_e2e::inpod::InpodTopology;
use tidegate_e2e::lab::app_server::AppPod;
use tidegate_e2e::lab::load::{Counts, Load};
use tidegate_e2e::measure::median;
use tidegate_e2e::netns::{run, veth};
use tidegate_e2e::zds_double::{expect_ack, ZdsConn, ZdsDouble};
use tidegate_xds::client::ADDRESS;
use tidegate_xds::workload::{address, Address, NetworkAddress, Port, Service};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{
    encode_workload, first_round_trip, interleaved, node_agent, pod_spec, xds_uid, xds_workload,
    Env, NodeProc, PairSpec, NS, SERVICE_HOST, SERVICE_PORT, UP_WITHIN,
};

const REPLICAS: u8 = 3;
const LONG_STREAMS: u32 = 5;
/// How long a replica's app keeps serving after SIGTERM.
const APP_DRAIN: Duration = Duration::from_secs(3);
/// SIGTERM → the pod listed not ready (the range is 0–1 s).
const ENDPOINT_LAG: Duration = Duration::from_secs(1);
/// The pod's termination grace period: the app is SIGKILLed at its end.
const GRACE: Duration = Duration::from_secs(30);
/// Crash → the pod deleted.
const CRASH_DELETED_AFTER: Duration = Duration::from_secs(2);
/// Any one step (a push ACKed by both gateways, a ZDS message).
const STEP: Duration = Duration::from_secs(10);
/// Load before the first step and after the last.
const SETTLE: Duration = Duration::from_secs(1);

#[derive(Clone, Copy)]
enum Variant {
    /// `drains`: the app serves `APP_DRAIN` after SIGTERM; otherwise it
    /// stops accepting at once (an app without a `preStop` sleep).
    Rollout {
        rate: u32,
        drains: bool,
    },
    Crash {
        rate: u32,
    },
}

impl Variant {
    fn name(self) -> String {
        match self {
            Variant::Rollout { rate, drains: true } => format!("rolling restart, {rate}/s"),
            Variant::Rollout {
                rate,
                drains: false,
            } => format!("rolling restart, {rate}/s, app exits at SIGTERM"),
            Variant::Crash { rate } => format!("crash, {rate}/s"),
        }
    }
    fn rate(self) -> u32 {
        match self {
            Variant::Rollout { rate, .. } | Variant::Crash { rate } => rate,
        }
    }
    /// How long the replicas' app serves after SIGTERM.
    fn app_drain(self) -> Duration {
        match self {
            Variant::Rollout { drains: false, .. } => Duration::ZERO,
            _ => APP_DRAIN,
        }
    }
}

const VARIANTS: [Variant; 4] = [
    Variant::Rollout {
        rate: 50,
        drains: true,
    },
    Variant::Rollout {
        rate: 500,
        drains: true,
    },
    Variant::Rollout {
        rate: 50,
        drains: false,
    },
    Variant::Crash { rate: 200 },
];

/// One variant's run: the load's counts and the first failures.
struct Measured {
    short_ok: u64,
    short_failed: u64,
    long_ok: u64,
    long_failed: u64,
    failures: Vec<String>,
    took: Duration,
}

impl Measured {
    fn of(c: &Counts, took: Duration) -> Measured {
        Measured {
            short_ok: Counts::get(&c.short_ok),
            short_failed: Counts::get(&c.short_failed),
            long_ok: Counts::get(&c.long_ok),
            long_failed: Counts::get(&c.long_failed),
            failures: c.failures.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            took,
        }
    }
}

pub(super) async fn bench(env: &Env, pairs: &[PairSpec], rounds: usize) -> anyhow::Result<()> {
    println!(
        "{REPLICAS} replicas on node B behind {SERVICE_HOST} ({}:{SERVICE_PORT}), pod A's load through the VIP with {LONG_STREAMS} keep-alive streams; app drain {:?}, endpoint lag {ENDPOINT_LAG:?}, crash deleted after {CRASH_DELETED_AFTER:?}; {rounds} rounds, interleaved",
        vip(&env.topo),
        APP_DRAIN,
    );
    env.xds.set(ADDRESS, &service_name(), service(&env.topo));
    let results = interleaved(
        pairs,
        &VARIANTS,
        rounds,
        Variant::name,
        async |pair, variant| once(env, pair, variant).await,
        |round, pair, variant, m: &Measured| {
            println!(
                "round {round}: {:<10} {:<24} short {} of {} failed, long-stream {} of {} failed ({:.1} s){}",
                pair.name,
                variant.name(),
                m.short_failed,
                m.short_ok + m.short_failed,
                m.long_failed,
                m.long_ok + m.long_failed,
                m.took.as_secs_f64(),
                first_failures(&m.failures),
            )
        },
    )
    .await?;
    println!("\nfailed requests per replaced or crashed pod ({REPLICAS} per run): median of the rounds (range)");
    println!("| pair | variant | new connections failed per pod | keep-alive requests failed per pod | requests per run (new / keep-alive) |");
    println!("|---|---|---|---|---|");
    let per_pod = |n: u64| n as f64 / f64::from(REPLICAS);
    for (i, p) in pairs.iter().enumerate() {
        for (v, variant) in VARIANTS.iter().enumerate() {
            let r = &results[i][v];
            let range = |f: fn(&Measured) -> u64| {
                let lo = r.iter().map(f).min().unwrap_or(0);
                let hi = r.iter().map(f).max().unwrap_or(0);
                format!(
                    "{:.1} ({:.1}–{:.1})",
                    median(r, |m| per_pod(f(m))),
                    per_pod(lo),
                    per_pod(hi)
                )
            };
            println!(
                "| {} | {} | {} | {} | {:.0} / {:.0} |",
                p.name,
                variant.name(),
                range(|m| m.short_failed),
                range(|m| m.long_failed),
                median(r, |m| (m.short_ok + m.short_failed) as f64),
                median(r, |m| (m.long_ok + m.long_failed) as f64),
            );
        }
    }
    Ok(())
}

fn first_failures(f: &[String]) -> String {
    match f.len() {
        0 => String::new(),
        n => format!(
            "; first: {}{}",
            f[..n.min(3)].join("; "),
            if n > 3 { " …" } else { "" }
        ),
    }
}

fn vip(t: &InpodTopology) -> Ipv4Addr {
    t.addr(141, 10)
}

fn service_name() -> String {
    format!("{NS}/{SERVICE_HOST}")
}

fn service(t: &InpodTopology) -> bytes::Bytes {
    use prost::Message as _;
    Address {
        r#type: Some(address::Type::Service(Service {
            name: "echo".into(),
            namespace: NS.into(),
            hostname: SERVICE_HOST.into(),
            addresses: vec![NetworkAddress {
                network: String::new(),
                address: vip(t).octets().to_vec().into(),
                length: None,
            }],
            ports: vec![Port {
                service_port: u32::from(SERVICE_PORT),
                target_port: u32::from(tidegate_e2e::lab::app_server::APP_PORT),
                app_protocol: 0,
            }],
            ..Default::default()
        })),
    }
    .encode_to_vec()
    .into()
}

/// A replica pod on node B.
struct Replica {
    name: String,
    ns: String,
    ip: Ipv4Addr,
    app: Option<AppPod>,
}

impl Replica {
    fn of(t: &InpodTopology, gen: u8, index: u8) -> Replica {
        Replica {
            name: format!("server-{gen}-{index}"),
            ns: format!("{}r{gen}{index}", t.nb),
            ip: t.addr(subnet(gen, index), 2),
            app: None,
        }
    }
}

fn subnet(gen: u8, index: u8) -> u8 {
    10 + 10 * gen + index
}

/// A pair's run: the gateways, node B's node agent, the replicas.
struct Run<'a> {
    env: &'a Env,
    pair: &'a PairSpec,
    app_drain: Duration,
    agent_b: ZdsConn,
    replicas: Vec<Replica>,
    guard: PodsGuard,
}

impl Run<'_> {
    /// Waits until both gateways ACKed the push `nonce` (`what` names it).
    async fn tell(&self, what: &str, nonce: Option<String>) -> anyhow::Result<()> {
        let nonce = nonce.with_context(|| format!("{what}: no gateway subscribed to istiod"))?;
        tokio::time::timeout(STEP, self.env.xds.replied_by(&nonce, 2))
            .await
            .with_context(|| format!("{what}: not ACKed by both gateways within {STEP:?}"))?
            .map_err(|nack| anyhow::anyhow!("{what}: NACK: {nack}"))
    }

    fn list(&self, r: &Replica, ready: bool) -> Option<String> {
        list(self.env, r, ready)
    }

    /// A new replica: created (CNI ADD, listed not ready), its app
    /// started, listed ready.
    async fn surge(&mut self, gen: u8, index: u8) -> anyhow::Result<()> {
        let mut r = create_pod_netns(&self.env.topo, &mut self.guard, gen, index)?;
        let fd = std::fs::File::open(InpodTopology::netns_path(&r.ns))?;
        let ack = tokio::time::timeout(STEP, self.agent_b.add(pod_spec(&r.name), fd.into()))
            .await
            .context("CNI ADD: no ZDS answer")??;
        expect_ack("AddWorkload", ack)?;
        self.tell("created", self.list(&r, false)).await?;
        r.app = Some(start_app(self.env, self.pair, &r, self.app_drain).await?);
        self.tell("ready", self.list(&r, true)).await?;
        self.replicas.push(r);
        Ok(())
    }

    fn take(&mut self, gen: u8, index: u8) -> Replica {
        let name = format!("server-{gen}-{index}");
        let at = self
            .replicas
            .iter()
            .position(|r| r.name == name)
            .expect("the replica runs until replaced");
        self.replicas.remove(at)
    }

    /// An old replica's deletion in the kubelet's order.
    async fn replace(&mut self, gen: u8, index: u8) -> anyhow::Result<()> {
        let mut r = self.take(gen, index);
        let app = r.app.take().expect("a running replica has its app");
        app.proc.signal(libc::SIGTERM);
        // The pacing of the scenario: the endpoint update lags the kubelet.
        tokio::time::sleep(ENDPOINT_LAG).await;
        self.tell("terminating", self.list(&r, false)).await?;
        if app.proc.wait(GRACE).await.is_err() {
            app.proc.signal(libc::SIGKILL);
            app.proc.wait(STEP).await?;
        }
        self.delete(r).await
    }

    /// An old replica's app killed, its pod deleted later.
    async fn crash(&mut self, gen: u8, index: u8) -> anyhow::Result<()> {
        let mut r = self.take(gen, index);
        let app = r.app.take().expect("a running replica has its app");
        app.proc.signal(libc::SIGKILL);
        app.proc.wait(STEP).await?;
        // The scenario's pacing: nothing tells anyone until the deletion.
        tokio::time::sleep(CRASH_DELETED_AFTER).await;
        self.delete(r).await
    }

    /// CNI DEL, the namespace gone, the pod gone from istiod.
    async fn delete(&mut self, r: Replica) -> anyhow::Result<()> {
        let uid = pod_spec(&r.name).uid;
        let ack = tokio::time::timeout(STEP, self.agent_b.del(&uid))
            .await
            .context("CNI DEL: no ZDS answer")??;
        expect_ack("DelWorkload", ack)?;
        delete_pod_netns(&self.env.topo, &r);
        self.tell("deleted", self.env.xds.remove(ADDRESS, &xds_uid(&r.name)))
            .await
    }
}

/// Pushes `r` as istiod lists it (an endpoint of the Service, `ready` or
/// not); the push's nonce, `None` when no gateway is subscribed yet.
fn list(env: &Env, r: &Replica, ready: bool) -> Option<String> {
    env.xds.set(
        ADDRESS,
        &xds_uid(&r.name),
        encode_workload(&xds_workload(&r.name, "node-b", r.ip, ready, true)),
    )
}

/// A pod's namespace, link, routes and istio-cni's in-pod rules (a
/// container runtime, then the rules of the CNI ADD).
fn create_pod_netns(
    t: &InpodTopology,
    guard: &mut PodsGuard,
    gen: u8,
    index: u8,
) -> anyhow::Result<Replica> {
    let r = Replica::of(t, gen, index);
    let s = subnet(gen, index);
    let link = format!("r{gen}{index}");
    // A namespace of the last run may outlive its file while the kernel
    // frees it; its link on node B goes with this.
    let _ = std::process::Command::new("ip")
        .args(["-n", &t.nb, "link", "del", &link])
        .output();
    run(&format!("ip netns add {}", r.ns));
    guard.0.push(r.ns.clone());
    run(&format!("ip -n {} link set lo up", r.ns));
    veth(
        &t.nb,
        &link,
        &format!("{}/24", t.addr(s, 1)),
        &r.ns,
        "eth0",
        &format!("{}/24", r.ip),
    );
    run(&format!(
        "ip -n {} route add default via {}",
        r.ns,
        t.addr(s, 1)
    ));
    run(&format!(
        "ip -n {} route replace {}/24 via {}",
        t.na,
        t.addr(s, 0),
        t.addr(0, 2)
    ));
    run(&format!(
        "ip netns exec {} sysctl -q -w net.ipv4.tcp_max_tw_buckets=0",
        r.ns
    ));
    tidegate_netns::capture::install(
        Path::new(&InpodTopology::netns_path(&r.ns)),
        Default::default(),
    )
    .with_context(|| format!("capture rules in {}", r.name))?;
    Ok(r)
}

/// Deletes the replicas' namespaces still there when dropped.
#[derive(Default)]
struct PodsGuard(Vec<String>);

impl Drop for PodsGuard {
    fn drop(&mut self) {
        for ns in &self.0 {
            if Path::new(&InpodTopology::netns_path(ns)).exists() {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "del", ns])
                    .output();
            }
        }
    }
}

fn delete_pod_netns(t: &InpodTopology, r: &Replica) {
    let s = r.ip.octets()[2];
    let _ = std::process::Command::new("ip")
        .args(["netns", "del", &r.ns])
        .output();
    let _ = std::process::Command::new("ip")
        .args(["-n", &t.na, "route", "del", &format!("{}/24", t.addr(s, 0))])
        .output();
}

async fn start_app(
    env: &Env,
    pair: &PairSpec,
    r: &Replica,
    drain: Duration,
) -> anyhow::Result<AppPod> {
    let log = env.dir.join(format!("app-{}-{}.log", pair.name, r.name));
    AppPod::start(&r.ns, &r.name, drain, &log)
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", r.name))
}

/// One pair started afresh, one variant applied under the load.
async fn once(env: &Env, pair: &PairSpec, variant: Variant) -> anyhow::Result<Measured> {
    let mut guard = PodsGuard::default();
    let mut first = Vec::new();
    for index in 0..REPLICAS {
        let mut r = create_pod_netns(&env.topo, &mut guard, 0, index)?;
        r.app = Some(start_app(env, pair, &r, variant.app_drain()).await?);
        // Held for the gateways about to start: nobody to wait for yet.
        let _ = list(env, &r, true);
        first.push(r);
    }
    let zds_a = ZdsDouble::bind(&env.dir.join("node-a.sock"))?;
    let zds_b = ZdsDouble::bind(&env.dir.join("node-b.sock"))?;
    let a = NodeProc::start(env, pair, "node-a", &env.topo.na)?;
    let b = NodeProc::start(env, pair, "node-b", &env.topo.nb)?;
    let mut pods_b = vec![(pod_spec("server"), InpodTopology::netns_path(&env.topo.pb))];
    pods_b.extend(
        first
            .iter()
            .map(|r| (pod_spec(&r.name), InpodTopology::netns_path(&r.ns))),
    );
    let up = async {
        let agents = tokio::try_join!(
            node_agent(
                &zds_a,
                vec![(pod_spec("client"), InpodTopology::netns_path(&env.topo.pa))]
            ),
            node_agent(&zds_b, pods_b),
        )?;
        first_round_trip(env).await?;
        vip_answers(env).await?;
        Ok::<_, anyhow::Error>(agents)
    };
    let (_agent_a, agent_b) = match up.await {
        Ok(x) => x,
        Err(e) => bail!(
            "not up: {e:#}\n--- node-a log ---\n{}\n--- node-b log ---\n{}",
            a.log_tail(),
            b.log_tail()
        ),
    };
    let mut run = Run {
        env,
        pair,
        app_drain: variant.app_drain(),
        agent_b,
        replicas: first,
        guard,
    };
    let dst = SocketAddr::new(vip(&env.topo).into(), SERVICE_PORT);
    let load = Load::start(
        &env.pod_a.handle,
        vec![("vip", dst)],
        variant.rate(),
        LONG_STREAMS,
    );
    let started = Instant::now();
    let steps = async {
        tokio::time::sleep(SETTLE).await;
        for index in 0..REPLICAS {
            match variant {
                Variant::Rollout { .. } => {
                    run.surge(1, index).await?;
                    run.replace(0, index).await?;
                }
                Variant::Crash { .. } => {
                    run.crash(0, index).await?;
                    run.surge(1, index).await?;
                }
            }
        }
        tokio::time::sleep(SETTLE).await;
        Ok::<_, anyhow::Error>(())
    };
    let stepped = steps.await;
    let counts = load.stop().await;
    let took = started.elapsed();
    // The next run starts from the same istiod: every replica is gone.
    for gen in 0..2 {
        for index in 0..REPLICAS {
            env.xds
                .remove_quietly(ADDRESS, &xds_uid(&format!("server-{gen}-{index}")));
        }
    }
    if let Err(e) = stepped {
        bail!(
            "{e:#}\n--- node-a log ---\n{}\n--- node-b log ---\n{}",
            a.log_tail(),
            b.log_tail()
        );
    }
    drop((a, b));
    for r in &run.replicas {
        delete_pod_netns(&env.topo, r);
    }
    Ok(Measured::of(&counts, took))
}

/// Retries one request through the VIP until it is answered (both
/// gateways know the Service and its endpoints).
async fn vip_answers(env: &Env) -> anyhow::Result<()> {
    let dst = SocketAddr::new(vip(&env.topo).into(), SERVICE_PORT);
    let started = Instant::now();
    env.pod_a
        .run("the VIP answers", UP_WITHIN + STEP, async move {
            let mut last = String::new();
            while started.elapsed() < UP_WITHIN {
                let once = async {
                    let mut tcp = tokio::net::TcpStream::connect(dst).await?;
                    tcp.write_all(b"GET / HTTP/1.1\r\nHost: echo\r\nConnection: close\r\n\r\n")
                        .await?;
                    let mut back = Vec::new();
                    tcp.read_to_end(&mut back).await?;
                    Ok::<_, std::io::Error>(back)
                };
                match tokio::time::timeout(STEP, once).await {
                    Ok(Ok(back)) if back.starts_with(b"HTTP/1.1 200") => return Ok(()),
                    Ok(Ok(back)) => {
                        last = String::from_utf8_lossy(&back[..back.len().min(80)]).into()
                    }
                    Ok(Err(e)) => last = e.to_string(),
                    Err(_) => last = "timed out".into(),
                }
                // Not an event we can await: the gateways apply istiod's
                // answers on their own schedule.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(anyhow::anyhow!(
                "no answer through the VIP within {UP_WITHIN:?}: {last}"
            ))
        })
        .await
}
