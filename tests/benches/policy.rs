//! Drain-policy host benchmark: a program that prints figures, not a timed test.
//!
//! ```text
//! cargo xtask plugins        # once: builds target/plugins/*.wasm
//! cargo bench -p tidegate-e2e --bench policy
//! ```
//!
//! Everything runs in this process against the real host
//! (`tidegate_policy_host`), with the reference plugins built by `cargo xtask
//! plugins` (`target/plugins/*.wasm`, next to this crate's `../target`):
//!
//! 1. **Decision latency** with a warm instance, per reference plugin, on a
//!    representative event with realistic workload labels and annotations:
//!    per-call times over 20,000 calls after a warm-up, through
//!    `PluginVersion::call_raw` (convert, lower, run the guest, lift,
//!    convert back) and through the full engine path (`PolicyEngine::select`
//!    then `PolicyEngine::decide`: selection, quarantine check, call,
//!    validation, metrics). Targets: p50 ≤ 1 µs, p99 ≤ 10 µs, printed as met
//!    or not met. Then a breakdown of where the time goes: the clock read,
//!    an empty plugin on events of growing size, trimmed events, the
//!    native (no wasm) decision of the same plugin source, validation, the
//!    `Mutex`, and the engine's share.
//! 2. **Re-instantiation after a trap**: the `trap` fixture with
//!    `{"only-on": "network-teardown"}`, alternating a trapping event and
//!    normal ones; the first normal call after a trap instantiates from the
//!    cached `InstancePre` and runs `init`.
//! 3. **Compile + validate + swap** per reference plugin: `Component::new`
//!    alone (same engine configuration as the host), `PluginVersion::load`
//!    pieces, and `PolicyEngine::install` (compile, version check, init,
//!    self-test event, atomic swap); median of a few runs.
//!
//! `POLICY_BENCH_SECTIONS=1` (or `2,3`) runs only the given sections (for
//! `perf record`); `POLICY_BENCH_ONLY=recommended` (or a comma-separated
//! list) times only those plugins in section 1's table, without the
//! breakdown (for `valgrind --tool=callgrind` of one plugin's call);
//! `POLICY_BENCH_PLUGINS=<dir>` reads the plugins from
//! another directory than `target/plugins` (the same host against plugins
//! built at another commit); `POLICY_BENCH_CALLS=N` times N calls per row
//! instead of 20,000 (two callgrind runs with different N give one call's
//! instructions by difference).
//!
//! Times are per call measured with `Instant::now()` around each call, so
//! they include one clock read (its cost is printed as the floor). The run
//! takes well under a minute after the build.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidegate::workloads::{Workload, WorkloadSpec};
use tidegate_policy_host::config::PoliciesConfig;
use tidegate_policy_host::{
    validate, Clock, PluginVersion, PolicyEngine, PolicyMetrics, PolicyRuntime, QuarantineRule,
    RuntimeLimits, Selection,
};
use tidegate_protocol::identity::SpiffeId;
use tidegate_sdk::{
    Action, Event, NetworkTeardown, PeerInfo, PeerState, Policy, ShutdownStarted, WorkloadInfo,
    WorkloadState,
};

/// The gateway's allocator: a decision allocates on the host (the lifted
/// actions, the decision's strings), and glibc's malloc costs more per
/// call than the jemalloc the gateway runs on.
#[global_allocator]
static ALLOCATOR: tidegate::Allocator = tidegate::ALLOCATOR;

// The reference plugins' own sources, compiled natively (the SDK types build
// natively and `export_policy!` expands to nothing off wasm32): the same
// decision logic without wasm, as a baseline. `cargo bench` sets cfg(test),
// so their unit-test helpers compile too (unused here, hence the allows).
#[path = "../../plugins/drain-at-teardown/src/lib.rs"]
#[allow(unused)]
mod drain_at_teardown;
#[path = "../../plugins/evict-on-delete/src/lib.rs"]
#[allow(unused)]
mod evict_on_delete;
#[path = "../../plugins/goaway-on-term-start/src/lib.rs"]
#[allow(unused)]
mod goaway_on_term_start;
#[path = "../../plugins/keepalive-only/src/lib.rs"]
#[allow(unused)]
mod keepalive_only;
#[path = "../../plugins/oci-drain/src/lib.rs"]
#[allow(unused)]
mod oci_drain;
#[path = "../../plugins/recommended/src/lib.rs"]
#[allow(unused)]
mod recommended;

