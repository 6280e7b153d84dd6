//! The server side of one HBONE tunnel: HTTP/2 over an established mTLS
//! connection, one CONNECT stream per application connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{Method, Request, Response, StatusCode};
use tokio::net::TcpStream;
use tracing::{debug, info_span, warn, Instrument};

use super::REASON_HEADER;
use crate::identity::SpiffeId;
use crate::metrics::AccessLog;
use crate::proxy::copy::copy_bidirectional;
use crate::proxy::inbound::Inbound;
use crate::proxy::tunnels::Registration;
use crate::shutdown::ShutdownWatch;
use crate::tls::ServerTls;
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
    NotLocal(std::net::IpAddr),
    #[error("authority ip {authority} differs from the dialed workload ip {dialed}")]
    AuthorityMismatch {
        authority: std::net::IpAddr,
        dialed: std::net::IpAddr,
    },
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
pub fn route(
    req: &Request<RecvStream>,
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

/// Serves one tunnel until the peer closes it, keepalive declares it dead, or
/// it is drained.
///
/// Drain contract: when the gateway's drain signal fires or a GOAWAY is
/// requested through the registry, the tunnel starts a graceful two-phase
/// GOAWAY (GOAWAY with the maximum stream id, a PING round trip, the final
/// GOAWAY — RFC 9113 §6.8, as h2 implements it); open streams go on. When the
/// last stream ends the connection closes with TLS close_notify. At the
/// gateway's drain deadline the remaining streams are cut and the tunnel closed.
pub async fn serve(
    inbound: Arc<Inbound>,
    tls: ServerTls,
    ctx: TunnelCtx,
    registration: Registration,
    mut drain: ShutdownWatch,
) {
    let cfg = &inbound.cfg;
    // A peer that completes TLS but never sends the HTTP/2 preface must not
    // hold a task forever: the handshake is bounded like the TLS one.
    let handshake = super::server_builder(cfg).handshake::<_, Bytes>(tls);
    let mut conn = match tokio::time::timeout(cfg.connect_timeout, handshake).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            debug!(error = %e, "http/2 handshake failed");
            return inbound.metrics.connection_failed("h2_handshake");
        }
        Err(_) => return inbound.metrics.connection_failed("h2_handshake_timeout"),
    };
    let ping = conn.ping_pong().expect("ping_pong is taken once");
    let keepalive = super::keepalive::run(ping, cfg.keepalive_interval, cfg.keepalive_timeout);
    tokio::pin!(keepalive);
    let ctx = Arc::new(ctx);
    let tunnel = registration.tunnel.clone();
    let mut goaway_sent = false;
    let mut deadline_set = false;
    let deadline = tokio::time::sleep(std::time::Duration::ZERO);
    tokio::pin!(deadline);
    let mut commands = tunnel.goaway_commands();
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    let inbound = inbound.clone();
                    let ctx = ctx.clone();
                    let count = tunnel.stream_started();
                    let tunnel = tunnel.clone();
                    tokio::spawn(async move {
                        handle_stream(&inbound, &ctx, &tunnel, req, respond).await;
                        drop(count);
                    });
                }
                Some(Err(e)) => {
                    debug!(error = %e, "tunnel ended with error");
                    break;
                }
                None => break,
            },
            err = &mut keepalive => {
                warn!(error = %err, "closing dead tunnel");
                inbound.metrics.connection_failed("keepalive_timeout");
                break;
            }
            d = drain.signaled(), if !deadline_set => {
                debug!("gateway draining: graceful GOAWAY");
                if !goaway_sent {
                    conn.graceful_shutdown();
                    goaway_sent = true;
                }
                deadline_set = true;
                deadline.as_mut().reset(d);
            }
            changed = commands.changed() => {
                let Some(cmd) = *commands.borrow_and_update() else { continue };
                if changed.is_err() {
                    continue;
                }
                if !goaway_sent || !cmd.graceful {
                    if cmd.graceful {
                        debug!("GOAWAY requested: graceful");
                        conn.graceful_shutdown();
                    } else {
                        debug!("GOAWAY requested: immediate");
                        conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                    }
                    if !goaway_sent {
                        inbound.goaway_sent(cmd);
                    }
                    goaway_sent = true;
                }
                if let Some(d) = cmd.deadline {
                    if !deadline_set || d < deadline.deadline() {
                        deadline_set = true;
                        deadline.as_mut().reset(d);
                    }
                }
            }
            _ = &mut deadline, if deadline_set => {
                debug!(streams = tunnel.streams(), "drain deadline reached; closing tunnel");
                conn.abrupt_shutdown(h2::Reason::NO_ERROR);
                // Flush the GOAWAY briefly, then drop the connection.
                let _ = tokio::time::timeout(std::time::Duration::from_millis(100), async {
                    while conn.accept().await.is_some() {}
                })
                .await;
                break;
            }
        }
    }
    drop(registration);
}

async fn handle_stream(
    inbound: &Inbound,
    ctx: &TunnelCtx,
    tunnel: &crate::proxy::tunnels::InboundTunnel,
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    let started = Instant::now();
    let span = info_span!("stream", authority = %req.uri());
    async {
        let _guard = inbound.streams.track();
        let snapshot = inbound.workloads.snapshot();
        let result = match route(&req, ctx, &snapshot) {
            Ok(target) => dial(target, inbound.cfg.connect_timeout).await,
            Err(e) => Err(e),
        };
        let (upstream, target) = match result {
            Ok(x) => x,
            Err(e) => {
                debug!(error = %e, status = %e.status(), "CONNECT refused");
                let resp = Response::builder()
                    .status(e.status())
                    .header(REASON_HEADER, e.to_string())
                    .body(())
                    .expect("static response");
                let _ = respond.send_response(resp, true);
                inbound.metrics.stream_ended(e.reason());
                log(
                    ctx,
                    None,
                    ctx.dialed,
                    Default::default(),
                    started,
                    e.reason(),
                );
                return;
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
            let _ = socket2::SockRef::from(&upstream).set_linger(Some(std::time::Duration::ZERO));
        }
        inbound.metrics.stream_ended(outcome);
        log(ctx, tunnel.drained_by(), target, moved, started, outcome);
    }
    .instrument(span)
    .await
}

async fn dial(
    target: SocketAddr,
    timeout: std::time::Duration,
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
    moved: crate::proxy::copy::Transferred,
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
