//! The Istio CA client: one gRPC call, `CreateCertificate`, over TLS that
//! verifies the CA against roots read from a file (re-read for every new
//! connection, so a rotated root applies without a restart), with the
//! headers istiod expects (`authorization: Bearer <token>`, the token file
//! re-read for every request; `clusterid`). A call — connecting included —
//! not answered within `timeout` is a [`CaClientError::Timeout`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tidegate_channel as channel;
use tonic::transport::Channel;

use super::messages::{IstioCertificateRequest, IstioCertificateResponse};
use super::CREATE_CERTIFICATE;

/// Where and how to reach the CA.
#[derive(Clone, Debug)]
pub struct CaClientConfig {
    /// `https://host:port`.
    pub address: String,
    /// PEM roots that verify the CA's serving certificate.
    pub roots: PathBuf,
    /// The projected service-account token (audience `istio-ca`). Unset:
    /// no `authorization` header (Cilium's agent checks no token).
    pub token: Option<PathBuf>,
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
        // The whole call is bounded in `create_certificate`; the connection
        // attempt and the server's HTTP/2 preface, which run on the
        // channel's own task, are bounded here, so a CA that stopped
        // answering is dropped and the next call connects again (so is one
        // whose PINGs go unanswered).
        let channel = channel::connect_lazy(&channel::Target {
            address: cfg.address.clone(),
            roots: cfg.roots.clone(),
            server_name: cfg.server_name.clone(),
            connect_timeout: cfg.timeout,
            pulse: channel::Pulse {
                handshake_timeout: cfg.timeout,
                ..channel::Pulse::default()
            },
        })
        .map_err(|e| CaClientError::Address {
            address: e.address,
            message: e.message,
        })?;
        Ok(CaClient {
            channel,
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
        let token = match &self.cfg.token {
            Some(path) => Some((
                path,
                std::fs::read_to_string(path).map_err(|source| CaClientError::Token {
                    path: path.clone(),
                    source,
                })?,
            )),
            None => None,
        };
        channel::client_config(&self.cfg.roots).map_err(|e| CaClientError::Roots {
            path: self.cfg.roots.clone(),
            message: e.to_string(),
        })?;
        let mut req = tonic::Request::new(request);
        let md = req.metadata_mut();
        if let Some((path, token)) = token {
            let bearer = format!("Bearer {}", token.trim());
            md.insert(
                "authorization",
                bearer.parse().map_err(|_| CaClientError::Token {
                    path: path.clone(),
                    source: std::io::Error::other("the token is not a valid header value"),
                })?,
            );
        }
        if let Ok(v) = self.cfg.cluster_id.parse() {
            md.insert("clusterid", v);
        }
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.map_err(|e| {
            if channel::timed_out(&e) {
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
