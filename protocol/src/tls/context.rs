//! Builds rustls configurations per identity and runs handshakes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ServerConfig, SignatureScheme};
use tokio::net::TcpStream;

use super::verify::{
    identity_of, Chain, IdentityError, SpiffeClientVerifier, SpiffeServerVerifier,
};
use super::{provider, CertError, CertSource, TlsMetrics, ALPN_H2};
use crate::identity::SpiffeId;
use tidegate_base::sync::Locked;

pub type ServerTls = tokio_rustls::server::TlsStream<TcpStream>;
pub type ClientTls = tokio_rustls::client::TlsStream<TcpStream>;

/// A failed handshake, with a bounded reason for metrics and logs.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("no certificate for local identity: {0}")]
    Cert(#[from] CertError),
    #[error("tls handshake failed ({reason}): {source}")]
    Failed {
        reason: &'static str,
        source: std::io::Error,
    },
}

impl HandshakeError {
    pub fn reason(&self) -> &'static str {
        match self {
            HandshakeError::Cert(_) => "no_local_certificate",
            HandshakeError::Failed { reason, .. } => reason,
        }
    }
}

/// Maps a handshake error to a small, bounded reason.
pub fn classify(err: &std::io::Error) -> &'static str {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    let Some(tls) = err.get_ref().and_then(|e| e.downcast_ref::<E>()) else {
        return match err.kind() {
            std::io::ErrorKind::UnexpectedEof => "eof",
            std::io::ErrorKind::TimedOut => "timeout",
            _ => "io",
        };
    };
    match tls {
        E::NoCertificatesPresented => "no_client_cert",
        // No trust anchor issued it; a CA with the same name but another key
        // shows up as a bad signature on the chain.
        E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => "untrusted_ca",
        E::InvalidCertificate(C::Expired) => "expired",
        E::InvalidCertificate(C::Other(o)) => match o.0.downcast_ref::<IdentityError>() {
            Some(id) => id.reason(),
            None => "bad_certificate",
        },
        E::InvalidCertificate(_) => "bad_certificate",
        E::AlertReceived(
            A::BadCertificate | A::UnknownCA | A::CertificateUnknown | A::AccessDenied,
        ) => "peer_rejected_certificate",
        E::AlertReceived(A::CertificateRequired) => "peer_requires_client_cert",
        E::AlertReceived(_) => "peer_alert",
        E::NoApplicationProtocol => "no_alpn",
        E::PeerIncompatible(_) => "incompatible",
        _ => "protocol",
    }
}

#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

