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
use h2::{RecvStream, SendStream};
use http::HeaderValue;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::time::Instant;
use tracing::{debug, info_span, warn, Instrument};

use crate::config::{HboneConfig, PoolConfig};
use crate::proxy::congestion::Congestion;
use crate::proxy::origin::Origin;
use tidegate_base::shutdown::ShutdownWatch;
use tidegate_base::sync::Locked;
use tidegate_protocol::hbone::client::{self, DialError, StreamError};
use tidegate_protocol::hbone::client_io::GoawayFlag;
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::TlsContext;

mod book;
mod dump;
mod metrics;
mod probe;
mod tunnel;

pub use book::{BackoffParams, ConnectFailure};
pub use dump::TunnelDump;
pub use probe::OnBackoff;
pub use tunnel::{StreamSlot, Tunnel};

use book::Book;
use metrics::{PoolMetrics, ReasonLabel};
use tunnel::KeyEntry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, Serialize)]
pub struct PoolKey {
    pub src: SpiffeId,
    /// The destination workload's uid (drains act on one workload's tunnels).
    pub dst_uid: String,
    pub dst: SpiffeId,
    /// Other identities the destination may present: those its Service
    /// vouches for (istiod's `subject_alt_names`; usually none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub dst_also: Vec<SpiffeId>,
    /// The destination workload's HBONE address (`ip:15008`).
    pub dst_addr: SocketAddr,
    /// In-pod mode: the source pod's namespace (its tunnels leave with its
    /// own address and are never shared with another pod).
    pub src_netns: Option<tidegate_netns::namespace::NetnsId>,
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

/// Whether a CONNECT's failure says its workload takes no connection now:
/// its gateway answered 5xx (503: it could not reach the application),
/// reset the stream or the tunnel, or did not answer in time. A refusal
/// by authorization (401, 403) or a GOAWAY (a drain, skipped on its own)
/// says nothing of the kind.
fn says_failing(e: &StreamError) -> bool {
    match e {
        StreamError::Status { status, .. } => status.is_server_error(),
        StreamError::H2(h) => !h.is_go_away() && h.reason() != Some(h2::Reason::REFUSED_STREAM),
        StreamError::Timeout(_) => true,
    }
}

impl PoolError {
    /// Whether the destination's endpoint takes no connection now (the
    /// failures [`Pool`] records for `outbound.failing_skip`, and a pick
    /// still backing off): another endpoint may take the connection. A
    /// refusal by authorization or a GOAWAY is no such failure.
    pub fn endpoint_failed(&self) -> bool {
        match self {
            PoolError::BackingOff { .. } | PoolError::Dial { .. } => true,
            PoolError::Stream { source, .. } => says_failing(source),
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            PoolError::BackingOff { .. } => "backing_off",
            PoolError::Dial { source, .. } => source.reason(),
            PoolError::Stream { source, .. } => source.reason(),
        }
    }
}

pub struct Pool {
    tls: Arc<TlsContext>,
    hbone: tidegate_protocol::hbone::Settings,
    cfg: PoolConfig,
    /// Congestion control of the tunnels dialed (`tcp.tunnel_congestion_control`).
    tunnel_cc: Congestion,
    /// Outer lock: a key's `tunnels` are taken under it, never the other
    /// way round (then the book).
    keys: Mutex<HashMap<PoolKey, Arc<KeyEntry>>>,
    next_id: AtomicU64,
    metrics: PoolMetrics,
    /// Tunnels evicted "when idle" that still carry streams: no longer
    /// pooled (they take no new stream), listed until they close.
    draining: Mutex<Vec<Arc<Tunnel>>>,
    /// What the pool knows about destinations, under one lock (`book.rs`).
    book: Arc<Mutex<Book>>,
    /// Whether the book holds a failing workload (written under its lock).
    any_failing: AtomicBool,
    /// Notified when a backoff's probe ends (`probe.rs`).
    probe_ended: Arc<tokio::sync::Notify>,
}

/// An established CONNECT stream on a pooled tunnel.
pub struct PooledStream {
    pub send: SendStream<Bytes>,
    pub recv: RecvStream,
    pub slot: StreamSlot,
}

impl Pool {
    /// `failures`: where consecutive connect failures are reported (the
    /// drain engine's `watch_connect_failures`), or nowhere.
    pub fn new(
        tls: Arc<TlsContext>,
        hbone: HboneConfig,
        cfg: PoolConfig,
        tunnel_cc: Congestion,
        failures: Option<tokio::sync::mpsc::UnboundedSender<ConnectFailure>>,
        registry: &mut Registry,
    ) -> Arc<Self> {
        Arc::new(Pool {
            tls,
            hbone: hbone.settings(),
            cfg,
            tunnel_cc,
            keys: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            metrics: PoolMetrics::register(registry),
            draining: Mutex::new(Vec::new()),
            book: Arc::new(Mutex::new(Book::reporting_to(failures))),
            any_failing: AtomicBool::new(false),
            probe_ended: Default::default(),
        })
    }

