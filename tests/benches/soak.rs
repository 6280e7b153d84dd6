//! Soak benchmark: a program that prints figures, not a timed test.
//!
//! ```text
//! cargo xtask demo --check            # builds the gateway and the plugins once
//! cargo bench --profile dev -p tidegate-e2e --bench soak            # 30 minutes
//! SOAK_SECS=240 cargo bench --profile dev -p tidegate-e2e --bench soak  # a short run
//! ```
//!
//! Runs the real `tidegate run` process on the embedded default (the demo
//! workloads on 127.0.0.2/3, the echo backend, the dev CA) and keeps a steady
//! stream of good traffic going through it for `SOAK_SECS` (default 1800),
//! while phases of hostile input come and go:
//!
//! | phase | what |
//! |---|---|
//! | `quiet` | good traffic only |
//! | `handshake` | 400 TCP connections to the HBONE port that send half a ClientHello and wait |
//! | `half-http` | 400 never-finished HTTP/1 requests each to the metrics and readiness ports |
//! | `rapid-reset` | mTLS connections opening and resetting CONNECT streams, 10 pairs per 2 ms |
//! | `bad-connect` | CONNECTs the gateway must refuse: its own ports, port 0, no authority |
//!
//! Phases last `SOAK_PHASE_SECS` (default 60) and the cycle repeats until
//! the end, so a 30-minute run floods each kind about four times. Every
//! `SOAK_SAMPLE_SECS` (default: 1/60 of the run, 2 to 30 s) it prints
//! the gateway's RSS, open descriptors and threads, and the good traffic's
//! successes, failures and round-trip p50/p99 next to raw loopback TCP to the
//! same echo backend measured in the same run. At the end it compares each
//! quiet phase with the first: memory or descriptors that grow during a
//! flood and do not come back afterwards are a leak.
//!
//! The gateway binary is `SOAK_GATEWAY_BIN`, else `target/release/tidegate`
//! when it exists, else `target/debug/tidegate`. It binds the demo's
//! addresses: stop a running `cargo xtask demo` first. Every loop is bounded
//! by the run's end.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use tidegate::config::Config;
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::{TlsContext, TlsMetrics};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HBONE: &str = "127.0.0.2:15008";
const ECHO: &str = "127.0.0.2:8080";
const METRICS: &str = "127.0.0.1:15020";
const READINESS: &str = "127.0.0.1:15021";
/// Good traffic: one round trip of this size per request.
const REQUEST: usize = 1024;
/// Good traffic: requests per second on the kept tunnel, new tunnels per second.
const KEPT_RATE: u64 = 100;
const NEW_RATE: u64 = 10;
/// Flood sizes.
const HELD: usize = 400;
const RESET_BURST: usize = 10;
const RESET_PACE: Duration = Duration::from_millis(2);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Quiet,
    Handshake,
    HalfHttp,
    RapidReset,
    BadConnect,
}

impl Phase {
    const CYCLE: [Phase; 8] = [
        Phase::Quiet,
        Phase::Handshake,
        Phase::Quiet,
        Phase::HalfHttp,
        Phase::Quiet,
        Phase::RapidReset,
        Phase::Quiet,
        Phase::BadConnect,
    ];

    fn name(self) -> &'static str {
        match self {
            Phase::Quiet => "quiet",
            Phase::Handshake => "handshake",
            Phase::HalfHttp => "half-http",
            Phase::RapidReset => "rapid-reset",
            Phase::BadConnect => "bad-connect",
        }
    }
}

/// Good traffic figures since the last sample.
#[derive(Default)]
struct Good {
    ok: AtomicU64,
    failed: AtomicU64,
    rtts_us: Mutex<Vec<u64>>,
}

impl Good {
    fn record(&self, r: anyhow::Result<Duration>) {
        match r {
            Ok(d) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
                self.rtts_us.lock().unwrap().push(d.as_micros() as u64);
            }
            Err(_) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// (ok, failed, p50 µs, p99 µs) since the last call.
    fn take(&self) -> (u64, u64, u64, u64) {
        let mut v = std::mem::take(&mut *self.rtts_us.lock().unwrap());
        v.sort_unstable();
        let pct = |p: f64| v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)));
        (
            self.ok.swap(0, Ordering::Relaxed),
            self.failed.swap(0, Ordering::Relaxed),
            pct(0.5).copied().unwrap_or(0),
            pct(0.99).copied().unwrap_or(0),
        )
    }
}

