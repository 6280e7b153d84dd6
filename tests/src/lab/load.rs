//! The client pod's load: `rate` new connections per second, each one short
//! HTTP/1.1 request/response (`Connection: close`), plus long-lived
//! keep-alive connections sending a request every ~100 ms and reconnecting
//! when the server closes them. Each connection picks its endpoint from the
//! ready endpoints, as a Service would (tidegate has no Service support yet,
//! issue 15, so the client chooses): both server pods before the
//! termination starts, only ready ones after.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A server pod as the client sees it: its name (for the report) and address.
pub type Endpoint = (&'static str, SocketAddr);

/// Bound on one request (connect, send, response).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const LONG_PERIOD: Duration = Duration::from_millis(100);
/// Failure messages kept (the first ones) for the report.
const KEEP_FAILURES: usize = 20;

#[derive(Default)]
pub struct Counts {
    pub short_ok: AtomicU64,
    pub short_failed: AtomicU64,
    pub long_ok: AtomicU64,
    pub long_failed: AtomicU64,
    /// Long-stream connections opened (first ones and reconnections).
    pub long_connects: AtomicU64,
    /// The first failures, each with its time since the load started.
    pub failures: Mutex<Vec<String>>,
    /// When the load started: failures and the scenarios' steps are timed
    /// from it.
    pub started: std::sync::OnceLock<std::time::Instant>,
}

impl Counts {
    fn fail(&self, what: String) {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if f.len() < KEEP_FAILURES {
            f.push(format!("at {}: {what}", self.since_start()));
        }
    }

    /// Time since the load started, as the report prints it (`12.345 s`).
    pub fn since_start(&self) -> String {
        let t = self.started.get().map(|s| s.elapsed()).unwrap_or_default();
        format!("{:.3} s", t.as_secs_f64())
    }
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Acquire)
    }
}

/// The running load; stopped (and awaited) by [`Load::stop`].
pub struct Load {
    pub counts: Arc<Counts>,
    endpoints: Arc<Mutex<Vec<Endpoint>>>,
    stop: watch::Sender<bool>,
    done: tokio::task::JoinHandle<()>,
    pod: Handle,
}

impl Load {
    /// Starts the load on `pod` (a runtime inside the client pod's namespace).
    pub fn start(pod: &Handle, endpoints: Vec<Endpoint>, rate: u32, long_streams: u32) -> Load {
        let counts = Arc::new(Counts::default());
        let _ = counts.started.set(std::time::Instant::now());
        let endpoints = Arc::new(Mutex::new(endpoints));
        let (stop, stopped) = watch::channel(false);
        let (c, e) = (counts.clone(), endpoints.clone());
        let done = pod.spawn(async move {
            let mut tasks = JoinSet::new();
            for i in 0..long_streams {
                tasks.spawn(long_stream(
                    i as usize,
                    e.clone(),
                    c.clone(),
                    stopped.clone(),
                ));
            }
            short_requests(rate, e, c, stopped).await;
            while tasks.join_next().await.is_some() {}
        });
        Load {
            counts,
            endpoints,
            stop,
            done,
            pod: pod.clone(),
        }
    }

    /// The endpoints new connections choose from from now on.
    pub fn set_endpoints(&self, endpoints: Vec<Endpoint>) {
        *self.endpoints.lock().unwrap_or_else(|e| e.into_inner()) = endpoints;
    }

    /// [`Load::set_endpoints`] once `lag` has passed (on the load's runtime).
    pub fn set_endpoints_after(&self, lag: Duration, endpoints: Vec<Endpoint>) {
        let e = self.endpoints.clone();
        self.pod.spawn(async move {
            tokio::time::sleep(lag).await;
            *e.lock().unwrap_or_else(|e| e.into_inner()) = endpoints;
        });
    }

    /// Stops sending and waits for the requests in flight (each bounded).
    pub async fn stop(self) -> Arc<Counts> {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(REQUEST_TIMEOUT * 2, self.done).await;
        self.counts
    }
}

fn pick(endpoints: &Mutex<Vec<Endpoint>>, n: usize) -> Option<Endpoint> {
    let e = endpoints.lock().unwrap_or_else(|e| e.into_inner());
    (!e.is_empty()).then(|| e[n % e.len()])
}

