//! The server side of one HBONE tunnel: HTTP/2 over an established mTLS
//! connection, one CONNECT stream per application connection.
//!
//! This layer knows the HTTP/2 handshake and settings, keepalive, GOAWAY
//! commands and the drain deadline. What a stream means (routing,
//! authorization, the upstream dial) is the [`StreamHandler`]'s business,
//! the proxy's inbound side, as in ztunnel's `proxy/h2/server.rs`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use h2::server::{Connection, SendResponse};
use h2::RecvStream;
use http::Request;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tracing::{debug, warn};

use super::io::{CloseNotify, Refusal, RefusalSink, ServerIo};
use super::keepalive::KeepaliveError;
use super::GoawayCommand;
use super::Settings;
use crate::tls::ServerTls;
use tidegate_base::shutdown::ShutdownWatch;

/// What to do with each accepted HTTP/2 stream.
pub trait StreamHandler: Send + Sync + 'static {
    /// Called in the accept loop, once per stream; the returned future is
    /// spawned and owns the stream from then on.
    fn handle(
        &self,
        req: Request<RecvStream>,
        respond: SendResponse<Bytes>,
    ) -> impl Future<Output = ()> + Send + 'static;

    /// The tunnel sent its first GOAWAY because of `cmd`.
    fn goaway_sent(&self, _cmd: GoawayCommand) {}

    /// h2 wrote an error-coded RST_STREAM or GOAWAY on its own (a stream or
    /// connection refused before or without the handler): see [`super::io`].
    fn refused(&self, _refusal: Refusal) {}
}

/// Why a tunnel could not start serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("http/2 handshake failed: {0}")]
    Handshake(h2::Error),
    #[error("http/2 handshake timed out")]
    HandshakeTimeout,
}

impl ServeError {
    pub fn reason(&self) -> &'static str {
        match self {
            ServeError::Handshake(_) => "h2_handshake",
            ServeError::HandshakeTimeout => "h2_handshake_timeout",
        }
    }
}

/// How a served tunnel ended.
#[derive(Debug)]
pub enum TunnelEnd {
    /// The peer closed it, or it closed after a GOAWAY once its streams ended.
    Closed,
    /// The connection failed.
    Error(h2::Error),
    /// The peer stopped answering PINGs.
    Keepalive(KeepaliveError),
    /// The drain deadline passed; remaining streams were cut.
    Deadline,
}

/// Where one tunnel stands in its GOAWAY sequence.
struct Goaway {
    sent: bool,
    deadline_set: bool,
    /// How the stream closes in the end; GOAWAY commands set it.
    close_notify: CloseNotify,
}

type Conn = Connection<ServerIo, Bytes>;

/// Serves one tunnel until the peer closes it, keepalive declares it dead, or
/// it is drained.
///
/// Drain contract: when `shutdown` fires or a GOAWAY is requested on
/// `commands`, the tunnel starts a graceful two-phase GOAWAY (GOAWAY with the
/// maximum stream id, a PING round trip, the final GOAWAY: RFC 9113 §6.8, as
/// h2 implements it); open streams go on. When the last stream ends the
/// connection closes, with a TLS close_notify alert unless the command said
/// `close_notify: false` (then the TCP connection just ends; see
/// [`ServerIo`]). At the deadline (the shutdown's, or a command's) the
/// remaining streams are cut and the tunnel closed the same way.
pub async fn serve<H: StreamHandler>(
    tls: ServerTls,
    cfg: &Settings,
    handler: Arc<H>,
    mut commands: watch::Receiver<Option<GoawayCommand>>,
    mut shutdown: ShutdownWatch,
) -> Result<TunnelEnd, ServeError> {
    let sink: RefusalSink = {
        let handler = handler.clone();
        Arc::new(move |r| handler.refused(r))
    };
    let io = ServerIo::new(tls, sink);
    let mut goaway = Goaway {
        sent: false,
        deadline_set: false,
        close_notify: io.close_notify(),
    };
    let mut conn = handshake(io, cfg).await?;
    let ping = conn.ping_pong().expect("ping_pong is taken once");
    let keepalive = super::keepalive::run(ping, cfg.keepalive_interval, cfg.keepalive_timeout);
    tokio::pin!(keepalive);
    let deadline = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(deadline);
    let handler = &*handler;
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    tokio::spawn(handler.handle(req, respond));
                }
                Some(Err(e)) => {
                    debug!(error = %e, "tunnel ended with error");
                    return Ok(TunnelEnd::Error(e));
                }
                None => return Ok(TunnelEnd::Closed),
            },
            err = &mut keepalive => {
                warn!(error = %err, "closing dead tunnel");
                return Ok(TunnelEnd::Keepalive(err));
            }
            at = shutdown.signaled(), if !goaway.deadline_set => {
                debug!("gateway shutting down: graceful GOAWAY");
                goaway.on_shutdown(&mut conn, deadline.as_mut(), at);
            }
            changed = commands.changed() => {
                let Some(cmd) = *commands.borrow_and_update() else { continue };
                if changed.is_ok() {
                    goaway.on_command(&mut conn, deadline.as_mut(), cmd, handler);
                }
            }
            _ = &mut deadline, if goaway.deadline_set => {
                close_at_deadline(&mut conn).await;
                return Ok(TunnelEnd::Deadline);
            }
        }
    }
}

