//! xDS apply benchmark: a program that prints figures, not a timed test.
//!
//! ```text
//! cargo bench --profile dev -p tidegate-e2e --bench xds
//! XDS_WORKLOADS=100000 cargo bench -p tidegate-e2e --bench xds
//! ```
//!
//! A gateway with `workloads.source: istio` against the xDS server double
//! (delta ADS over gRPC/TLS on loopback, in this process). The double holds
//! `XDS_WORKLOADS` workloads (1,000 to 100,000; default 10,000) and a fifth
//! as many Services before the gateway starts: each workload is an
//! endpoint of one Service (five per Service, a port mapping 80 → 8080
//! each), pods spread over 1,000 nodes, about 30 of them on the gateway's
//! own node (their certificates come from the dev CA as they would from
//! istiod's). Addresses: workloads from 10.64.0.0, VIPs from 172.16.0.0;
//! nothing dials them.
//!
//! - **Time to ready**: `tidegate::app::build` → `/healthz/ready` answering
//!   200 (polled every 5 ms), and, inside it, stream open (the double's
//!   stream handler called) → the client's ACK of the Address
//!   subscription's answer (sent once that answer was decoded, converted,
//!   assembled and published). Baselines, same run, same set, no gateway:
//!   the same encoded resources handed to `IstioSource::handle` in process
//!   (decode, convert, assemble, publish: everything but the transport) —
//!   the Address answer alone (against stream open → ACK), then with the
//!   empty authorization answer after it, which republishes the set again
//!   (against build → ready: readiness waits for both) — and the workload
//!   file's path (`parse_file` of the same set as YAML,
//!   `publish`). Medians of 3.
//! - **Memory per workload**: jemalloc's `stats.allocated` (live
//!   allocations) and the process's RSS, before the gateway starts (the
//!   double already holding the encoded set) and once it is ready (plus a
//!   500 ms settle); divided by 10,000. The doubles serve from a thread
//!   of their own, and what a double kept for the gateway's stream over
//!   the same interval (the buffer it encoded the answer into) is counted
//!   there and subtracted: it is not the gateway's, and the other
//!   gateway's RSS (`--pair`) never included it. Everything the gateway holds for
//!   the set is in it: the client's name → version map, the source's
//!   converted workloads and Services, the store's snapshot (indexes,
//!   resolved Services), and the gateway's own fixed state (listeners,
//!   tasks, metrics, dev CA, certificates of the 20 local identities). A
//!   gateway of 100 workloads and 20 Services started just before gives
//!   the fixed part, and the marginal figure subtracts it.
//! - **Per update**: with the full set held, single-workload updates pushed
//!   one at a time (`XdsDouble::set`: a remote pod turning UNHEALTHY, or
//!   back); per update, push → the client's ACK, which it sends after the
//!   handler applied the update and republished the whole set. p50 / p99 /
//!   max, beside the same on a gateway of 100 workloads and 20 Services
//!   (blocks of 100 interleaved). The in-process handler's figure for the
//!   same updates, and `assemble` and `publish` of the full set
//!   alone, say where the time goes. CPU per update: the process's CPU
//!   time (user + system, the double's share included) over the updates.
//! - **Churn**: updates pushed at a rate without waiting for ACKs — 50
//!   single-workload updates per second, then 10 pushes per second of 5
//!   workloads each — for `XDS_CHURN_SECS` (default 20); per push, push →
//!   its ACK. The largest is the ACK lag: bounded when the gateway keeps
//!   up, growing through the phase when it does not (the ACKs still
//!   missing 30 s after the last push are counted).
//!
//! `XDS_UPDATES` (1 to 10,000, default 1,000) sets the update count; each
//! update phase also stops after 60 s. `XDS_SERVICES` (1 to a fifth of the
//! workloads, the default) sets the Services the workloads are spread
//! over: `XDS_WORKLOADS=100000 XDS_SERVICES=100` gives each Service 1,000
//! endpoints, and each update touches one of them.
//!
//! With `-- --pair NAME=COMMAND` another gateway, started by the command
//! line in a network namespace of its own and fed by a second double
//! holding the same set, is measured beside tidegate (see [`pair`]): spawn
//! → ready, stream open → ACK, its CPU time at ready, its RSS at ready
//! (and the marginal per workload over the same gateway started with the
//! 100-workload set), push → ACK per update (its blocks interleaved with
//! tidegate's), its CPU per update, and both churn phases (each right
//! after tidegate's). The table gives tidegate / the other gateway.
//!
//! With `-- --dump --pair NAME=COMMAND` the bench runs nothing of the
//! above: both gateways are fed a small set of their own (a waypointed
//! Service with SANs, a capacity, authorization policies) and their
//! `/config_dump`s are compared key by key (see [`dump`]).

