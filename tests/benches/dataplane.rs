//! Data-path benchmark: a program that prints figures, not a timed test.
//!
//! ```text
//! cargo bench -p tidegate-e2e --bench dataplane
//! ```
//!
//! Every figure is printed next to a raw loopback TCP baseline measured in the
//! same run (ratios, never absolute times alone; see docs/performance.md). Every loop is
//! bounded in count and in time; the whole run takes about two minutes.
//!
//! Two modes, named next to each figure:
//! - **in-process**: both gateways run in this process on one tokio runtime
//!   (the harness's [`TwoNodes`]); application connections enter the client
//!   gateway through the harness [`Capture`](tidegate_e2e::Capture), which
//!   calls `Outbound::proxy(tcp, src, original_dst)` exactly as the listener
//!   does after `SO_ORIGINAL_DST`. Used for throughput, latency and tunnel
//!   rates: no iptables REDIRECT, so no PAWS/TIME_WAIT trouble under churn.
//! - **processes+netns**: the real `tidegate run` binary, two processes (node
//!   A, node B), in a network namespace this program creates
//!   (`unshare(CLONE_NEWNET)` on one thread; the gateways, `ip`, `iptables`,
//!   the application connections and the backend all live in it), with
//!   `iptables -t nat OUTPUT ... REDIRECT` capturing the application's
//!   connections to node A's outbound port. Used for memory (VmRSS of each
//!   gateway process from /proc/<pid>/status) and, as a cross-check, for
//!   throughput and warm latency. Needs root; skipped with a note otherwise.
//!
//! The binary is built with `cargo build --release -p tidegate` (or taken
//! from `DATAPLANE_GATEWAY_BIN` when set).
//!
//! With `-- --pair NAME=COMMAND ...` it measures gateway pairs side by side
//! instead (any HBONE gateway a command line starts; `--pair tidegate` is
//! the built-in line): see [`pair`]; with `--restart` as well, what a
//! stop-and-start and a `kill -9` of node B's gateway cost new connections,
//! pair by pair; with `--rollout`, what a rolling restart and a crash of
//! the replicas behind a Service VIP cost the clients. With `-- --authorization`, how long a
//! policy change takes to close the streams it refuses among 10,000 live
//! ones: see [`authorization`]. With `-- --ipv6`, the gateway pair on
//! IPv4 and on IPv6 addresses in one run: throughput and new connections
//! per second, IPv6 / IPv4 ([`ipv6`]); with `--pair` as well, the pairs
//! on an IPv6 topology ([`pair`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "dataplane/authorization.rs"]
mod authorization;
#[path = "dataplane/ipv6.rs"]
mod ipv6;
#[path = "dataplane/pair.rs"]
mod pair;

use anyhow::{anyhow, bail, Context as _};
use bytes::Bytes;
use tidegate_e2e::{ip, metric, workloads_yaml, Options, TwoNodes, TRUST_DOMAIN};
use tidegate_protocol::hbone::client::{connect_stream, dial};
use tidegate_protocol::hbone::Settings;
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::TlsContext;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;

// ---- bounds -------------------------------------------------------------

/// Throughput: one direction, stop at whichever comes first.
const TP_MAX_BYTES: u64 = 1 << 30;
const TP_MAX_TIME: Duration = Duration::from_secs(3);
const TP_CHUNK: usize = 256 * 1024;
/// Warm request/response latency.
const RR_SIZE: usize = 1024;
const RR_WARMUP: usize = 200;
const RR_MAX: usize = 20_000;
const RR_MAX_TIME: Duration = Duration::from_secs(2);
/// New tunnel (or new TCP connection) per request.
const NEW_MAX: usize = 1_000;
const NEW_MAX_TIME: Duration = Duration::from_secs(3);
/// Tunnels per second.
const RATE_MAX: usize = 2_000;
const RATE_MAX_TIME: Duration = Duration::from_secs(5);
const RATE_CONCURRENCY: usize = 8;
/// Memory.
const MEM_CONNS: usize = 10_000;
const MEM_STREAMS_PER_TUNNEL: usize = 100;
const MEM_TUNNEL_CONNS: usize = 1_000;
/// Inbound connections node B takes from the one client identity. The
/// default cap is a quarter of the inbound share of the descriptors: at
/// this bench's 20,000-descriptor limit ~3,680, fewer than `MEM_CONNS`
/// (at a node's usual 1,048,576, ~196,000).
const MEM_PER_IDENTITY: u32 = 12_000;
/// The same idle connections spread over this many destination workloads
/// (`127.<NS_OCTET>.1.<1..=N>`, one echo process on `NS_DESTS_PORT`).
const MEM_DESTINATIONS: u8 = 100;
const NS_DESTS_PORT: u16 = 8081;
const MEM_CONCURRENCY: usize = 200;
const MEM_PHASE_MAX_TIME: Duration = Duration::from_secs(60);
/// Any single network operation.
const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// Octet of the in-process mesh (`127.<octet>.0.x`).
const OCTET: u8 = 211;
/// Addresses inside the namespace: echo workload (node B), client workload
/// (node A), and a non-workload source for raw baselines.
const NS_OCTET: u8 = 77;
const NS_ECHO_PORT: u16 = 8080;
const NS_SINK_PORT: u16 = 9000;

// ---- small helpers ------------------------------------------------------

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[derive(Clone, Copy, Default)]
struct Lat {
    p50: Duration,
    p99: Duration,
    n: usize,
}

impl Lat {
    fn of(mut v: Vec<Duration>) -> Lat {
        v.sort();
        Lat {
            p50: percentile(&v, 0.50),
            p99: percentile(&v, 0.99),
            n: v.len(),
        }
    }
}

impl std::fmt::Display for Lat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {:>8.1} µs  p99 {:>8.1} µs  (n={})",
            us(self.p50),
            us(self.p99),
            self.n
        )
    }
}

/// Raises RLIMIT_NOFILE: 10,000 idle connections need ~20,000 descriptors in
/// this process (application side + backend side); the gateway processes
/// inherit the limit. Root may raise the hard limit; otherwise soft = hard.
fn raise_nofile(want: u64) -> u64 {
    // SAFETY: getrlimit/setrlimit only read/write the local `rlimit` passed by pointer.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        if r.rlim_max < want {
            let up = libc::rlimit {
                rlim_cur: want,
                rlim_max: want,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &up) == 0 {
                return want;
            }
        }
        tidegate_e2e::raise_fd_limit();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur
    }
}