impl ResolvesClientCert for Fixed {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A server config and the certificate it was built with.
type CachedServerConfig = (Arc<CertifiedKey>, Arc<ServerConfig>);

/// TLS for every local identity. Server configs are cached per identity and
/// rebuilt when the certificate changes; trust bundle changes apply at once
/// because the verifiers read the current roots on every handshake.
pub struct TlsContext {
    source: Arc<dyn CertSource>,
    provider: Arc<CryptoProvider>,
    trust_domain: String,
    server_cache: Mutex<HashMap<SpiffeId, CachedServerConfig>>,
    pub metrics: TlsMetrics,
}

impl TlsContext {
    pub fn new(source: Arc<dyn CertSource>, trust_domain: &str, metrics: TlsMetrics) -> Self {
        TlsContext {
            source,
            provider: provider(),
            trust_domain: trust_domain.to_owned(),
            server_cache: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    fn chain(&self) -> Chain {
        Chain {
            source: self.source.clone(),
            provider: self.provider.clone(),
        }
    }

    pub fn source(&self) -> &Arc<dyn CertSource> {
        &self.source
    }

    pub fn server_config(&self, id: &SpiffeId) -> Result<Arc<ServerConfig>, CertError> {
        self.server_config_with(id, self.source.certified_key(id)?)
    }

    fn server_config_with(
        &self,
        id: &SpiffeId,
        key: Arc<CertifiedKey>,
    ) -> Result<Arc<ServerConfig>, CertError> {
        let mut cache = self.server_cache.locked();
        if let Some((k, cfg)) = cache.get(id) {
            if Arc::ptr_eq(k, &key) {
                return Ok(cfg.clone());
            }
        }
        let verifier = Arc::new(SpiffeClientVerifier {
            chain: self.chain(),
            trust_domain: self.trust_domain.clone(),
        });
        let mut cfg = ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("ring supports TLS 1.3")
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(Arc::new(Fixed(key.clone())));
        cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
        // Every tunnel is a full handshake: identities are verified each time
        // and no ticket state outlives a certificate rotation.
        cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        cfg.send_tls13_tickets = 0;
        let cfg = Arc::new(cfg);
        cache.insert(id.clone(), (key, cfg.clone()));
        Ok(cfg)
    }

    pub fn client_config(
        &self,
        src: &SpiffeId,
        expected: &SpiffeId,
    ) -> Result<Arc<ClientConfig>, CertError> {
        self.client_config_with(
            std::slice::from_ref(expected),
            self.source.certified_key(src)?,
        )
    }

    /// `expected`: the identities the server may present, the destination
    /// workload's first.
    fn client_config_with(
        &self,
        expected: &[SpiffeId],
        key: Arc<CertifiedKey>,
    ) -> Result<Arc<ClientConfig>, CertError> {
        let verifier = Arc::new(SpiffeServerVerifier {
            chain: self.chain(),
            expected: expected.to_vec(),
        });
        let mut cfg = ClientConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("ring supports TLS 1.3")
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_cert_resolver(Arc::new(Fixed(key)));
        cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
        cfg.resumption = rustls::client::Resumption::disabled();
        Ok(Arc::new(cfg))
    }

    /// Server handshake presenting `local`'s certificate; returns the verified peer identity.
    pub async fn accept(
        &self,
        local: &SpiffeId,
        tcp: TcpStream,
    ) -> Result<(ServerTls, SpiffeId), HandshakeError> {
        let result = self.accept_inner(local, tcp).await;
        self.metrics
            .record_handshake("inbound", result.as_ref().err());
        result
    }

    async fn accept_inner(
        &self,
        local: &SpiffeId,
        tcp: TcpStream,
    ) -> Result<(ServerTls, SpiffeId), HandshakeError> {
        let key = self.source.fetch(local).await?;
        let cfg = self.server_config_with(local, key)?;
        let tls = tokio_rustls::TlsAcceptor::from(cfg)
            .accept(tcp)
            .await
            .map_err(|source| HandshakeError::Failed {
                reason: classify(&source),
                source,
            })?;
        let peer = peer_identity(tls.get_ref().1.peer_certificates())?;
        Ok((tls, peer))
    }

    /// Client handshake as `src`, requiring the server to be `expected`.
    pub async fn connect(
        &self,
        src: &SpiffeId,
        expected: &SpiffeId,
        dst_ip: IpAddr,
        tcp: TcpStream,
    ) -> Result<ClientTls, HandshakeError> {
        self.connect_any(src, std::slice::from_ref(expected), dst_ip, tcp)
            .await
    }

    /// Client handshake as `src`, requiring the server to be one of
    /// `expected`: the destination workload's identity first, then those
    /// its Service vouches for (istiod's `subject_alt_names`).
    pub async fn connect_any(
        &self,
        src: &SpiffeId,
        expected: &[SpiffeId],
        dst_ip: IpAddr,
        tcp: TcpStream,
    ) -> Result<ClientTls, HandshakeError> {
        let result = async {
            let key = self.source.fetch(src).await?;
            let cfg = self.client_config_with(expected, key)?;
            // An IP server name: rustls sends no SNI for it, as HBONE expects.
            tokio_rustls::TlsConnector::from(cfg)
                .connect(ServerName::IpAddress(dst_ip.into()), tcp)
                .await
                .map_err(|source| HandshakeError::Failed {
                    reason: classify(&source),
                    source,
                })
        }
        .await;
        self.metrics
            .record_handshake("outbound", result.as_ref().err());
        result
    }
}

fn peer_identity(
    certs: Option<&[rustls::pki_types::CertificateDer<'static>]>,
) -> Result<SpiffeId, HandshakeError> {
    let leaf = certs
        .and_then(|c| c.first())
        .ok_or_else(|| HandshakeError::Failed {
            reason: "no_client_cert",
            source: std::io::Error::other("peer presented no certificate"),
        })?;
    identity_of(leaf).map_err(|e| HandshakeError::Failed {
        reason: e.reason(),
        source: std::io::Error::other(e),
    })
}
