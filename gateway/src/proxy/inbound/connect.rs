//! One CONNECT on an inbound tunnel: route and authorize it, pace and dial
//! the workload, copy the bytes, log the stream. The [`StreamHandler`] the
//! HBONE server calls for each stream.
//!
//! A dial takes a slot under the connection caps (`limits.rs`) and a place
//! in the tunnel's dial budget (`pace.rs`). It is abandoned as soon as the
//! peer resets the stream, and its budget token is given back only if the
//! peer sent bytes on the stream: what a reset loop cannot fake.

use std::future::{poll_fn, Future};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{Method, Request, Response, StatusCode};
use tokio::net::TcpStream;
use tracing::{debug, info_span, Instrument};

use super::limits::{DialSlot, IdentitySlot, OverLimit, Refused};
use super::metrics::InboundMetrics;
use super::pace::{Borrowed, DialBudget, Paced};
use crate::authorization::{Admitted, Authorizer, Facts, NotAdmitted, Transport};
use crate::config::HboneConfig;
use crate::proxy::congestion::Congestion;
use crate::proxy::copy::{copy_bidirectional, Transferred};
use crate::proxy::istio_tcp::{self, Flags, Reporter};
use crate::proxy::ledger::{self, ConnectionLedger, Ended};
use crate::proxy::metrics::ProxyMetrics;
use crate::proxy::origin::Origin;
use crate::proxy::tunnels::InboundTunnel;
use crate::workloads::{Workload, WorkloadSnapshot, WorkloadStore};
use tidegate_base::shutdown::{ActiveStreams, StreamGuard};
use tidegate_protocol::hbone::authority::{self, AuthorityError};
use tidegate_protocol::hbone::baggage::{Baggage, BAGGAGE_HEADER};
use tidegate_protocol::hbone::io::{reason_label, Refusal};
use tidegate_protocol::hbone::server::StreamHandler;
use tidegate_protocol::hbone::{GoawayCommand, REASON_HEADER};
use tidegate_protocol::identity::SpiffeId;

/// What every CONNECT on every inbound tunnel needs; shared by all of them.
pub struct ConnectDeps {
    pub workloads: Arc<WorkloadStore>,
    pub cfg: HboneConfig,
    pub own_ports: OwnPorts,
    pub metrics: ProxyMetrics,
    pub active: ActiveStreams,
    pub inbound_metrics: InboundMetrics,
    /// Where upstream dials are made: the node's namespace, or the pod's
    /// (in-pod mode) with the peer's address as source.
    pub origin: Origin,
    /// Congestion control of the deliveries (`tcp.app_congestion_control`).
    pub app_cc: Congestion,
    /// Istio's L4 authorization: each CONNECT is checked, and closed when a
    /// later policy change refuses it.
    pub authorizer: Arc<Authorizer>,
}

/// The gateway's own listening ports (and port 0): a CONNECT to one of them
/// on a local workload's address would tunnel into the gateway itself
/// (ztunnel's "illegal ports").
#[derive(Clone, Debug, Default)]
pub struct OwnPorts(Vec<u16>);

impl OwnPorts {
    pub fn new(ports: impl IntoIterator<Item = u16>) -> Self {
        let mut v: Vec<u16> = ports.into_iter().chain([0]).collect();
        v.sort_unstable();
        v.dedup();
        OwnPorts(v)
    }

    pub fn contains(&self, port: u16) -> bool {
        port == 0 || self.0.binary_search(&port).is_ok()
    }
}

/// Facts about a tunnel fixed at accept time.
pub struct TunnelCtx {
    pub peer: SpiffeId,
    /// The peer's identity as authorization policies read it.
    pub peer_identity: Arc<tidegate_authz::Identity>,
    pub peer_addr: SocketAddr,
    /// The address the peer dialed (original destination).
    pub dialed: SocketAddr,
    /// The workload whose certificate we presented.
    pub workload: Arc<Workload>,
}