    /// When a tunnel to workload `uid` received GOAWAY, if that was within
    /// `window` and no tunnel to it opened since.
    pub fn goaway_within(&self, uid: &str, window: Duration) -> Option<Instant> {
        self.book.locked().goaway_within(uid, window)
    }

    /// Why a new connection should pass over workload `uid` — its gateway
    /// at `addrs[0]` (`ip:15008`), its application at `addrs[1]` — now, if
    /// it should (one look under the book's lock):
    /// - `goaway_received`: a tunnel to it received GOAWAY within
    ///   `goaway_skip` (0: never);
    /// - `connect_backoff`: a policy's connect-failing backoff runs for
    ///   either address;
    /// - `failing`: a connect failed at either within `failing_skip`,
    ///   doubled for each failure in a row (0: never).
    pub fn passed_over(
        &self,
        uid: &str,
        addrs: [SocketAddr; 2],
        goaway_skip: Duration,
        failing_skip: Duration,
    ) -> Option<&'static str> {
        let book = self.book.locked();
        if !goaway_skip.is_zero() && book.goaway_within(uid, goaway_skip).is_some() {
            return Some("goaway_received");
        }
        if addrs.iter().any(|a| book.backing_off(*a).is_some()) {
            return Some("connect_backoff");
        }
        if !failing_skip.is_zero() && book.failing_for(uid, &addrs, failing_skip).is_some() {
            return Some("failing");
        }
        None
    }

    /// A connect through `key` failed at `at`: its workload is failing there.
    fn failed(&self, key: &PoolKey, at: SocketAddr, error: &str) {
        let mut book = self.book.locked();
        book.connect_failed(key, at, error);
        self.any_failing.store(true, Ordering::Release);
    }

    /// How loaded workload `uid` looks to a new connection: the streams
    /// open to it, plus its connects that failed in a row while its last
    /// failure is recent (within `recent`, doubled per failure as the
    /// failing skip is) — so a workload that refuses at once, and so holds
    /// no stream, never looks the least loaded.
    pub fn load_of(&self, uid: &str, addrs: [SocketAddr; 2], recent: Duration) -> u64 {
        let book = self.book.locked();
        let failures = match book.failing_for(uid, &addrs, recent) {
            Some(_) => book.failures_of(uid, &addrs),
            None => 0,
        };
        book.open_streams_to(uid) as u64 + u64::from(failures)
    }

    /// Streams open now on tunnels (pooled or draining) to workload `uid`.
    pub fn open_streams_to(&self, uid: &str) -> usize {
        self.book.locked().open_streams_to(uid)
    }

    /// Opens a CONNECT stream to `authority` through a tunnel for `key`,
    /// reusing a pooled tunnel when one has room.
    pub async fn connect(
        self: &Arc<Self>,
        key: &PoolKey,
        authority: SocketAddr,
    ) -> Result<PooledStream, PoolError> {
        let origin = &Origin::Node;
        self.connect_from(key, authority, origin, None, OnBackoff::Probe)
            .await
    }

    /// [`Pool::connect`], dialing a new tunnel from `origin`'s namespace
    /// (`key.src_netns` must name the same one). Under a backoff on the
    /// pod's HBONE address (its dials failed) or on the application's (its
    /// CONNECTs were refused), `on_backoff` says whether the connection
    /// fails at once or goes through the backoff's probe (`probe.rs`).
    pub async fn connect_from(
        self: &Arc<Self>,
        key: &PoolKey,
        authority: SocketAddr,
        origin: &Origin,
        baggage: Option<HeaderValue>,
        on_backoff: OnBackoff,
    ) -> Result<PooledStream, PoolError> {
        let probe = self.through_backoff(key, authority, on_backoff).await?;
        let connected = self.connect_now(key, authority, origin, baggage).await;
        if let Some(p) = probe {
            p.finish(connected.is_ok());
        }
        connected
    }

