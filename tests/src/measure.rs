//! The data-path measurements the benches share: an echo and a sink server
//! inside a pod, and from a client (in whatever namespace it runs)
//! single-stream throughput, warm 1 KiB request/response latency and new
//! connections per second — every loop bounded in count and in time.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::netns::{NsThread, STEP};

/// The echo server's port.
pub const ECHO: u16 = 8080;
/// The sink's port: it answers the byte count once the client half-closes.
pub const SINK: u16 = 8081;
const TP_MAX_BYTES: u64 = 1 << 30;
const TP_MAX_TIME: Duration = Duration::from_secs(3);
const RR_SIZE: usize = 1024;
/// Round trips before the timed ones (not in the latencies, but served).
pub const RR_WARMUP: usize = 200;
const RR_MAX: usize = 20_000;
const RR_MAX_TIME: Duration = Duration::from_secs(2);
const CONN_CONCURRENCY: usize = 8;
const CONN_MAX_TIME: Duration = Duration::from_secs(3);

/// One round's figures for one path.
#[derive(Clone, Debug)]
pub struct Figures {
    pub mb_s: f64,
    /// Bytes the throughput run moved (the sink counted exactly these).
    pub bytes: u64,
    /// From the first write until the sink's count arrived.
    pub secs: f64,
    pub rr_p50_us: f64,
    pub rr_p99_us: f64,
    pub conns_s: f64,
    pub conn_p50_us: f64,
    pub conn_p99_us: f64,
}

