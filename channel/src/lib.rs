//! The gRPC channel to istiod (its CA and its xDS server share one
//! address, `istiod.istio-system.svc:15012`): TLS 1.3 with ALPN `h2`,
//! verifying the server against PEM roots read from a file for every new
//! connection (a rotated mesh root applies without a restart), under a
//! name other than the address's host when asked (ztunnel's
//! `ALT_CA_HOSTNAME` / `ALT_XDS_HOSTNAME`). No tonic TLS feature: the
//! connection is ours, so it uses the project's crypto provider.
//!
//! The channel has a pulse ([`Pulse`]): a server that completes TLS and
//! then sends no HTTP/2 frame is dropped after `handshake_timeout`, and an
//! established connection that goes silent both ways (istiod's node gone,
//! no FIN or RST) is dropped when an HTTP/2 PING goes unanswered. Either
//! way the next call connects again.

#![forbid(unsafe_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::{Channel, Endpoint};

/// Where a channel goes and how its server is verified.
#[derive(Clone, Debug)]
pub struct Target {
    /// `https://host:port`.
    pub address: String,
    /// PEM roots that verify the server's certificate.
    pub roots: PathBuf,
    /// Verify the server as this name instead of the address's host.
    pub server_name: Option<String>,
    /// Bounds one connection attempt (TCP and TLS).
    pub connect_timeout: Duration,
    pub pulse: Pulse,
}

/// How a connection that stopped answering is noticed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pulse {
    /// An HTTP/2 PING is sent after this long without a frame from the
    /// server, also while no call is open (ztunnel: 30 s; istiod accepts
    /// PINGs every 15 s, with or without a stream).
    pub keepalive_interval: Duration,
    /// A PING not answered within this closes the connection (ztunnel:
    /// 10 s).
    pub keepalive_timeout: Duration,
    /// After TLS, the server's first HTTP/2 frame (its SETTINGS, which
    /// RFC 9113 §3.4 has it send first) must arrive within this, else the
    /// connection is closed.
    pub handshake_timeout: Duration,
    /// An xDS stream inside a message (its length prefix begun, the
    /// message not whole) with no byte for this long fails and is opened
    /// again (`tidegate_xds::mid_message`); between messages a stream may rest
    /// indefinitely. The CA client's calls are bounded as a whole instead.
    pub message_timeout: Duration,
}

impl Default for Pulse {
    fn default() -> Self {
        Pulse {
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            message_timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{address:?}: {message}")]
pub struct AddressError {
    pub address: String,
    pub message: String,
}

/// A channel to `target`, connected lazily and re-connected by tonic after
/// a failure. Only `https://` addresses: a node proxy never fetches
/// certificates or configuration in plaintext.
pub fn connect_lazy(target: &Target) -> Result<Channel, AddressError> {
    let bad = |message: String| AddressError {
        address: target.address.clone(),
        message,
    };
    let uri: Uri = target.address.parse().map_err(|e| bad(format!("{e}")))?;
    if uri.scheme_str() != Some("https") {
        return Err(bad("must be https://host:port".into()));
    }
    let host = uri
        .host()
        .ok_or_else(|| bad("no host".into()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let name = target.server_name.clone().unwrap_or_else(|| host.clone());
    let server_name = ServerName::try_from(name.clone())
        .map_err(|e| bad(format!("server name {name:?}: {e}")))?;
    let pulse = target.pulse;
    let endpoint = Endpoint::from_shared(target.address.clone())
        .map_err(|e| bad(e.to_string()))?
        .http2_keep_alive_interval(pulse.keepalive_interval)
        .keep_alive_timeout(pulse.keepalive_timeout)
        .keep_alive_while_idle(true);
    let (roots, timeout) = (target.roots.clone(), target.connect_timeout);
    let connector = tower::service_fn(move |_: Uri| {
        let (host, roots, server_name) = (host.clone(), roots.clone(), server_name.clone());
        let connect = async move {
            let tls = client_config(&roots)?;
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let stream = tokio_rustls::TlsConnector::from(tls)
                .connect(server_name, tcp)
                .await?;
            let preface = Preface {
                io: stream,
                deadline: Some(Box::pin(tokio::time::sleep(pulse.handshake_timeout))),
                after: pulse.handshake_timeout,
            };
            Ok::<_, std::io::Error>(TokioIo::new(preface))
        };
        async move {
            tokio::time::timeout(timeout, connect)
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
        }
    });
    Ok(endpoint.connect_with_connector_lazy(connector))
}

/// A connection until the server's first bytes over TLS: a read still
/// waiting for them past the deadline fails, which fails the HTTP/2
/// connection and every call on it. Afterwards a plain pass-through.
struct Preface<S> {
    io: S,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    after: Duration,
}

impl<S: AsyncRead + Unpin> AsyncRead for Preface<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if read.is_ready() {
            if buf.filled().len() > before {
                this.deadline = None;
            }
            return read;
        }
        let expired = this
            .deadline
            .as_mut()
            .is_some_and(|d| d.as_mut().poll(cx).is_ready());
        if !expired {
            return Poll::Pending;
        }
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{NO_PREFACE} {:?} of the TLS handshake", this.after),
        )))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Preface<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// How the error that closes a connection whose server sent no HTTP/2
/// frame after TLS begins. h2 keeps an I/O error's kind and text, not its
/// type, so the text is what identifies it.
const NO_PREFACE: &str = "no HTTP/2 frame from the server within";

/// The message of `e`'s (or a wrapped error's) closing of a connection
/// whose server sent no HTTP/2 frame within [`Pulse::handshake_timeout`].
pub fn no_preface(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            let message = io.to_string();
            if io.kind() == std::io::ErrorKind::TimedOut && message.starts_with(NO_PREFACE) {
                return Some(message);
            }
        }
        next = e.source();
    }
    None
}

/// Whether `e` (or an error it wraps) is a connection attempt's timeout.
pub fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// A client config trusting the PEM roots at `path`: TLS 1.3, ALPN `h2`.
pub fn client_config(path: &Path) -> Result<Arc<rustls::ClientConfig>, std::io::Error> {
    let pem = std::fs::read(path)?;
    let mut store = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?;
        store
            .add(cert)
            .map_err(|e| std::io::Error::other(format!("{}: {e}", path.display())))?;
    }
    if store.is_empty() {
        return Err(std::io::Error::other(format!(
            "{}: no PEM certificate",
            path.display()
        )));
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(tidegate_protocol::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("ring supports TLS 1.3")
        .with_root_certificates(store)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![tidegate_protocol::tls::ALPN_H2.to_vec()];
    Ok(Arc::new(cfg))
}