// ---- bounds -------------------------------------------------------------

const WARMUP: usize = 2_000;
/// Timed calls per row: 20,000, or `POLICY_BENCH_CALLS` (two runs with
/// different counts under callgrind give a call's instructions by
/// difference, whatever the run's fixed costs, such as compiling the
/// plugins, are).
static CALLS: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| {
    tidegate_e2e::env_count("POLICY_BENCH_CALLS", 20_000, usize::MAX).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    })
});
/// Trap / re-instantiate alternations (bounded in time too).
const TRAP_ROUNDS: usize = 1_000;
const TRAP_MAX_TIME: Duration = Duration::from_secs(8);
/// Compile / load / install repetitions per plugin (median printed).
const LOAD_RUNS: usize = 5;

const P50_TARGET: Duration = Duration::from_micros(1);
const P99_TARGET: Duration = Duration::from_micros(10);

const PLUGINS: [&str; 6] = [
    "goaway-on-term-start",
    "drain-at-teardown",
    "evict-on-delete",
    "keepalive-only",
    "oci-drain",
    "recommended",
];
const TRAP_FIXTURE: &str = "fixtures/trap";
const TRAP_CONFIG: &str = r#"{"only-on": "network-teardown"}"#;

// ---- statistics ---------------------------------------------------------

struct Stats {
    sorted: Vec<u64>,
}

impl Stats {
    fn new(mut ns: Vec<u64>) -> Self {
        ns.sort_unstable();
        Stats { sorted: ns }
    }

    /// Nearest-rank percentile.
    fn q(&self, q: f64) -> Duration {
        if self.sorted.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((q * self.sorted.len() as f64).ceil() as usize).clamp(1, self.sorted.len());
        Duration::from_nanos(self.sorted[rank - 1])
    }

    fn p50(&self) -> Duration {
        self.q(0.50)
    }
    fn p99(&self) -> Duration {
        self.q(0.99)
    }
    fn p999(&self) -> Duration {
        self.q(0.999)
    }
    fn max(&self) -> Duration {
        Duration::from_nanos(self.sorted.last().copied().unwrap_or(0))
    }
}

fn fmt_d(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.2} µs", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else {
        format!("{:.2} s", ns as f64 / 1e9)
    }
}

/// Times `f` per call: `warmup` untimed calls, then `calls` timed ones.
fn per_call(warmup: usize, calls: usize, mut f: impl FnMut()) -> Stats {
    for _ in 0..warmup {
        f();
    }
    let mut ns = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        f();
        ns.push(t.elapsed().as_nanos() as u64);
    }
    Stats::new(ns)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn verdict(s: &Stats) -> &'static str {
    match (s.p50() <= P50_TARGET, s.p99() <= P99_TARGET) {
        (true, true) => "met",
        (false, true) => "NOT MET (p50)",
        (true, false) => "NOT MET (p99)",
        (false, false) => "NOT MET (p50, p99)",
    }
}

// ---- the workload and events --------------------------------------------

const NS: &str = "shop";
const NAME: &str = "checkout-7d9f8b6c5d-x2x4q";
const UID: &str = "3f2a9c1e-6b7d-4e0f-9a1b-2c3d4e5f6a7b";

/// Labels and annotations of a typical Deployment pod (6 labels, 5 annotations).
fn workload_meta() -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let labels = [
        ("app", "checkout"),
        ("app.kubernetes.io/name", "checkout"),
        ("app.kubernetes.io/part-of", "shop"),
        ("version", "v2"),
        ("pod-template-hash", "7d9f8b6c5d"),
        ("team", "payments"),
    ];
    let annotations = [
        ("tidegate.io/oci-drain", "true"),
        ("kubectl.kubernetes.io/restartedAt", "2025-11-29T16:35:00Z"),
        ("prometheus.io/scrape", "true"),
        ("prometheus.io/port", "9090"),
        ("cluster-autoscaler.kubernetes.io/safe-to-evict", "true"),
    ];
    let m = |kv: &[(&str, &str)]| {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    (m(&labels), m(&annotations))
}