#[path = "xds/dump.rs"]
mod dump;
#[path = "xds/pair.rs"]
mod pair;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidegate::workloads::WholeSet;

use bytes::Bytes;
use prost::Message as _;
use tidegate::app::App;
use tidegate::config::Config;
use tidegate::workloads::istio::{convert, IstioSource};
use tidegate::workloads::WorkloadStore;
use tidegate_e2e::synthetic_cluster::{Set, GATEWAY_NODE};
use tidegate_e2e::xds_double::XdsDouble;
use tidegate_e2e::{env_count, http_get, poll_within};
use tidegate_xds::client::{ADDRESS, AUTHORIZATION};
use tidegate_xds::workload::{address, Address};
use tidegate_xds::{Handler, Update};

/// What the gateway runs on: jemalloc (its stats are the memory figure).
#[global_allocator]
static ALLOCATOR: tidegate::Allocator = tidegate::ALLOCATOR;

const SMALL_WORKLOADS: usize = 100;
const SMALL_SERVICES: usize = 20;
const BLOCK: usize = 100;
const PHASE_MAX: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(60);
const REPEATS: usize = 3;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// p50, p99, max of `v` (ms).
fn summary(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (pct(&v, 0.5), pct(&v, 0.99), *v.last().unwrap_or(&f64::NAN))
}

const SMALL: Set = Set {
    workloads: SMALL_WORKLOADS,
    services: SMALL_SERVICES,
};

fn config(dir: &Path, double: &XdsDouble) -> Config {
    let roots = dir.join("xds-root.pem");
    std::fs::write(&roots, &double.root_pem).unwrap();
    let token = dir.join("istio-token");
    std::fs::write(&token, "tok").unwrap();
    let yaml = format!(
        r#"node_name: {GATEWAY_NODE}
trust_domain: cluster.local
listeners:
  outbound: 127.0.0.1:0
  inbound: 127.0.0.1:0
  admin: 127.0.0.1:0
  metrics: 127.0.0.1:0
  readiness: 127.0.0.1:0
certificates: {{source: dev-ca, state_dir: {ca}}}
workloads:
  source: istio
  istio:
    address: https://{addr}
    roots: {roots}
    token: {token}
    pod_ip: 10.0.0.1
    pod_name: tidegate-{GATEWAY_NODE}
"#,
        ca = dir.join("ca").display(),
        addr = double.addr,
        roots = roots.display(),
        token = token.display(),
    );
    Config::from_yaml(&yaml).unwrap_or_else(|e| panic!("bench config: {e}\n{yaml}"))
}

/// A runtime of one thread for the doubles feeding this process's
/// gateways: what a double holds for a stream (the buffer it encoded the
/// answer into, its side of the HTTP/2 connection) is allocated and freed
/// on that thread, where jemalloc counts it apart from the gateway's.
struct DoubleThread(tokio::runtime::Handle);

impl DoubleThread {
    fn new() -> DoubleThread {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("xds-double")
            .enable_all()
            .build()
            .expect("the doubles' runtime");
        let handle = rt.handle().clone();
        // Serves until the process exits (a runtime is not dropped inside
        // another).
        std::mem::forget(rt);
        DoubleThread(handle)
    }

    async fn double(&self) -> Arc<XdsDouble> {
        Arc::new(
            self.0
                .spawn(XdsDouble::start())
                .await
                .expect("the double starts"),
        )
    }

    /// Bytes allocated less bytes freed on the doubles' thread so far.
    async fn live(&self) -> i64 {
        self.0
            .spawn(async {
                let allocated = tikv_jemalloc_ctl::thread::allocatedp::read().unwrap().get();
                let freed = tikv_jemalloc_ctl::thread::deallocatedp::read()
                    .unwrap()
                    .get();
                allocated as i64 - freed as i64
            })
            .await
            .expect("the doubles' thread answers")
    }
}

/// jemalloc's live allocations and this process's RSS, in bytes.
fn memory() -> (u64, u64) {
    tikv_jemalloc_ctl::epoch::advance().unwrap();
    let allocated = tikv_jemalloc_ctl::stats::allocated::read().unwrap() as u64;
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    (allocated, pages * page)
}

async fn ready(app: &App) -> bool {
    http_get(app.addrs.readiness, "/healthz/ready").await.0 == 200
}

/// A gateway started against `double` (which holds `set`): build → ready,
/// and stream open → the Address subscription's answer ACKed.
struct Started {
    app: App,
    to_ready: Duration,
    /// This process's CPU time over build → ready (the double's share included).
    cpu: Duration,
    to_built: Duration,
    open_to_ack: Duration,
    _dir: tempfile::TempDir,
}