async fn connect_from(src: Option<IpAddr>, dst: SocketAddr) -> std::io::Result<TcpStream> {
    let s = match dst {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    if let Some(src) = src {
        s.bind(SocketAddr::new(src, 0))?;
    }
    let tcp = tokio::time::timeout(OP_TIMEOUT, s.connect(dst))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

async fn round_trip(tcp: &mut TcpStream, out: &[u8], back: &mut [u8]) -> anyhow::Result<()> {
    tokio::time::timeout(OP_TIMEOUT, async {
        tcp.write_all(out).await?;
        tcp.read_exact(back).await?;
        anyhow::Ok(())
    })
    .await
    .map_err(|_| anyhow!("round trip timed out"))?
}

/// An echo backend (like the harness's, but with nodelay so a 1 KiB answer
/// leaves at once on either path).
async fn echo_backend(l: TcpListener) {
    loop {
        let tcp = match l.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // EMFILE and friends: say so, back off, keep serving.
                eprintln!("echo backend: accept: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let (mut r, mut w) = tcp.into_split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        });
    }
}

/// A discard backend: reports (bytes, time of EOF) for each connection.
fn sink_backend(l: TcpListener) -> mpsc::UnboundedReceiver<(u64, Instant)> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut tcp, _)) = l.accept().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; TP_CHUNK];
                let mut n = 0u64;
                while let Ok(k @ 1..) = tcp.read(&mut buf).await {
                    n += k as u64;
                }
                let _ = tx.send((n, Instant::now()));
            });
        }
    });
    rx
}

#[derive(Clone, Copy, Default)]
struct Throughput {
    bytes: u64,
    secs: f64,
}

impl Throughput {
    fn mbps(&self) -> f64 {
        if self.secs > 0.0 {
            self.bytes as f64 / self.secs / 1e6
        } else {
            0.0
        }
    }
}

/// Writes up to TP_MAX_BYTES for up to TP_MAX_TIME, half-closes, and waits
/// for the sink to see EOF: the figure is bytes received / (EOF − first write).
async fn blast(
    mut tcp: TcpStream,
    sink: &mut mpsc::UnboundedReceiver<(u64, Instant)>,
) -> anyhow::Result<Throughput> {
    let chunk = vec![0x5a_u8; TP_CHUNK];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < TP_MAX_BYTES && start.elapsed() < TP_MAX_TIME {
        tokio::time::timeout(OP_TIMEOUT, tcp.write_all(&chunk))
            .await
            .map_err(|_| anyhow!("write stalled"))??;
        sent += TP_CHUNK as u64;
    }
    tcp.shutdown().await?;
    let (bytes, end) = tokio::time::timeout(Duration::from_secs(15), sink.recv())
        .await
        .map_err(|_| anyhow!("sink saw no EOF"))?
        .ok_or_else(|| anyhow!("sink gone"))?;
    if bytes != sent {
        bail!("sink received {bytes} of {sent} bytes");
    }
    Ok(Throughput {
        bytes,
        secs: (end - start).as_secs_f64(),
    })
}

/// Warm ping-pong of RR_SIZE bytes on one connection.
async fn ping_pong(tcp: &mut TcpStream) -> anyhow::Result<Lat> {
    let out = vec![0x42_u8; RR_SIZE];
    let mut back = vec![0u8; RR_SIZE];
    for _ in 0..RR_WARMUP {
        round_trip(tcp, &out, &mut back).await?;
    }
    let mut v = Vec::with_capacity(RR_MAX);
    let start = Instant::now();
    while v.len() < RR_MAX && start.elapsed() < RR_MAX_TIME {
        let t = Instant::now();
        round_trip(tcp, &out, &mut back).await?;
        v.push(t.elapsed());
    }
    Ok(Lat::of(v))
}

/// What a "new connection" is: a raw TCP connection to the backend, or a
/// fresh HBONE tunnel (TCP + mTLS + h2 handshakes + CONNECT), as
/// `tidegate connect` dials one.
enum Target {
    Raw(SocketAddr),
    Tunnel(Box<Dialer>),
    /// An application connection from `src` through the client gateway's
    /// capture: a new CONNECT stream on its pooled tunnel.
    Captured {
        capture: tidegate_e2e::Capture,
        src: IpAddr,
    },
}

struct Dialer {
    tls: Arc<TlsContext>,
    cfg: Settings,
    src: SpiffeId,
    dst: SpiffeId,
    hbone: SocketAddr,
    authority: SocketAddr,
}

impl Dialer {
    /// The client workload's tunnels to the echo workload at `echo_ip`
    /// (its gateway's HBONE port), CONNECTing to `echo`.
    fn client_to_echo(nodes: &TwoNodes, echo_ip: IpAddr, echo: SocketAddr) -> Dialer {
        Dialer {
            tls: nodes.client.tls.clone(),
            cfg: Settings::default(),
            src: SpiffeId::new(TRUST_DOMAIN, "demo", "client"),
            dst: SpiffeId::new(TRUST_DOMAIN, "demo", "echo"),
            hbone: SocketAddr::new(
                echo_ip,
                nodes.server.addrs.inbound.expect("node listeners").port(),
            ),
            authority: echo,
        }
    }
}

impl Target {
    /// One new connection carrying one round trip of `payload`.
    async fn once(&self, payload: &[u8]) -> anyhow::Result<()> {
        match self {
            Target::Raw(addr) => {
                let mut tcp = connect_from(None, *addr).await?;
                let mut back = vec![0u8; payload.len()];
                round_trip(&mut tcp, payload, &mut back).await
            }
            Target::Captured { capture, src } => {
                let mut tcp = tokio::time::timeout(OP_TIMEOUT, capture.try_connect(*src))
                    .await
                    .map_err(|_| anyhow!("connect timed out"))??;
                let mut back = vec![0u8; payload.len()];
                round_trip(&mut tcp, payload, &mut back).await
            }
            Target::Tunnel(d) => {
                let (send, conn) = dial(&d.tls, &d.cfg, &d.src, &d.dst, d.hbone)
                    .await
                    .map_err(|e| anyhow!("dial: {e} [{}]", e.reason()))?;
                let driver = tokio::spawn(async move {
                    let _ = conn.await;
                });
                let exchange = async {
                    let (mut tx, mut rx) = connect_stream(send, d.authority, d.cfg.connect_timeout)
                        .await
                        .map_err(|e| anyhow!("CONNECT: {e} [{}]", e.reason()))?;
                    tx.send_data(Bytes::copy_from_slice(payload), false)?;
                    let mut got = 0;
                    while got < payload.len() {
                        let chunk = rx
                            .data()
                            .await
                            .ok_or_else(|| anyhow!("stream ended after {got} bytes"))??;
                        got += chunk.len();
                        let _ = rx.flow_control().release_capacity(chunk.len());
                    }
                    anyhow::Ok(())
                };
                let r = tokio::time::timeout(OP_TIMEOUT, exchange).await;
                driver.abort();
                r.map_err(|_| anyhow!("tunnel exchange timed out"))?
            }
        }
    }
}

async fn new_conn_latency(target: &Target) -> (Lat, usize) {
    let payload = vec![0x42_u8; RR_SIZE];
    let mut v = Vec::new();
    let mut failed = 0;
    let start = Instant::now();
    for _ in 0..10 {
        let _ = target.once(&payload).await;
    }
    while v.len() + failed < NEW_MAX && start.elapsed() < NEW_MAX_TIME {
        let t = Instant::now();
        match target.once(&payload).await {
            Ok(()) => v.push(t.elapsed()),
            Err(_) => failed += 1,
        }
    }
    (Lat::of(v), failed)
}

