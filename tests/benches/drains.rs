//! Drain reaction-time benchmark: a program that prints figures, not a timed test.
//!
//! ```text
//! cargo xtask plugins        # once: builds target/plugins/*.wasm
//! cargo bench -p tidegate-e2e --bench drains
//! ```
//!
//! Issue 4's reaction-time targets, measured in process (the harness's
//! [`TwoNodes`]: two real gateways on one tokio runtime, loopback TCP, mTLS,
//! HTTP/2), with the reference plugins from `target/plugins`:
//!
//! 1. **Event → GOAWAY on the wire** (target p99 ≤ 5 ms).
//!    `goaway-on-term-start` is bound on the server gateway. Each iteration
//!    uses its own server workload (a fresh lifecycle: the engine's
//!    transitions are idempotent per uid), with its own IP and echo backend,
//!    and one tunnel holding one open CONNECT stream to it. The clock starts
//!    just before `DrainEngine::on_lifecycle(uid, ShutdownStarted, Admin)` is
//!    called in process (policy decision + execution included) and stops when
//!    the client side has parsed the GOAWAY frame. Two observers:
//!    - **raw h2 client**: a tunnel dialled by this program
//!      (`tidegate_protocol::hbone::client::dial`); the task driving the h2 connection
//!      checks `SendRequest::poll_ready` after every poll of the connection
//!      (as the pool's `refresh_goaway` does) and timestamps the first error,
//!      i.e. the moment the frame was read off the socket and processed.
//!    - **client gateway pool**: an application connection through the
//!      client gateway (capture → `Outbound::proxy` → pooled tunnel); the
//!      measuring task spins on `Tunnel::received_goaway()` of that pooled
//!      tunnel with `tokio::task::yield_now` between checks (the pool's own
//!      driver sets the flag after each poll of the connection).
//!
//!    The server's own histogram `tidegate_drain_event_to_goaway_seconds`
//!    (decision → GOAWAY handed to h2 by the tunnel's task) is printed too,
//!    per observer (bucket upper bounds).
//! 2. **Peer deleted → pooled tunnels evicted** (target p99 ≤ 10 ms).
//!    `evict-on-delete` is bound on the client gateway. Each iteration opens
//!    an application connection to the `echo` workload (one pooled tunnel,
//!    one held stream), then calls `DrainEngine::on_peer(echo, deleted)` in
//!    process; the clock stops when the client pool holds no tunnel to the
//!    echo identity, and (second figure) when the server gateway's inbound tunnel list
//!    holds no tunnel for `echo-uid` (the server saw the connection end).
//!
//! Every loop is bounded in count and in time; the run takes a few seconds
//! after the build. No figure is asserted: targets are printed as met or not met.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tidegate::drains::{Lifecycle, Trigger};
use tidegate_e2e::{echo_server, metric, round_trip, Capture, Options, TwoNodes, TRUST_DOMAIN};
use tidegate_protocol::hbone::client::{connect_stream, dial};
use tidegate_protocol::hbone::Settings;
use tidegate_protocol::identity::SpiffeId;
use tokio::sync::oneshot;

// ---- bounds -------------------------------------------------------------

/// Timed iterations per measurement, after `WARMUP` untimed ones.
const ITERATIONS: usize = 1_000;
const WARMUP: usize = 5;
/// Each section stops early after this long.
const SECTION_MAX_TIME: Duration = Duration::from_secs(15);
/// Waiting for one GOAWAY / one eviction.
const OBSERVE_TIMEOUT: Duration = Duration::from_secs(2);
/// Any setup step (dial, CONNECT, reload of the workload files).
const OP_TIMEOUT: Duration = Duration::from_secs(5);

const GOAWAY_TARGET: Duration = Duration::from_millis(5);
const EVICT_TARGET: Duration = Duration::from_millis(10);

/// Octet of the in-process mesh (`127.<octet>.x.y`).
const OCTET: u8 = 214;
/// Service account of the per-iteration server workloads (not `echo`, so
/// evicting pooled tunnels to `echo` never touches theirs).
const DRAINED_SA: &str = "drained";
const GRACE: Duration = Duration::from_secs(30);
const HISTOGRAM: &str = "tidegate_drain_event_to_goaway_seconds";