fn workload_state() -> WorkloadState {
    let (labels, annotations) = workload_meta();
    WorkloadState {
        info: WorkloadInfo {
            uid: UID.into(),
            name: NAME.into(),
            namespace: NS.into(),
            identity: format!("spiffe://cluster.local/ns/{NS}/sa/checkout"),
            labels,
            annotations,
        },
        inbound_tunnels: 3,
        inbound_streams: 12,
        outbound_pooled_tunnels: 2,
        age_ms: 3_600_000,
    }
}

fn shutdown_started() -> Event {
    Event::ShutdownStarted(ShutdownStarted {
        workload: workload_state(),
        grace_deadline_ms: Clock::Wall.now_ms() + 30_000,
        grace_remaining_ms: 30_000,
    })
}

fn network_teardown() -> Event {
    Event::NetworkTeardown(NetworkTeardown {
        workload: workload_state(),
        since_shutdown_ms: Some(27_500),
        max_hold_ms: 30_000,
    })
}

fn peer_deleted() -> Event {
    Event::PeerDeleted(PeerState {
        peer: PeerInfo {
            uid: "9b8c7d6e-5f4a-4b3c-8d2e-1f0a9b8c7d6e".into(),
            name: "payments-6c8b7f9d4-q7w2e".into(),
            namespace: "payments".into(),
            identity: "spiffe://cluster.local/ns/payments/sa/payments".into(),
            address: "10.244.1.37:15008".into(),
        },
        pooled_tunnels: 2,
        active_streams: 5,
    })
}

/// A workload with only a uid: the smallest event that carries a workload.
fn bare_event() -> Event {
    Event::WorkloadAdded(WorkloadState::new(WorkloadInfo::new(UID)))
}

/// A label-heavy workload (40 labels + 20 annotations of ~30-60 bytes).
fn heavy_event() -> Event {
    let mut w = workload_state();
    for i in 0..40 {
        w.info.labels.insert(
            format!("example.com/label-{i:02}"),
            format!("value-{i:02}-abcdefghijklmnop"),
        );
    }
    for i in 0..20 {
        w.info.annotations.insert(
            format!("example.com/annotation-{i:02}"),
            format!("{{\"key\":\"value-{i:02}\",\"n\":{i}}}"),
        );
    }
    Event::ShutdownStarted(ShutdownStarted {
        workload: w,
        grace_deadline_ms: Clock::Wall.now_ms() + 30_000,
        grace_remaining_ms: 30_000,
    })
}

/// `event` with the workload's labels dropped and its annotations
/// filtered to `tidegate.io/*` (peer events carry neither).
fn trimmed(event: &Event) -> Event {
    let mut e = event.clone();
    let info = match &mut e {
        Event::ShutdownStarted(s) => Some(&mut s.workload.info),
        Event::NetworkTeardown(t) => Some(&mut t.workload.info),
        Event::WorkloadAdded(w) | Event::WorkloadDeleted(w) => Some(&mut w.info),
        _ => None,
    };
    if let Some(info) = info {
        info.labels.clear();
        info.annotations
            .retain(|k, _| k.starts_with("tidegate.io/"));
    }
    e
}

/// The event each plugin reacts to (the one that exercises its logic).
fn event_for(plugin: &str) -> Event {
    match plugin {
        "drain-at-teardown" | "recommended" => network_teardown(),
        "evict-on-delete" => peer_deleted(),
        _ => shutdown_started(),
    }
}

/// The gateway's view of the same workload, annotated to select `policy`.
fn gateway_workload(policy: &str) -> Workload {
    let (labels, mut annotations) = workload_meta();
    annotations.insert(
        tidegate_policy_host::POLICY_ANNOTATION.to_owned(),
        policy.to_owned(),
    );
    Workload {
        spec: WorkloadSpec::new(UID, "node-a")
            .name(NAME)
            .namespace(NS)
            .service_account("checkout")
            .ips(["10.244.0.12".parse().unwrap()])
            .labels(labels)
            .annotations(annotations),
        identity: SpiffeId::new("cluster.local", NS, "checkout"),
        local: true,
    }
}