/// The `q` quantile of sorted durations, in µs (NaN when empty).
pub fn pct(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// The median of `f` over rounds.
pub fn median<T>(rounds: &[T], f: impl Fn(&T) -> f64) -> f64 {
    let mut x: Vec<f64> = rounds.iter().map(f).collect();
    x.sort_by(|a, b| a.total_cmp(b));
    x.get(x.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Echo on [`ECHO`], and on [`SINK`] a sink that answers the byte count (8
/// bytes, big-endian) once the client half-closes; both inside `pod`.
pub async fn servers(pod: &NsThread) {
    pod.run("servers", STEP, async {
        let echo = listen(ECHO).await;
        let sink = listen(SINK).await;
        tokio::spawn(async move {
            while let Ok((tcp, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let _ = tcp.set_nodelay(true);
                    let (mut r, mut w) = tcp.into_split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = sink.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 256 << 10];
                    let mut n = 0u64;
                    while let Ok(k) = tcp.read(&mut buf).await {
                        if k == 0 {
                            break;
                        }
                        n += k as u64;
                    }
                    let _ = tcp.write_all(&n.to_be_bytes()).await;
                });
            }
        });
    })
    .await;
}

/// A listener on `port` for both families (`[::]`, dual-stack), or on
/// `0.0.0.0` where the namespace has no IPv6.
async fn listen(port: u16) -> TcpListener {
    match TcpListener::bind((Ipv6Addr::UNSPECIFIED, port)).await {
        Ok(l) => l,
        Err(_) => TcpListener::bind(("0.0.0.0", port)).await.unwrap(),
    }
}

impl Figures {
    /// From what [`throughput`], [`warm_rr`] and [`new_conns`] returned.
    pub fn new(
        (bytes, secs): (u64, f64),
        rr: &[Duration],
        (conns_s, conns): (f64, &[Duration]),
    ) -> Figures {
        Figures {
            mb_s: bytes as f64 / secs / 1e6,
            bytes,
            secs,
            rr_p50_us: pct(rr, 0.5),
            rr_p99_us: pct(rr, 0.99),
            conns_s,
            conn_p50_us: pct(conns, 0.5),
            conn_p99_us: pct(conns, 0.99),
        }
    }
}

/// Throughput, warm RR and new connections/s against the [`servers`] at `ip`.
pub async fn measure(ip: impl Into<IpAddr>) -> Result<Figures, String> {
    let ip: IpAddr = ip.into();
    let tp = throughput(ip).await?;
    let rr = warm_rr(ip).await?;
    let (conns_s, conns) = new_conns(ip).await?;
    Ok(Figures::new(tp, &rr, (conns_s, &conns)))
}

fn err(what: &'static str) -> impl Fn(std::io::Error) -> String {
    move |x| format!("{what}: {x}")
}

/// One direction into the sink: (bytes the sink counted, seconds).
pub async fn throughput(ip: impl Into<IpAddr>) -> Result<(u64, f64), String> {
    let ip: IpAddr = ip.into();
    let mut tcp = TcpStream::connect((ip, SINK))
        .await
        .map_err(err("connect sink"))?;
    let chunk = vec![0x5au8; 256 << 10];
    let started = Instant::now();
    let mut sent = 0u64;
    while sent < TP_MAX_BYTES && started.elapsed() < TP_MAX_TIME {
        tcp.write_all(&chunk).await.map_err(err("write"))?;
        sent += chunk.len() as u64;
    }
    tcp.shutdown().await.map_err(err("shutdown"))?;
    let mut count = [0u8; 8];
    tcp.read_exact(&mut count)
        .await
        .map_err(err("sink count"))?;
    let secs = started.elapsed().as_secs_f64();
    if u64::from_be_bytes(count) != sent {
        return Err(format!(
            "sink counted {} of {sent} bytes",
            u64::from_be_bytes(count)
        ));
    }
    Ok((sent, secs))
}

/// Warm 1 KiB request/response on one connection: sorted latencies.
pub async fn warm_rr(ip: impl Into<IpAddr>) -> Result<Vec<Duration>, String> {
    let ip: IpAddr = ip.into();
    let mut tcp = TcpStream::connect((ip, ECHO))
        .await
        .map_err(err("connect echo"))?;
    tcp.set_nodelay(true).map_err(err("nodelay"))?;
    let out: Vec<u8> = (0..RR_SIZE).map(|i| (i % 251) as u8).collect();
    let mut back = vec![0u8; RR_SIZE];
    let mut lat = Vec::new();
    let started = Instant::now();
    for i in 0..RR_WARMUP + RR_MAX {
        if started.elapsed() > RR_MAX_TIME {
            break;
        }
        let t = Instant::now();
        tcp.write_all(&out).await.map_err(err("rr write"))?;
        tcp.read_exact(&mut back).await.map_err(err("rr read"))?;
        if back != out {
            return Err(format!(
                "round trip {i}: the echo differs from what was sent"
            ));
        }
        if i >= RR_WARMUP {
            lat.push(t.elapsed());
        }
    }
    lat.sort();
    Ok(lat)
}

/// New connections per second from [`CONN_CONCURRENCY`] workers, each with
/// one 1 KiB round trip: (rate, sorted latencies).
pub async fn new_conns(ip: impl Into<IpAddr>) -> Result<(f64, Vec<Duration>), String> {
    let ip: IpAddr = ip.into();
    let deadline = Instant::now() + CONN_MAX_TIME;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CONN_CONCURRENCY {
        tasks.spawn(async move {
            let mut lat = Vec::new();
            let out = vec![9u8; RR_SIZE];
            let mut back = vec![0u8; RR_SIZE];
            while Instant::now() < deadline {
                let t = Instant::now();
                let mut tcp = TcpStream::connect((ip, ECHO))
                    .await
                    .map_err(|x| format!("connect: {x}"))?;
                tcp.write_all(&out)
                    .await
                    .map_err(|x| format!("write: {x}"))?;
                tcp.read_exact(&mut back)
                    .await
                    .map_err(|x| format!("read: {x}"))?;
                drop(tcp);
                lat.push(t.elapsed());
            }
            Ok::<_, String>(lat)
        });
    }
    let started = Instant::now();
    let mut all = Vec::new();
    while let Some(r) = tasks.join_next().await {
        all.extend(r.map_err(|x| x.to_string())??);
    }
    let rate = all.len() as f64
        / started
            .elapsed()
            .as_secs_f64()
            .max(CONN_MAX_TIME.as_secs_f64());
    all.sort();
    Ok((rate, all))
}

/// Opens `n` connections to the echo server at `ip` (each proven with a
/// one-byte round trip, `concurrency` at a time) and returns them, idle.
pub async fn idle_conns(
    ip: impl Into<IpAddr>,
    n: usize,
    concurrency: usize,
) -> Result<Vec<TcpStream>, String> {
    let ip: IpAddr = ip.into();
    let dst = SocketAddr::new(ip, ECHO);
    let mut held = Vec::with_capacity(n);
    let mut tasks = tokio::task::JoinSet::new();
    let mut started = 0;
    while held.len() < n {
        while started < n && tasks.len() < concurrency {
            started += 1;
            tasks.spawn(async move {
                let mut tcp = TcpStream::connect(dst)
                    .await
                    .map_err(|x| format!("connect: {x}"))?;
                tcp.write_all(b"x")
                    .await
                    .map_err(|x| format!("write: {x}"))?;
                let mut b = [0u8; 1];
                tcp.read_exact(&mut b)
                    .await
                    .map_err(|x| format!("read: {x}"))?;
                Ok::<_, String>(tcp)
            });
        }
        match tasks.join_next().await {
            Some(r) => held.push(r.map_err(|x| x.to_string())??),
            None => break,
        }
    }
    Ok(held)
}

/// A new connection (and a 1-byte echo round trip, 1 s at most) to `dst`
/// every `every` until `stop` turns true: when each started and whether it
/// worked, in order. Run inside the client pod; what a gateway restart
/// costs is read from it by [`Restart::from_load`].
pub async fn connection_every(
    dst: SocketAddr,
    every: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<(Instant, bool)> {
    connection_every_why(dst, every, stop)
        .await
        .into_iter()
        .map(|(at, r)| (at, r.is_ok()))
        .collect()
}

/// [`connection_every`], keeping each failure's error: which step failed
/// (`connect`, `write`, `read`, or the 1 s `timeout`) and the OS error.
pub async fn connection_every_why(
    dst: SocketAddr,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<(Instant, Result<(), String>)> {
    let mut tick = tokio::time::interval(every);
    let mut conns = tokio::task::JoinSet::new();
    while !*stop.borrow() {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        conns.spawn(async move {
            let at = Instant::now();
            let tried = tokio::time::timeout(Duration::from_secs(1), async {
                let mut t = TcpStream::connect(dst)
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                t.write_all(b"x").await.map_err(|e| format!("write: {e}"))?;
                let mut b = [0u8; 1];
                t.read_exact(&mut b)
                    .await
                    .map_err(|e| format!("read: {e}"))?;
                Ok::<_, String>(())
            })
            .await;
            (at, tried.unwrap_or_else(|_| Err("timeout".to_owned())))
        });
    }
    let mut seen = Vec::new();
    while let Some(r) = conns.join_next().await {
        seen.push(r.expect("connection task"));
    }
    seen.sort_by_key(|(at, _)| *at);
    seen
}

/// What a stop-and-start of a gateway cost a client's new connections.
#[derive(Clone, Copy, Debug)]
pub struct Restart {
    pub connections: usize,
    pub failed: usize,
    /// From the last connection that worked before the first failure to
    /// the first that worked after the last one (zero without failures).
    pub gap: Duration,
    /// From the old gateway's exit to the first connection that worked.
    pub served_after: Duration,
}

impl Restart {
    /// Reads [`connection_every`]'s record; `gone`: when the old gateway
    /// had exited.
    pub fn from_load(seen: &[(Instant, bool)], gone: Instant) -> Restart {
        let failed: Vec<Instant> = seen
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(at, _)| *at)
            .collect();
        let before = failed
            .first()
            .and_then(|f| seen.iter().rev().find(|(at, ok)| *ok && at < f))
            .map(|(at, _)| *at);
        let after = seen
            .iter()
            .find(|(at, ok)| *ok && failed.last().is_none_or(|l| at > l))
            .map(|(at, _)| *at);
        let served_after = seen
            .iter()
            .find(|(at, ok)| *ok && *at >= gone)
            .map_or(Duration::ZERO, |(at, _)| at.duration_since(gone));
        Restart {
            connections: seen.len(),
            failed: failed.len(),
            gap: match (before, after) {
                (Some(b), Some(a)) => a.duration_since(b),
                _ => Duration::ZERO,
            },
            served_after,
        }
    }
}