#[derive(Default)]
struct Rate {
    ok: usize,
    failed: usize,
    secs: f64,
    first_error: Option<String>,
}

impl Rate {
    fn per_sec(&self) -> f64 {
        self.ok as f64 / self.secs.max(1e-9)
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:>8.0}/s  ({} ok, {} failed in {:.2} s{})",
            self.per_sec(),
            self.ok,
            self.failed,
            self.secs,
            self.first_error
                .as_ref()
                .map(|e| format!("; first error: {e}"))
                .unwrap_or_default()
        )
    }
}

/// New connections (each with a one-byte round trip) from `concurrency`
/// workers until RATE_MAX attempts or RATE_MAX_TIME.
async fn rate(target: Arc<Target>, concurrency: usize) -> Rate {
    let next = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let first_error = Arc::new(Mutex::new(None));
    let start = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (target, next, ok, failed, first_error) = (
            target.clone(),
            next.clone(),
            ok.clone(),
            failed.clone(),
            first_error.clone(),
        );
        workers.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < RATE_MAX && start.elapsed() < RATE_MAX_TIME
            {
                match target.once(&[7]).await {
                    Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        first_error.lock().unwrap().get_or_insert(format!("{e:#}"));
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        });
    }
    while workers.join_next().await.is_some() {}
    let secs = start.elapsed().as_secs_f64();
    let first_error = first_error.lock().unwrap().take();
    Rate {
        ok: ok.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        secs,
        first_error,
    }
}

// ---- in-process part ----------------------------------------------------

/// Sizes of the futures an outbound application connection lives in. An
/// async fn's state is as large as its largest suspended state, so the
/// one-time dial path is paid by every idle connection's task allocation.
async fn future_sizes(nodes: &TwoNodes, d: &Dialer) -> anyhow::Result<String> {
    use std::mem::size_of_val;
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let tcp = TcpStream::connect(l.local_addr()?).await?;
    let src = tcp.local_addr()?;
    let proxy = size_of_val(&nodes.client.outbound.proxy(tcp, src, d.authority));
    let key = tidegate::proxy::pool::PoolKey {
        src: d.src.clone(),
        dst_uid: "echo-uid".into(),
        dst: d.dst.clone(),
        dst_also: Vec::new(),
        dst_addr: d.hbone,
        src_netns: None,
    };
    let pool_connect = size_of_val(&nodes.client.pool.connect(&key, d.authority));
    let dial_size = size_of_val(&dial(&d.tls, &d.cfg, &d.src, &d.dst, d.hbone));
    let (send, conn) = dial(&d.tls, &d.cfg, &d.src, &d.dst, d.hbone).await?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    let (tx, rx) = connect_stream(send, d.authority, d.cfg.connect_timeout).await?;
    let tcp = TcpStream::connect(l.local_addr()?).await?;
    let counters = tidegate::proxy::copy::ByteCounters::default();
    let copy = size_of_val(&tidegate::proxy::copy::copy_bidirectional(
        &tcp, tx, rx, &counters, &counters,
    ));
    driver.abort();
    Ok(format!(
        "Outbound::proxy {proxy} B, of which Pool::connect {pool_connect} B (hbone::client::dial alone {dial_size} B) vs copy_bidirectional {copy} B"
    ))
}

const BREAKDOWN_MAX: usize = 300;
const BREAKDOWN_MAX_TIME: Duration = Duration::from_secs(2);

/// The steps of `hbone::client::dial` + `connect_stream` timed one by one
/// (same TLS context, same HTTP/2 settings as the gateway's client builder).
async fn tunnel_breakdown(d: &Dialer) -> anyhow::Result<Vec<(&'static str, Lat)>> {
    let names = [
        "TCP connect",
        "TLS 1.3 handshake, client side (mTLS, ECDSA P-256)",
        "HTTP/2 client preface (no round trip)",
        "CONNECT → 200 (server: client-cert check, h2, upstream dial)",
        "1 KiB echo on the new stream",
    ];
    let mut v: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    let payload = Bytes::from(vec![0x42_u8; RR_SIZE]);
    let start = Instant::now();
    while v[0].len() < BREAKDOWN_MAX && start.elapsed() < BREAKDOWN_MAX_TIME {
        let mut t = Instant::now();
        let mut lap = |i: usize, v: &mut Vec<Vec<Duration>>| {
            let now = Instant::now();
            v[i].push(now - t);
            t = now;
        };
        let tcp = TcpStream::connect(d.hbone).await?;
        tcp.set_nodelay(true)?;
        lap(0, &mut v);
        let tls = d.tls.connect(&d.src, &d.dst, d.hbone.ip(), tcp).await?;
        lap(1, &mut v);
        let mut b = h2::client::Builder::new();
        b.initial_window_size(d.cfg.stream_window)
            .initial_connection_window_size(d.cfg.connection_window)
            .max_frame_size(d.cfg.max_frame_size)
            .max_header_list_size(d.cfg.max_header_list_size)
            .max_send_buffer_size(d.cfg.max_frame_size as usize)
            .enable_push(false);
        let (send, conn) = b.handshake::<_, Bytes>(tls).await?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        lap(2, &mut v);
        let r = tokio::time::timeout(OP_TIMEOUT, async {
            let (mut tx, mut rx) = connect_stream(send, d.authority, d.cfg.connect_timeout).await?;
            lap(3, &mut v);
            tx.send_data(payload.clone(), false)?;
            let mut got = 0;
            while got < RR_SIZE {
                let chunk = rx.data().await.ok_or_else(|| anyhow!("stream ended"))??;
                got += chunk.len();
                let _ = rx.flow_control().release_capacity(chunk.len());
            }
            lap(4, &mut v);
            anyhow::Ok(())
        })
        .await;
        driver.abort();
        r.map_err(|_| anyhow!("timed out"))??;
    }
    Ok(names.into_iter().zip(v.into_iter().map(Lat::of)).collect())
}

#[derive(Default)]
struct InProcess {
    tp_raw: Vec<Throughput>,
    tp_tg: Vec<Throughput>,
    warm_raw: Lat,
    warm_tg: Lat,
    new_raw: (Lat, usize),
    new_tg: (Lat, usize),
    rate_seq_raw: Rate,
    rate_seq_tg: Rate,
    rate_conc_raw: Rate,
    rate_conc_tg: Rate,
}

