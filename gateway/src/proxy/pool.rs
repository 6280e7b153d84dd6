//! The outbound tunnel pool, keyed by (source identity, destination
//! workload: uid, identity and HBONE address). The uid is part of the key so
//! a tunnel never outlives its workload: an IP reused by another pod, or a
//! replacement pod with the same identity, gets tunnels of its own.
//!
//! - Single-flight dialing per key: concurrent requests for a key with no
//!   usable tunnel wait for one dial instead of each dialing.
//! - At most `max_streams_per_tunnel` streams per tunnel; a full tunnel is
//!   used again as soon as one of its streams ends.
//! - A tunnel that received GOAWAY (or whose connection broke) takes no new
//!   streams; its open streams finish, then it closes.
//! - Tunnels idle for `idle_timeout` are closed.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use h2::{RecvStream, SendStream};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::time::Instant;
use tracing::{debug, info_span, warn, Instrument};

use crate::config::{HboneConfig, PoolConfig};
use crate::hbone::client::{self, DialError, StreamError};
use crate::hbone::client_io::GoawayFlag;
use crate::identity::SpiffeId;
use crate::proxy::congestion::Congestion;
use crate::proxy::origin::Origin;
use crate::shutdown::ShutdownWatch;
use crate::tls::TlsContext;

#[derive(Clone, Debug, Hash, PartialEq, Eq, Serialize)]
pub struct PoolKey {
    pub src: SpiffeId,
    /// The destination workload's uid (drains act on one workload's tunnels).
    pub dst_uid: String,
    pub dst: SpiffeId,
    /// The destination workload's HBONE address (`ip:15008`).
    pub dst_addr: SocketAddr,
    /// In-pod mode: the source pod's namespace (its tunnels leave with its
    /// own address and are never shared with another pod).
    pub src_netns: Option<crate::netns::NetnsId>,
}

/// Consecutive connect failures to one destination, reported to the drain engine.
#[derive(Clone, Debug)]
pub struct ConnectFailure {
    pub key: PoolKey,
    pub consecutive: u32,
    pub failing_for: Duration,
    pub last_error: String,
}

/// Exponential backoff a policy set for a destination.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackoffParams {
    pub initial: Duration,
    pub max: Duration,
    pub multiplier: f64,
    pub jitter: f64,
}

#[derive(Debug)]
struct DestState {
    consecutive: u32,
    first_failure: Instant,
    backoff: Option<BackoffParams>,
    /// Retries attempted under the current backoff.
    attempt: u32,
    until: Option<Instant>,
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("{addr} is backing off after repeated connect failures ({remaining_ms} ms left)")]
    BackingOff { addr: SocketAddr, remaining_ms: u64 },
    #[error("dial {addr}: {source}")]
    Dial { addr: SocketAddr, source: DialError },
    #[error("stream to {addr}: {source}")]
    Stream {
        addr: SocketAddr,
        source: StreamError,
    },
}