/// Refuses a tunnel whose TLS handshake succeeded (its peer is over a
/// cap): completes the HTTP/2 handshake, bounded like the TLS one, sends
/// GOAWAY with `reason` before any stream, and closes once the peer has
/// read it (or after `connect_timeout`). The peer learns why from the
/// error code instead of a bare close.
pub async fn refuse(tls: ServerTls, cfg: &Settings, reason: h2::Reason) {
    // Our own refusal: not one h2 made by itself (`h2_refusals_total`).
    let io = ServerIo::new(tls, Arc::new(|_| {}));
    let Ok(mut conn) = handshake(io, cfg).await else {
        return;
    };
    conn.abrupt_shutdown(reason);
    let _ = tokio::time::timeout(cfg.connect_timeout, async {
        while let Some(Ok(_)) = conn.accept().await {}
    })
    .await;
}

/// The HTTP/2 handshake, bounded like the TLS one: a peer that completes TLS
/// but never sends the preface must not hold a task forever.
async fn handshake(io: ServerIo, cfg: &Settings) -> Result<Conn, ServeError> {
    let handshake = super::server_builder(cfg).handshake::<_, Bytes>(io);
    match tokio::time::timeout(cfg.connect_timeout, handshake).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => {
            debug!(error = %e, "http/2 handshake failed");
            Err(ServeError::Handshake(e))
        }
        Err(_) => Err(ServeError::HandshakeTimeout),
    }
}

impl Goaway {
    fn on_shutdown(&mut self, conn: &mut Conn, deadline: Pin<&mut Sleep>, at: Instant) {
        if !self.sent {
            conn.graceful_shutdown();
            self.sent = true;
        }
        self.deadline_set = true;
        deadline.reset(at);
    }

    /// A later command can only make things stricter: immediate after
    /// graceful, an earlier deadline.
    fn on_command(
        &mut self,
        conn: &mut Conn,
        deadline: Pin<&mut Sleep>,
        cmd: GoawayCommand,
        handler: &impl StreamHandler,
    ) {
        // The merged command (see `InboundTunnel::request_goaway`) decides.
        self.close_notify.set(cmd.close_notify);
        if !self.sent || !cmd.graceful {
            if cmd.graceful {
                debug!("GOAWAY requested: graceful");
                conn.graceful_shutdown();
            } else {
                debug!("GOAWAY requested: immediate");
                conn.abrupt_shutdown(h2::Reason::NO_ERROR);
            }
            if !self.sent {
                handler.goaway_sent(cmd);
            }
            self.sent = true;
        }
        if let Some(d) = cmd.deadline {
            if !self.deadline_set || d < deadline.deadline() {
                self.deadline_set = true;
                deadline.reset(d);
            }
        }
    }
}

/// Sends the final GOAWAY, flushes it briefly, and gives the connection up.
async fn close_at_deadline(conn: &mut Conn) {
    debug!("drain deadline reached; closing tunnel");
    conn.abrupt_shutdown(h2::Reason::NO_ERROR);
    let _ = tokio::time::timeout(Duration::from_millis(100), async {
        while conn.accept().await.is_some() {}
    })
    .await;
}