/// The next stream `double` opens: stream open → the client's ACK (or
/// NACK) of its Address answer, and the NACK's text if it was one.
fn watch_next_stream(
    double: &Arc<XdsDouble>,
) -> tokio::task::JoinHandle<(Duration, Option<String>)> {
    let streams = double.opened().len();
    let double = double.clone();
    tokio::spawn(async move {
        double.opened_at_least(streams + 1).await;
        let opened = Instant::now();
        let nonce = double.answered(streams, ADDRESS).await;
        let reply = double.reply(&nonce).await;
        (opened.elapsed(), reply.nack)
    })
}

async fn start(double: &Arc<XdsDouble>, set: Set) -> Started {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), double);
    let watcher = watch_next_stream(double);
    let (t0, c0) = (Instant::now(), cpu_time());
    let app = tidegate::app::build(cfg).await.unwrap();
    let to_built = t0.elapsed();
    poll_within(WAIT, || async { ready(&app).await.then_some(()) })
        .await
        .expect("the gateway became ready");
    let to_ready = t0.elapsed();
    let cpu = cpu_time() - c0;
    let (open_to_ack, nack) = tokio::time::timeout(WAIT, watcher).await.unwrap().unwrap();
    assert_eq!(nack, None, "the set is accepted");
    let snap = app.workloads.snapshot();
    assert_eq!(snap.len(), set.workloads, "every workload published");
    assert_eq!(snap.services_len(), set.services, "every Service published");
    drop(snap);
    Started {
        app,
        to_ready,
        cpu,
        to_built,
        open_to_ack,
        _dir: dir,
    }
}

/// This process's CPU time so far (user + system, every thread, to the
/// nanosecond: /proc's clock ticks are 10 ms, a thousand updates' worth).
fn cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Pushes updates `from..to` of `set` one at a time; push → ACK, ms.
async fn push_updates(double: &XdsDouble, set: Set, from: usize, to: usize) -> Vec<f64> {
    let remote = set.remote();
    let mut out = Vec::with_capacity(to - from);
    for k in from..to {
        let (name, value) = set.update(&remote, k);
        let t = Instant::now();
        let nonce = double.set(ADDRESS, &name, value).expect("subscribed");
        let reply = tokio::time::timeout(WAIT, double.reply(&nonce))
            .await
            .expect("the update ACKed");
        out.push(ms(t.elapsed()));
        assert_eq!(reply.nack, None);
    }
    out
}

fn updates_of(items: Vec<(String, Bytes)>) -> Vec<Update> {
    items
        .into_iter()
        .map(|(name, value)| Update {
            name,
            version: "1".into(),
            value,
        })
        .collect()
}

/// The in-process path: a fresh store and source, the whole set handed to
/// the handler (then the empty policy answer, as the stream's second
/// subscription). Returns the store, the source (full set held), the
/// Address answer's time and the time of both.
fn handler_apply(
    items: &[(String, Bytes)],
    set: Set,
) -> (Arc<WorkloadStore>, IstioSource, Duration, Duration) {
    let store = WorkloadStore::new("cluster.local", GATEWAY_NODE);
    let mut source = IstioSource::new(store.clone());
    let updates = updates_of(items.to_vec());
    let t = Instant::now();
    assert!(source.handle(ADDRESS, updates, vec![]).is_empty());
    let address = t.elapsed();
    assert!(source.handle(AUTHORIZATION, vec![], vec![]).is_empty());
    let both = t.elapsed();
    assert_eq!(store.snapshot().len(), set.workloads);
    (store, source, address, both)
}

/// What the source and the store each hold for the whole set, in
/// jemalloc's live bytes: `handle` of the set into a fresh pair, then the
/// source dropped (its held resources and indexes), then the store (the
/// snapshot).
fn memory_by_layer(items: &[(String, Bytes)], set: Set) -> (f64, f64) {
    let (store, source, _, _) = handler_apply(items, set);
    let both = memory().0;
    drop(source);
    let store_only = memory().0;
    drop(store);
    (
        both as f64 - store_only as f64,
        store_only as f64 - memory().0 as f64,
    )
}

fn file_apply(yaml: &str, set: Set) -> Duration {
    let store = WorkloadStore::new("cluster.local", GATEWAY_NODE);
    let t = Instant::now();
    let parsed = tidegate::workloads::parse_file(yaml).expect("bench workload file");
    store.publish(parsed);
    let took = t.elapsed();
    assert_eq!(store.snapshot().len(), set.workloads);
    took
}

