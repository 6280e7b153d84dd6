//! The client side of HBONE: dial a peer gateway (TCP, mTLS, HTTP/2) and open
//! CONNECT streams on the resulting tunnel.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use h2::client::{Connection, SendRequest};
use h2::{RecvStream, SendStream};
use http::{HeaderValue, Method, Request, StatusCode};
use tokio::net::TcpStream;

use super::client_io::{ClientIo, GoawayFlag};
use super::Settings;
use super::REASON_HEADER;
use crate::identity::SpiffeId;
use crate::tls::{HandshakeError, TlsContext};

pub type ClientConnection = Connection<ClientIo, Bytes>;

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("connect to {addr} failed: {source} (is the peer gateway listening on its HBONE port? maybe a NetworkPolicy blocks it)")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("dialing {addr} timed out after {timeout:?}")]
    Timeout { addr: SocketAddr, timeout: Duration },
    #[error(transparent)]
    Tls(#[from] HandshakeError),
    #[error("peer chose no ALPN or not h2")]
    NoH2,
    #[error("http/2 handshake: {0}")]
    H2(#[from] h2::Error),
}

impl DialError {
    pub fn reason(&self) -> &'static str {
        match self {
            DialError::Connect { source, .. }
                if source.kind() == std::io::ErrorKind::ConnectionRefused =>
            {
                "connect_refused"
            }
            DialError::Connect { .. } => "connect_error",
            DialError::Timeout { .. } => "connect_timeout",
            DialError::Tls(e) => e.reason(),
            DialError::NoH2 => "no_alpn",
            DialError::H2(_) => "h2_handshake",
        }
    }
}

/// A stream the peer refused or that failed before it was established.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("peer answered {status}{}", reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default())]
    Status {
        status: StatusCode,
        reason: Option<String>,
    },
    #[error("stream failed: {0}")]
    H2(#[from] h2::Error),
    #[error("peer did not answer the CONNECT within {0:?}")]
    Timeout(Duration),
}

impl StreamError {
    pub fn reason(&self) -> &'static str {
        match self {
            StreamError::Status { status, .. } => match status.as_u16() {
                400 => "status_400",
                401 => "status_401",
                503 => "status_503",
                _ => "status_other",
            },
            StreamError::H2(e) if e.is_go_away() => "tunnel_goaway",
            StreamError::H2(e) if e.reason() == Some(h2::Reason::REFUSED_STREAM) => {
                "refused_stream"
            }
            StreamError::H2(_) => "tunnel_error",
            StreamError::Timeout(_) => "connect_timeout",
        }
    }

    /// The stream never reached the peer's application: retrying on another tunnel is safe.
    pub fn retryable(&self) -> bool {
        matches!(self, StreamError::H2(e) if e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM))
    }
}

/// Dials `addr` as `src`, requiring the server to be `dst`, and runs the
/// HTTP/2 handshake. The returned connection must be polled (spawned) for the
/// tunnel to make progress.
pub async fn dial(
    tls: &TlsContext,
    cfg: &Settings,
    src: &SpiffeId,
    dst: &SpiffeId,
    addr: SocketAddr,
) -> Result<(SendRequest<Bytes>, ClientConnection), DialError> {
    let goaway = GoawayFlag::default();
    let dst = std::slice::from_ref(dst);
    dial_over(tls, cfg, src, dst, addr, TcpStream::connect(addr), goaway).await
}

/// [`dial`] over a TCP connection `connect` makes (in a pod's namespace,
/// say); the same bound covers it. `goaway` is raised when the peer's
/// GOAWAY is read ([`ClientIo`]). The server may be any of `dst`: the
/// destination workload's identity first, then those its Service vouches
/// for.
pub async fn dial_over(
    tls: &TlsContext,
    cfg: &Settings,
    src: &SpiffeId,
    dst: &[SpiffeId],
    addr: SocketAddr,
    connect: impl std::future::Future<Output = std::io::Result<TcpStream>>,
    goaway: GoawayFlag,
) -> Result<(SendRequest<Bytes>, ClientConnection), DialError> {
    let fut = async {
        let tcp = connect
            .await
            .map_err(|source| DialError::Connect { addr, source })?;
        tcp.set_nodelay(true)
            .map_err(|source| DialError::Connect { addr, source })?;
        let stream = tls.connect_any(src, dst, addr.ip(), tcp).await?;
        if stream.get_ref().1.alpn_protocol() != Some(crate::tls::ALPN_H2) {
            return Err(DialError::NoH2);
        }
        let io = ClientIo::new(stream, goaway);
        Ok(super::client_builder(cfg).handshake(io).await?)
    };
    tokio::time::timeout(cfg.connect_timeout, fut)
        .await
        .map_err(|_| DialError::Timeout {
            addr,
            timeout: cfg.connect_timeout,
        })?
}

/// Opens a CONNECT stream to `authority` and waits for the peer's answer.
/// Only `:method` and `:authority` are sent (RFC 9113 §8.5); ztunnel adds
/// `baggage` ([`connect_stream_with`]).
pub async fn connect_stream(
    send: SendRequest<Bytes>,
    authority: SocketAddr,
    timeout: Duration,
) -> Result<(SendStream<Bytes>, RecvStream), StreamError> {
    connect_stream_with(send, authority, timeout, None).await
}

/// [`connect_stream`] with a `baggage` header naming the source workload
/// ([`super::baggage`]).
pub async fn connect_stream_with(
    send: SendRequest<Bytes>,
    authority: SocketAddr,
    timeout: Duration,
    baggage: Option<HeaderValue>,
) -> Result<(SendStream<Bytes>, RecvStream), StreamError> {
    let mut send = send.ready().await?;
    let mut req = Request::builder()
        .method(Method::CONNECT)
        .uri(super::authority::write(authority))
        .body(())
        .expect("a socket address is a valid authority");
    if let Some(b) = baggage {
        req.headers_mut().insert(super::baggage::BAGGAGE_HEADER, b);
    }
    let (resp, stream) = send.send_request(req, false)?;
    let resp = tokio::time::timeout(timeout, resp)
        .await
        .map_err(|_| StreamError::Timeout(timeout))??;
    if resp.status() != StatusCode::OK {
        let reason = resp
            .headers()
            .get(REASON_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        return Err(StreamError::Status {
            status: resp.status(),
            reason,
        });
    }
    Ok((stream, resp.into_body()))
}
