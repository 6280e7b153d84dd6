//! Outbound: transparent capture (port 15001). The original destination comes
//! from `SO_ORIGINAL_DST` (iptables REDIRECT). The source workload is the pod
//! whose own listener accepted the connection (in-pod mode), or, on the
//! node's listener (node mode), the local workload with the source IP.
//! HBONE destinations get a CONNECT stream on a pooled tunnel to
//! `<dst ip>:15008`; others are passed through as plain TCP.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info_span, Instrument};

use crate::proxy::congestion::Congestion;
use crate::proxy::copy::{copy_bidirectional, copy_tcp, Transferred};
use crate::proxy::istio_tcp::{self, Flags, Reporter, ServiceRef};
use crate::proxy::ledger::{self, ConnectionLedger, Ended};
use crate::proxy::metrics::ProxyMetrics;
use crate::proxy::origin::Origin;
use crate::proxy::pool::{OnBackoff, Pool, PoolError, PoolKey, PooledStream};
use crate::proxy::routing::Routing;
use crate::proxy::waypoint::{self, WaypointError};
use crate::workloads::services::Service;
use crate::workloads::waypoint::Waypoint;
use crate::workloads::{Protocol, Workload, WorkloadStore};
use tidegate_base::shutdown::{ActiveStreams, ShutdownWatch};
use tidegate_protocol::identity::SpiffeId;

#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    #[error("connection was not redirected (no original destination)")]
    NotRedirected,
    #[error("source {0} is not a workload on this node")]
    UnknownSource(std::net::IpAddr),
    #[error("pod {0} is not known to discovery yet and its node agent named no service account")]
    UnknownPod(String),
    #[error("destination {0} is the outbound listener itself")]
    Loop(SocketAddr),
    #[error(transparent)]
    Pool(#[from] PoolError),
    #[error("Service {service} has no endpoint for port {port}")]
    NoHealthyEndpoint { service: String, port: u16 },
    #[error("{0} is inside the cluster's ranges but no known workload or Service (outbound.unknown_in_cluster: refuse)")]
    UnknownInCluster(std::net::IpAddr),
    /// An address the mesh has known that nothing claims now: refused
    /// whatever `outbound.unknown_in_cluster` says, never plaintext.
    #[error("{ip} is the mesh's ({known}) and no workload or Service claims it now: refused, never sent in plaintext")]
    FormerlyKnown {
        ip: std::net::IpAddr,
        known: crate::workloads::FormerlyKnown,
    },
    #[error("endpoint {addr} unreachable: {source}")]
    Endpoint {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("passthrough connect to {addr}: {source}")]
    Passthrough {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Waypoint(#[from] WaypointError),
}

impl OutboundError {
    pub fn reason(&self) -> &'static str {
        match self {
            OutboundError::NotRedirected => "not_redirected",
            OutboundError::UnknownSource(_) | OutboundError::UnknownPod(_) => "unknown_source",
            OutboundError::Loop(_) => "loop",
            OutboundError::Pool(e) => e.reason(),
            OutboundError::Passthrough { .. } => "passthrough_connect",
            OutboundError::NoHealthyEndpoint { .. } => "no_healthy_endpoint",
            OutboundError::UnknownInCluster(_) => "unknown_in_cluster",
            OutboundError::FormerlyKnown { known, .. } => match known {
                crate::workloads::FormerlyKnown::Departed { .. } => "departed_address",
                crate::workloads::FormerlyKnown::Refused { .. } => "refused_address",
            },
            OutboundError::Endpoint { .. } => "endpoint_connect",
            OutboundError::Waypoint(e) => e.reason(),
        }
    }

    /// How Istio's report of the connection closes, when it was routed.
    fn flags(&self) -> Flags {
        match self {
            OutboundError::Pool(e) => Flags::of_pool_error(e),
            _ => Flags::Connect,
        }
    }
}

pub struct Outbound {
    workloads: Arc<WorkloadStore>,
    pool: Arc<Pool>,
    hbone_port: u16,
    metrics: ProxyMetrics,
    streams: ActiveStreams,
    listen_addr: std::sync::OnceLock<SocketAddr>,
    origin: Origin,
    routing: Arc<Routing>,
}

/// What [`Outbound::open_stream`] opened.
enum Opened {
    /// A CONNECT stream on a pooled tunnel.
    Tunnel(PooledStream),
    /// Nothing yet: the route is plain TCP.
    Plain(Route),
}

/// Where a connection goes once routed.
enum Route {
    /// A CONNECT stream on a tunnel to the workload's gateway.
    Hbone {
        target: Arc<Workload>,
        hbone_ip: std::net::IpAddr,
        authority: SocketAddr,
        service: Option<Arc<Service>>,
        /// Identities the target may present beside its own: its
        /// Service's `subject_alt_names` (usually none).
        also: Vec<SpiffeId>,
        /// Under a backoff: fail at once (another endpoint may take the
        /// connection) or go through its probe (none can).
        on_backoff: OnBackoff,
    },
    /// Plain TCP to this address (a workload outside the mesh, or a
    /// non-mesh Service endpoint).
    Tcp {
        to: SocketAddr,
        target: Arc<Workload>,
        service: Option<Arc<Service>>,
    },
    /// Plain TCP to the original destination, which is no workload.
    Passthrough,
}

/// Who connects, as Istio's report of each attempt names it.
#[derive(Clone, Copy)]
struct Source<'a> {
    identity: &'a SpiffeId,
    workload: Option<&'a Workload>,
}