/// `assemble`, `publish` and dropping the snapshot it replaced, of
/// the full set, each alone (median of 5 each, ms).
fn republish_parts(items: &[(String, Bytes)]) -> (f64, f64, f64) {
    let mut workloads = BTreeMap::new();
    let mut services = BTreeMap::new();
    for (name, value) in items {
        match Address::decode(value.as_ref()).unwrap().r#type.unwrap() {
            address::Type::Workload(w) => {
                workloads.insert(name.clone(), convert::workload(&w).unwrap());
            }
            address::Type::Service(s) => {
                services.insert(name.clone(), convert::service(&s).unwrap());
            }
        }
    }
    let store = WorkloadStore::new("cluster.local", GATEWAY_NODE);
    let policies = Arc::new(tidegate_authz::PolicyStore::default());
    let (mut assemble, mut publish, mut drop_old) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..6 {
        let t = Instant::now();
        let (specs, svcs) = convert::assemble(&workloads, &services);
        assemble.push(ms(t.elapsed()));
        let previous = store.snapshot();
        let t = Instant::now();
        store.publish(
            WholeSet::new(specs)
                .services(svcs)
                .policies(policies.clone())
                .members_by_protocol(tidegate::workloads::membership::Reason::Istio),
        );
        publish.push(ms(t.elapsed()));
        let t = Instant::now();
        drop(previous);
        drop_old.push(ms(t.elapsed()));
    }
    // The first publish replaced an empty snapshot.
    drop_old.remove(0);
    assemble.remove(0);
    publish.remove(0);
    (median(assemble), median(publish), median(drop_old))
}

/// Push → ACK of every push of a churn phase (ms), and how many were
/// still not acknowledged 30 s after the last push.
struct Churn {
    lags: Vec<f64>,
    missing: usize,
    /// Pushes answered with a NACK.
    nacks: usize,
    pushes: usize,
}

/// Pushes `per_push` updates at a time, `rate` pushes per second, for
/// `secs`, without waiting for ACKs (updates `from..` of `set`).
async fn churn(
    double: &Arc<XdsDouble>,
    set: Set,
    from: usize,
    rate: u32,
    per_push: usize,
    secs: u64,
) -> Churn {
    let remote = set.remote();
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / rate);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let pushes = (u64::from(rate) * secs) as usize;
    let mut waiters = Vec::with_capacity(pushes);
    for p in 0..pushes {
        ticks.tick().await;
        let batch: Vec<(String, Bytes)> = (0..per_push)
            .map(|j| set.update(&remote, from + p * per_push + j))
            .collect();
        let t = Instant::now();
        let nonce = double.set_all(ADDRESS, batch).expect("subscribed");
        let double = double.clone();
        waiters.push(tokio::spawn(async move {
            let reply = double.reply(&nonce).await;
            (ms(t.elapsed()), reply.nack.is_some())
        }));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut lags = Vec::with_capacity(pushes);
    let (mut missing, mut nacks) = (0, 0);
    for w in waiters {
        match tokio::time::timeout_at(deadline, w).await {
            Ok(Ok((lag, nack))) => {
                lags.push(lag);
                nacks += usize::from(nack);
            }
            _ => missing += 1,
        }
    }
    Churn {
        lags,
        missing,
        nacks,
        pushes,
    }
}

fn main() -> anyhow::Result<()> {
    let updates = env_count("XDS_UPDATES", 1000, 10_000).map_err(anyhow::Error::msg)?;
    let workloads = env_count("XDS_WORKLOADS", 10_000, 100_000).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(workloads >= 1000, "XDS_WORKLOADS: at least 1,000");
    let churn_secs = env_count("XDS_CHURN_SECS", 20, 60).map_err(anyhow::Error::msg)? as u64;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pair = pair::parse_args(&args)?;
    // SAFETY: geteuid has no preconditions.
    if pair.is_some() && unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: --pair needs root (a network namespace)");
        return Ok(());
    }
    if args.iter().any(|a| a == "--dump") {
        let spec = pair.ok_or_else(|| {
            anyhow::anyhow!("--dump compares with another gateway: give --pair NAME=COMMAND")
        })?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        return rt.block_on(dump::run(spec));
    }
    let services =
        env_count("XDS_SERVICES", workloads / 5, workloads / 5).map_err(anyhow::Error::msg)?;
    let big = Set {
        workloads,
        services,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(updates, big, churn_secs, pair))
}