/// A plugin's decision function, natively.
type NativeDecide = Box<dyn FnMut(&Event) -> Vec<Action>>;

/// The same plugin source, natively.
fn native_policy(plugin: &str) -> NativeDecide {
    fn boxed<P: Policy>() -> NativeDecide {
        let mut p = P::init("").expect("native init");
        Box::new(move |e| p.decide(e))
    }
    match plugin {
        "goaway-on-term-start" => boxed::<goaway_on_term_start::GoawayOnTermStart>(),
        "drain-at-teardown" => boxed::<drain_at_teardown::DrainAtTeardown>(),
        "evict-on-delete" => boxed::<evict_on_delete::EvictOnDelete>(),
        "keepalive-only" => boxed::<keepalive_only::KeepaliveOnly>(),
        "oci-drain" => boxed::<oci_drain::OciDrainPolicy>(),
        "recommended" => boxed::<recommended::Recommended>(),
        other => panic!("no native build of {other}"),
    }
}

// ---- setup --------------------------------------------------------------

/// A comma-separated list from the environment (`POLICY_BENCH_SECTIONS`,
/// `POLICY_BENCH_ONLY`); unset or empty picks everything.
struct EnvList(String);

impl EnvList {
    fn read(var: &str) -> Self {
        EnvList(std::env::var(var).unwrap_or_default())
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.0.split(',').map(str::trim).filter(|n| !n.is_empty())
    }

    fn is_all(&self) -> bool {
        self.names().next().is_none()
    }

    fn picks(&self, name: &str) -> bool {
        self.is_all() || self.names().any(|n| n == name)
    }
}

/// `target/plugins`, or `POLICY_BENCH_PLUGINS` (the same host timed
/// against plugins built from another commit, e.g. for another contract).
fn plugins_dir() -> PathBuf {
    match std::env::var_os("POLICY_BENCH_PLUGINS") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins"),
    }
}

fn read_plugins() -> Result<BTreeMap<&'static str, Vec<u8>>, String> {
    let dir = plugins_dir();
    let mut out = BTreeMap::new();
    let mut missing = Vec::new();
    for name in PLUGINS.iter().copied().chain([TRAP_FIXTURE]) {
        let path = dir.join(format!("{name}.wasm"));
        match std::fs::read(&path) {
            Ok(b) => {
                out.insert(name, b);
            }
            Err(e) => missing.push(format!("  {}: {e}", path.display())),
        }
    }
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(format!(
            "plugins missing:\n{}\nbuild them first with `cargo xtask plugins`, then rerun \
             `cargo bench -p tidegate-e2e --bench policy`",
            missing.join("\n")
        ))
    }
}

/// The host's engine configuration (see `PolicyRuntime::new`), to time
/// `Component::new` alone.
fn host_like_engine() -> wasmtime::Engine {
    let mut cfg = wasmtime::Config::new();
    cfg.wasm_component_model(true)
        .concurrency_support(false)
        .epoch_interruption(true)
        .cranelift_opt_level(wasmtime::OptLevel::Speed);
    wasmtime::Engine::new(&cfg).expect("wasmtime engine")
}

// ---- 1. decision latency -------------------------------------------------

struct LatencyRow {
    plugin: &'static str,
    raw: Stats,
    engine: Stats,
}

fn header(title: &str) {
    println!("\n== {title}");
}

fn print_stats_row(label: &str, event: &str, actions: &str, path: &str, s: &Stats, v: &str) {
    println!(
        "{label:<22} {event:<17} {actions:>3}  {path:<16} {:>9} {:>9} {:>9} {:>9}  {v}",
        fmt_d(s.p50()),
        fmt_d(s.p99()),
        fmt_d(s.p999()),
        fmt_d(s.max()),
    );
}