async fn in_process() -> anyhow::Result<InProcess> {
    let mut out = InProcess::default();
    let nodes = TwoNodes::with(OCTET, Options::default()).await;
    let echo_ip = ip(OCTET, 2);

    // Backends on the echo workload's IP: the inbound side dials the CONNECT
    // authority, so any port on that IP is "the workload".
    let echo_l = TcpListener::bind(SocketAddr::new(echo_ip, 0)).await?;
    let echo = echo_l.local_addr()?;
    tokio::spawn(echo_backend(echo_l));
    let sink_l = TcpListener::bind(SocketAddr::new(echo_ip, 0)).await?;
    let sink = sink_l.local_addr()?;
    let mut sink_rx = sink_backend(sink_l);
    let to_echo = tidegate_e2e::Capture::start(nodes.client.outbound.clone(), echo).await;
    let to_sink = tidegate_e2e::Capture::start(nodes.client.outbound.clone(), sink).await;

    // Warm the pooled tunnel once (first CONNECT dials it).
    let mut warm = to_echo.connect(nodes.client_ip).await;
    round_trip(&mut warm, b"x", &mut [0u8; 1]).await?;
    drop(warm);

    println!("\n[1] single-stream throughput, one direction, {} MiB or {:?} (whichever first), sink backend  [in-process]", TP_MAX_BYTES >> 20, TP_MAX_TIME);
    for round in 0..2 {
        let raw = blast(connect_from(None, sink).await?, &mut sink_rx).await?;
        println!("    round {round}  raw TCP   app → backend                      {:>8.0} MB/s  ({} MiB in {:.2} s)", raw.mbps(), raw.bytes >> 20, raw.secs);
        out.tp_raw.push(raw);
        let tg = blast(to_sink.connect(nodes.client_ip).await, &mut sink_rx).await?;
        println!("    round {round}  tidegate  app → A → HBONE mTLS h2 → B → backend {:>8.0} MB/s  ({} MiB in {:.2} s)", tg.mbps(), tg.bytes >> 20, tg.secs);
        out.tp_tg.push(tg);
    }

    println!("\n[2a] {RR_SIZE} B request/response over one warm connection, up to {RR_MAX} or {RR_MAX_TIME:?}  [in-process]");
    let mut raw = connect_from(None, echo).await?;
    out.warm_raw = ping_pong(&mut raw).await?;
    println!("    raw TCP            {}", out.warm_raw);
    let mut tg = to_echo.connect(nodes.client_ip).await;
    out.warm_tg = ping_pong(&mut tg).await?;
    println!("    tidegate tunnel    {}", out.warm_tg);
    drop((raw, tg));

    let dialer = Dialer::client_to_echo(&nodes, echo_ip, echo);
    match future_sizes(&nodes, &dialer).await {
        Ok(line) => println!("\nper-connection task state, outbound side (size_of_val of the unpolled futures): {line}"),
        Err(e) => println!("\n(future sizes: {e:#})"),
    }
    let raw_target = Arc::new(Target::Raw(echo));
    let tg_target = Arc::new(Target::Tunnel(Box::new(dialer)));

    println!("\n[2b] {RR_SIZE} B request/response on a NEW connection each (connect → 1 KiB echo), up to {NEW_MAX} or {NEW_MAX_TIME:?}  [in-process]");
    out.new_raw = new_conn_latency(&raw_target).await;
    println!(
        "    raw TCP: new TCP connection                          {}  failed {}",
        out.new_raw.0, out.new_raw.1
    );
    out.new_tg = new_conn_latency(&tg_target).await;
    println!(
        "    tidegate: new tunnel (TCP+TLS+h2+CONNECT), as `tidegate connect`  {}  failed {}",
        out.new_tg.0, out.new_tg.1
    );

    if let Target::Tunnel(d) = &*tg_target {
        match tunnel_breakdown(d).await {
            Ok(phases) => {
                println!("    where a new tunnel's time goes (p50 of each step, sequential, up to {BREAKDOWN_MAX} or {BREAKDOWN_MAX_TIME:?}):");
                for (name, lat) in phases {
                    println!("      {name:<58} {lat}");
                }
            }
            Err(e) => println!("    (breakdown failed: {e:#})"),
        }
    }

    println!("\n[3] new connections per second (each: connect + 1-byte round trip), up to {RATE_MAX} or {RATE_MAX_TIME:?}  [in-process]");
    out.rate_seq_raw = rate(raw_target.clone(), 1).await;
    println!("    sequential      raw TCP          {}", out.rate_seq_raw);
    out.rate_seq_tg = rate(tg_target.clone(), 1).await;
    println!("    sequential      tidegate tunnels {}", out.rate_seq_tg);
    out.rate_conc_raw = rate(raw_target.clone(), RATE_CONCURRENCY).await;
    println!(
        "    {RATE_CONCURRENCY} concurrent    raw TCP          {}",
        out.rate_conc_raw
    );
    out.rate_conc_tg = rate(tg_target.clone(), RATE_CONCURRENCY).await;
    println!(
        "    {RATE_CONCURRENCY} concurrent    tidegate tunnels {}",
        out.rate_conc_tg
    );

    let text = nodes.server.metrics_text();
    let failures: f64 = text
        .lines()
        .filter(|l| l.starts_with("tidegate_tls_handshake_failures_total"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum::<f64>()
        + 0.0;
    println!(
        "    server gateway counters: {} inbound TLS handshakes, {failures} handshake failures",
        metric(
            &text,
            "tidegate_tls_handshakes_total{direction=\"inbound\"}"
        )
    );
    Ok(out)
}

// ---- processes + network namespace part ---------------------------------

/// Finds (or builds) the release `tidegate` binary.
fn gateway_binary() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("DATAPLANE_GATEWAY_BIN") {
        return Ok(PathBuf::from(p));
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    println!("\nbuilding the gateway binary: cargo build --release -p tidegate --bin tidegate (not timed; only waits if sources changed)");
    let out = Command::new(cargo)
        .current_dir(&workspace)
        .args([
            "build",
            "--release",
            "-p",
            "tidegate",
            "--bin",
            "tidegate",
            "--message-format=json",
        ])
        .stderr(Stdio::piped())
        .output()
        .context("running cargo build")?;
    if !out.status.success() {
        bail!(
            "cargo build --release -p tidegate failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let exe = stdout
        .lines()
        .filter(|l| {
            l.contains("\"reason\":\"compiler-artifact\"") && l.contains("\"name\":\"tidegate\"")
        })
        .find_map(|l| {
            let rest = &l[l.find("\"executable\":\"")? + "\"executable\":\"".len()..];
            Some(PathBuf::from(&rest[..rest.find('"')?]))
        })
        .ok_or_else(|| anyhow!("cargo build printed no executable for tidegate"))?;
    println!(
        "    gateway binary: {} (cargo build --release -p tidegate, {:.1} s)",
        exe.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(exe)
}

fn run(cmd: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn vm_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS for {pid}"))
}

/// User + system CPU seconds consumed so far by process `pid` (all threads).
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // Fields after the `(comm)`: state is field 3; utime, stime are 14, 15.
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(14) + ticks(15)) / hz
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Children die with the thread that spawned them (the namespace thread),
/// even if this program is killed.
fn die_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: the pre_exec hook only calls prctl(2), which is async-signal-safe
    // and allocates nothing, as required between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Set in the environment of the echo backend child (this same program).
const ECHO_ROLE_ENV: &str = "DATAPLANE_ECHO_BACKEND";

/// The echo backend as its own process: with 10,000 connections it holds
/// 10,000 descriptors, and this process holds the 10,000 application ends
/// (RLIMIT_NOFILE may be 20,000, not raisable without CAP_SYS_RESOURCE).
/// Prints `ready` once listening; exits when its stdin closes.
fn echo_process(addr: &str) -> anyhow::Result<()> {
    let addr: SocketAddr = addr.parse()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let l = TcpListener::bind(addr).await?;
        tokio::spawn(echo_backend(l));
        println!("ready");
        let mut b = [0u8; 1];
        let _ = tokio::io::stdin().read(&mut b).await;
        anyhow::Ok(())
    })?;
    std::process::exit(0)
}

struct EchoChild(Child);

impl Drop for EchoChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_echo_child(addr: SocketAddr) -> anyhow::Result<EchoChild> {
    use std::io::BufRead;
    let exe = std::env::current_exe()?;
    let mut child = EchoChild(
        die_with_parent(
            Command::new(exe)
                .env(ECHO_ROLE_ENV, addr.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped()),
        )
        .spawn()
        .context("spawning the echo backend process")?,
    );
    let mut line = String::new();
    std::io::BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line)?;
    if line.trim() != "ready" {
        bail!("echo backend process did not start");
    }
    Ok(child)
}

/// One gateway process; killed (by its pid) on drop.
struct Gateway {
    name: &'static str,
    child: Child,
    log: PathBuf,
    metrics: SocketAddr,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gateway {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn rss(&self) -> anyhow::Result<u64> {
        vm_rss_kib(self.pid())
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

struct NodePorts {
    outbound: u16,
    inbound: u16,
    admin: u16,
    metrics: u16,
    readiness: u16,
}

const NODE_A: NodePorts = NodePorts {
    outbound: 15001,
    inbound: 15108,
    admin: 15000,
    metrics: 15020,
    readiness: 15021,
};
const NODE_B: NodePorts = NodePorts {
    outbound: 15101,
    inbound: 15008,
    admin: 15100,
    metrics: 15120,
    readiness: 15121,
};

async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let fut = async {
        let mut tcp = TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        tcp.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        tcp.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text.split(' ').nth(1)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|x| x.1.to_owned())
            .unwrap_or_default();
        Some((status, body))
    };
    tokio::time::timeout(Duration::from_secs(3), fut)
        .await
        .ok()
        .flatten()
}

fn lo(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
}

/// Starts `tidegate run` (from the calling thread, hence in its namespace)
/// and waits until `/healthz/ready` answers 200.
async fn start_gateway(
    bin: &Path,
    dir: &Path,
    name: &'static str,
    node: &str,
    ports: &NodePorts,
    max_streams: usize,
) -> anyhow::Result<Gateway> {
    let config = dir.join(format!("{name}.yaml"));
    let inbound_ip = if ports.inbound == NODE_B.inbound {
        "0.0.0.0"
    } else {
        "127.0.0.1"
    };
    std::fs::write(
        &config,
        format!(
            r#"node_name: {node}
trust_domain: {TRUST_DOMAIN}
listeners:
  outbound: 127.0.0.1:{}
  inbound: {inbound_ip}:{}
  admin: 127.0.0.1:{}
  metrics: 127.0.0.1:{}
  readiness: 127.0.0.1:{}
certificates:
  source: dev-ca
  state_dir: {}
workloads:
  file: {}
  reload_interval: 1s
hbone:
  port: {}
  max_connections_per_identity: {MEM_PER_IDENTITY}
pool:
  max_streams_per_tunnel: {max_streams}
shutdown:
  deadline: 1s
"#,
            ports.outbound,
            ports.inbound,
            ports.admin,
            ports.metrics,
            ports.readiness,
            dir.join("ca").display(),
            dir.join("workloads.yaml").display(),
            NODE_B.inbound,
        ),
    )?;
    let log = dir.join(format!("{name}.log"));
    let mut cmd = Command::new(bin);
    // The gateway reads TIDEGATE_* as config keys: pass it none but the log filter.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TIDEGATE_") {
            cmd.env_remove(k);
        }
    }
    let child = die_with_parent(
        cmd.args(["run", "--config"])
            .arg(&config)
            .env("TIDEGATE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?),
    )
    .spawn()
    .with_context(|| format!("spawning {}", bin.display()))?;
    let mut gw = Gateway {
        name,
        child,
        log,
        metrics: lo(ports.metrics),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = gw.child.try_wait()? {
            bail!("gateway {name} exited with {status}:\n{}", gw.log_tail());
        }
        if let Some((200, _)) = http_get(lo(ports.readiness), "/healthz/ready").await {
            return Ok(gw);
        }
        if Instant::now() > deadline {
            bail!("gateway {name} not ready after 20 s:\n{}", gw.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn gateway_metric(gw: &Gateway, series: &str) -> f64 {
    match http_get(gw.metrics, "/metrics").await {
        Some((200, body)) => metric(&body, series),
        _ => f64::NAN,
    }
}

#[derive(Default)]
struct MemResult {
    conns: usize,
    failed: usize,
    first_error: Option<String>,
    open_secs: f64,
    tunnels: f64,
    a_before: u64,
    a_after: u64,
    b_before: u64,
    b_after: u64,
    streams_a: f64,
    streams_b: f64,
}

impl MemResult {
    fn growth_kib(&self) -> f64 {
        (self.a_after as f64 - self.a_before as f64) + (self.b_after as f64 - self.b_before as f64)
    }

    fn per_conn_kib(&self) -> f64 {
        self.growth_kib() / self.conns.max(1) as f64
    }
}

/// Opens `n` application connections through the capture (each proven with
/// a one-byte round trip), keeps them idle, and measures both gateways' RSS.
async fn memory_phase(
    bin: &Path,
    dir: &Path,
    n: usize,
    max_streams: usize,
    dests: &[SocketAddr],
) -> anyhow::Result<MemResult> {
    let b = start_gateway(bin, dir, "node-b", "node-b", &NODE_B, max_streams).await?;
    let a = start_gateway(bin, dir, "node-a", "node-a", &NODE_A, max_streams).await?;
    let client_ip = ip(NS_OCTET, 3);
    let echo = dests[0];

    // One-time costs (certificates minted, TLS configs, the first tunnel,
    // runtime warm-up) belong to the baseline, not to the connections.
    {
        let mut c = connect_from(Some(client_ip), echo).await?;
        round_trip(&mut c, b"w", &mut [0u8; 1])
            .await
            .context("warm-up through the capture")?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut r = MemResult {
        a_before: a.rss()?,
        b_before: b.rss()?,
        ..Default::default()
    };

    let start = Instant::now();
    let mut conns = Vec::with_capacity(n);
    let mut inflight = tokio::task::JoinSet::new();
    let mut launched = 0;
    while (launched < n || !inflight.is_empty()) && start.elapsed() < MEM_PHASE_MAX_TIME {
        while launched < n && inflight.len() < MEM_CONCURRENCY {
            let echo = dests[launched % dests.len()];
            launched += 1;
            inflight.spawn(async move {
                let mut c = connect_from(Some(client_ip), echo).await?;
                round_trip(&mut c, b"m", &mut [0u8; 1]).await?;
                anyhow::Ok(c)
            });
        }
        match tokio::time::timeout(Duration::from_secs(1), inflight.join_next()).await {
            Ok(Some(Ok(Ok(c)))) => conns.push(c),
            Ok(Some(Ok(Err(e)))) => {
                r.failed += 1;
                r.first_error.get_or_insert(format!("{e:#}"));
            }
            Ok(Some(Err(e))) => {
                r.failed += 1;
                r.first_error.get_or_insert(e.to_string());
            }
            Ok(None) | Err(_) => {}
        }
    }
    inflight.abort_all();
    r.failed += n - conns.len() - r.failed;
    r.conns = conns.len();
    r.open_secs = start.elapsed().as_secs_f64();
    // Let both gateways settle (no traffic moves now), then measure.
    tokio::time::sleep(Duration::from_secs(1)).await;
    r.a_after = a.rss()?;
    r.b_after = b.rss()?;
    r.tunnels = gateway_metric(&a, "tidegate_pool_tunnels").await;
    r.streams_a = gateway_metric(&a, "tidegate_streams_open{direction=\"outbound\"}").await;
    r.streams_b = gateway_metric(&b, "tidegate_streams_open{direction=\"inbound\"}").await;
    if r.conns < n {
        eprintln!(
            "    node-a log tail:\n{}\n    node-b log tail:\n{}",
            a.log_tail(),
            b.log_tail()
        );
    }
    // The application closes first, so TIME_WAIT stays on its side (its ports
    // are not reused by the next phase); then the gateways are killed.
    drop(conns);
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!(
        "    gateways stopped ({} pid {}, {} pid {})",
        a.name,
        a.pid(),
        b.name,
        b.pid()
    );
    drop((a, b));
    Ok(r)
}

#[derive(Default)]
struct Processes {
    cpu_raw: f64,
    cpu_app: f64,
    cpu_a: f64,
    cpu_b: f64,
    tp_raw: Throughput,
    tp_tg: Throughput,
    warm_raw: Lat,
    warm_tg: Lat,
    mem: MemResult,
    mem_tunnel: MemResult,
    mem_dests: MemResult,
}

/// `DATAPLANE_PERF=<file>`: record a `perf` profile of both gateways
/// during the process-mode throughput run (for finding where time goes).
fn start_perf(pids: &[u32]) -> Option<Child> {
    start_perf_to(pids, Path::new(&std::env::var_os("DATAPLANE_PERF")?))
}

/// `perf record` (call graphs) of `pids` into `out` until [`stop_perf`].
fn start_perf_to(pids: &[u32], out: &Path) -> Option<Child> {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    let child = Command::new("perf")
        .args(["record", "-F", "999", "-g", "-o"])
        .arg(out)
        .args(["-p", &pids.join(",")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_millis(300));
    Some(child)
}

fn stop_perf(perf: Option<Child>) {
    if let Some(mut p) = perf {
        // SAFETY: kill(2) on the pid of a child this program spawned and has not reaped.
        unsafe { libc::kill(p.id() as i32, libc::SIGINT) };
        let _ = p.wait();
    }
}

/// Runs inside the new network namespace (on this thread and its children).
async fn processes(bin: PathBuf) -> anyhow::Result<Processes> {
    let mut out = Processes::default();
    run("ip", &["link", "set", "lo", "up"])?;
    let client = ip(NS_OCTET, 3).to_string();
    let echo = ip(NS_OCTET, 2).to_string();
    // Capture: the client workload's connections to the echo workload go
    // to node A's outbound, and so do those to the destination workloads
    // of [4''].
    for (dst, dports) in [
        (echo, format!("{NS_ECHO_PORT},{NS_SINK_PORT}")),
        (format!("127.{NS_OCTET}.1.0/24"), NS_DESTS_PORT.to_string()),
    ] {
        run(
            "iptables",
            &[
                "-w",
                "-t",
                "nat",
                "-A",
                "OUTPUT",
                "-p",
                "tcp",
                "-s",
                &client,
                "-d",
                &dst,
                "-m",
                "multiport",
                "--dports",
                &dports,
                "-j",
                "REDIRECT",
                "--to-ports",
                &NODE_A.outbound.to_string(),
            ],
        )?;
    }
    let dir = tempfile::tempdir()?;
    let mut workloads = workloads_yaml(NS_OCTET, "echo");
    for d in destinations() {
        workloads += &format!(
            "- {{uid: dest-{ip}, name: dest-{ip}, namespace: demo, service_account: echo, ips: [{ip}], node: node-b}}\n",
            ip = d.ip()
        );
    }
    std::fs::write(dir.path().join("workloads.yaml"), workloads)?;
    let _echo = spawn_echo_child(SocketAddr::new(ip(NS_OCTET, 2), NS_ECHO_PORT))?;
    let _dests_echo =
        spawn_echo_child(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), NS_DESTS_PORT))?;
    let sink_l = TcpListener::bind(SocketAddr::new(ip(NS_OCTET, 2), NS_SINK_PORT)).await?;
    let mut sink_rx = sink_backend(sink_l);
    let client_ip = ip(NS_OCTET, 3);
    let other_ip = ip(NS_OCTET, 9); // not a workload, not captured: the raw baseline
    let echo_addr = SocketAddr::new(ip(NS_OCTET, 2), NS_ECHO_PORT);
    let sink_addr = SocketAddr::new(ip(NS_OCTET, 2), NS_SINK_PORT);

    {
        println!("\n[1'/2a'] cross-check with the gateways as separate processes  [processes+netns, iptables REDIRECT]");
        let b = start_gateway(
            &bin,
            dir.path(),
            "node-b",
            "node-b",
            &NODE_B,
            MEM_STREAMS_PER_TUNNEL,
        )
        .await?;
        let a = start_gateway(
            &bin,
            dir.path(),
            "node-a",
            "node-a",
            &NODE_A,
            MEM_STREAMS_PER_TUNNEL,
        )
        .await?;
        let mut w = connect_from(Some(client_ip), echo_addr).await?;
        round_trip(&mut w, b"x", &mut [0u8; 1])
            .await
            .context("warm-up through the capture")?;
        drop(w);
        // CPU accounting: this process runs the application and the sink
        // (the in-process runtime is gone by now); the gateways run in theirs.
        let me = std::process::id();
        let c0 = cpu_secs(me);
        out.tp_raw = blast(connect_from(Some(other_ip), sink_addr).await?, &mut sink_rx).await?;
        let raw_cpu = cpu_secs(me) - c0;
        let (m0, a0, b0) = (cpu_secs(me), cpu_secs(a.pid()), cpu_secs(b.pid()));
        let perf = start_perf(&[a.pid(), b.pid()]);
        out.tp_tg = blast(
            connect_from(Some(client_ip), sink_addr).await?,
            &mut sink_rx,
        )
        .await?;
        stop_perf(perf);
        let gb = |t: &Throughput| t.bytes as f64 / 1e9;
        out.cpu_raw = raw_cpu / gb(&out.tp_raw);
        out.cpu_app = (cpu_secs(me) - m0) / gb(&out.tp_tg);
        out.cpu_a = (cpu_secs(a.pid()) - a0) / gb(&out.tp_tg);
        out.cpu_b = (cpu_secs(b.pid()) - b0) / gb(&out.tp_tg);
        println!(
            "    throughput  raw TCP {:>8.0} MB/s   tidegate {:>8.0} MB/s   ({:.0} %)",
            out.tp_raw.mbps(),
            out.tp_tg.mbps(),
            100.0 * out.tp_tg.mbps() / out.tp_raw.mbps()
        );
        println!(
            "    CPU seconds per GB moved: raw TCP app+backend {:.2};  tidegate: app+backend {:.2}, node A (outbound, encrypt) {:.2}, node B (inbound, decrypt) {:.2}  → {:.1} CPU-s/s while running",
            out.cpu_raw,
            out.cpu_app,
            out.cpu_a,
            out.cpu_b,
            (out.cpu_app + out.cpu_a + out.cpu_b) * gb(&out.tp_tg) / out.tp_tg.secs
        );
        out.warm_raw = ping_pong(&mut connect_from(Some(other_ip), echo_addr).await?).await?;
        out.warm_tg = ping_pong(&mut connect_from(Some(client_ip), echo_addr).await?).await?;
        println!("    warm 1 KiB RTT  raw TCP {}", out.warm_raw);
        println!("    warm 1 KiB RTT  tidegate {}", out.warm_tg);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    println!("\n[4] memory: {MEM_CONNS} idle application connections, pool.max_streams_per_tunnel={MEM_STREAMS_PER_TUNNEL}  [processes+netns, iptables REDIRECT]");
    out.mem = memory_phase(
        &bin,
        dir.path(),
        MEM_CONNS,
        MEM_STREAMS_PER_TUNNEL,
        &[echo_addr],
    )
    .await?;
    print_mem(&out.mem);
    println!("\n[4'] memory per tunnel in isolation: {MEM_TUNNEL_CONNS} idle connections, pool.max_streams_per_tunnel=1  [processes+netns]");
    out.mem_tunnel = memory_phase(&bin, dir.path(), MEM_TUNNEL_CONNS, 1, &[echo_addr]).await?;
    print_mem(&out.mem_tunnel);
    println!("\n[4''] {MEM_CONNS} idle connections to {MEM_DESTINATIONS} destination workloads, pool.max_streams_per_tunnel={MEM_STREAMS_PER_TUNNEL}  [processes+netns]");
    out.mem_dests = memory_phase(
        &bin,
        dir.path(),
        MEM_CONNS,
        MEM_STREAMS_PER_TUNNEL,
        &destinations(),
    )
    .await?;
    print_mem(&out.mem_dests);
    Ok(out)
}

/// The destination workloads of [4''].
fn destinations() -> Vec<SocketAddr> {
    (1..=MEM_DESTINATIONS)
        .map(|h| SocketAddr::new(Ipv4Addr::new(127, NS_OCTET, 1, h).into(), NS_DESTS_PORT))
        .collect()
}

fn print_mem(m: &MemResult) {
    println!(
        "    established {} (failed {}{}) in {:.2} s; pooled tunnels (node A gauge) {}; open streams A {} / B {}",
        m.conns,
        m.failed,
        m.first_error.as_ref().map(|e| format!(", first error: {e}")).unwrap_or_default(),
        m.open_secs,
        m.tunnels,
        m.streams_a,
        m.streams_b
    );
    println!(
        "    VmRSS node A {} → {} KiB (+{} KiB); node B {} → {} KiB (+{} KiB)",
        m.a_before,
        m.a_after,
        m.a_after as i64 - m.a_before as i64,
        m.b_before,
        m.b_after,
        m.b_after as i64 - m.b_before as i64
    );
    println!(
        "    per application connection (A+B): {:.2} KiB   (A {:.2} + B {:.2});  per pooled tunnel: {:.1} KiB",
        m.per_conn_kib(),
        (m.a_after as f64 - m.a_before as f64) / m.conns.max(1) as f64,
        (m.b_after as f64 - m.b_before as f64) / m.conns.max(1) as f64,
        m.growth_kib() / m.tunnels.max(1.0)
    );
}

/// Runs `f` on a new thread moved into a new network namespace; processes
/// it spawns inherit the namespace, which vanishes when they are all gone.
fn in_new_netns<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    std::thread::spawn(move || {
        // SAFETY: unshare(2) moves only this fresh thread into a new network
        // namespace; no memory is involved.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            bail!(
                "unshare(CLONE_NEWNET): {} (needs root)",
                std::io::Error::last_os_error()
            );
        }
        f()
    })
    .join()
    .map_err(|_| anyhow!("namespace thread panicked"))?
}

// ---- summary ------------------------------------------------------------

struct Row {
    metric: String,
    tidegate: String,
    raw: String,
    cmp: String,
    target: String,
    met: Option<bool>,
}

fn row(
    metric: &str,
    tidegate: String,
    raw: String,
    cmp: String,
    target: &str,
    met: Option<bool>,
) -> Row {
    Row {
        metric: metric.into(),
        tidegate,
        raw,
        cmp,
        target: target.into(),
        met,
    }
}

fn print_table(rows: &[Row]) {
    let head = [
        "metric",
        "tidegate",
        "raw TCP",
        "ratio / delta",
        "target",
        "met",
    ];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.metric.clone(),
                r.tidegate.clone(),
                r.raw.clone(),
                r.cmp.clone(),
                r.target.clone(),
                match r.met {
                    Some(true) => "met".into(),
                    Some(false) => "NOT MET".into(),
                    None => "-".into(),
                },
            ]
        })
        .collect();
    let mut w = head.map(|h| h.chars().count());
    for c in &cells {
        for (i, s) in c.iter().enumerate() {
            w[i] = w[i].max(s.chars().count());
        }
    }
    let line = |c: &[String]| {
        let parts: Vec<String> = c
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{s:<width$}", width = w[i]))
            .collect();
        println!("| {} |", parts.join(" | "));
    };
    line(&head.map(String::from));
    let sep: Vec<String> = w.iter().map(|n| "-".repeat(*n)).collect();
    println!("|-{}-|", sep.join("-|-"));
    for c in &cells {
        line(c);
    }
}