/// Why a CONNECT was refused; each maps to one status and one metric reason.
#[derive(Debug, thiserror::Error)]
pub enum InboundError {
    #[error("method {0} is not CONNECT")]
    NotConnect(Method),
    #[error("authority {0:?} is not ip:port")]
    BadAuthority(String),
    /// An IPv6 zone id or an IPv4-mapped spelling ([`authority`]).
    #[error("{0}")]
    Authority(AuthorityError),
    #[error("authority ip {0} is not a workload on this node")]
    NotLocal(IpAddr),
    #[error("authority ip {authority} differs from the dialed workload ip {dialed}")]
    AuthorityMismatch { authority: IpAddr, dialed: IpAddr },
    #[error("port {} of {} is the gateway's own port or port 0; refused", .0.port(), .0.ip())]
    IllegalPort(SocketAddr),
    #[error("{peer} may not connect to {workload}")]
    Denied { peer: SpiffeId, workload: String },
    #[error("connection closed due to policy rejection: {0}")]
    Policy(tidegate_authz::Denial),
    #[error("upstream dial not started: {0}")]
    Paced(#[from] Paced),
    #[error("upstream dial not started: {0}")]
    OverLimit(#[from] OverLimit),
    #[error("upstream {addr} unreachable: {source}")]
    Upstream {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl InboundError {
    pub fn status(&self) -> StatusCode {
        match self {
            InboundError::Denied { .. } | InboundError::Policy(_) => StatusCode::UNAUTHORIZED,
            InboundError::Upstream { .. } | InboundError::Paced(_) | InboundError::OverLimit(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::BAD_REQUEST,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            InboundError::NotConnect(_) => "not_connect",
            InboundError::BadAuthority(_) => "bad_authority",
            InboundError::Authority(e) => e.reason(),
            InboundError::NotLocal(_) => "target_not_local",
            InboundError::AuthorityMismatch { .. } => "authority_mismatch",
            InboundError::IllegalPort(_) => "illegal_port",
            InboundError::Denied { .. } => "denied",
            InboundError::Policy(_) => "policy_denied",
            InboundError::Paced(Paced::InFlight(_)) => "dials_in_flight_limit",
            InboundError::Paced(Paced::Rate(_)) => "dial_rate_limit",
            InboundError::Paced(Paced::Wasted(_)) => "wasted_dials_limit",
            InboundError::OverLimit(o) => o.stream_reason(),
            InboundError::Upstream { .. } => "upstream_unreachable",
        }
    }

    /// How Istio's report of the stream closes, when it was routed.
    fn flags(&self) -> Flags {
        match self {
            InboundError::Policy(_) => Flags::Deny,
            _ => Flags::Connect,
        }
    }
}

/// Validates a CONNECT against the tunnel; never an open proxy: the target
/// must be the very workload the peer dialed, on this node, and not one of
/// the gateway's own ports there.
pub fn route<B>(
    req: &Request<B>,
    ctx: &TunnelCtx,
    snapshot: &WorkloadSnapshot,
    own_ports: &OwnPorts,
) -> Result<SocketAddr, InboundError> {
    if req.method() != Method::CONNECT {
        return Err(InboundError::NotConnect(req.method().clone()));
    }
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_default();
    let target = authority::parse(&authority).map_err(|e| match e {
        AuthorityError::Malformed(a) => InboundError::BadAuthority(a),
        other => InboundError::Authority(other),
    })?;
    let workload = snapshot
        .by_ip(target.ip())
        .filter(|w| w.local)
        .ok_or(InboundError::NotLocal(target.ip()))?;
    if target.ip() != ctx.dialed.ip() {
        return Err(InboundError::AuthorityMismatch {
            authority: target.ip(),
            dialed: ctx.dialed.ip(),
        });
    }
    if own_ports.contains(target.port()) {
        return Err(InboundError::IllegalPort(target));
    }
    if !workload.allows(&ctx.peer) {
        return Err(InboundError::Denied {
            peer: ctx.peer.clone(),
            workload: workload.uid().to_owned(),
        });
    }
    Ok(target)
}

/// The streams of one inbound tunnel.
pub struct ConnectHandler {
    pub deps: Arc<ConnectDeps>,
    pub ctx: Arc<TunnelCtx>,
    pub tunnel: Arc<InboundTunnel>,
    pub dials: Arc<DialBudget>,
    /// The tunnel's place under its peer identity's cap; its dials take theirs from it.
    pub identity: Arc<IdentitySlot>,
}

impl StreamHandler for ConnectHandler {
    fn handle(
        &self,
        req: Request<RecvStream>,
        respond: SendResponse<Bytes>,
    ) -> impl Future<Output = ()> + Send + 'static {
        // Counted from acceptance, so a drain waiting for idle sees it at
        // once — the tunnel's and the gateway's (a shutdown that begins
        // while the stream's task has not run yet counts it open).
        let count = self.tunnel.stream_started();
        let guard = self.deps.active.track();
        let stream = Stream {
            deps: self.deps.clone(),
            ctx: self.ctx.clone(),
            tunnel: self.tunnel.clone(),
            dials: self.dials.clone(),
            identity: self.identity.clone(),
        };
        let span = info_span!("stream", authority = %req.uri());
        async move {
            stream.serve(req, respond, guard).await;
            drop(count);
        }
        .instrument(span)
    }

    fn goaway_sent(&self, cmd: GoawayCommand) {
        self.deps.inbound_metrics.goaway_sent(cmd);
    }

    fn refused(&self, r: Refusal) {
        self.deps.inbound_metrics.h2_refused(r);
        debug!(
            frame = r.frame.label(),
            reason = reason_label(r.reason),
            "http/2 layer refused on its own"
        );
    }
}

/// One stream's share of its tunnel.
struct Stream {
    deps: Arc<ConnectDeps>,
    ctx: Arc<TunnelCtx>,
    tunnel: Arc<InboundTunnel>,
    dials: Arc<DialBudget>,
    identity: Arc<IdentitySlot>,
}

/// A dialed workload connection and what it holds.
struct Upstream {
    tcp: TcpStream,
    /// The dial's budget token: given back once the peer sent bytes.
    borrowed: Borrowed,
    /// Its place under the connection caps, as long as the socket.
    _slot: DialSlot,
    /// Its registration with authorization, as long as the stream.
    admitted: Admitted,
}

/// Why a stream got no upstream.
enum Failed {
    /// Refused, with a status for the peer.
    Refused(InboundError),
    /// The peer reset the stream while it was being dialed.
    Reset,
}

impl From<InboundError> for Failed {
    fn from(e: InboundError) -> Self {
        Failed::Refused(e)
    }
}

impl From<Paced> for Failed {
    fn from(e: Paced) -> Self {
        Failed::Refused(e.into())
    }
}

impl From<OverLimit> for Failed {
    fn from(e: OverLimit) -> Self {
        Failed::Refused(e.into())
    }
}

impl Stream {
    async fn serve(
        self,
        req: Request<RecvStream>,
        mut respond: SendResponse<Bytes>,
        guard: StreamGuard,
    ) {
        let deps = &*self.deps;
        // The access line names the app port asked for, refused or not.
        let asked = asked_for(&req, &self.ctx);
        let mut ledger = ConnectionLedger::stream(&deps.metrics, guard, self.ctx.peer_addr, asked);
        ledger.source(self.ctx.peer.clone());
        ledger.destination(Some(self.ctx.workload.identity.clone()));
        // Boxed: the routing and dial state lives only while they run, not
        // in every stream's task for its whole life.
        let up = match Box::pin(self.open_upstream(&req, &mut respond, &mut ledger)).await {
            Ok(up) => up,
            Err(Failed::Refused(e)) => return refuse(ledger, respond, e),
            Err(Failed::Reset) => {
                debug!("peer reset the stream during its dial; dial abandoned");
                return self.ended_unanswered(ledger, "reset_during_dial");
            }
        };
        let resp = Response::builder()
            .status(StatusCode::OK)
            .body(())
            .expect("static");
        let send = match respond.send_response(resp, false) {
            Ok(s) => s,
            Err(e) => {
                debug!(error = %e, "peer went away before 200");
                return self.ended_unanswered(ledger, "tunnel_error");
            }
        };
        ledger.carrying();
        let Upstream {
            tcp: upstream,
            borrowed,
            _slot,
            admitted,
        } = up;
        let istio_bytes = ledger.istio_byte_counters(false);
        let copy = copy_bidirectional(
            &upstream,
            send,
            req.into_body(),
            &deps.metrics.bytes,
            &istio_bytes,
        );
        // A policy change that refuses the stream ends it: dropping the
        // copy resets the stream, and the workload's side is reset below.
        let (moved, result) = tokio::select! {
            copied = copy => copied,
            denial = admitted.refused() => {
                ledger::reset(&upstream);
                // Not the peer's waste: the policy ended a stream it opened in good faith.
                borrowed.useful();
                let error = InboundError::Policy(denial).to_string();
                let ended = Ended::new("policy_closed", Transferred::default())
                    .denied(&error)
                    .drained_by(self.tunnel.drained_by());
                return ledger.finish(ended);
            }
        };
        if moved.h2_to_tcp > 0 {
            borrowed.useful();
        } else {
            deps.inbound_metrics.dial_wasted("no_bytes");
        }
        if result.is_err() {
            // Reset the workload's side too: a cut stream is not a clean end.
            ledger::reset(&upstream);
        }
        ledger.finish(Ended::copied(moved, &result).drained_by(self.tunnel.drained_by()));
    }

    /// A stream that ends without an answer (the peer reset it or went
    /// away): its dial, if any, was wasted.
    fn ended_unanswered(&self, ledger: ConnectionLedger<'_>, result: &'static str) {
        let why = if result == "reset_during_dial" {
            result
        } else {
            "no_bytes"
        };
        self.deps.inbound_metrics.dial_wasted(why);
        ledger.finish(Ended::new(result, Transferred::default()));
    }

    /// Routes the CONNECT (Istio's report opens in `ledger`), then dials
    /// under the connection caps and within the tunnel's dial budget;
    /// gives the dial up if the peer resets the stream meanwhile.
    async fn open_upstream(
        &self,
        req: &Request<RecvStream>,
        respond: &mut SendResponse<Bytes>,
        ledger: &mut ConnectionLedger<'_>,
    ) -> Result<Upstream, Failed> {
        let (target, workload_uid) = {
            let snapshot = self.deps.workloads.snapshot();
            let target = route(req, &self.ctx, &snapshot, &self.deps.own_ports)?;
            let destination = snapshot.by_ip(target.ip());
            let baggage = Baggage::parse(req.headers().get_all(BAGGAGE_HEADER));
            ledger.report(istio_tcp::Connection {
                reporter: Reporter::Destination,
                source: snapshot.by_ip(self.ctx.peer_addr.ip()).map(|w| &**w),
                source_identity: Some(&self.ctx.peer),
                source_baggage: Some(&baggage),
                destination: destination.map(|w| &**w),
                service: None,
                mutual_tls: true,
            });
            let uid = destination.map(|w| w.uid().to_owned());
            (target, uid.unwrap_or_default())
        };
        // Registered before its check: a policy change in between is seen.
        let admitted = self
            .deps
            .authorizer
            .admit(Facts {
                src: self.ctx.peer_addr,
                dst: target,
                identity: Some(self.ctx.peer_identity.clone()),
                workload_uid,
                transport: Transport::Hbone,
            })
            .map_err(|e| match e {
                NotAdmitted::Policy(denial) => InboundError::Policy(denial),
                NotAdmitted::WorkloadGone => InboundError::NotLocal(target.ip()),
            })?;
        let slot = match self.identity.admit_dial() {
            Ok(s) => s,
            Err(over) => {
                let (peer, id) = (self.ctx.peer_addr, Some(&self.ctx.peer));
                self.identity
                    .limits()
                    .refused(over, Refused::Dial, peer, id);
                return Err(over.into());
            }
        };
        let (permit, borrowed) = self.dials.try_start()?;
        let connect =
            self.deps
                .origin
                .connect(target, Some(self.ctx.peer_addr.ip()), &self.deps.app_cc);
        let dialing = dial(target, connect, self.deps.cfg.connect_timeout);
        let reset = poll_fn(|cx| respond.poll_reset(cx));
        let dialed = tokio::select! {
            biased;
            _ = reset => return Err(Failed::Reset),
            d = dialing => d,
        };
        drop(permit);
        match dialed {
            Ok(tcp) => Ok(Upstream {
                tcp,
                borrowed,
                _slot: slot,
                admitted,
            }),
            Err(e) => {
                // Not the peer's waste: the workload did not answer.
                borrowed.useful();
                Err(e.into())
            }
        }
    }
}

/// The address the CONNECT asked for — the app's port — for the access
/// line; the dialed workload's address with port 0 when the authority is
/// no `ip:port` (the tunnel's own port is never logged as the target).
fn asked_for<B>(req: &Request<B>, ctx: &TunnelCtx) -> SocketAddr {
    req.uri()
        .authority()
        .and_then(|a| a.as_str().parse().ok())
        .unwrap_or(SocketAddr::new(ctx.dialed.ip(), 0))
}

/// Answers a refused CONNECT with its status and reason. Counted and
/// logged before the answer leaves: whoever reads the answer finds it counted.
fn refuse(ledger: ConnectionLedger<'_>, mut respond: SendResponse<Bytes>, e: InboundError) {
    debug!(error = %e, status = %e.status(), "CONNECT refused");
    let error = e.to_string();
    let resp = Response::builder()
        .status(e.status())
        .header(REASON_HEADER, &error)
        .body(())
        .expect("static response");
    ledger.refuse(e.reason(), e.flags(), Some(&error));
    let _ = respond.send_response(resp, true);
}

/// The upstream dial (`connect`: in the gateway's namespace, or in the
/// pod's with the client's address as source), bounded by `timeout`.
async fn dial(
    target: SocketAddr,
    connect: impl Future<Output = std::io::Result<TcpStream>>,
    timeout: Duration,
) -> Result<TcpStream, InboundError> {
    let connect = tokio::time::timeout(timeout, connect).await;
    let tcp = match connect {
        Ok(Ok(t)) => t,
        Ok(Err(source)) => {
            return Err(InboundError::Upstream {
                addr: target,
                source,
            })
        }
        Err(_) => {
            return Err(InboundError::Upstream {
                addr: target,
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
            })
        }
    };
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

#[cfg(test)]
mod tests;
