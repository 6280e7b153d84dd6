//! The Istio CA client: one gRPC call, `CreateCertificate`, over TLS that
//! verifies the CA against roots read from a file (re-read for every new
//! connection, so a rotated root applies without a restart), with the
//! headers istiod expects (`authorization: Bearer <token>`, the token file
//! re-read for every request; `clusterid`). A call — connecting included —
//! not answered within `timeout` is a [`CaClientError::Timeout`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tonic::transport::{Channel, Endpoint};

use super::messages::{IstioCertificateRequest, IstioCertificateResponse};
use super::CREATE_CERTIFICATE;

/// Where and how to reach the CA.
#[derive(Clone, Debug)]
pub struct CaClientConfig {
    /// `https://host:port`.
    pub address: String,
    /// PEM roots that verify the CA's serving certificate.
    pub roots: PathBuf,
    /// The projected service-account token (audience `istio-ca`).
    pub token: PathBuf,
    pub cluster_id: String,
    /// Verify the CA as this name instead of the address's host
    /// (ztunnel's `ALT_CA_HOSTNAME`).
    pub server_name: Option<String>,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum CaClientError {
    #[error("certificates.address {address:?}: {message}")]
    Address { address: String, message: String },
    #[error("cannot read the CA roots {path}: {message}")]
    Roots { path: PathBuf, message: String },
    #[error("cannot read the token {path}: {source}")]
    Token {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The call failed: transport (`Unavailable`), refusal
    /// (`Unauthenticated`), or anything else the CA answered.
    #[error("CA answered {code:?}: {message}")]
    Status { code: tonic::Code, message: String },
    #[error("the CA did not answer within certificates.timeout ({after:?}); check that it is reachable and not overloaded")]
    Timeout { after: Duration },
}

impl CaClientError {
    /// A bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CaClientError::Address { .. } => "config",
            CaClientError::Roots { .. } => "roots",
            CaClientError::Token { .. } => "token",
            CaClientError::Status { code, .. } => match code {
                tonic::Code::Unavailable => "unavailable",
                tonic::Code::DeadlineExceeded => "timeout",
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => "refused",
                _ => "error",
            },
            CaClientError::Timeout { .. } => "timeout",
        }
    }
}

impl From<tonic::Status> for CaClientError {
    fn from(s: tonic::Status) -> Self {
        CaClientError::Status {
            code: s.code(),
            message: s.message().to_owned(),
        }
    }
}

/// A connection to the CA, established lazily and re-established by tonic
/// after a failure.
#[derive(Clone)]
pub struct CaClient {
    channel: Channel,
    cfg: Arc<CaClientConfig>,
}

impl CaClient {
    pub fn new(cfg: CaClientConfig) -> Result<CaClient, CaClientError> {
        let bad = |message: String| CaClientError::Address {
            address: cfg.address.clone(),
            message,
        };
        let uri: Uri = cfg.address.parse().map_err(|e| bad(format!("{e}")))?;
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
        let name = cfg.server_name.clone().unwrap_or_else(|| host.clone());
        let server_name = ServerName::try_from(name.clone())
            .map_err(|e| bad(format!("server name {name:?}: {e}")))?;
        // The whole call is bounded in `create_certificate`; the connection
        // attempt, which runs on the channel's own task, is bounded here.
        let endpoint =
            Endpoint::from_shared(cfg.address.clone()).map_err(|e| bad(e.to_string()))?;
        let (roots, timeout) = (cfg.roots.clone(), cfg.timeout);
        let connector = tower::service_fn(move |_: Uri| {
            let (host, roots, server_name) = (host.clone(), roots.clone(), server_name.clone());
            let connect = async move {
                let tls = tls_config(&roots)?;
                let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
                tcp.set_nodelay(true)?;
                let stream = tokio_rustls::TlsConnector::from(tls)
                    .connect(server_name, tcp)
                    .await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            };
            async move {
                tokio::time::timeout(timeout, connect)
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
            }
        });
        Ok(CaClient {
            channel: endpoint.connect_with_connector_lazy(connector),
            cfg: Arc::new(cfg),
        })
    }

    /// Sends one request; returns the PEM chain (leaf first, root last).
    pub async fn create_certificate(
        &self,
        request: IstioCertificateRequest,
    ) -> Result<Vec<String>, CaClientError> {
        let after = self.cfg.timeout;
        tokio::time::timeout(after, self.call(request))
            .await
            .map_err(|_| CaClientError::Timeout { after })?
    }

    async fn call(&self, request: IstioCertificateRequest) -> Result<Vec<String>, CaClientError> {
        let token =
            std::fs::read_to_string(&self.cfg.token).map_err(|source| CaClientError::Token {
                path: self.cfg.token.clone(),
                source,
            })?;
        tls_config(&self.cfg.roots).map_err(|e| CaClientError::Roots {
            path: self.cfg.roots.clone(),
            message: e.to_string(),
        })?;
        let mut req = tonic::Request::new(request);
        let md = req.metadata_mut();
        let bearer = format!("Bearer {}", token.trim());
        md.insert(
            "authorization",
            bearer.parse().map_err(|_| CaClientError::Token {
                path: self.cfg.token.clone(),
                source: std::io::Error::other("the token is not a valid header value"),
            })?,
        );
        if let Ok(v) = self.cfg.cluster_id.parse() {
            md.insert("clusterid", v);
        }
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.map_err(|e| {
            if timed_out(&e) {
                return CaClientError::Timeout {
                    after: self.cfg.timeout,
                };
            }
            CaClientError::from(tonic::Status::unavailable(format!("CA not reachable: {e}")))
        })?;
        let codec =
            tonic_prost::ProstCodec::<IstioCertificateRequest, IstioCertificateResponse>::default();
        let resp = grpc
            .unary(
                req,
                http::uri::PathAndQuery::from_static(CREATE_CERTIFICATE),
                codec,
            )
            .await?;
        Ok(resp.into_inner().cert_chain)
    }
}

/// Whether `e` (or an error it wraps) is the connection attempt's timeout.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
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

/// A client config trusting the PEM roots at `path`.
fn tls_config(path: &std::path::Path) -> Result<Arc<rustls::ClientConfig>, std::io::Error> {
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