fn main() -> anyhow::Result<()> {
    if let Ok(addr) = std::env::var(ECHO_ROLE_ENV) {
        return echo_process(&addr);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "app-server") {
        // `--rollout`'s replicas: the drain lab's app, run by this program.
        return pair::app_server(&args[1..]);
    }
    if let Some(pairs) = pair::parse_args(&args)? {
        let ipv6 = args.iter().any(|a| a == "--ipv6");
        return pair::run(pairs, pair::Mode::of(&args), ipv6);
    }
    if args.iter().any(|a| a == "--ipv6") {
        return ipv6::run();
    }
    if args.iter().any(|a| a == "--authorization") {
        let nofile = raise_nofile(65_536);
        println!(
            "authorization close time — RLIMIT_NOFILE {nofile}, load average at start {}",
            loadavg()
        );
        return authorization::run();
    }
    let started = Instant::now();
    let nofile = raise_nofile(65_536);
    println!(
        "tidegate data-path benchmark — {} cores, RLIMIT_NOFILE {nofile}, load average at start {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        loadavg()
    );
    println!("modes: [in-process] = both gateways in this process (harness TwoNodes, test-side capture calling Outbound::proxy);");
    println!("       [processes+netns] = two `tidegate run` processes in a private network namespace, iptables REDIRECT capture");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let ip_res = rt.block_on(in_process())?;
    rt.shutdown_timeout(Duration::from_secs(2));

    let proc_res = match gateway_binary() {
        Ok(bin) => in_new_netns(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            let r = rt.block_on(processes(bin));
            rt.shutdown_timeout(Duration::from_secs(2));
            r
        }),
        Err(e) => Err(e),
    };
    let proc_res = match proc_res {
        Ok(r) => Some(r),
        Err(e) => {
            println!("\n[4] SKIPPED processes+netns part: {e:#}");
            None
        }
    };

    // ---- summary
    let best = |v: &[Throughput]| {
        v.iter()
            .copied()
            .max_by(|a, b| a.mbps().total_cmp(&b.mbps()))
            .unwrap_or_default()
    };
    let (tp_tg, tp_raw) = (best(&ip_res.tp_tg), best(&ip_res.tp_raw));
    let ratio = tp_tg.mbps() / tp_raw.mbps();
    let mut rows = vec![row(
        "throughput, 1 stream, MB/s [in-process, best of 2]",
        format!("{:.0}", tp_tg.mbps()),
        format!("{:.0}", tp_raw.mbps()),
        format!("{:.1} %", 100.0 * ratio),
        ">= 40 %",
        Some(ratio >= 0.40),
    )];
    if let Some(p) = &proc_res {
        let r = p.tp_tg.mbps() / p.tp_raw.mbps();
        rows.push(row(
            "throughput, 1 stream, MB/s [processes+netns]",
            format!("{:.0}", p.tp_tg.mbps()),
            format!("{:.0}", p.tp_raw.mbps()),
            format!("{:.1} %", 100.0 * r),
            ">= 40 %",
            Some(r >= 0.40),
        ));
    }
    let lat_rows = |name: &str, tg: &Lat, raw: &Lat, target50: Option<f64>, rows: &mut Vec<Row>| {
        let d50 = us(tg.p50) - us(raw.p50);
        rows.push(row(
            &format!("{name} p50 µs"),
            format!("{:.1}", us(tg.p50)),
            format!("{:.1}", us(raw.p50)),
            format!("{d50:+.1} µs"),
            &target50
                .map(|t| format!("<= +{t:.0} µs"))
                .unwrap_or_else(|| "-".into()),
            target50.map(|t| d50 <= t),
        ));
        rows.push(row(
            &format!("{name} p99 µs"),
            format!("{:.1}", us(tg.p99)),
            format!("{:.1}", us(raw.p99)),
            format!("{:+.1} µs", us(tg.p99) - us(raw.p99)),
            "-",
            None,
        ));
    };
    lat_rows(
        "1 KiB RTT, warm tunnel [in-process]",
        &ip_res.warm_tg,
        &ip_res.warm_raw,
        Some(80.0),
        &mut rows,
    );
    if let Some(p) = &proc_res {
        lat_rows(
            "1 KiB RTT, warm tunnel [processes+netns]",
            &p.warm_tg,
            &p.warm_raw,
            Some(80.0),
            &mut rows,
        );
    }
    lat_rows(
        "1 KiB req, new tunnel vs new TCP conn [in-process]",
        &ip_res.new_tg.0,
        &ip_res.new_raw.0,
        None,
        &mut rows,
    );
    for (name, tg, raw) in [
        (
            "new tunnels/s, sequential [in-process]",
            &ip_res.rate_seq_tg,
            &ip_res.rate_seq_raw,
        ),
        (
            "new tunnels/s, 8 concurrent [in-process]",
            &ip_res.rate_conc_tg,
            &ip_res.rate_conc_raw,
        ),
    ] {
        rows.push(row(
            name,
            format!("{:.0} ({} fail)", tg.per_sec(), tg.failed),
            format!("{:.0} ({} fail)", raw.per_sec(), raw.failed),
            format!("{:.1} %", 100.0 * tg.per_sec() / raw.per_sec()),
            "-",
            None,
        ));
    }
    if let Some(p) = &proc_res {
        let tg = p.cpu_app + p.cpu_a + p.cpu_b;
        rows.push(row(
            "CPU-s per GB, 1 stream (app+backend+A+B) [processes+netns]",
            format!("{tg:.2} (A {:.2}, B {:.2})", p.cpu_a, p.cpu_b),
            format!("{:.2}", p.cpu_raw),
            format!("{:.1}x", tg / p.cpu_raw),
            "-",
            None,
        ));
        let m = &p.mem;
        let all = m.conns == MEM_CONNS;
        rows.push(row(
            &format!(
                "RSS per idle app conn, A+B, KiB [processes+netns, {} conns]",
                m.conns
            ),
            format!("{:.2}", m.per_conn_kib()),
            "-".into(),
            "-".into(),
            "<= 8 KiB",
            Some(all && m.per_conn_kib() <= 8.0),
        ));
        rows.push(row(
            &format!("RSS per pooled tunnel (incl. its ~{MEM_STREAMS_PER_TUNNEL} streams), KiB"),
            format!(
                "{:.0} ({} tunnels)",
                m.growth_kib() / m.tunnels.max(1.0),
                m.tunnels
            ),
            "-".into(),
            "-".into(),
            "-",
            None,
        ));
        let d = &p.mem_dests;
        rows.push(row(
            &format!(
                "idle conns to {MEM_DESTINATIONS} destinations: failed, tunnels, RSS per conn A+B KiB"
            ),
            format!(
                "{} of {MEM_CONNS}, {} tunnels, {:.2}",
                MEM_CONNS - d.conns,
                d.tunnels,
                d.per_conn_kib()
            ),
            "-".into(),
            "-".into(),
            "0 failed",
            Some(d.conns == MEM_CONNS),
        ));
        let t = &p.mem_tunnel;
        let k = MEM_STREAMS_PER_TUNNEL as f64;
        rows.push(row(
            &format!(
                "RSS per tunnel, fixed part, KiB [{} conns at 1 stream/tunnel]",
                t.conns
            ),
            format!(
                "{:.1}",
                (t.per_conn_kib() - m.per_conn_kib()) * k / (k - 1.0)
            ),
            "-".into(),
            "-".into(),
            "-",
            None,
        ));
    }
    println!(
        "\n== summary ({:.0} s total; load average at end {}) ==",
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    print_table(&rows);
    Ok(())
}