struct Client {
    tls: TlsContext,
    config: Config,
    me: SpiffeId,
    echo: SpiffeId,
}

impl Client {
    fn new() -> anyhow::Result<Self> {
        let config = Config::from_yaml(tidegate::app::DEFAULT_CONFIG)?;
        let source = tidegate::app::cert_source(&config)?;
        let tls = TlsContext::new(source, &config.trust_domain, TlsMetrics::default());
        let me = SpiffeId::new(&config.trust_domain, "demo", "client");
        let echo = SpiffeId::new(&config.trust_domain, "demo", "echo");
        Ok(Self {
            tls,
            config,
            me,
            echo,
        })
    }

    async fn tunnel(&self) -> anyhow::Result<h2::client::SendRequest<Bytes>> {
        let (send, conn) = tidegate_protocol::hbone::client::dial(
            &self.tls,
            &self.config.hbone.settings(),
            &self.me,
            &self.echo,
            HBONE.parse()?,
        )
        .await?;
        tokio::spawn(conn);
        Ok(send)
    }
}

/// One 1 KiB round trip on a new CONNECT stream of `send`.
async fn request(
    send: h2::client::SendRequest<Bytes>,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let (mut tx, mut rx) =
        tidegate_protocol::hbone::client::connect_stream(send, ECHO.parse()?, timeout).await?;
    tx.send_data(Bytes::from(vec![7u8; REQUEST]), true)?;
    let mut got = 0;
    while let Some(chunk) = tokio::time::timeout(timeout, rx.data()).await? {
        let chunk = chunk?;
        got += chunk.len();
        rx.flow_control().release_capacity(chunk.len())?;
    }
    if got != REQUEST {
        bail!("echoed {got} of {REQUEST} bytes");
    }
    Ok(start.elapsed())
}

async fn raw_round_trip(timeout: Duration) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let mut tcp = TcpStream::connect(ECHO).await?;
    tcp.write_all(&[7u8; REQUEST]).await?;
    tcp.shutdown().await?;
    let mut buf = Vec::with_capacity(REQUEST);
    tokio::time::timeout(timeout, tcp.read_to_end(&mut buf)).await??;
    if buf.len() != REQUEST {
        bail!("raw echo returned {} bytes", buf.len());
    }
    Ok(start.elapsed())
}

/// Good traffic until `stop`: a kept tunnel at `KEPT_RATE` and a new tunnel
/// per request at `NEW_RATE`.
async fn good_traffic(client: Arc<Client>, good: Arc<Good>, stop: Arc<AtomicBool>) {
    let timeout = Duration::from_secs(5);
    let kept = {
        let (client, good, stop) = (client.clone(), good.clone(), stop.clone());
        async move {
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / KEPT_RATE));
            let mut send = None;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                if send.is_none() {
                    send = client.tunnel().await.ok();
                }
                let r = match &send {
                    Some(s) => request(s.clone(), timeout).await,
                    None => Err(anyhow::anyhow!("no tunnel")),
                };
                if r.is_err() {
                    send = None;
                }
                good.record(r);
            }
        }
    };
    let fresh = async move {
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / NEW_RATE));
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let r = async {
                let send = client.tunnel().await?;
                request(send, timeout).await
            };
            good.record(r.await);
        }
    };
    tokio::join!(kept, fresh);
}