impl PoolError {
    pub fn reason(&self) -> &'static str {
        match self {
            PoolError::BackingOff { .. } => "backing_off",
            PoolError::Dial { source, .. } => source.reason(),
            PoolError::Stream { source, .. } => source.reason(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Default)]
struct PoolMetrics {
    tunnels: Gauge,
    opened: Counter,
    dial_failures: Family<ReasonLabel, Counter>,
    goaways_received: Counter,
    closed: Family<ReasonLabel, Counter>,
    backoffs: Counter,
    fast_failed: Counter,
}

impl PoolMetrics {
    fn register(registry: &mut Registry) -> Self {
        let m = PoolMetrics::default();
        let r = registry.sub_registry_with_prefix("pool");
        r.register(
            "tunnels",
            "Pooled outbound tunnels open now",
            m.tunnels.clone(),
        );
        r.register(
            "tunnels_opened",
            "Outbound tunnels dialed",
            m.opened.clone(),
        );
        r.register(
            "dial_failures",
            "Outbound tunnel dials that failed, by reason",
            m.dial_failures.clone(),
        );
        r.register(
            "goaways_received",
            "Pooled tunnels that received GOAWAY from the peer",
            m.goaways_received.clone(),
        );
        r.register(
            "tunnels_closed",
            "Pooled tunnels closed, by reason",
            m.closed.clone(),
        );
        r.register(
            "backoff_activations",
            "Backoffs a policy set on a destination after connect failures",
            m.backoffs.clone(),
        );
        r.register(
            "backoff_fast_failures",
            "Application connections refused at once because their destination backs off",
            m.fast_failed.clone(),
        );
        m
    }
}

/// One pooled tunnel.
pub struct Tunnel {
    pub id: u64,
    pub key: PoolKey,
    /// `None` once evicted: dropping the last handle makes h2 send GOAWAY and
    /// close the connection as soon as its streams end.
    send: Mutex<Option<SendRequest<Bytes>>>,
    streams: AtomicUsize,
    /// Open streams to the destination workload over all its tunnels
    /// (shared by them; Service endpoint choice reads it).
    to_workload: Arc<AtomicUsize>,
    streams_total: AtomicU64,
    goaway: AtomicBool,
    closed: AtomicBool,
    /// Set when the pool evicted it (idle or shutdown) rather than the peer closing it.
    evicted: AtomicBool,
    /// Close now, open streams or not (evict `now`).
    kill: tokio::sync::Notify,
    opened: Instant,
    idle_since: Mutex<Option<Instant>>,
    goaways_received: Counter,
    goaway_seen: GoawaySeen,
    /// Raised by the connection's reader when the peer's GOAWAY arrives.
    goaway_read: GoawayFlag,
}

impl Tunnel {
    pub fn streams(&self) -> usize {
        self.streams.load(Ordering::Acquire)
    }

    pub fn received_goaway(&self) -> bool {
        self.goaway.load(Ordering::Acquire)
    }

    /// Still connected and accepting new streams from the peer's point of view.
    fn usable(&self) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return false;
        }
        self.refresh_goaway();
        !self.goaway.load(Ordering::Acquire)
    }

    /// Notices a GOAWAY the tunnel's reader has seen (`hbone::client_io`):
    /// the driver calls this after every poll of the connection, checkout
    /// before using the tunnel. One atomic load while none arrived.
    fn refresh_goaway(&self) {
        if self.goaway_read.is_raised() {
            self.mark_goaway();
        }
    }

    fn mark_goaway(&self) {
        if !self.goaway.swap(true, Ordering::AcqRel) {
            self.goaways_received.inc();
            self.goaway_seen
                .lock()
                .unwrap()
                .insert(self.key.dst_uid.clone(), Instant::now());
            debug!(tunnel = self.id, "tunnel received GOAWAY; no new streams");
        }
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.send.lock().unwrap().take();
    }
}

/// A reserved stream slot on a tunnel; released on drop.
pub struct StreamSlot {
    tunnel: Arc<Tunnel>,
}

impl StreamSlot {
    pub fn tunnel(&self) -> &Arc<Tunnel> {
        &self.tunnel
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.tunnel.to_workload.fetch_sub(1, Ordering::AcqRel);
        if self.tunnel.streams.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.tunnel.idle_since.lock().unwrap() = Some(Instant::now());
        }
    }
}

#[derive(Default)]
struct KeyEntry {
    tunnels: Mutex<Vec<Arc<Tunnel>>>,
    dialing: tokio::sync::Mutex<()>,
}