impl<'a> Source<'a> {
    fn to(
        self,
        target: Option<&'a Workload>,
        service: Option<&'a Service>,
        mutual_tls: bool,
    ) -> istio_tcp::Connection<'a> {
        istio_tcp::Connection {
            reporter: Reporter::Source,
            source: self.workload,
            source_identity: Some(self.identity),
            source_baggage: None,
            destination: target,
            service: service.map(|s| ServiceRef {
                namespace: &s.spec.namespace,
                name: &s.spec.name,
            }),
            mutual_tls,
        }
    }
}

impl Outbound {
    pub fn new(
        workloads: Arc<WorkloadStore>,
        pool: Arc<Pool>,
        hbone_port: u16,
        metrics: ProxyMetrics,
        streams: ActiveStreams,
        routing: Arc<Routing>,
    ) -> Arc<Self> {
        Arc::new(Outbound {
            workloads,
            pool,
            hbone_port,
            metrics,
            streams,
            listen_addr: std::sync::OnceLock::new(),
            origin: Origin::Node,
            routing,
        })
    }

    /// The same outbound side for one pod's own listener: its connections
    /// are the pod's, and its tunnels and passthrough dials leave from the
    /// pod's namespace.
    pub fn for_pod(&self, origin: Origin) -> Arc<Self> {
        Arc::new(Outbound {
            workloads: self.workloads.clone(),
            pool: self.pool.clone(),
            hbone_port: self.hbone_port,
            metrics: self.metrics.clone(),
            streams: self.streams.clone(),
            listen_addr: std::sync::OnceLock::new(),
            origin,
            routing: self.routing.clone(),
        })
    }