/// Holds `HELD` connections to `addr` that each sent `prefix` and wait,
/// reopening those the gateway closes, until `phase` changes.
async fn hold_half_open(
    addr: &'static str,
    prefix: &'static [u8],
    phase: Arc<Mutex<Phase>>,
    mine: Phase,
) {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..HELD {
        let phase = phase.clone();
        tasks.spawn(async move {
            while *phase.lock().unwrap() == mine {
                let Ok(mut tcp) = TcpStream::connect(addr).await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let _ = tcp.write_all(prefix).await;
                let mut b = [0u8; 512];
                // The gateway closes it (a timeout, its cap) or the phase
                // ends; each slot reopens at most 10 times a second, so the
                // flood does not become a CPU race on a 2-core machine.
                let opened = Instant::now();
                let _ = tokio::time::timeout(Duration::from_secs(1), tcp.read(&mut b)).await;
                tokio::time::sleep(Duration::from_millis(100).saturating_sub(opened.elapsed()))
                    .await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

async fn rapid_reset(client: Arc<Client>, phase: Arc<Mutex<Phase>>) {
    let authority: SocketAddr = ECHO.parse().unwrap();
    while *phase.lock().unwrap() == Phase::RapidReset {
        let Ok(mut send) = client.tunnel().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        'conn: while *phase.lock().unwrap() == Phase::RapidReset {
            for _ in 0..RESET_BURST {
                let Ok(ready) = send.clone().ready().await else {
                    break 'conn;
                };
                send = ready;
                let req = http::Request::builder()
                    .method(http::Method::CONNECT)
                    .uri(authority.to_string())
                    .body(())
                    .unwrap();
                match send.send_request(req, false) {
                    Ok((_, mut stream)) => stream.send_reset(h2::Reason::CANCEL),
                    Err(_) => break 'conn,
                }
            }
            tokio::time::sleep(RESET_PACE).await;
        }
    }
}

async fn bad_connects(client: Arc<Client>, phase: Arc<Mutex<Phase>>) {
    let targets = [
        "127.0.0.2:15008",
        "127.0.0.2:15001",
        "127.0.0.2:15020",
        "127.0.0.2:0",
    ];
    while *phase.lock().unwrap() == Phase::BadConnect {
        let Ok(send) = client.tunnel().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        for t in targets.iter().cycle().take(200) {
            if *phase.lock().unwrap() != Phase::BadConnect {
                break;
            }
            let to: SocketAddr = t.parse().unwrap();
            let _ = tidegate_protocol::hbone::client::connect_stream(
                send.clone(),
                to,
                Duration::from_secs(2),
            )
            .await;
        }
    }
}

fn gateway_bin(root: &std::path::Path) -> PathBuf {
    if let Some(p) = std::env::var_os("SOAK_GATEWAY_BIN") {
        return p.into();
    }
    let release = root.join("target/release/tidegate");
    if release.exists() {
        release
    } else {
        root.join("target/debug/tidegate")
    }
}

/// (RSS KiB, open descriptors, threads) of `pid`.
fn usage(pid: u32) -> anyhow::Result<(u64, usize, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .with_context(|| format!("no {name} for {pid}"))
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok((field("VmRSS:")?, fds, field("Threads:")?))
}

struct Sample {
    at: Duration,
    phase: Phase,
    rss_kib: u64,
    fds: usize,
}

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let _ = self.0.wait();
    }
}

fn main() -> anyhow::Result<()> {
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1800);
    let run = Duration::from_secs(secs.max(16));
    let every = Duration::from_secs(
        std::env::var("SOAK_SAMPLE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or((secs / 60).clamp(2, 30)),
    );
    tidegate_e2e::raise_fd_limit();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let bin = gateway_bin(&root);
    let log = tempfile::NamedTempFile::new()?;
    let child = Command::new(&bin)
        .arg("run")
        .current_dir(&root)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(log.reopen()?)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let gw = Gateway(child);
    let pid = gw.0.id();
    println!(
        "soak: {} (pid {pid}) for {} s, a sample every {} s; gateway log {}",
        bin.display(),
        run.as_secs(),
        every.as_secs(),
        log.path().display()
    );

    let phase_secs: u64 = std::env::var("SOAK_PHASE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // The floods run on their own thread, so they cannot starve the good
    // traffic's client (what is measured is the gateway, not this program).
    let floods = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let spawner = floods.handle().clone();
    rt.block_on(async move {
        tidegate_e2e::wait_for(
            "the gateway to be ready",
            Duration::from_secs(30),
            || async {
                // Refused until the gateway has bound its ports.
                TcpStream::connect(READINESS).await.ok()?;
                let (status, _) =
                    tidegate_e2e::http_get(READINESS.parse().unwrap(), "/healthz/ready").await;
                (status == 200).then_some(())
            },
        )
        .await;
        let mut raw = Vec::new();
        for _ in 0..200 {
            raw.push(raw_round_trip(Duration::from_secs(2)).await?.as_micros() as u64);
        }
        raw.sort_unstable();
        let raw_p50 = raw[raw.len() / 2].max(1);
        println!(
            "raw loopback TCP to the echo backend (new connection per request): p50 {raw_p50} µs"
        );

        let client = Arc::new(Client::new()?);
        let good = Arc::new(Good::default());
        let stop = Arc::new(AtomicBool::new(false));
        let traffic = tokio::spawn(good_traffic(client.clone(), good.clone(), stop.clone()));
        let phase = Arc::new(Mutex::new(Phase::Quiet));
        // Phases of SOAK_PHASE_SECS (60) repeat until the end, so a leak
        // shows as growth from one cycle's quiet phases to the next; a run
        // shorter than one cycle gets shorter phases.
        let phase_len = Duration::from_secs(phase_secs.max(1)).min(run / Phase::CYCLE.len() as u32);
        println!(
            "{:>6} {:<12} {:>9} {:>6} {:>7} {:>7} {:>7} {:>9} {:>9} {:>8}",
            "t (s)",
            "phase",
            "RSS KiB",
            "fds",
            "threads",
            "ok",
            "failed",
            "p50 µs",
            "p99 µs",
            "p50/raw"
        );
        let start = Instant::now();
        let mut samples = Vec::new();
        let mut flood: Option<tokio::task::JoinHandle<()>> = None;
        let mut current = None;
        while start.elapsed() < run {
            let at = start.elapsed();
            let now =
                Phase::CYCLE[(at.as_nanos() / phase_len.as_nanos()) as usize % Phase::CYCLE.len()];
            if current != Some(now) {
                *phase.lock().unwrap() = now;
                if let Some(f) = flood.take() {
                    let _ = f.await;
                }
                let p = phase.clone();
                flood = match now {
                    Phase::Quiet => None,
                    Phase::Handshake => Some(spawner.spawn(hold_half_open(
                        HBONE,
                        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
                        p,
                        now,
                    ))),
                    Phase::HalfHttp => Some(spawner.spawn(async move {
                        tokio::join!(
                            hold_half_open(
                                METRICS,
                                b"GET /metrics HTTP/1.1\r\nHost: soak\r\n",
                                p.clone(),
                                Phase::HalfHttp
                            ),
                            hold_half_open(
                                READINESS,
                                b"GET /healthz/ready HTTP/1.1\r\n",
                                p,
                                Phase::HalfHttp
                            ),
                        );
                    })),
                    Phase::RapidReset => Some(spawner.spawn(rapid_reset(client.clone(), p))),
                    Phase::BadConnect => Some(spawner.spawn(bad_connects(client.clone(), p))),
                };
                current = Some(now);
            }
            tokio::time::sleep(every.min(run.saturating_sub(at))).await;
            let (rss_kib, fds, threads) = usage(pid).context("the gateway process is gone")?;
            let (ok, failed, p50, p99) = good.take();
            println!(
                "{:>6} {:<12} {:>9} {:>6} {:>7} {:>7} {:>7} {:>9} {:>9} {:>8.2}",
                start.elapsed().as_secs(),
                now.name(),
                rss_kib,
                fds,
                threads,
                ok,
                failed,
                p50,
                p99,
                p50 as f64 / raw_p50 as f64
            );
            samples.push(Sample {
                at: start.elapsed(),
                phase: now,
                rss_kib,
                fds,
            });
        }
        *phase.lock().unwrap() = Phase::Quiet;
        if let Some(f) = flood.take() {
            let _ = f.await;
        }
        stop.store(true, Ordering::Relaxed);
        let _ = traffic.await;
        summary(&samples);
        anyhow::Ok(())
    })
}

/// Each quiet phase's last sample against the first quiet phase's last one.
fn summary(samples: &[Sample]) {
    let mut quiet_ends = Vec::new();
    for w in samples.windows(2) {
        if w[0].phase == Phase::Quiet && w[1].phase != Phase::Quiet {
            quiet_ends.push(&w[0]);
        }
    }
    if let Some(last) = samples.last().filter(|s| s.phase == Phase::Quiet) {
        quiet_ends.push(last);
    }
    let (Some(base), Some(peak)) = (quiet_ends.first(), samples.iter().max_by_key(|s| s.rss_kib))
    else {
        println!("too short for a summary: give SOAK_SECS at least 16");
        return;
    };
    println!(
        "\nbaseline (end of the first quiet phase, t={} s): RSS {} KiB, {} fds; peak RSS {} KiB at t={} s ({})",
        base.at.as_secs(), base.rss_kib, base.fds, peak.rss_kib, peak.at.as_secs(), peak.phase.name()
    );
    for q in &quiet_ends[1..] {
        println!(
            "after the flood before t={:>5} s: RSS {:>7} KiB ({:+.1} % of the baseline), {:>5} fds ({:+})",
            q.at.as_secs(),
            q.rss_kib,
            (q.rss_kib as f64 / base.rss_kib as f64 - 1.0) * 100.0,
            q.fds,
            q.fds as i64 - base.fds as i64
        );
    }
}
