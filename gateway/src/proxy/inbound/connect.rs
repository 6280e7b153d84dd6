//! One CONNECT on an inbound tunnel: route and authorize it, dial the
//! workload, copy the bytes, log the stream. The [`StreamHandler`] the HBONE
//! server calls for each stream.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{Method, Request, Response, StatusCode};
use tokio::net::TcpStream;
use tracing::{debug, info_span, Instrument};

use super::Inbound;
use crate::hbone::server::StreamHandler;
use crate::hbone::{GoawayCommand, REASON_HEADER};
use crate::identity::SpiffeId;
use crate::metrics::AccessLog;
use crate::proxy::copy::{copy_bidirectional, Transferred};
use crate::proxy::tunnels::InboundTunnel;
use crate::workloads::{Workload, WorkloadSnapshot};

/// Facts about a tunnel fixed at accept time.
pub struct TunnelCtx {
    pub peer: SpiffeId,
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
    #[error("authority ip {0} is not a workload on this node")]
    NotLocal(IpAddr),
    #[error("authority ip {authority} differs from the dialed workload ip {dialed}")]
    AuthorityMismatch { authority: IpAddr, dialed: IpAddr },
    #[error("{peer} may not connect to {workload}")]
    Denied { peer: SpiffeId, workload: String },
    #[error("upstream {addr} unreachable: {source}")]
    Upstream {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl InboundError {
    pub fn status(&self) -> StatusCode {
        match self {
            InboundError::Denied { .. } => StatusCode::UNAUTHORIZED,
            InboundError::Upstream { .. } => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            InboundError::NotConnect(_) => "not_connect",
            InboundError::BadAuthority(_) => "bad_authority",
            InboundError::NotLocal(_) => "target_not_local",
            InboundError::AuthorityMismatch { .. } => "authority_mismatch",
            InboundError::Denied { .. } => "denied",
            InboundError::Upstream { .. } => "upstream_unreachable",
        }
    }
}

/// Validates a CONNECT against the tunnel; never an open proxy: the target
/// must be the very workload the peer dialed, on this node.
pub fn route<B>(
    req: &Request<B>,
    ctx: &TunnelCtx,
    snapshot: &WorkloadSnapshot,
) -> Result<SocketAddr, InboundError> {
    if req.method() != Method::CONNECT {
        return Err(InboundError::NotConnect(req.method().clone()));
    }
    let authority = req
        .uri()
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_default();
    let target: SocketAddr = authority
        .parse()
        .map_err(|_| InboundError::BadAuthority(authority.clone()))?;
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
    if !workload.allows(&ctx.peer) {
        return Err(InboundError::Denied {
            peer: ctx.peer.clone(),
            workload: workload.uid().to_owned(),
        });
    }
    Ok(target)
}

/// The streams of one inbound tunnel.
pub(super) struct ConnectHandler {
    pub(super) inbound: Arc<Inbound>,
    pub(super) ctx: Arc<TunnelCtx>,
    pub(super) tunnel: Arc<InboundTunnel>,
}

impl StreamHandler for ConnectHandler {
    fn handle(
        &self,
        req: Request<RecvStream>,
        respond: SendResponse<Bytes>,
    ) -> impl Future<Output = ()> + Send + 'static {
        // Counted from acceptance, so a drain waiting for idle sees it at once.
        let count = self.tunnel.stream_started();
        let inbound = self.inbound.clone();
        let ctx = self.ctx.clone();
        let tunnel = self.tunnel.clone();
        let span = info_span!("stream", authority = %req.uri());
        async move {
            handle_stream(&inbound, &ctx, &tunnel, req, respond).await;
            drop(count);
        }
        .instrument(span)
    }

    fn goaway_sent(&self, cmd: GoawayCommand) {
        self.inbound.goaway_sent(cmd);
    }
}

async fn handle_stream(
    inbound: &Inbound,
    ctx: &TunnelCtx,
    tunnel: &InboundTunnel,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    let started = Instant::now();
    let _guard = inbound.streams.track();
    let snapshot = inbound.workloads.snapshot();
    let result = match route(&req, ctx, &snapshot) {
        Ok(target) => dial(target, inbound.cfg.connect_timeout).await,
        Err(e) => Err(e),
    };
    let (upstream, target) = match result {
        Ok(x) => x,
        Err(e) => return refuse(inbound, ctx, respond, e, started),
    };
    let resp = Response::builder()
        .status(StatusCode::OK)
        .body(())
        .expect("static");
    let send = match respond.send_response(resp, false) {
        Ok(s) => s,
        Err(e) => {
            debug!(error = %e, "peer went away before 200");
            return inbound.metrics.stream_ended("tunnel_error");
        }
    };
    inbound.metrics.streams_open.inc();
    let (moved, result) =
        copy_bidirectional(&upstream, send, req.into_body(), &inbound.metrics.bytes).await;
    inbound.metrics.streams_open.dec();
    let outcome = match &result {
        Ok(()) => "ok",
        Err(e) => e.reason(),
    };
    if result.is_err() {
        // Reset the workload's side too: a cut stream is not a clean end.
        let _ = socket2::SockRef::from(&upstream).set_linger(Some(Duration::ZERO));
    }
    inbound.metrics.stream_ended(outcome);
    log(ctx, tunnel.drained_by(), target, moved, started, outcome);
}

/// Answers a refused CONNECT with its status and reason, counts and logs it.
fn refuse(
    inbound: &Inbound,
    ctx: &TunnelCtx,
    mut respond: SendResponse<Bytes>,
    e: InboundError,
    started: Instant,
) {
    debug!(error = %e, status = %e.status(), "CONNECT refused");
    let resp = Response::builder()
        .status(e.status())
        .header(REASON_HEADER, e.to_string())
        .body(())
        .expect("static response");
    let _ = respond.send_response(resp, true);
    inbound.metrics.stream_ended(e.reason());
    let moved = Transferred::default();
    log(ctx, None, ctx.dialed, moved, started, e.reason());
}

async fn dial(
    target: SocketAddr,
    timeout: Duration,
) -> Result<(TcpStream, SocketAddr), InboundError> {
    let connect = tokio::time::timeout(timeout, TcpStream::connect(target)).await;
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
    Ok((tcp, target))
}

fn log(
    ctx: &TunnelCtx,
    drained_by: Option<&str>,
    dst: SocketAddr,
    moved: Transferred,
    started: Instant,
    result: &str,
) {
    AccessLog {
        direction: "inbound",
        src_identity: &ctx.peer.to_string(),
        dst_identity: &ctx.workload.identity.to_string(),
        src_addr: ctx.peer_addr,
        dst_addr: dst,
        moved,
        duration: started.elapsed(),
        result,
        drained_by,
    }
    .emit();
}

#[cfg(test)]
mod tests;