fn print_table_header() {
    println!(
        "{:<22} {:<17} {:>3}  {:<16} {:>9} {:>9} {:>9} {:>9}  target p50≤1µs p99≤10µs",
        "plugin", "event", "act", "path", "p50", "p99", "p999", "max"
    );
}

fn decision_latency(engine: &PolicyEngine, only: &EnvList) -> Vec<LatencyRow> {
    header(&format!(
        "1. Decision latency, warm instance ({} timed calls per row after {WARMUP} warm-up; \
         per-call wall time incl. one clock read)",
        *CALLS
    ));
    println!(
        "   call_raw = PluginVersion::call_raw(&event, Clock::Wall); \
         engine = PolicyEngine::select + PolicyEngine::decide"
    );
    print_table_header();
    let mut rows = Vec::new();
    for plugin in PLUGINS.into_iter().filter(|p| only.picks(p)) {
        let version = engine.version(plugin).expect("installed");
        let event = event_for(plugin);
        let n_actions = version.call_raw(&event, Clock::Wall).expect("call").len();
        let raw = per_call(WARMUP, *CALLS, || {
            std::hint::black_box(version.call_raw(&event, Clock::Wall).unwrap());
        });
        let workload = gateway_workload(plugin);
        let sel = engine.select(&workload);
        assert_eq!(sel.name, plugin, "selection by annotation");
        let d = engine.decide(&sel, &event);
        assert!(d.fallback.is_none(), "{plugin}: fallback {:?}", d.fallback);
        let eng = per_call(WARMUP, *CALLS, || {
            let sel = engine.select(&workload);
            std::hint::black_box(engine.decide(&sel, &event));
        });
        print_stats_row(
            plugin,
            event.kind(),
            &n_actions.to_string(),
            "call_raw",
            &raw,
            verdict(&raw),
        );
        print_stats_row("", "", "", "engine", &eng, verdict(&eng));
        rows.push(LatencyRow {
            plugin,
            raw,
            engine: eng,
        });
    }
    let met = rows
        .iter()
        .all(|r| verdict(&r.raw) == "met" && verdict(&r.engine) == "met");
    println!(
        "overall: targets {}",
        if met {
            "met for every plugin and path"
        } else {
            "NOT MET (see rows above and the breakdown below)"
        }
    );
    rows
}