// ---- statistics ---------------------------------------------------------

struct Stats {
    sorted: Vec<Duration>,
}

impl Stats {
    fn new(mut v: Vec<Duration>) -> Self {
        v.sort_unstable();
        Stats { sorted: v }
    }

    /// Nearest-rank percentile.
    fn q(&self, q: f64) -> Duration {
        if self.sorted.is_empty() {
            return Duration::ZERO;
        }
        let rank = ((q * self.sorted.len() as f64).ceil() as usize).clamp(1, self.sorted.len());
        self.sorted[rank - 1]
    }

    fn max(&self) -> Duration {
        self.sorted.last().copied().unwrap_or_default()
    }
}

fn fmt_d(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{:.2} ms", ns as f64 / 1e6)
    }
}

fn verdict(s: &Stats, target: Duration) -> String {
    if s.sorted.is_empty() {
        "no samples".into()
    } else if s.q(0.99) <= target {
        format!("met (p99 ≤ {})", fmt_d(target))
    } else {
        format!("NOT MET (p99 > {})", fmt_d(target))
    }
}

fn header(title: &str) {
    println!("\n== {title}");
}

fn print_table_header() {
    println!(
        "{:<50} {:>5} {:>10} {:>10} {:>10} {:>10}  target",
        "measurement", "n", "p50", "p90", "p99", "max"
    );
}

fn print_row(label: &str, s: &Stats, target: Option<Duration>) {
    println!(
        "{label:<50} {:>5} {:>10} {:>10} {:>10} {:>10}  {}",
        s.sorted.len(),
        fmt_d(s.q(0.50)),
        fmt_d(s.q(0.90)),
        fmt_d(s.q(0.99)),
        fmt_d(s.max()),
        target.map_or_else(|| "–".to_owned(), |t| verdict(s, t)),
    );
}

/// The cumulative buckets of a Prometheus histogram: (upper bound, count).
fn buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (le, value) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, value.trim().parse().ok()?))
        })
        .collect()
}

/// Prints the server histogram's observations between two scrapes.
fn print_histogram_delta(label: &str, before: &str, after: &str) {
    let count = metric(after, &format!("{HISTOGRAM}_count"))
        - metric(before, &format!("{HISTOGRAM}_count"));
    let sum =
        metric(after, &format!("{HISTOGRAM}_sum")) - metric(before, &format!("{HISTOGRAM}_sum"));
    let b0 = buckets(before, HISTOGRAM);
    let b1 = buckets(after, HISTOGRAM);
    let delta: Vec<(f64, f64)> = b1
        .iter()
        .map(|&(le, c)| {
            let prev = b0.iter().find(|&&(l, _)| l == le).map_or(0.0, |&(_, c)| c);
            (le, c - prev)
        })
        .collect();
    let bound = |q: f64| -> String {
        let rank = (q * count).ceil().max(1.0);
        match delta.iter().find(|&&(_, c)| c >= rank) {
            Some(&(le, _)) if le.is_finite() => format!("≤ {}", fmt_d(Duration::from_secs_f64(le))),
            Some(_) => "> last bucket".into(),
            None => "–".into(),
        }
    };
    println!(
        "{label:<50} {:>5} {:>10} {:>10} {:>10}  mean {}",
        count as u64,
        bound(0.50),
        bound(0.90),
        bound(0.99),
        if count > 0.0 {
            fmt_d(Duration::from_secs_f64(sum / count))
        } else {
            "–".into()
        }
    );
}

// ---- setup --------------------------------------------------------------

fn plugin(name: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/plugins")
        .join(format!("{name}.wasm"));
    if p.exists() {
        Ok(p)
    } else {
        Err(format!(
            "{} missing: build the plugins first with `cargo xtask plugins`, then rerun \
             `cargo bench -p tidegate-e2e --bench drains`",
            p.display()
        ))
    }
}