pub struct Pool {
    tls: Arc<TlsContext>,
    hbone: HboneConfig,
    cfg: PoolConfig,
    /// Congestion control of the tunnels dialed (`tcp.tunnel_congestion_control`).
    tunnel_cc: Congestion,
    keys: Mutex<HashMap<PoolKey, Arc<KeyEntry>>>,
    /// Tunnels evicted "when idle" that still carry streams: no longer
    /// pooled (they take no new stream), listed until they close.
    draining: Mutex<Vec<Arc<Tunnel>>>,
    next_id: AtomicU64,
    metrics: PoolMetrics,
    dests: Mutex<HashMap<SocketAddr, DestState>>,
    failures: Mutex<Option<tokio::sync::mpsc::UnboundedSender<ConnectFailure>>>,
    /// When a tunnel to each destination workload (uid) last received
    /// GOAWAY: usually the earliest sign that it drains (Service endpoint
    /// choice skips it). Cleared when a new tunnel to it opens.
    goaway_seen: GoawaySeen,
    /// Destination uid → open streams over all its tunnels.
    by_workload: Mutex<HashMap<String, Arc<AtomicUsize>>>,
}

/// Destination uid → when a tunnel to it last received GOAWAY.
pub(crate) type GoawaySeen = Arc<Mutex<HashMap<String, Instant>>>;

/// An established CONNECT stream on a pooled tunnel.
pub struct PooledStream {
    pub send: SendStream<Bytes>,
    pub recv: RecvStream,
    pub slot: StreamSlot,
}

#[derive(Debug, Serialize)]
pub struct TunnelDump {
    pub id: u64,
    pub src: String,
    pub dst: String,
    pub dst_addr: SocketAddr,
    pub streams: usize,
    pub streams_total: u64,
    pub age_ms: u128,
    pub goaway_received: bool,
    /// `active`, `goaway-received` (the peer asked it to go away) or
    /// `draining` (evicted here; its open streams finish, then it closes).
    pub state: &'static str,
}

impl Pool {
    pub fn new(
        tls: Arc<TlsContext>,
        hbone: HboneConfig,
        cfg: PoolConfig,
        tunnel_cc: Congestion,
        registry: &mut Registry,
    ) -> Arc<Self> {
        Arc::new(Pool {
            tls,
            hbone,
            cfg,
            tunnel_cc,
            keys: Mutex::new(HashMap::new()),
            draining: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            metrics: PoolMetrics::register(registry),
            dests: Mutex::new(HashMap::new()),
            failures: Mutex::new(None),
            goaway_seen: Default::default(),
            by_workload: Default::default(),
        })
    }

    /// When a tunnel to workload `uid` received GOAWAY, if that was within
    /// `window` and no tunnel to it opened since.
    pub fn goaway_within(&self, uid: &str, window: Duration) -> Option<Instant> {
        let seen = *self.goaway_seen.lock().unwrap().get(uid)?;
        (seen.elapsed() < window).then_some(seen)
    }

    /// Whether new tunnels to `addr` fail fast (a policy's connect-failing backoff).
    pub fn is_backing_off(&self, addr: SocketAddr) -> bool {
        self.backing_off(addr).is_some()
    }