/// The contract's metadata reads (0.2.0 on) in one run: the same plugin
/// (`fixtures/reads-probe`) on the typical pod event, handed every label
/// and annotation (`*`, what a 0.1.0 plugin gets) or only the one
/// annotation it reads; and `fixtures/contract-0-1` and `-0-2`, plugins
/// built for the older contracts (0.2.0's reads one label and one
/// annotation, and gets the event typed rather than encoded).
fn metadata_reads(engine: &PolicyEngine) {
    header(
        "1b. Metadata reads (contract 0.2.0 on): the same event, every key vs only the declared ones",
    );
    print_table_header();
    let probe = match std::fs::read(plugins_dir().join("fixtures/reads-probe.wasm")) {
        Ok(b) => b,
        Err(e) => return println!("  fixtures/reads-probe.wasm: {e} (cargo xtask plugins)"),
    };
    let event = shutdown_started();
    let mut p50 = Vec::new();
    for (name, config) in [
        ("probe-every-key", r#"{"labels": "*", "annotations": "*"}"#),
        (
            "probe-one-annotation",
            r#"{"annotations": "tidegate.io/oci-drain"}"#,
        ),
    ] {
        engine
            .install(name, &probe, Some(config))
            .expect("reads-probe loads");
        let version = engine.version(name).expect("installed");
        let raw = per_call(WARMUP, *CALLS, || {
            std::hint::black_box(version.call_raw(&event, Clock::Wall).unwrap());
        });
        print_stats_row(name, event.kind(), "1", "call_raw", &raw, verdict(&raw));
        p50.push(raw.p50());
    }
    println!(
        "  declared / every key, p50: {:.2}x",
        p50[1].as_secs_f64() / p50[0].as_secs_f64()
    );
    for (fixture, what) in [
        ("contract-0-1", "built for 0.1.0"),
        ("contract-0-2", "built for 0.2.0"),
    ] {
        let Ok(old) = std::fs::read(plugins_dir().join(format!("fixtures/{fixture}.wasm"))) else {
            continue;
        };
        engine
            .install(fixture, &old, None)
            .expect("an older contract loads");
        let version = engine.version(fixture).expect("installed");
        let raw = per_call(WARMUP, *CALLS, || {
            std::hint::black_box(version.call_raw(&event, Clock::Wall).unwrap());
        });
        print_stats_row(
            &format!("{fixture} ({what})"),
            event.kind(),
            "2",
            "call_raw",
            &raw,
            verdict(&raw),
        );
    }
}

fn breakdown(engine: &PolicyEngine, rows: &[LatencyRow]) {
    header("1b. Where the time goes (per call; p50 / p99)");
    let line = |what: &str, s: &Stats| {
        println!("  {what:<70} {:>9} {:>9}", fmt_d(s.p50()), fmt_d(s.p99()));
    };
    line(
        "clock floor: Instant::now + elapsed, nothing between",
        &per_call(WARMUP, *CALLS, || {}),
    );
    let m = Mutex::new(0u64);
    line(
        "uncontended std Mutex lock + unlock",
        &per_call(WARMUP, *CALLS, || {
            *m.lock().unwrap() += 1;
        }),
    );

    // The same empty plugin on events that differ only in size: what the
    // event costs when the plugin reads no label and no annotation (the
    // host lowers them borrowed from the event, copying nothing itself).
    println!("  keepalive-only (reads no metadata, decides nothing) call_raw, by event size:");
    let keepalive = engine.version("keepalive-only").expect("installed");
    let events = [
        ("bare workload-added (uid only, 1 string)", bare_event()),
        (
            "shutdown-started, 0 labels + 1 tidegate.io/ annotation (6 strings)",
            trimmed(&shutdown_started()),
        ),
        (
            "shutdown-started, 6 labels + 5 annotations (26 strings)",
            shutdown_started(),
        ),
        (
            "shutdown-started, 46 labels + 25 annotations (146 strings)",
            heavy_event(),
        ),
    ];
    for (what, event) in &events {
        line(
            &format!("  {what}"),
            &per_call(WARMUP, *CALLS, || {
                std::hint::black_box(keepalive.call_raw(event, Clock::Wall).unwrap());
            }),
        );
    }

    // What dropping labels and non-tidegate annotations from events would
    // give the plugins that need only `tidegate.io/oci-drain`.
    println!("  the same plugins with labels dropped and annotations filtered to tidegate.io/*:");
    for plugin in PLUGINS {
        let event = trimmed(&event_for(plugin));
        let version = engine.version(plugin).expect("installed");
        let s = per_call(WARMUP, *CALLS, || {
            std::hint::black_box(version.call_raw(&event, Clock::Wall).unwrap());
        });
        line(
            &format!("  {plugin} call_raw, trimmed {}", event.kind()),
            &s,
        );
    }

    println!("  per plugin, p50 on its representative event (native = the plugin source compiled natively, no wasm):");
    println!(
        "  {:<22} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "plugin", "native p50", "validate", "call_raw", "engine", "engine−raw"
    );
    let bounds = PoliciesConfig::default().bounds();
    for r in rows {
        let event = event_for(r.plugin);
        let mut native = native_policy(r.plugin);
        let native_s = per_call(WARMUP, *CALLS, || {
            std::hint::black_box(native(std::hint::black_box(&event)));
        });
        let actions = native(&event);
        // Validation alone (the clone of its input happens outside the timer).
        let mut ns = Vec::with_capacity(*CALLS);
        for i in 0..WARMUP + *CALLS {
            let input = actions.clone();
            let t = Instant::now();
            std::hint::black_box(validate(&event, input, &bounds));
            if i >= WARMUP {
                ns.push(t.elapsed().as_nanos() as u64);
            }
        }
        let val = Stats::new(ns);
        let diff = r.engine.p50().saturating_sub(r.raw.p50());
        println!(
            "  {:<22} {:>11} {:>11} {:>11} {:>11} {:>11}",
            r.plugin,
            fmt_d(native_s.p50()),
            fmt_d(val.p50()),
            fmt_d(r.raw.p50()),
            fmt_d(r.engine.p50()),
            fmt_d(diff),
        );
    }

    // The engine's own share: select alone, and decide on a version-less
    // selection (fallback: no plugin call, but validation and metrics).
    let workload = gateway_workload("recommended");
    line(
        "PolicyEngine::select (annotation, clones name + Arc)",
        &per_call(WARMUP, *CALLS, || {
            std::hint::black_box(engine.select(&workload));
        }),
    );
    let fallback_sel = Selection {
        name: "not-loaded".into(),
        by: tidegate_policy_host::SelectedBy::Default,
        version: None,
        why: "".into(),
        skipped: Vec::new(),
    };
    let teardown = network_teardown();
    line(
        "PolicyEngine::decide without a plugin (fallback: validate+metrics)",
        &per_call(WARMUP, *CALLS, || {
            std::hint::black_box(engine.decide(&fallback_sel, &teardown));
        }),
    );
}

// ---- 2. re-instantiation after a trap -------------------------------------

fn trap_reinstantiation(runtime: &Arc<PolicyRuntime>, bytes: &[u8]) {
    header(&format!(
        "2. Re-instantiation after a trap (fixture trap.wasm, config {TRAP_CONFIG}; \
         alternating network-teardown (traps) / shutdown-started)"
    ));
    let v = PluginVersion::load(
        runtime,
        "trap",
        bytes,
        TRAP_CONFIG,
        QuarantineRule::default(),
    )
    .expect("load the trap fixture");
    let trapping = network_teardown();
    let normal = shutdown_started();
    // Warm it, and check it behaves as the test expects.
    v.call_raw(&normal, Clock::Wall).expect("normal event");
    let inst0 = v.instantiations();
    let (mut t_trap, mut t_after, mut t_warm) = (Vec::new(), Vec::new(), Vec::new());
    let started = Instant::now();
    let mut rounds = 0;
    while rounds < TRAP_ROUNDS && started.elapsed() < TRAP_MAX_TIME {
        let t = Instant::now();
        let r = v.call_raw(&trapping, Clock::Wall);
        t_trap.push(t.elapsed().as_nanos() as u64);
        let failure = r.expect_err("the fixture traps on network-teardown");
        assert_eq!(failure.kind.label(), "trap", "{failure}");
        let t = Instant::now();
        v.call_raw(&normal, Clock::Wall).expect("after trap");
        t_after.push(t.elapsed().as_nanos() as u64);
        for _ in 0..3 {
            let t = Instant::now();
            v.call_raw(&normal, Clock::Wall).expect("warm");
            t_warm.push(t.elapsed().as_nanos() as u64);
        }
        rounds += 1;
    }
    let new_instances = v.instantiations() - inst0;
    assert_eq!(
        new_instances, rounds as u64,
        "one instantiation per trap, none for warm calls"
    );
    let (trap, after, warm) = (Stats::new(t_trap), Stats::new(t_after), Stats::new(t_warm));
    println!("  {rounds} rounds, {new_instances} instantiations (one per trap, none otherwise)");
    println!("  {:<62} {:>9} {:>9} {:>9}", "", "p50", "p99", "max");
    let line = |what: &str, s: &Stats| {
        println!(
            "  {what:<62} {:>9} {:>9} {:>9}",
            fmt_d(s.p50()),
            fmt_d(s.p99()),
            fmt_d(s.max())
        );
    };
    line(
        "trapping call (trap, backtrace, classify, discard store)",
        &trap,
    );
    line(
        "first normal call after a trap (instantiate + init + decide)",
        &after,
    );
    line("warm normal call", &warm);
    println!(
        "  → re-instantiation cost (p50 after-trap − p50 warm): {}",
        fmt_d(after.p50().saturating_sub(warm.p50()))
    );
}

// ---- 3. compile + validate + swap ------------------------------------------

fn load_and_swap(
    engine: &PolicyEngine,
    plugins: &BTreeMap<&'static str, Vec<u8>>,
) -> Vec<(&'static str, Duration)> {
    header(&format!(
        "3. Compile + validate + swap per reference plugin (median of {LOAD_RUNS} runs)"
    ));
    println!(
        "   compile = wasmtime Component::new (host engine config); load_unchecked = compile + \
         version check + InstancePre + instantiate + init;"
    );
    println!(
        "   load = load_unchecked + self-test event; install = PolicyEngine::install(name, bytes, \
         None): load + atomic swap + bookkeeping"
    );
    println!(
        "  {:<22} {:>8} {:>10} {:>15} {:>10} {:>10}",
        "plugin", "size", "compile", "load_unchecked", "load", "install"
    );
    let wt = host_like_engine();
    let runtime = engine.runtime();
    let mut out = Vec::new();
    for plugin in PLUGINS {
        let bytes = &plugins[plugin];
        let time = |f: &mut dyn FnMut()| {
            median(
                (0..LOAD_RUNS)
                    .map(|_| {
                        let t = Instant::now();
                        f();
                        t.elapsed()
                    })
                    .collect(),
            )
        };
        let compile = time(&mut || {
            std::hint::black_box(wasmtime::component::Component::new(&wt, bytes).expect("compile"));
        });
        let unchecked = time(&mut || {
            std::hint::black_box(
                PluginVersion::load_unchecked(
                    runtime,
                    plugin,
                    bytes,
                    "",
                    QuarantineRule::default(),
                    Clock::Wall,
                )
                .expect("load_unchecked"),
            );
        });
        let load = time(&mut || {
            std::hint::black_box(
                PluginVersion::load(runtime, plugin, bytes, "", QuarantineRule::default())
                    .expect("load"),
            );
        });
        let install = time(&mut || {
            std::hint::black_box(engine.install(plugin, bytes, None).expect("install"));
        });
        println!(
            "  {:<22} {:>5} KiB {:>10} {:>15} {:>10} {:>10}",
            plugin,
            bytes.len() / 1024,
            fmt_d(compile),
            fmt_d(unchecked),
            fmt_d(load),
            fmt_d(install)
        );
        out.push((plugin, install));
    }
    out
}

// ---- main ------------------------------------------------------------------

fn main() -> ExitCode {
    let plugins = match read_plugins() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("policy bench: {e}");
            return ExitCode::from(2);
        }
    };
    let run_started = Instant::now();
    println!(
        "tidegate policy benchmark — {} CPU(s), plugins from {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        plugins_dir().display()
    );

    let only = EnvList::read("POLICY_BENCH_ONLY");
    if let Some(unknown) = only.names().find(|n| !PLUGINS.contains(n)) {
        eprintln!(
            "policy bench: POLICY_BENCH_ONLY names {unknown:?}, which is no reference plugin \
             (one of: {})",
            PLUGINS.join(", ")
        );
        return ExitCode::FAILURE;
    }

    let engine = PolicyEngine::new(&PoliciesConfig::default(), PolicyMetrics::default())
        .expect("policy engine");
    for plugin in PLUGINS {
        if let Err(e) = engine.install(plugin, &plugins[plugin], None) {
            eprintln!("policy bench: {plugin} refused: {e}");
            return ExitCode::FAILURE;
        }
    }

    // `POLICY_BENCH_SECTIONS=1` (or `2,3`, ...) runs only those sections,
    // e.g. under `perf record`.
    let sections = EnvList::read("POLICY_BENCH_SECTIONS");
    let run = |n: &str| sections.picks(n);

    if run("1") {
        let rows = decision_latency(&engine, &only);
        // A plugin picked by POLICY_BENCH_ONLY is timed alone: the
        // breakdown's other plugins would land in the same profile.
        if only.is_all() {
            metadata_reads(&engine);
            breakdown(&engine, &rows);
        }
    }
    if run("2") {
        let trap_runtime = PolicyRuntime::new(RuntimeLimits::default(), PolicyMetrics::default())
            .expect("policy runtime");
        trap_reinstantiation(&trap_runtime, &plugins[TRAP_FIXTURE]);
    }
    if run("3") {
        load_and_swap(&engine, &plugins);
    }

    println!(
        "\ndone in {:.1} s (figures are per call on this machine; compare ratios, not absolutes)",
        run_started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