/// A per-iteration server workload.
struct Target {
    uid: String,
    ip: IpAddr,
    backend: SocketAddr,
}

/// Workload `k`: `127.<OCTET>.<1 + k/200>.<10 + k%200>`.
fn target_ip(k: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        127,
        OCTET,
        1 + (k / 200) as u8,
        10 + (k % 200) as u8,
    ))
}

/// Adds `count` workloads (uids `w0`.. on node-b) to both gateways' workload
/// files, each with its own echo backend, and waits until both gateways
/// loaded them.
async fn add_targets(nodes: &TwoNodes, count: usize) -> anyhow::Result<Vec<Target>> {
    let mut targets = Vec::with_capacity(count);
    let mut extra = String::new();
    for k in 0..count {
        let ip = target_ip(k);
        let backend = echo_server(ip).await;
        let uid = format!("w{k}");
        extra.push_str(&format!(
            "- {{uid: {uid}, name: {uid}, namespace: demo, service_account: {DRAINED_SA}, \
             ips: [{ip}], node: node-b}}\n"
        ));
        targets.push(Target { uid, ip, backend });
    }
    for file in ["server-workloads.yaml", "client-workloads.yaml"] {
        let path = nodes.dir.path().join(file);
        let mut text = std::fs::read_to_string(&path)?;
        text.push_str(&extra);
        // Write then rename: the reloader never reads half a file.
        let tmp = nodes.dir.path().join(format!("{file}.tmp"));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)?;
    }
    let last = format!("w{}", count - 1);
    let deadline = Instant::now() + OP_TIMEOUT;
    while nodes.server.workloads.snapshot().by_uid(&last).is_none()
        || nodes.client.workloads.snapshot().by_uid(&last).is_none()
    {
        if Instant::now() > deadline {
            anyhow::bail!("the gateways did not load the {count} added workloads");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(targets)
}

async fn within<T>(what: &str, f: impl Future<Output = T>) -> anyhow::Result<T> {
    tokio::time::timeout(OP_TIMEOUT, f)
        .await
        .map_err(|_| anyhow::anyhow!("{what}: timed out after {OP_TIMEOUT:?}"))
}

fn shutdown_started() -> Lifecycle {
    Lifecycle::ShutdownStarted { grace: GRACE }
}

// ---- 1a. event → GOAWAY, raw h2 client -----------------------------------

/// One iteration: (event → GOAWAY parsed by the client, on_lifecycle call time).
async fn goaway_raw_once(
    nodes: &TwoNodes,
    t: &Target,
) -> anyhow::Result<Option<(Duration, Duration)>> {
    let cfg = Settings::default();
    let src = SpiffeId::new(TRUST_DOMAIN, "demo", "client");
    let dst = SpiffeId::new(TRUST_DOMAIN, "demo", DRAINED_SA);
    let hbone = SocketAddr::new(
        t.ip,
        nodes.server.addrs.inbound.expect("node listeners").port(),
    );
    let (send, mut conn) = dial(&nodes.client.tls, &cfg, &src, &dst, hbone)
        .await
        .map_err(|e| anyhow::anyhow!("dial {hbone}: {e} [{}]", e.reason()))?;
    let mut probe = send.clone();
    let (seen_tx, seen_rx) = oneshot::channel::<Instant>();
    let driver = tokio::spawn(async move {
        let mut seen_tx = Some(seen_tx);
        std::future::poll_fn(|cx| {
            let r = Pin::new(&mut conn).poll(cx);
            if seen_tx.is_some() {
                // h2 records a received GOAWAY as a connection error that
                // `poll_ready` reports (like the pool's `refresh_goaway`).
                let mut noop = Context::from_waker(Waker::noop());
                if let Poll::Ready(Err(_)) = probe.poll_ready(&mut noop) {
                    let _ = seen_tx.take().unwrap().send(Instant::now());
                }
            }
            r
        })
        .await
    });
    let held = within(
        "CONNECT",
        connect_stream(send, t.backend, cfg.connect_timeout),
    )
    .await?
    .map_err(|e| anyhow::anyhow!("CONNECT {}: {e}", t.backend))?;
    // The server counts the stream once the CONNECT is answered.
    let start = Instant::now();
    nodes
        .server
        .drains
        .on_lifecycle(&t.uid, shutdown_started(), Trigger::Admin)
        .await?;
    let called = start.elapsed();
    let r = tokio::time::timeout(OBSERVE_TIMEOUT, seen_rx).await;
    driver.abort();
    drop(held);
    Ok(match r {
        Ok(Ok(at)) => Some((at.saturating_duration_since(start), called)),
        _ => None,
    })
}

// ---- 1b. event → GOAWAY, client gateway pool -----------------------------

async fn goaway_pool_once(
    nodes: &TwoNodes,
    t: &Target,
) -> anyhow::Result<Option<(Duration, Duration)>> {
    let capture = Capture::start(nodes.client.outbound.clone(), t.backend).await;
    let mut app = within("app connect", capture.try_connect(nodes.client_ip)).await??;
    within("round trip", round_trip(&mut app, b"x")).await??;
    let tunnel = nodes
        .client
        .pool
        .tunnels()
        .into_iter()
        .find(|tn| tn.key.dst_addr.ip() == t.ip)
        .ok_or_else(|| anyhow::anyhow!("no pooled tunnel to {}", t.ip))?;
    let start = Instant::now();
    nodes
        .server
        .drains
        .on_lifecycle(&t.uid, shutdown_started(), Trigger::Admin)
        .await?;
    let called = start.elapsed();
    let deadline = start + OBSERVE_TIMEOUT;
    let seen = loop {
        if tunnel.received_goaway() {
            break Some(start.elapsed());
        }
        if Instant::now() > deadline {
            break None;
        }
        tokio::task::yield_now().await;
    };
    drop(app);
    Ok(seen.map(|d| (d, called)))
}

struct GoawayRun {
    wire: Stats,
    call: Stats,
    missed: usize,
    errors: usize,
    first_error: Option<String>,
    elapsed: Duration,
}

async fn goaway_section(
    nodes: &TwoNodes,
    targets: &[Target],
    pool_mode: bool,
) -> anyhow::Result<GoawayRun> {
    let mut wire = Vec::new();
    let mut call = Vec::new();
    let (mut missed, mut errors, mut first_error) = (0, 0, None);
    let started = Instant::now();
    for (i, t) in targets.iter().enumerate() {
        if started.elapsed() > SECTION_MAX_TIME {
            break;
        }
        let r = if pool_mode {
            goaway_pool_once(nodes, t).await
        } else {
            goaway_raw_once(nodes, t).await
        };
        match r {
            Ok(Some((w, c))) if i >= WARMUP => {
                wire.push(w);
                call.push(c);
            }
            Ok(Some(_)) => {}
            Ok(None) => missed += 1,
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
    Ok(GoawayRun {
        wire: Stats::new(wire),
        call: Stats::new(call),
        missed,
        errors,
        first_error,
        elapsed: started.elapsed(),
    })
}

fn print_goaway(label: &str, r: &GoawayRun, before: &str, after: &str) {
    print_row(
        &format!("{label}: event → GOAWAY parsed"),
        &r.wire,
        Some(GOAWAY_TARGET),
    );
    print_row("  of which on_lifecycle() returned", &r.call, None);
    print_histogram_delta(&format!("  server {HISTOGRAM}"), before, after);
    println!(
        "  ({} missed within {OBSERVE_TIMEOUT:?}, {} errors{}; {:.2} s)",
        r.missed,
        r.errors,
        r.first_error
            .as_ref()
            .map(|e| format!(", first: {e}"))
            .unwrap_or_default(),
        r.elapsed.as_secs_f64()
    );
}

// ---- 2. peer deleted → pooled tunnels evicted ------------------------------

struct EvictRun {
    pool: Stats,
    server: Stats,
    call: Stats,
    missed: usize,
    errors: usize,
    first_error: Option<String>,
    elapsed: Duration,
}

async fn evict_section(nodes: &TwoNodes) -> anyhow::Result<EvictRun> {
    let peer = nodes
        .client
        .workloads
        .snapshot()
        .by_uid("echo-uid")
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("the client gateway does not know echo-uid"))?;
    let echo_id = peer.identity.clone();
    let (mut pool, mut server, mut call) = (Vec::new(), Vec::new(), Vec::new());
    let (mut missed, mut errors, mut first_error) = (0, 0, None);
    let started = Instant::now();
    for i in 0..WARMUP + ITERATIONS {
        if started.elapsed() > SECTION_MAX_TIME {
            break;
        }
        let once = async {
            // The previous iteration's tunnel is gone on both sides.
            let settle = Instant::now() + OP_TIMEOUT;
            while !nodes.server.tunnels.for_workload("echo-uid").is_empty()
                || nodes
                    .client
                    .pool
                    .tunnels()
                    .iter()
                    .any(|t| t.key.dst == echo_id)
            {
                if Instant::now() > settle {
                    anyhow::bail!("previous tunnel still open");
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let mut app =
                within("app connect", nodes.capture.try_connect(nodes.client_ip)).await??;
            within("round trip", round_trip(&mut app, b"x")).await??;
            let start = Instant::now();
            let outcome = nodes.client.drains.on_peer(&peer, true);
            let called = start.elapsed();
            let outcome = outcome
                .into_iter()
                .next()
                .ok_or_else(|| anyhow::anyhow!("on_peer: no pooled tunnel"))?;
            if outcome.actions.is_empty() {
                anyhow::bail!("evict-on-delete decided nothing: {outcome:?}");
            }
            let deadline = start + OBSERVE_TIMEOUT;
            let (mut pool_gone, mut server_gone) = (None, None);
            while pool_gone.is_none() || server_gone.is_none() {
                if pool_gone.is_none()
                    && !nodes
                        .client
                        .pool
                        .tunnels()
                        .iter()
                        .any(|t| t.key.dst == echo_id)
                {
                    pool_gone = Some(start.elapsed());
                }
                if server_gone.is_none() && nodes.server.tunnels.for_workload("echo-uid").is_empty()
                {
                    server_gone = Some(start.elapsed());
                }
                if Instant::now() > deadline {
                    break;
                }
                tokio::task::yield_now().await;
            }
            drop(app);
            anyhow::Ok((pool_gone, server_gone, called))
        };
        match once.await {
            Ok((Some(p), Some(s), c)) => {
                if i >= WARMUP {
                    pool.push(p);
                    server.push(s);
                    call.push(c);
                }
            }
            Ok(_) => missed += 1,
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
    }
    Ok(EvictRun {
        pool: Stats::new(pool),
        server: Stats::new(server),
        call: Stats::new(call),
        missed,
        errors,
        first_error,
        elapsed: started.elapsed(),
    })
}

// ---- main -----------------------------------------------------------------

async fn run() -> anyhow::Result<Vec<(String, Stats, Duration)>> {
    let goaway_plugin = plugin("goaway-on-term-start").map_err(anyhow::Error::msg)?;
    let evict_plugin = plugin("evict-on-delete").map_err(anyhow::Error::msg)?;
    let setup = Instant::now();
    let nodes = TwoNodes::with(
        OCTET,
        Options {
            server_yaml: format!(
                "policies:\n  default: p\n  plugins:\n    p: {{file: {}}}\n",
                goaway_plugin.display()
            ),
            client_yaml: format!(
                "policies:\n  default: p\n  plugins:\n    p: {{file: {}}}\n",
                evict_plugin.display()
            ),
            ..Default::default()
        },
    )
    .await;
    let per_mode = WARMUP + ITERATIONS;
    let targets = add_targets(&nodes, 2 * per_mode).await?;
    println!(
        "setup: two gateways + {} extra server workloads (uids w0..w{}) in {:.2} s",
        targets.len(),
        targets.len() - 1,
        setup.elapsed().as_secs_f64()
    );
    let (raw_targets, pool_targets) = targets.split_at(per_mode);
    let mut summary = Vec::new();

    header(&format!(
        "1. Event → GOAWAY on the wire: goaway-on-term-start on the server gateway, \
         {ITERATIONS} iterations per observer after {WARMUP} warm-up, one fresh workload each"
    ));
    println!(
        "   clock: just before DrainEngine::on_lifecycle(uid, ShutdownStarted{{grace: 30s}}, \
         Admin) (in process: policy decision + execution included)"
    );
    println!(
        "   raw h2 client   = tunnel dialled by this program; its connection task checks \
         SendRequest::poll_ready after every poll and timestamps the first error"
    );
    println!(
        "   gateway pool    = app connection through the client gateway; this task spins on \
         the pooled Tunnel::received_goaway() with tokio::task::yield_now"
    );
    println!(
        "   server histogram = decision → GOAWAY handed to h2 by the tunnel task \
         (bucket upper bounds, lowest 50 µs; count incl. warm-up)"
    );
    print_table_header();
    let m0 = nodes.server.metrics_text();
    let raw = goaway_section(&nodes, raw_targets, false).await?;
    let m1 = nodes.server.metrics_text();
    print_goaway("raw h2 client", &raw, &m0, &m1);
    let pooled = goaway_section(&nodes, pool_targets, true).await?;
    let m2 = nodes.server.metrics_text();
    print_goaway("gateway pool", &pooled, &m1, &m2);

    header(&format!(
        "2. Peer deleted → pooled tunnels evicted: evict-on-delete on the client gateway, \
         {ITERATIONS} iterations after {WARMUP} warm-up"
    ));
    println!(
        "   clock: just before DrainEngine::on_peer(echo, deleted = true) (in process); \
         this task spins with tokio::task::yield_now on"
    );
    println!(
        "   pool   = client Pool::tunnels() holds none to the echo identity; \
         server = server Registry holds no tunnel for echo-uid"
    );
    print_table_header();
    let evict = evict_section(&nodes).await?;
    print_row(
        "peer deleted → client pool empty",
        &evict.pool,
        Some(EVICT_TARGET),
    );
    print_row("peer deleted → server tunnel gone", &evict.server, None);
    print_row("  of which on_peer() returned", &evict.call, None);
    println!(
        "  ({} missed within {OBSERVE_TIMEOUT:?}, {} errors{}; {:.2} s)",
        evict.missed,
        evict.errors,
        evict
            .first_error
            .as_ref()
            .map(|e| format!(", first: {e}"))
            .unwrap_or_default(),
        evict.elapsed.as_secs_f64()
    );

    summary.push((
        "event → GOAWAY on the wire (raw h2 client)".to_owned(),
        raw.wire,
        GOAWAY_TARGET,
    ));
    summary.push((
        "event → GOAWAY seen by the client gateway pool".to_owned(),
        pooled.wire,
        GOAWAY_TARGET,
    ));
    summary.push((
        "peer deleted → pooled tunnels evicted".to_owned(),
        evict.pool,
        EVICT_TARGET,
    ));
    Ok(summary)
}

fn main() -> ExitCode {
    let started = Instant::now();
    println!(
        "tidegate drain reaction-time benchmark — {} CPU(s), in process (two gateways, one \
         tokio runtime, 2 workers), plugins from target/plugins",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let summary = match rt.block_on(async { tokio::spawn(run()).await }) {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            eprintln!("drains bench: {e:#}");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("drains bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    header("Targets (issue 4)");
    println!(
        "{:<48} {:>10} {:>10} {:>10}  verdict",
        "reaction", "p50", "p99", "max"
    );
    for (label, s, target) in &summary {
        println!(
            "{label:<48} {:>10} {:>10} {:>10}  {}",
            fmt_d(s.q(0.50)),
            fmt_d(s.q(0.99)),
            fmt_d(s.max()),
            verdict(s, *target)
        );
    }
    println!(
        "\ndone in {:.1} s (in-process loopback on this machine; compare ratios, not absolutes)",
        started.elapsed().as_secs_f64()
    );
    rt.shutdown_timeout(Duration::from_secs(1));
    ExitCode::SUCCESS
}