async fn run(
    updates: usize,
    set: Set,
    churn_secs: u64,
    pair: Option<pair::PairSpec>,
) -> anyhow::Result<()> {
    tidegate_e2e::raise_fd_limit();
    let (workloads, services) = (set.workloads, set.services);
    println!(
        "xDS apply benchmark: {workloads} workloads, {services} Services (the xDS double, delta ADS over gRPC/TLS on loopback)\n"
    );
    let big_items = set.resources();
    let small_items = SMALL.resources();
    let bytes: usize = big_items.iter().map(|(n, v)| n.len() + v.len()).sum();
    let doubles = DoubleThread::new();
    let big_double = doubles.double().await;
    let small_double = doubles.double().await;
    for (name, value) in &big_items {
        big_double.set_quietly(ADDRESS, name, value.clone());
    }
    for (name, value) in &small_items {
        small_double.set_quietly(ADDRESS, name, value.clone());
    }
    // The other gateway's namespace and doubles, set up before the first
    // memory reading.
    let mut other = match pair {
        Some(spec) => {
            let env = pair::PairEnv::new(spec).await?;
            let (big, small) = (env.double().await, env.double().await);
            for (name, value) in &big_items {
                big.set_quietly(ADDRESS, name, value.clone());
            }
            for (name, value) in &small_items {
                small.set_quietly(ADDRESS, name, value.clone());
            }
            Some((env, big, small))
        }
        None => None,
    };

    // ---- time to ready, memory ----
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (mem0, held0) = (memory(), doubles.live().await);
    let small = start(&small_double, SMALL).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mem1, held1) = (memory(), doubles.live().await);
    let big = start(&big_double, set).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (mem2, held2) = (memory(), doubles.live().await);

    // ---- the other gateway: the small set, then the full one (kept) ----
    let other = match &mut other {
        Some((env, big_double, small_double)) => {
            let name = env.spec.name.clone();
            let small = env.start(small_double).await?;
            let (small_rss, small_ready) = (small.rss, small.to_ready);
            drop(small);
            let big = env.start(big_double).await?;
            println!(
                "{name} ready: {:.0} ms at {SMALL_WORKLOADS} workloads, {:.0} ms at {workloads}",
                ms(small_ready),
                ms(big.to_ready)
            );
            Some(Other {
                name,
                double: big_double.clone(),
                small_rss,
                small_ready,
                big,
            })
        }
        None => None,
    };

    // ---- per update, interleaved blocks ----
    let (mut big_lat, mut small_lat) = (Vec::new(), Vec::new());
    let (mut big_time, mut small_time) = (Duration::ZERO, Duration::ZERO);
    let (mut big_cpu, mut small_cpu) = (Duration::ZERO, Duration::ZERO);
    let mut other_upd = OtherUpdates::default();
    let mut k = 0;
    while k < updates
        && big_time < PHASE_MAX
        && small_time < PHASE_MAX
        && other_upd.time < PHASE_MAX
    {
        let to = (k + BLOCK).min(updates);
        let (t, c) = (Instant::now(), cpu_time());
        big_lat.extend(push_updates(&big_double, set, k, to).await);
        (big_time, big_cpu) = (big_time + t.elapsed(), big_cpu + (cpu_time() - c));
        let (t, c) = (Instant::now(), cpu_time());
        small_lat.extend(push_updates(&small_double, SMALL, k, to).await);
        (small_time, small_cpu) = (small_time + t.elapsed(), small_cpu + (cpu_time() - c));
        if let Some(o) = &other {
            other_upd.block(o, set, k, to).await;
        }
        k = to;
    }
    let done = k;

    // ---- churn: updates at a rate, ACKs not awaited ----
    // Each of the other gateway's phases right after tidegate's, the same
    // updates in the same order.
    let single = churn(&big_double, set, done, 50, 1, churn_secs).await;
    let other_single = match &other {
        Some(o) => Some(churn(&o.double, set, done, 50, 1, churn_secs).await),
        None => None,
    };
    let batched = churn(&big_double, set, done + single.pushes, 10, 5, churn_secs).await;
    let other_batched = match &other {
        Some(o) => Some(churn(&o.double, set, done + single.pushes, 10, 5, churn_secs).await),
        None => None,
    };
    let xds_metrics = big.app.metrics_text();

    // ---- baselines in process (the gateways idle) ----
    let yaml = set.yaml();
    let (mut handler_ms, mut address_ms) = (Vec::new(), Vec::new());
    let mut held = None;
    for _ in 0..REPEATS {
        // The previous run's set freed before the next is built.
        drop(held.take());
        let (store, source, address, both) = handler_apply(&big_items, set);
        address_ms.push(ms(address));
        handler_ms.push(ms(both));
        held = Some((store, source));
    }
    let (store, mut source) = held.unwrap();
    let (source_bytes, store_bytes) = memory_by_layer(&big_items, set);
    let file_ms: Vec<f64> = (0..REPEATS).map(|_| ms(file_apply(&yaml, set))).collect();
    let remote = set.remote();
    let mut inproc_lat = Vec::new();
    let t = Instant::now();
    for k in 0..done {
        if t.elapsed() > PHASE_MAX {
            break;
        }
        let (name, value) = set.update(&remote, k);
        let u = updates_of(vec![(name, value)]);
        // Held, and dropped after the timing: in the gateway, the drain
        // engine holds the previous snapshot and drops it on its own task.
        let previous = store.snapshot();
        let t = Instant::now();
        assert!(source.handle(ADDRESS, u, vec![]).is_empty());
        inproc_lat.push(ms(t.elapsed()));
        drop(previous);
    }
    let inproc_n = inproc_lat.len();
    let (assemble_ms, publish_ms, drop_ms) = republish_parts(&big_items);

    // ---- the table ----
    let (handler, address, file) = (median(handler_ms), median(address_ms), median(file_ms));
    let open_to_ack = ms(big.open_to_ack);
    println!(
        "time to ready ({} workloads, {} Services, {:.1} MB of encoded resources):",
        workloads,
        services,
        bytes as f64 / 1e6
    );
    println!("| path | ms | baseline (same set, same run) | × baseline |\n|---|---|---|---|");
    println!(
        "| build → /healthz/ready 200 (xDS) | {:.0} | in-process `handle` of both answers, {handler:.0} ms | {:.2} |",
        ms(big.to_ready),
        ms(big.to_ready) / handler
    );
    println!(
        "| stream open → Address answer ACKed (xDS) | {open_to_ack:.0} | in-process `handle` of the Address answer, {address:.0} ms | {:.2} |",
        open_to_ack / address
    );
    println!(
        "| workload file: `parse_file` + `publish`, same set as YAML | {file:.0} | in-process `handle` of both answers | {:.2} |",
        file / handler
    );
    println!(
        "(build itself returned after {:.0} ms; the 100-workload gateway: build → ready {:.0} ms, stream open → ACK {:.0} ms)",
        ms(big.to_built),
        ms(small.to_ready),
        ms(small.open_to_ack)
    );

    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let delta = |a: (u64, u64), b: (u64, u64)| {
        (
            b.0 as f64 - a.0 as f64, // allocated
            b.1 as f64 - a.1 as f64, // RSS
        )
    };
    // What the double kept for the gateway's stream over the same
    // interval (its encoding buffer, sized by the largest answer) is not
    // the gateway's: subtracted from both figures.
    let (small_held, big_held) = ((held1 - held0) as f64, (held2 - held1) as f64);
    let (small_alloc, small_rss) = delta(mem0, mem1);
    let (small_alloc, small_rss) = (small_alloc - small_held, small_rss - small_held);
    let (big_alloc, big_rss) = delta(mem1, mem2);
    let (big_alloc, big_rss) = (big_alloc - big_held, big_rss - big_held);
    let marginal = (workloads - SMALL_WORKLOADS) as f64;
    println!(
        "\nmemory (jemalloc allocated / RSS; the double's copy of the encoded set was already held; what the double kept for each gateway's stream, counted on its own thread, subtracted: {:.1} MiB for the big gateway, {:.1} MiB for the small one):",
        big_held / (1 << 20) as f64,
        small_held / (1 << 20) as f64
    );
    println!("| | allocated | RSS |\n|---|---|---|");
    println!(
        "| before the gateways | {:.1} MiB | {:.1} MiB |",
        mib(mem0.0),
        mib(mem0.1)
    );
    println!(
        "| + gateway of {SMALL_WORKLOADS} workloads, {SMALL_SERVICES} Services (ready) | +{:.1} MiB | +{:.1} MiB |",
        small_alloc / (1 << 20) as f64,
        small_rss / (1 << 20) as f64
    );
    println!(
        "| + gateway of {workloads} workloads, {services} Services (ready) | +{:.1} MiB | +{:.1} MiB |",
        big_alloc / (1 << 20) as f64,
        big_rss / (1 << 20) as f64
    );
    println!(
        "| per workload (÷ {workloads}, Services included) | {:.2} KiB | {:.2} KiB |",
        big_alloc / workloads as f64 / 1024.0,
        big_rss / workloads as f64 / 1024.0
    );
    println!(
        "| per workload, marginal ((big − small) ÷ {marginal:.0}) | {:.2} KiB | {:.2} KiB |",
        (big_alloc - small_alloc) / marginal / 1024.0,
        (big_rss - small_rss) / marginal / 1024.0
    );

    println!(
        "| of which, in process: the source's held resources and indexes / the store's snapshot (÷ {workloads}) | {:.2} / {:.2} KiB | |",
        source_bytes / workloads as f64 / 1024.0,
        store_bytes / workloads as f64 / 1024.0
    );

    let (b50, b99, bmax) = summary(big_lat);
    let (s50, s99, smax) = summary(small_lat);
    let (i50, i99, imax) = summary(inproc_lat);
    println!(
        "\nper update, push → ACK ({done} single-workload updates each, blocks of {BLOCK} interleaved; ms):"
    );
    println!("| set | p50 | p99 | max |\n|---|---|---|---|");
    println!(
        "| {workloads} workloads, {services} Services (xDS) | {b50:.2} | {b99:.2} | {bmax:.2} |"
    );
    println!("| {SMALL_WORKLOADS} workloads, {SMALL_SERVICES} Services (xDS) | {s50:.2} | {s99:.2} | {smax:.2} |");
    println!(
        "| {workloads} workloads, in-process `handle`, the replaced snapshot dropped after ({inproc_n} updates) | {i50:.2} | {i99:.2} | {imax:.2} |"
    );
    println!(
        "full set / small set: p50 {:.1}×, p99 {:.1}×; in-process / xDS p50: {:.2}",
        b50 / s50,
        b99 / s99,
        i50 / b50
    );
    println!(
        "the full republish alone: `assemble` {assemble_ms:.2} ms + `publish` {publish_ms:.2} ms = {:.2} ms ({:.0} % of the xDS p50); dropping the snapshot it replaced, {drop_ms:.2} ms more (off the ACK's path in the gateway)",
        assemble_ms + publish_ms,
        (assemble_ms + publish_ms) / b50 * 100.0
    );
    println!(
        "CPU per update (the process, the double's share included): {:.3} ms at {workloads} workloads, {:.3} ms at {SMALL_WORKLOADS} ({:.1}×)",
        ms(big_cpu) / done as f64,
        ms(small_cpu) / done as f64,
        big_cpu.as_secs_f64() / small_cpu.as_secs_f64().max(1e-9)
    );
    println!(
        "\nchurn at {workloads} workloads, ACKs not awaited, {churn_secs} s each (push → ACK, ms):"
    );
    println!("| pushes | p50 | p99 | max (the ACK lag) | not ACKed 30 s after the last push |\n|---|---|---|---|---|");
    for (label, c) in [
        ("50/s, 1 workload each", &single),
        ("10/s, 5 workloads each", &batched),
    ] {
        let (p50, p99, max) = summary(c.lags.clone());
        println!(
            "| {label} ({} pushes) | {p50:.2} | {p99:.2} | {max:.2} | {} |",
            c.pushes, c.missing
        );
        assert_eq!(c.nacks, 0, "tidegate NACKed none of the churn's pushes");
    }
    let sum = |name: &str| tidegate_e2e::metric_sum(&xds_metrics, name);
    println!(
        "(the {workloads}-workload gateway: {:.0} xDS responses, {:.1} MB, {:.0} streams ended)",
        sum("istio_xds_message_total"),
        sum("istio_xds_message_bytes_total") / 1e6,
        sum("istio_xds_connection_terminations_total").abs()
    );
    if let (Some(o), Some(os), Some(ob)) = (&other, &other_single, &other_batched) {
        let side = Side {
            set,
            big: &big,
            mem: [mem0, mem1, mem2],
            held: [held0, held1, held2],
            lat: (b50, b99),
            cpu_per_update: big_cpu / done as u32,
            churn: [&single, &batched],
        };
        print_side_by_side(&side, o, &other_upd, [os, ob]);
    }
    drop((big, small, other));
    Ok(())
}