async fn short_requests(
    rate: u32,
    endpoints: Arc<Mutex<Vec<Endpoint>>>,
    counts: Arc<Counts>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut inflight = JoinSet::new();
    let next = AtomicUsize::new(0);
    // Pacing of the load generator (an interval, not a wait for an event).
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            _ = tick.tick() => {}
            Some(_) = inflight.join_next() => continue,
        }
        if rate == 0 {
            continue;
        }
        let Some((name, dst)) = pick(&endpoints, next.fetch_add(1, Ordering::Relaxed)) else {
            continue;
        };
        let c = counts.clone();
        inflight.spawn(async move {
            match tokio::time::timeout(REQUEST_TIMEOUT, short_request(dst)).await {
                Ok(Ok(())) => {
                    c.short_ok.fetch_add(1, Ordering::AcqRel);
                }
                Ok(Err(e)) => {
                    c.short_failed.fetch_add(1, Ordering::AcqRel);
                    c.fail(format!("short to {name}: {e}"));
                }
                Err(_) => {
                    c.short_failed.fetch_add(1, Ordering::AcqRel);
                    c.fail(format!(
                        "short to {name}: no response within {REQUEST_TIMEOUT:?}"
                    ));
                }
            }
        });
    }
    while inflight.join_next().await.is_some() {}
}

async fn short_request(dst: SocketAddr) -> Result<(), String> {
    let tcp = TcpStream::connect(dst)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut io = BufReader::new(tcp);
    io.get_mut()
        .write_all(b"GET /short HTTP/1.1\r\nHost: server\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| format!("write: {e}"))?;
    read_response(&mut io).await?;
    Ok(())
}

/// One long-lived connection (re-opened whenever it ends).
async fn long_stream(
    index: usize,
    endpoints: Arc<Mutex<Vec<Endpoint>>>,
    counts: Arc<Counts>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(LONG_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn: Option<(&'static str, BufReader<TcpStream>)> = None;
    let mut connects = index;
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = tick.tick() => {}
        }
        if conn.is_none() {
            let Some((name, dst)) = pick(&endpoints, connects) else {
                continue;
            };
            connects += 1;
            counts.long_connects.fetch_add(1, Ordering::AcqRel);
            match tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(dst)).await {
                Ok(Ok(tcp)) => {
                    let _ = tcp.set_nodelay(true);
                    conn = Some((name, BufReader::new(tcp)));
                }
                Ok(Err(e)) => {
                    counts.long_failed.fetch_add(1, Ordering::AcqRel);
                    counts.fail(format!("long {index} to {name}: connect: {e}"));
                    continue;
                }
                Err(_) => {
                    counts.long_failed.fetch_add(1, Ordering::AcqRel);
                    counts.fail(format!("long {index} to {name}: connect timed out"));
                    continue;
                }
            }
        }
        let (name, io) = conn.as_mut().expect("connected above");
        let name = *name;
        let round = async {
            io.get_mut()
                .write_all(b"GET /long HTTP/1.1\r\nHost: server\r\n\r\n")
                .await
                .map_err(|e| format!("write: {e}"))?;
            read_response(io).await
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, round).await {
            Ok(Ok(close)) => {
                counts.long_ok.fetch_add(1, Ordering::AcqRel);
                if close {
                    conn = None;
                }
            }
            Ok(Err(e)) => {
                counts.long_failed.fetch_add(1, Ordering::AcqRel);
                counts.fail(format!("long {index} to {name}: {e}"));
                conn = None;
            }
            Err(_) => {
                counts.long_failed.fetch_add(1, Ordering::AcqRel);
                counts.fail(format!(
                    "long {index} to {name}: no response within {REQUEST_TIMEOUT:?}"
                ));
                conn = None;
            }
        }
    }
}

/// Reads one response (status 200, `Content-Length` body); returns whether
/// the server said `Connection: close`.
async fn read_response(io: &mut BufReader<TcpStream>) -> Result<bool, String> {
    let mut line = String::new();
    let n = io
        .read_line(&mut line)
        .await
        .map_err(|e| format!("read: {e}"))?;
    if n == 0 {
        return Err("connection closed before the response".into());
    }
    if !line.starts_with("HTTP/1.1 200") {
        return Err(format!("status line {:?}", line.trim_end()));
    }
    let (mut len, mut close) = (None, false);
    loop {
        line.clear();
        let n = io
            .read_line(&mut line)
            .await
            .map_err(|e| format!("read headers: {e}"))?;
        if n == 0 {
            return Err("connection closed in the response head".into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        match k.trim().to_ascii_lowercase().as_str() {
            "content-length" => len = v.trim().parse::<usize>().ok(),
            "connection" => close = v.trim().eq_ignore_ascii_case("close"),
            _ => {}
        }
    }
    let len = len.ok_or("response without content-length")?;
    let mut body = vec![0; len];
    io.read_exact(&mut body)
        .await
        .map_err(|e| format!("read body: {e}"))?;
    if !body.starts_with(b"ok from ") {
        return Err(format!(
            "unexpected body {:?}",
            String::from_utf8_lossy(&body)
        ));
    }
    Ok(close)
}