    /// Streams open now on tunnels (pooled or draining) to workload `uid`.
    pub fn open_streams_to(&self, uid: &str) -> usize {
        self.by_workload
            .lock()
            .unwrap()
            .get(uid)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// The shared open-stream counter of workload `uid`'s tunnels.
    fn workload_streams(&self, uid: &str) -> Arc<AtomicUsize> {
        self.by_workload
            .lock()
            .unwrap()
            .entry(uid.to_owned())
            .or_default()
            .clone()
    }

    /// Opens a CONNECT stream to `authority` through a tunnel for `key`,
    /// reusing a pooled tunnel when one has room.
    pub async fn connect(
        self: &Arc<Self>,
        key: &PoolKey,
        authority: SocketAddr,
    ) -> Result<PooledStream, PoolError> {
        self.connect_from(key, authority, &Origin::Node).await
    }

    /// [`Pool::connect`], dialing a new tunnel from `origin`'s namespace
    /// (`key.src_netns` must name the same one).
    pub async fn connect_from(
        self: &Arc<Self>,
        key: &PoolKey,
        authority: SocketAddr,
        origin: &Origin,
    ) -> Result<PooledStream, PoolError> {
        if let Some(remaining) = self.backing_off(key.dst_addr) {
            self.metrics.fast_failed.inc();
            return Err(PoolError::BackingOff {
                addr: key.dst_addr,
                remaining_ms: remaining.as_millis() as u64,
            });
        }
        let entry = self.entry(key);
        // A tunnel may turn out to have received GOAWAY between checkout and
        // use; such a stream never reached the peer, so retry a few times.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let slot = match checkout(&entry, self.cfg.max_streams_per_tunnel) {
                Some(slot) => slot,
                // Boxed: an async fn's state is as large as its largest await
                // point, and the dial (TLS handshake) would otherwise make every
                // idle connection's task ~4 KiB bigger though ~1 in 100 dials.
                None => Box::pin(self.dial_single_flight(key, &entry, origin)).await?,
            };
            let send = slot.tunnel.send.lock().unwrap().clone();
            let Some(send) = send else { continue };
            match client::connect_stream(send, authority, self.hbone.connect_timeout).await {
                Ok((send, recv)) => return Ok(PooledStream { send, recv, slot }),
                Err(e) if e.retryable() && attempts < 3 => {
                    debug!(error = %e, tunnel = slot.tunnel.id, "tunnel refused the stream; retrying on another");
                    slot.tunnel.mark_goaway();
                }
                Err(source) => {
                    return Err(PoolError::Stream {
                        addr: key.dst_addr,
                        source,
                    })
                }
            }
        }
    }

    fn entry(&self, key: &PoolKey) -> Arc<KeyEntry> {
        self.keys
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .clone()
    }

    async fn dial_single_flight(
        self: &Arc<Self>,
        key: &PoolKey,
        entry: &Arc<KeyEntry>,
        origin: &Origin,
    ) -> Result<StreamSlot, PoolError> {
        let _dialing = entry.dialing.lock().await;
        // Someone else may have dialed while we waited.
        if let Some(slot) = checkout(entry, self.cfg.max_streams_per_tunnel) {
            return Ok(slot);
        }
        let tcp = origin.connect(key.dst_addr, None, &self.tunnel_cc);
        let goaway_read = GoawayFlag::default();
        let (send, conn) = client::dial_over(
            &self.tls,
            &self.hbone,
            &key.src,
            &key.dst,
            key.dst_addr,
            tcp,
            goaway_read.clone(),
        )
        .await
        .map_err(|source| {
            self.metrics
                .dial_failures
                .get_or_create(&ReasonLabel {
                    reason: source.reason(),
                })
                .inc();
            self.dial_failed(key, &source.to_string());
            PoolError::Dial {
                addr: key.dst_addr,
                source,
            }
        })?;
        // Success ends any backoff for the destination.
        self.dests.lock().unwrap().remove(&key.dst_addr);
        let tunnel = Arc::new(Tunnel {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            key: key.clone(),
            send: Mutex::new(Some(send)),
            streams: AtomicUsize::new(1),
            to_workload: {
                let c = self.workload_streams(&key.dst_uid);
                c.fetch_add(1, Ordering::AcqRel);
                c
            },
            streams_total: AtomicU64::new(1),
            goaway: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            kill: tokio::sync::Notify::new(),
            opened: Instant::now(),
            idle_since: Mutex::new(None),
            goaways_received: self.metrics.goaways_received.clone(),
            goaway_seen: self.goaway_seen.clone(),
            goaway_read,
        });
        // The destination takes new tunnels again: whatever GOAWAY said is over.
        self.goaway_seen.lock().unwrap().remove(&key.dst_uid);
        self.metrics.opened.inc();
        self.metrics.tunnels.inc();
        entry.tunnels.lock().unwrap().push(tunnel.clone());
        self.spawn_driver(tunnel.clone(), entry.clone(), conn);
        Ok(StreamSlot { tunnel })
    }

    /// Drives the tunnel's connection and keepalive; removes it when it ends.
    fn spawn_driver(
        self: &Arc<Self>,
        tunnel: Arc<Tunnel>,
        entry: Arc<KeyEntry>,
        mut conn: client::ClientConnection,
    ) {
        let pool = self.clone();
        let span = info_span!("tunnel", id = tunnel.id, dst = %tunnel.key.dst_addr);
        tokio::spawn(
            async move {
                let ping = conn.ping_pong().expect("ping_pong is taken once");
                let keepalive = crate::hbone::keepalive::run(
                    ping,
                    pool.hbone.keepalive_interval,
                    pool.hbone.keepalive_timeout,
                );
                // Poll the connection, and after each poll check whether a
                // GOAWAY was read so the tunnel stops taking streams at once
                // (also on the poll that ends the connection: the GOAWAY and
                // the close may arrive together). One atomic load per poll.
                let watched = std::future::poll_fn(|cx| {
                    let r = std::pin::Pin::new(&mut conn).poll(cx);
                    tunnel.refresh_goaway();
                    r
                });
                let reason = tokio::select! {
                    r = watched => close_reason(&tunnel, r),
                    e = keepalive => {
                        warn!(error = %e, "closing dead tunnel");
                        "keepalive_timeout"
                    }
                    _ = tunnel.kill.notified() => "evicted_now",
                };
                if reason == "goaway" {
                    tunnel.mark_goaway();
                }
                tunnel.closed.store(true, Ordering::Release);
                tunnel.send.lock().unwrap().take();
                entry
                    .tunnels
                    .lock()
                    .unwrap()
                    .retain(|t| !Arc::ptr_eq(t, &tunnel));
                pool.draining
                    .lock()
                    .unwrap()
                    .retain(|t| !Arc::ptr_eq(t, &tunnel));
                pool.metrics.tunnels.dec();
                pool.metrics
                    .closed
                    .get_or_create(&ReasonLabel { reason })
                    .inc();
                debug!(reason, "tunnel closed");
            }
            .instrument(span),
        );
    }

    /// Closes tunnels idle for longer than the idle timeout. Runs until drained.
    pub async fn evict_idle(self: Arc<Self>, mut drain: ShutdownWatch) {
        let period =
            (self.cfg.idle_timeout / 4).clamp(Duration::from_millis(5), Duration::from_secs(30));
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = tick.tick() => self.evict_idle_once(),
                _ = drain.signaled() => return,
            }
        }
    }

    fn evict_idle_once(&self) {
        let now = Instant::now();
        for entry in self.entries() {
            let mut tunnels = entry.tunnels.lock().unwrap();
            tunnels.retain(|t| {
                let idle = t.streams() == 0
                    && t.idle_since
                        .lock()
                        .unwrap()
                        .is_some_and(|since| now.duration_since(since) >= self.cfg.idle_timeout);
                if idle {
                    debug!(tunnel = t.id, "evicting idle tunnel");
                    t.evict();
                }
                !idle
            });
        }
        self.by_workload
            .lock()
            .unwrap()
            .retain(|_, c| Arc::strong_count(c) > 1 || c.load(Ordering::Acquire) > 0);
        self.goaway_seen
            .lock()
            .unwrap()
            .retain(|_, at| at.elapsed() < Duration::from_secs(3600));
        // Forget a key only when it has no tunnel and nothing holds its
        // entry: a connect holds it from looking the key up until its new
        // tunnel is pooled, and removing the entry in between would orphan
        // that tunnel (the next connection would dial again).
        self.keys
            .lock()
            .unwrap()
            .retain(|_, e| Arc::strong_count(e) > 1 || !e.tunnels.lock().unwrap().is_empty());
    }

    /// Evicts every pooled tunnel: idle ones close at once, busy ones when
    /// their streams end. Used at shutdown.
    pub fn evict_all(&self) {
        self.evict_matching(false, |_| true);
    }

    /// Where consecutive connect failures are reported (the drain engine).
    pub fn report_failures_to(&self, tx: tokio::sync::mpsc::UnboundedSender<ConnectFailure>) {
        *self.failures.lock().unwrap() = Some(tx);
    }

    fn dial_failed(&self, key: &PoolKey, error: &str) {
        let now = Instant::now();
        let report = {
            let mut dests = self.dests.lock().unwrap();
            let d = dests.entry(key.dst_addr).or_insert(DestState {
                consecutive: 0,
                first_failure: now,
                backoff: None,
                attempt: 0,
                until: None,
            });
            d.consecutive += 1;
            if let Some(b) = d.backoff {
                // Still failing under backoff: wait longer before the next try.
                d.attempt += 1;
                d.until = Some(now + backoff_wait(b, d.attempt));
            }
            ConnectFailure {
                key: key.clone(),
                consecutive: d.consecutive,
                failing_for: now.duration_since(d.first_failure),
                last_error: error.to_owned(),
            }
        };
        if let Some(tx) = self.failures.lock().unwrap().as_ref() {
            let _ = tx.send(report);
        }
    }

    /// Starts (or replaces) a backoff for `addr`: new application connections
    /// to it fail at once until the wait is over; a successful connect ends it.
    pub fn set_backoff(&self, addr: SocketAddr, params: BackoffParams) {
        let now = Instant::now();
        let mut dests = self.dests.lock().unwrap();
        let d = dests.entry(addr).or_insert(DestState {
            consecutive: 0,
            first_failure: now,
            backoff: None,
            attempt: 0,
            until: None,
        });
        d.backoff = Some(params);
        d.attempt = 1;
        d.until = Some(now + backoff_wait(params, 1));
        self.metrics.backoffs.inc();
    }

    fn backing_off(&self, addr: SocketAddr) -> Option<Duration> {
        let dests = self.dests.lock().unwrap();
        let until = dests.get(&addr)?.until?;
        until.checked_duration_since(Instant::now())
    }

    /// Evicts the tunnels whose key matches: they take no new streams and
    /// close (client-side GOAWAY) when their streams end — or at once when
    /// `now`, resetting open streams. Returns how many.
    pub fn evict_matching(&self, now: bool, matches: impl Fn(&PoolKey) -> bool) -> usize {
        let mut evicted = Vec::new();
        for entry in self.entries() {
            entry.tunnels.lock().unwrap().retain(|t| {
                if !matches(&t.key) {
                    return true;
                }
                t.evict();
                evicted.push(t.clone());
                false
            });
        }
        if now {
            // Draining tunnels evicted earlier "when idle" are cut too.
            self.draining.lock().unwrap().retain(|t| {
                if !matches(&t.key) {
                    return true;
                }
                t.kill.notify_one();
                false
            });
        }
        for t in &evicted {
            if now {
                t.kill.notify_one();
            } else if t.streams() > 0 {
                self.keep_draining(t);
            }
        }
        evicted.len()
    }

    /// Lists an evicted tunnel with open streams until its driver ends it.
    fn keep_draining(&self, t: &Arc<Tunnel>) {
        self.draining.lock().unwrap().push(t.clone());
        // The driver sets `closed` before it removes the tunnel from
        // `draining` (under the same lock): if it ended meanwhile, undo.
        if t.closed.load(Ordering::Acquire) {
            self.draining.lock().unwrap().retain(|d| !Arc::ptr_eq(d, t));
        }
    }

    fn entries(&self) -> Vec<Arc<KeyEntry>> {
        self.keys.lock().unwrap().values().cloned().collect()
    }

    pub fn tunnels(&self) -> Vec<Arc<Tunnel>> {
        self.entries()
            .iter()
            .flat_map(|e| e.tunnels.lock().unwrap().clone())
            .collect()
    }

    /// Evicted tunnels whose streams still run.
    pub fn draining(&self) -> Vec<Arc<Tunnel>> {
        self.draining.lock().unwrap().clone()
    }

    /// Pooled and draining tunnels (`/config_dump`).
    pub fn dump(&self) -> Vec<TunnelDump> {
        let now = Instant::now();
        let pooled = self.tunnels().into_iter().map(|t| {
            let state = if t.received_goaway() {
                "goaway-received"
            } else {
                "active"
            };
            (t, state)
        });
        let draining = self.draining().into_iter().map(|t| (t, "draining"));
        pooled
            .chain(draining)
            .map(|(t, state)| TunnelDump {
                id: t.id,
                src: t.key.src.to_string(),
                dst: t.key.dst.to_string(),
                dst_addr: t.key.dst_addr,
                streams: t.streams(),
                streams_total: t.streams_total.load(Ordering::Relaxed),
                age_ms: now.duration_since(t.opened).as_millis(),
                goaway_received: t.received_goaway(),
                state,
            })
            .collect()
    }
}

