//! Mutual TLS as HBONE speaks it: TLS 1.3 only, ALPN `h2`, SPIFFE URI SANs,
//! no SNI and no DNS names. Certificates come from a [`CertSource`]: the
//! development CA or a directory of PEM files.

mod certdir;
mod context;
mod devca;
mod metrics;
mod verify;

pub use certdir::{CertDir, CertDirError};
pub use context::{classify, ClientTls, HandshakeError, ServerTls, TlsContext};
pub use devca::{DevCa, DevCaError};
pub use metrics::TlsMetrics;
pub use verify::{identity_of, IdentityError};

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, TrustAnchor};
use rustls::sign::CertifiedKey;

use crate::identity::SpiffeId;

pub const ALPN_H2: &[u8] = b"h2";

/// The crypto provider: *ring*.
///
/// Why ring and not aws-lc-rs (rustls' default): it builds with a plain C
/// compiler in seconds (no cmake, no Go, no bindgen), which matters on 2-core
/// CI machines, and it has everything HBONE needs: TLS 1.3 AES-GCM suites,
/// X25519/P-256 key exchange and ECDSA P-256 signatures. Like ztunnel, we
/// offer only the AES-GCM suites (no ChaCha20), so a ztunnel peer always
/// finds a common suite and we never negotiate something it would refuse.
pub fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring as r;
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            r::cipher_suite::TLS13_AES_128_GCM_SHA256,
            r::cipher_suite::TLS13_AES_256_GCM_SHA384,
        ],
        ..r::default_provider()
    })
}

/// Trust anchors, owned.
#[derive(Debug, Default)]
pub struct Roots {
    pub anchors: Vec<TrustAnchor<'static>>,
    /// The DER of each root, for `config_dump` and tests.
    pub certs: Vec<CertificateDer<'static>>,
}

impl Roots {
    pub fn from_certs(certs: Vec<CertificateDer<'static>>) -> Result<Roots, webpki::Error> {
        let anchors = certs
            .iter()
            .map(|c| webpki::anchor_from_trusted_cert(c).map(|a| a.to_owned()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Roots { anchors, certs })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("no certificate for identity {0}; check the certificate directory holds a pair whose URI SAN is this identity")]
    NoCertificate(SpiffeId),
    #[error("development CA: {0}")]
    DevCa(#[from] DevCaError),
    #[error("no certificate for identity {id} yet: {reason}")]
    Unavailable { id: Box<SpiffeId>, reason: String },
}

/// A boxed future, for the one async method of [`CertSource`].
pub type CertFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Arc<CertifiedKey>, CertError>> + Send + 'a>,
>;

/// Where the gateway gets certificates for its local workload identities.
pub trait CertSource: Send + Sync + 'static {
    /// The certificate chain and key presented for `id`.
    fn certified_key(&self, id: &SpiffeId) -> Result<Arc<CertifiedKey>, CertError>;
    /// The current trust bundle.
    fn roots(&self) -> Arc<Roots>;
    /// Like [`CertSource::certified_key`], but a source that fetches
    /// certificates on demand waits (a bounded time) for one it does not
    /// hold yet. Handshakes call this.
    fn fetch<'a>(&'a self, id: &'a SpiffeId) -> CertFuture<'a> {
        Box::pin(std::future::ready(self.certified_key(id)))
    }
    /// What `/config_dump` shows under `certificates` (never a key).
    fn dump(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}