/// The other gateway of `--pair`, started with the full set.
struct Other {
    name: String,
    double: Arc<XdsDouble>,
    /// Its RSS and spawn → ready with the 100-workload set.
    small_rss: u64,
    small_ready: Duration,
    big: pair::PairStarted,
}

/// The other gateway's per-update phase.
#[derive(Default)]
struct OtherUpdates {
    lat: Vec<f64>,
    time: Duration,
    /// Its own CPU time.
    cpu: Duration,
    /// This process's over the same blocks (the double's share).
    double_cpu: Duration,
}

impl OtherUpdates {
    async fn block(&mut self, o: &Other, set: Set, from: usize, to: usize) {
        let own = o.big.cpu();
        let (t, c) = (Instant::now(), cpu_time());
        self.lat
            .extend(push_updates(&o.double, set, from, to).await);
        self.time += t.elapsed();
        self.double_cpu += cpu_time() - c;
        self.cpu += o.big.cpu() - own;
    }
}

/// tidegate's figures of the run, for the side-by-side table.
struct Side<'a> {
    set: Set,
    big: &'a Started,
    /// Before the gateways, with the small one, with both.
    mem: [(u64, u64); 3],
    /// What the doubles' thread held at each of those readings.
    held: [i64; 3],
    /// Per update p50, p99 (ms).
    lat: (f64, f64),
    /// The process's, the double's share included.
    cpu_per_update: Duration,
    churn: [&'a Churn; 2],
}