    /// A stream on a pooled tunnel, or on one dialed now.
    async fn connect_now(
        self: &Arc<Self>,
        key: &PoolKey,
        authority: SocketAddr,
        origin: &Origin,
        baggage: Option<HeaderValue>,
    ) -> Result<PooledStream, PoolError> {
        let entry = self.entry(key);
        // A tunnel may turn out to have received GOAWAY between checkout and
        // use; such a stream never reached the peer, so retry a few times.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let slot = match entry.checkout(self.cfg.max_streams_per_tunnel) {
                Some(slot) => slot,
                // Boxed: an async fn's state is as large as its largest await
                // point, and the dial (TLS handshake) would otherwise make every
                // idle connection's task ~4 KiB bigger though ~1 in 100 dials.
                None => Box::pin(self.dial_single_flight(key, &entry, origin)).await?,
            };
            let send = slot.tunnel.send.locked().clone();
            let Some(send) = send else { continue };
            let timeout = self.hbone.connect_timeout;
            match client::connect_stream_with(send, authority, timeout, baggage.clone()).await {
                Ok((send, recv)) => {
                    // The book's lock only while some workload is failing.
                    if self.any_failing.load(Ordering::Acquire) {
                        let mut book = self.book.locked();
                        book.connect_succeeded(key, authority);
                        self.any_failing
                            .store(book.any_failing(), Ordering::Release);
                    }
                    return Ok(PooledStream { send, recv, slot });
                }
                Err(e) if e.retryable() && attempts < 3 => {
                    debug!(error = %e, tunnel = slot.tunnel.id, "tunnel refused the stream; retrying on another");
                    slot.tunnel.mark_goaway();
                }
                Err(source) => {
                    if says_failing(&source) {
                        self.metrics
                            .connect_refusals
                            .get_or_create(&ReasonLabel {
                                reason: source.reason(),
                            })
                            .inc();
                        let error = format!("CONNECT {authority}: {source}");
                        self.failed(key, authority, &error);
                    }
                    return Err(PoolError::Stream {
                        addr: key.dst_addr,
                        source,
                    });
                }
            }
        }
    }

    fn entry(&self, key: &PoolKey) -> Arc<KeyEntry> {
        self.keys.locked().entry(key.clone()).or_default().clone()
    }

    async fn dial_single_flight(
        self: &Arc<Self>,
        key: &PoolKey,
        entry: &Arc<KeyEntry>,
        origin: &Origin,
    ) -> Result<StreamSlot, PoolError> {
        let _dialing = entry.dialing.lock().await;
        // Someone else may have dialed while we waited.
        if let Some(slot) = entry.checkout(self.cfg.max_streams_per_tunnel) {
            return Ok(slot);
        }
        let tcp = origin.connect(key.dst_addr, None, &self.tunnel_cc);
        let goaway_read = GoawayFlag::default();
        let expected: Vec<SpiffeId> = std::iter::once(&key.dst)
            .chain(&key.dst_also)
            .cloned()
            .collect();
        let (send, conn) = client::dial_over(
            &self.tls,
            &self.hbone,
            &key.src,
            &expected,
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
            self.failed(key, key.dst_addr, &source.to_string());
            PoolError::Dial {
                addr: key.dst_addr,
                source,
            }
        })?;
        // Success ends any backoff for the destination and what its
        // workload's GOAWAY said.
        let to_workload = self.book.locked().opened(key);
        let tunnel = Arc::new(Tunnel {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            key: key.clone(),
            send: Mutex::new(Some(send)),
            streams: AtomicUsize::new(1),
            to_workload,
            streams_total: AtomicU64::new(1),
            goaway: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            kill: tokio::sync::Notify::new(),
            opened: Instant::now(),
            idle_since: Mutex::new(None),
            goaways_received: self.metrics.goaways_received.clone(),
            book: self.book.clone(),
            goaway_read,
        });
        self.metrics.opened.inc();
        self.metrics.tunnels.inc();
        entry.tunnels.locked().push(tunnel.clone());
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
                let keepalive = tidegate_protocol::hbone::keepalive::run(
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
                    r = watched => tunnel.close_reason(r),
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
                tunnel.send.locked().take();
                entry.tunnels.locked().retain(|t| !Arc::ptr_eq(t, &tunnel));
                pool.draining.locked().retain(|t| !Arc::ptr_eq(t, &tunnel));
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

    /// Closes tunnels idle for longer than the idle timeout until drained.
    ///
    /// Drain contract: when `drain` fires, idle eviction stops (shutdown
    /// evicts every tunnel itself, [`Pool::evict_all`]); at its deadline
    /// every tunnel still open, pooled or draining, is closed at once, so
    /// the streams it still carries are cut as a reset at both ends: the
    /// outbound copy resets the application's connection (TCP RST), and
    /// the peer gateway, its tunnel gone, resets the workload's. Without
    /// this the streams ran on past the deadline and ended as the process
    /// exited: a FIN at the client, which looks like a clean end.
    pub async fn evict_idle(self: Arc<Self>, mut drain: ShutdownWatch) {
        let period =
            (self.cfg.idle_timeout / 4).clamp(Duration::from_millis(5), Duration::from_secs(30));
        let mut tick = tokio::time::interval(period);
        let deadline = loop {
            tokio::select! {
                _ = tick.tick() => self.evict_idle_once(),
                at = drain.signaled() => break at,
            }
        };
        tokio::time::sleep_until(deadline).await;
        let open = self.tunnels().len() + self.draining.locked().len();
        if open > 0 {
            debug!(tunnels = open, "drain deadline: closing outbound tunnels");
        }
        // Pooled and draining tunnels alike (`tunnels_closed{reason="evicted_now"}`).
        self.evict_matching(true, |_| true);
    }

    fn evict_idle_once(&self) {
        let now = Instant::now();
        for entry in self.entries() {
            let mut tunnels = entry.tunnels.locked();
            tunnels.retain(|t| {
                let idle = t.streams() == 0
                    && t.idle_since
                        .locked()
                        .is_some_and(|since| now.duration_since(since) >= self.cfg.idle_timeout);
                if idle {
                    debug!(tunnel = t.id, "evicting idle tunnel");
                    t.evict();
                }
                !idle
            });
        }
        {
            let mut book = self.book.locked();
            book.forget_idle();
            self.any_failing
                .store(book.any_failing(), Ordering::Release);
        }
        // Forget a key only when it has no tunnel and nothing holds its
        // entry: a connect holds it from looking the key up until its new
        // tunnel is pooled, and removing the entry in between would orphan
        // that tunnel (the next connection would dial again).
        self.keys
            .locked()
            .retain(|_, e| Arc::strong_count(e) > 1 || !e.tunnels.locked().is_empty());
    }

    /// Evicts every pooled tunnel: idle ones close at once, busy ones when
    /// their streams end. Used at shutdown.
    pub fn evict_all(&self) {
        self.evict_matching(false, |_| true);
    }

    /// Starts (or replaces) a backoff for `addr`: until the wait is over, new
    /// application connections to it fail at once when they have another
    /// endpoint, else go through its probe (`probe.rs`); a successful
    /// connect ends it.
    pub fn set_backoff(&self, addr: SocketAddr, params: BackoffParams) {
        self.book.locked().set_backoff(addr, params);
        self.metrics.backoffs.inc();
    }

    /// Evicts the tunnels whose key matches: they take no new streams and
    /// close (client-side GOAWAY) when their streams end — or at once when
    /// `now`, resetting open streams. Returns how many.
    pub fn evict_matching(&self, now: bool, matches: impl Fn(&PoolKey) -> bool) -> usize {
        let mut evicted = Vec::new();
        for entry in self.entries() {
            entry.tunnels.locked().retain(|t| {
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
            self.draining.locked().retain(|t| {
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
        self.draining.locked().push(t.clone());
        // The driver sets `closed` before it removes the tunnel from
        // `draining` (under the same lock): if it ended meanwhile, undo.
        if t.closed.load(Ordering::Acquire) {
            self.draining.locked().retain(|d| !Arc::ptr_eq(d, t));
        }
    }

    fn entries(&self) -> Vec<Arc<KeyEntry>> {
        self.keys.locked().values().cloned().collect()
    }

    pub fn tunnels(&self) -> Vec<Arc<Tunnel>> {
        self.entries()
            .iter()
            .flat_map(|e| e.tunnels.locked().clone())
            .collect()
    }

    /// Evicted tunnels whose streams still run.
    pub fn draining(&self) -> Vec<Arc<Tunnel>> {
        self.draining.locked().clone()
    }
}

#[cfg(test)]
mod key_and_limit_tests;