    /// Accepts captured connections until the drain signal fires, then drops
    /// the listener. Proxied connections go on until they end or the process
    /// exits at the drain deadline.
    ///
    /// The listener's address is recorded before the future is returned, so
    /// loop detection holds from the moment the caller has it, not from the
    /// spawned task's first poll (a connection proxied in between would
    /// otherwise pass through to the listener itself).
    pub fn run(
        self: Arc<Self>,
        listener: TcpListener,
        drain: ShutdownWatch,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        if let Ok(a) = listener.local_addr() {
            let _ = self.listen_addr.set(a);
        }
        self.accept_loop(listener, drain)
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener, mut drain: ShutdownWatch) {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = drain.signaled() => return,
            };
            match accepted {
                Ok((tcp, src)) => {
                    let src = crate::proxy::listener::canonical(src);
                    let this = self.clone();
                    tokio::spawn(async move {
                        let Some(dst) = crate::proxy::listener::original_dst(&tcp) else {
                            this.metrics
                                .connection_failed(OutboundError::NotRedirected.reason());
                            return;
                        };
                        this.proxy(tcp, src, dst).await;
                    });
                }
                Err(e) => {
                    debug!(error = %e, "outbound accept failed");
                    self.metrics.connection_failed("accept");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
    }

    /// Proxies one captured application connection from `src` to its original
    /// destination `dst`. The listener calls this after reading
    /// `SO_ORIGINAL_DST`; tests and tools with their own capture call it directly.
    pub async fn proxy(&self, tcp: TcpStream, src: SocketAddr, dst: SocketAddr) {
        // Canonical whoever calls: a caller's own capture may hand over a
        // dual-stack socket's IPv4-mapped addresses.
        let (src, dst) = (
            crate::proxy::listener::canonical(src),
            crate::proxy::listener::canonical(dst),
        );
        let span = info_span!("outbound", src.addr = %src, dst.addr = %dst);
        async {
            let guard = self.streams.track();
            let mut ledger = ConnectionLedger::connection(&self.metrics, &tcp, guard, src, dst);
            let _ = tcp.set_nodelay(true);
            match self.proxy_inner(&tcp, src, dst, &mut ledger).await {
                Ok(ended) => ledger.finish(ended),
                Err(e) => {
                    debug!(error = %e, "outbound connection failed");
                    ledger.refuse(e.reason(), e.flags(), None);
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Proxies one connection; the ledger gets each identity and endpoint
    /// as it is learned, so the access line of a failure names those it knew.
    async fn proxy_inner(
        &self,
        tcp: &TcpStream,
        src: SocketAddr,
        dst: SocketAddr,
        ledger: &mut ConnectionLedger<'_>,
    ) -> Result<Ended<'static>, OutboundError> {
        if self.is_own_listener(dst) {
            return Err(OutboundError::Loop(dst));
        }
        let snapshot = self.workloads.snapshot();
        let (identity, workload) = self.source_of(&snapshot, src)?;
        drop(snapshot);
        ledger.source(identity.clone());
        let source = Source {
            identity: &identity,
            workload: workload.as_deref(),
        };
        // Boxed: the connect's state lives only while it runs, not in
        // every proxied connection's task for its whole life.
        let stream = match Box::pin(self.open_stream(dst, source, ledger)).await? {
            Opened::Tunnel(stream) => stream,
            Opened::Plain(route) => {
                return Box::pin(self.passthrough(tcp, dst, route, source, ledger)).await
            }
        };
        ledger.carrying();
        let (moved, result) = copy_bidirectional(
            tcp,
            stream.send,
            stream.recv,
            &self.metrics.bytes,
            &ledger.istio_byte_counters(true),
        )
        .await;
        if result.is_err() {
            // The tunnel broke or was cut: reset, so the application does not
            // take it for a normal end of stream.
            ledger::reset(tcp);
        }
        Ok(Ended::copied(moved, &result))
    }

    /// Routes `dst` and opens a CONNECT stream to it, each attempt in
    /// Istio's report; a Service's endpoint whose connect fails is
    /// replaced by another, up to `outbound.connect_attempts`. A route to
    /// plain TCP is returned as it is.
    async fn open_stream(
        &self,
        dst: SocketAddr,
        source: Source<'_>,
        ledger: &mut ConnectionLedger<'_>,
    ) -> Result<Opened, OutboundError> {
        let baggage = source.workload.and_then(|w| self.metrics.istio.baggage(w));
        let mut attempt = 1;
        let mut failed: Option<String> = None;
        loop {
            let route = self.route_waiting(dst, source.workload, failed.as_deref());
            let (target, hbone_ip, authority, service, also, on_backoff) = match route.await? {
                Route::Hbone {
                    target,
                    hbone_ip,
                    authority,
                    service,
                    also,
                    on_backoff,
                } => (target, hbone_ip, authority, service, also, on_backoff),
                plain => return Ok(Opened::Plain(plain)),
            };
            ledger.destination(Some(target.identity.clone()));
            if service.is_some() {
                ledger.trying(&target, authority);
            }
            ledger.report(source.to(Some(&target), service.as_deref(), true));
            let key = PoolKey {
                src: source.identity.clone(),
                dst_uid: target.uid().to_owned(),
                dst: target.identity.clone(),
                dst_also: also,
                dst_addr: SocketAddr::new(hbone_ip, self.hbone_port),
                src_netns: self.origin.netns(),
            };
            let connected = self
                .pool
                .connect_from(&key, authority, &self.origin, baggage.clone(), on_backoff)
                .await;
            match connected {
                Ok(s) => {
                    if attempt > 1 {
                        self.routing.retried("connected");
                    }
                    return Ok(Opened::Tunnel(s));
                }
                // A Service's endpoint that takes no connection now: the
                // pool has recorded it (skipped from now on), and nothing of
                // the application's was sent, so another endpoint may take
                // the connection.
                Err(e)
                    if service.is_some()
                        && e.endpoint_failed()
                        && attempt < self.routing.connect_attempts =>
                {
                    debug!(error = %e, endpoint = target.uid(), attempt, "endpoint connect failed; choosing another");
                    ledger.endpoint_refused(Flags::of_pool_error(&e), e.reason());
                    failed = Some(target.uid().to_owned());
                    attempt += 1;
                }
                Err(e) => {
                    if attempt > 1 {
                        self.routing.retried("failed");
                    }
                    return Err(e.into());
                }
            }
        }
    }

    /// Where `dst` goes ([`Self::route`]); an address discovery may learn
    /// yet is waited for ([`Self::await_discovery`]).
    async fn route_waiting(
        &self,
        dst: SocketAddr,
        source: Option<&Workload>,
        avoid: Option<&str>,
    ) -> Result<Route, OutboundError> {
        let routed = self.route(&self.workloads.snapshot(), dst, source, avoid);
        match routed {
            Err(OutboundError::UnknownInCluster(_) | OutboundError::FormerlyKnown { .. })
                if !self.routing.unknown_wait.is_zero() =>
            {
                Box::pin(self.await_discovery(dst)).await
            }
            r => r,
        }
    }

    /// Where `dst` goes: a workload IP first, then a Service VIP:port (an
    /// endpoint chosen, drain-aware); neither: refused if the mesh has
    /// known the address (a workload gave it up recently, or discovery
    /// refused the resource naming it), else passthrough — unless it is
    /// inside the cluster's ranges and `unknown_in_cluster` refuses.
    /// `avoid`: a Service's endpoint whose connect failed for this
    /// connection, chosen again only when nothing else is left.
    fn route(
        &self,
        snapshot: &crate::workloads::WorkloadSnapshot,
        dst: SocketAddr,
        source: Option<&Workload>,
        avoid: Option<&str>,
    ) -> Result<Route, OutboundError> {
        if let Some(w) = snapshot.by_ip(dst.ip()) {
            if let Some(wp) = &w.spec.waypoint {
                let via = self.via_waypoint(snapshot, wp, dst, &w.spec.uid, source, None)?;
                if let Some(route) = via {
                    return Ok(route);
                }
            }
            if w.spec.other_network {
                return Err(self.refused(WaypointError::DestinationOnOtherNetwork {
                    destination: w.spec.uid.clone(),
                }));
            }
            return Ok(match w.spec.protocol {
                Protocol::Hbone => Route::Hbone {
                    target: w.clone(),
                    hbone_ip: dst.ip(),
                    authority: dst,
                    service: None,
                    also: Vec::new(),
                    on_backoff: OnBackoff::Probe,
                },
                Protocol::Tcp => Route::Tcp {
                    to: dst,
                    target: w.clone(),
                    service: None,
                },
            });
        }
        if let Some(svc) = snapshot.service_by_vip(dst.ip(), dst.port()) {
            if let Some(wp) = Waypoint::pick(&svc.spec.waypoints) {
                let key = svc.key();
                let via = self.via_waypoint(snapshot, wp, dst, &key, source, Some(svc))?;
                if let Some(route) = via {
                    return Ok(route);
                }
            }
            let picked = self.routing.picker.pick_avoiding(svc, dst.port(), avoid);
            let picked = picked.ok_or_else(|| OutboundError::NoHealthyEndpoint {
                service: svc.key(),
                port: dst.port(),
            })?;
            let e = picked.endpoint;
            let on_backoff = if picked.last_resort {
                OnBackoff::Probe
            } else {
                OnBackoff::FailFast
            };
            if e.workload.spec.other_network {
                return Err(self.refused(WaypointError::DestinationOnOtherNetwork {
                    destination: e.workload.spec.uid.clone(),
                }));
            }
            // The endpoint's address of the VIP's family, else its other one.
            let ip = e.ip_for(dst.ip());
            let addr = SocketAddr::new(ip, e.target_port);
            return Ok(match e.workload.spec.protocol {
                Protocol::Hbone => Route::Hbone {
                    target: e.workload.clone(),
                    hbone_ip: ip,
                    authority: addr,
                    also: svc.spec.subject_alt_names.clone(),
                    service: Some(svc.clone()),
                    on_backoff,
                },
                Protocol::Tcp => Route::Tcp {
                    to: addr,
                    target: e.workload.clone(),
                    service: Some(svc.clone()),
                },
            });
        }
        if let Some(known) = snapshot.formerly_known(dst.ip()) {
            return Err(OutboundError::FormerlyKnown {
                ip: dst.ip(),
                known,
            });
        }
        let in_cluster = self
            .routing
            .cluster_cidrs
            .iter()
            .chain(snapshot.cluster_ranges.iter())
            .any(|c| c.contains(dst.ip()));
        if in_cluster && self.routing.unknown_in_cluster == crate::config::UnknownInCluster::Refuse
        {
            return Err(OutboundError::UnknownInCluster(dst.ip()));
        }
        Ok(Route::Passthrough)
    }

    /// The route through `wp`, the waypoint of `destination` (the
    /// authority stays `dst`); `None` when the source is that waypoint.
    fn via_waypoint(
        &self,
        snapshot: &crate::workloads::WorkloadSnapshot,
        wp: &Waypoint,
        dst: SocketAddr,
        destination: &str,
        source: Option<&Workload>,
        service: Option<&Arc<Service>>,
    ) -> Result<Option<Route>, OutboundError> {
        match waypoint::resolve(snapshot, &self.routing.picker, wp, destination, source) {
            Ok(Some(via)) => {
                self.routing.waypoint("routed");
                Ok(Some(Route::Hbone {
                    target: via.workload,
                    hbone_ip: via.ip,
                    authority: dst,
                    service: service.cloned(),
                    also: via.also,
                    on_backoff: OnBackoff::Probe,
                }))
            }
            Ok(None) => {
                self.routing.waypoint("from_waypoint");
                Ok(None)
            }
            Err(e) => Err(self.refused(e)),
        }
    }

    fn refused(&self, e: WaypointError) -> OutboundError {
        self.routing.waypoint(e.reason());
        OutboundError::Waypoint(e)
    }

    /// An unknown address inside the cluster's ranges, or one the mesh
    /// has known (a pod just started, an address reused), waits up to
    /// `outbound.unknown_in_cluster_wait` for discovery to learn it, then
    /// is refused: never plaintext.
    async fn await_discovery(&self, dst: SocketAddr) -> Result<Route, OutboundError> {
        // Subscribed before the look: a publish in between is seen.
        let mut changed = self.workloads.subscribe();
        let deadline = tokio::time::Instant::now() + self.routing.unknown_wait;
        self.routing.waiting.inc();
        let routed = loop {
            let refused = match self.route(&self.workloads.snapshot(), dst, None, None) {
                Err(
                    e @ (OutboundError::UnknownInCluster(_) | OutboundError::FormerlyKnown { .. }),
                ) => e,
                r => {
                    self.routing.waited("learned");
                    break r;
                }
            };
            let published = tokio::time::timeout_at(deadline, changed.changed()).await;
            if !matches!(published, Ok(Ok(()))) {
                self.routing.waited("refused");
                break Err(refused);
            }
        };
        self.routing.waiting.dec();
        routed
    }

    /// Who is connecting, and its workload when discovery holds it: the
    /// pod that owns this listener (never looked up by address: another
    /// pod cannot claim it), or on the node's listener the local workload
    /// with the source address.
    fn source_of(
        &self,
        snapshot: &crate::workloads::WorkloadSnapshot,
        src: SocketAddr,
    ) -> Result<(SpiffeId, Option<Arc<Workload>>), OutboundError> {
        match &self.origin {
            Origin::Node => snapshot
                .by_ip(src.ip())
                .filter(|w| w.local)
                .map(|w| (w.identity.clone(), Some(w.clone())))
                .ok_or(OutboundError::UnknownSource(src.ip())),
            Origin::Pod(pod) => match pod.workload(snapshot) {
                Some(w) => Ok((w.identity.clone(), Some(w.clone()))),
                None => pod
                    .service_account
                    .as_deref()
                    .map(|sa| {
                        let id = SpiffeId::new(self.workloads.trust_domain(), &pod.namespace, sa);
                        (id, None)
                    })
                    .ok_or_else(|| OutboundError::UnknownPod(pod.uid.clone())),
            },
        }
    }

    /// Whether `dst` is this very listener: its address, or, when it listens
    /// on a wildcard address, its port on any address of this host. (A pod's
    /// listener cannot be reached by capture: traffic to the pod itself is
    /// not redirected.)
    fn is_own_listener(&self, dst: SocketAddr) -> bool {
        let Some(listen) = self.listen_addr.get() else {
            return false;
        };
        if self.origin.pod().is_some() {
            return false;
        }
        if listen.port() != dst.port() {
            return false;
        }
        if !listen.ip().is_unspecified() {
            return listen.ip() == dst.ip();
        }
        // Only addresses of this host can be bound (no IP_FREEBIND here).
        std::net::UdpSocket::bind(SocketAddr::new(dst.ip(), 0)).is_ok()
    }

    /// Plain TCP (`route`): to the original destination `dst`
    /// (passthrough), or to a non-mesh Service endpoint (no identity on
    /// that side).
    async fn passthrough(
        &self,
        tcp: &TcpStream,
        dst: SocketAddr,
        route: Route,
        source: Source<'_>,
        ledger: &mut ConnectionLedger<'_>,
    ) -> Result<Ended<'static>, OutboundError> {
        ledger.destination(None);
        let to = match &route {
            Route::Tcp {
                to,
                target,
                service,
            } => {
                ledger.report(source.to(Some(target), service.as_deref(), false));
                if service.is_some() {
                    ledger.trying(target, *to);
                }
                *to
            }
            _ => {
                ledger.report(source.to(None, None, false));
                dst
            }
        };
        let connected = self
            .origin
            .connect(to, None, &Congestion::host_default())
            .await;
        let upstream = connected.map_err(|source| {
            if to == dst {
                OutboundError::Passthrough { addr: dst, source }
            } else {
                OutboundError::Endpoint { addr: to, source }
            }
        })?;
        if to == dst {
            self.routing.passthrough.inc();
        }
        let _ = upstream.set_nodelay(true);
        let (received, sent) = ledger.istio_counters();
        let (up, down) = tokio::join!(
            copy_tcp(tcp, &upstream, &received),
            copy_tcp(&upstream, tcp, &sent)
        );
        let result = up.and_then(|u| down.map(|d| (u, d)));
        let (up, down) = result.as_ref().copied().unwrap_or_default();
        let outcome = if result.is_ok() {
            ledger::OK
        } else {
            "passthrough_error"
        };
        let moved = Transferred {
            tcp_to_h2: up,
            h2_to_tcp: down,
        };
        Ok(Ended::new(outcome, moved))
    }
}