fn print_side_by_side(t: &Side<'_>, o: &Other, upd: &OtherUpdates, churns: [&Churn; 2]) {
    let n = t.set.workloads;
    let name = &o.name;
    let kib = |b: f64| b / 1024.0;
    let marginal = (n - SMALL_WORKLOADS) as f64;
    let held = |a: usize, b: usize| (t.held[b] - t.held[a]) as f64;
    let rss_t = (
        t.mem[2].1 as f64 - t.mem[1].1 as f64 - held(1, 2),
        t.mem[1].1 as f64 - t.mem[0].1 as f64 - held(0, 1),
    );
    let per_wl_t = (rss_t.0 - rss_t.1) / marginal;
    let per_wl_o = (o.big.rss as f64 - o.small_rss as f64) / marginal;
    let updates = upd.lat.len();
    let (o50, o99, omax) = summary(upd.lat.clone());
    let cpu_upd_o = upd.cpu.as_secs_f64() * 1e3 / updates as f64;
    let double_upd = upd.double_cpu.as_secs_f64() * 1e3 / updates as f64;
    let cpu_upd_t = ms(t.cpu_per_update);
    let ready_cpu_o = o.big.cpu_at_ready.as_secs_f64();
    let ready_double = o.big.double_cpu.as_secs_f64();
    let ready_cpu_t = t.big.cpu.as_secs_f64();
    println!(
        "
side by side at {n} workloads, {} Services: tidegate (in process) / {name} (a process in its own namespace), each fed by its own double holding the same set",
        t.set.services
    );
    println!(
        "| figure | tidegate | {name} | tidegate / {name} |
|---|---|---|---|"
    );
    let row = |what: &str, a: f64, b: f64, unit: &str, prec: usize| {
        println!(
            "| {what} | {a:.prec$} {unit} | {b:.prec$} {unit} | {:.2} |",
            a / b
        );
    };
    row(
        "start → ready (tidegate: `app::build` → 200; the other: spawn → 200)",
        ms(t.big.to_ready),
        ms(o.big.to_ready),
        "ms",
        0,
    );
    row(
        "stream open → Address answer ACKed",
        ms(t.big.open_to_ack),
        ms(o.big.open_to_ack),
        "ms",
        0,
    );
    row(
        "CPU at ready, the double's share included (tidegate: the process over build → ready; the other: its own + this process's over spawn → ready)",
        ready_cpu_t,
        ready_cpu_o + ready_double,
        "s",
        2,
    );
    row(
        "CPU at ready, the gateway alone (tidegate: less the other's double share, ≈)",
        ready_cpu_t - ready_double,
        ready_cpu_o,
        "s",
        2,
    );
    println!(
        "| RSS at ready (tidegate: the process's growth less what its double kept for the stream; the other: its VmRSS) | +{:.1} MiB | {:.1} MiB | – |",
        rss_t.0 / (1 << 20) as f64,
        o.big.rss as f64 / (1 << 20) as f64
    );
    println!(
        "| the same with {SMALL_WORKLOADS} workloads (the fixed part) | +{:.1} MiB | {:.1} MiB | – |",
        rss_t.1 / (1 << 20) as f64,
        o.small_rss as f64 / (1 << 20) as f64
    );
    row(
        &format!(
            "RSS per workload, marginal ((full − {SMALL_WORKLOADS}-workload) ÷ {marginal:.0})"
        ),
        kib(per_wl_t),
        kib(per_wl_o),
        "KiB",
        2,
    );
    row(
        &format!("per update, push → ACK p50 ({updates} updates, blocks interleaved)"),
        t.lat.0,
        o50,
        "ms",
        2,
    );
    row("per update, push → ACK p99", t.lat.1, o99, "ms", 2);
    row(
        "CPU per update, the double's share included",
        cpu_upd_t,
        cpu_upd_o + double_upd,
        "ms",
        3,
    );
    row(
        "CPU per update, the gateway alone (tidegate: less the other's double share, ≈)",
        cpu_upd_t - double_upd,
        cpu_upd_o,
        "ms",
        3,
    );
    for (label, (a, b)) in [
        "churn, 50/s single-workload pushes",
        "churn, 10/s pushes of 5 workloads",
    ]
    .into_iter()
    .zip(t.churn.into_iter().zip(churns))
    {
        let (a50, a99, amax) = summary(a.lags.clone());
        let (b50, b99, bmax) = summary(b.lags.clone());
        println!(
            "| {label}: p50 / p99 / max (not ACKed) | {a50:.2} / {a99:.2} / {amax:.2} ms ({}) | {b50:.2} / {b99:.2} / {bmax:.2} ms ({}) | {:.2} / {:.2} / {:.2} |",
            a.missing,
            b.missing,
            a50 / b50,
            a99 / b99,
            amax / bmax
        );
    }
    let nacks: usize = churns.iter().map(|c| c.nacks).sum();
    let (warnings, first) = o.big.log_warnings();
    println!(
        "({name}: per update max {omax:.2} ms; {SMALL_WORKLOADS}-workload start {:.0} ms; NACKs: none at start or per update (checked), {nacks} in churn; {warnings} warning/error lines in its log{})",
        ms(o.small_ready),
        first.map(|l| format!(", the first: {l}")).unwrap_or_default()
    );
}