/// Why a tunnel's connection ended (the `tunnels_closed` reason). A
/// transport error after the peer's GOAWAY is the peer closing as it
/// announced (its final close may cross our last write and come back as a
/// reset or broken pipe): `goaway`, not `error`.
fn close_reason(tunnel: &Tunnel, r: Result<(), h2::Error>) -> &'static str {
    match r {
        // Our own GOAWAY after eviction may cross the peer's.
        _ if tunnel.evicted.load(Ordering::Acquire) => "evicted",
        Ok(()) => "closed",
        Err(e) if e.is_go_away() => "goaway",
        Err(e) if e.is_io() && tunnel.received_goaway() => {
            debug!(error = %e, "tunnel closed by the peer after its GOAWAY");
            "goaway"
        }
        Err(e) => {
            debug!(error = %e, "tunnel failed");
            "error"
        }
    }
}

/// Reserves a slot on the first usable tunnel with room.
fn checkout(entry: &KeyEntry, max: usize) -> Option<StreamSlot> {
    let tunnels = entry.tunnels.lock().unwrap();
    for t in tunnels.iter() {
        if !t.usable() {
            continue;
        }
        let reserved = t
            .streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        if reserved.is_ok() {
            t.to_workload.fetch_add(1, Ordering::AcqRel);
            t.streams_total.fetch_add(1, Ordering::Relaxed);
            *t.idle_since.lock().unwrap() = None;
            return Some(StreamSlot { tunnel: t.clone() });
        }
    }
    None
}

/// The n-th wait (n from 1): min(initial * multiplier^(n-1), max), randomised
/// by ± jitter × that value.
fn backoff_wait(b: BackoffParams, n: u32) -> Duration {
    let base = b.initial.as_secs_f64() * b.multiplier.powi(n.saturating_sub(1) as i32);
    let base = base.min(b.max.as_secs_f64());
    // A cheap, good-enough random number: the clock's nanoseconds, mixed.
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(1)
        | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    let unit = (x % 10_000) as f64 / 10_000.0 * 2.0 - 1.0; // [-1, 1)
    Duration::from_secs_f64((base * (1.0 + b.jitter * unit)).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_max_within_jitter() {
        let b = BackoffParams {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
            multiplier: 2.0,
            jitter: 0.2,
        };
        for (n, base) in [(1, 100.0), (2, 200.0), (3, 400.0), (5, 1000.0), (9, 1000.0)] {
            let w = backoff_wait(b, n).as_secs_f64() * 1000.0;
            assert!(
                w >= base * 0.8 - 1e-6 && w <= base * 1.2 + 1e-6,
                "n={n}: {w} vs {base}"
            );
        }
    }
}

#[cfg(test)]
mod key_and_limit_tests;
