//! Certificate verification for SPIFFE identities: the chain must lead to the
//! trust bundle, and the leaf's single URI SAN is the peer's identity.
//!
//! Server side: any identity of our trust domain may connect (authorization
//! happens per stream). Client side: the server's identity must be the
//! destination workload's identity or one its Service vouches for
//! (istiod's `subject_alt_names`, ztunnel's upstream SANs); SNI and DNS
//! names play no part.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme,
};

use super::CertSource;
use crate::identity::SpiffeId;

/// Why a certificate's identity was refused.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum IdentityError {
    #[error("certificate has no URI SAN with a SPIFFE id")]
    NoSpiffeId,
    #[error("certificate has {0} URI SANs; exactly one SPIFFE id is required")]
    SeveralUris(usize),
    #[error("certificate is not valid X.509: {0}")]
    Malformed(String),
    #[error("{0}")]
    BadSpiffeId(String),
    #[error("peer trust domain {got:?} is not ours ({want:?})")]
    WrongTrustDomain { got: String, want: String },
    #[error("server presented identity {got} but the destination is {want}")]
    UnexpectedIdentity { got: String, want: String },
}

impl IdentityError {
    /// A bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            IdentityError::NoSpiffeId => "no_spiffe_id",
            IdentityError::SeveralUris(_) => "multiple_uri_sans",
            IdentityError::Malformed(_) | IdentityError::BadSpiffeId(_) => "malformed_certificate",
            IdentityError::WrongTrustDomain { .. } => "wrong_trust_domain",
            IdentityError::UnexpectedIdentity { .. } => "unexpected_identity",
        }
    }
}

impl From<IdentityError> for rustls::Error {
    fn from(e: IdentityError) -> Self {
        rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
    }
}

/// The SPIFFE id in a leaf certificate's URI SAN.
pub fn identity_of(cert: &CertificateDer<'_>) -> Result<SpiffeId, IdentityError> {
    use x509_parser::extensions::GeneralName;
    let (_, parsed) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| IdentityError::Malformed(e.to_string()))?;
    let san = parsed
        .subject_alternative_name()
        .map_err(|e| IdentityError::Malformed(e.to_string()))?
        .ok_or(IdentityError::NoSpiffeId)?;
    let uris: Vec<&str> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some(*u),
            _ => None,
        })
        .collect();
    match uris.as_slice() {
        [] => Err(IdentityError::NoSpiffeId),
        [one] => one
            .parse()
            .map_err(|e: crate::identity::SpiffeIdError| IdentityError::BadSpiffeId(e.to_string())),
        more => Err(IdentityError::SeveralUris(more.len())),
    }
}

fn webpki_to_rustls(e: webpki::Error) -> rustls::Error {
    use webpki::Error as W;
    let ce = match e {
        W::UnknownIssuer => CertificateError::UnknownIssuer,
        W::CertExpired { .. } => CertificateError::Expired,
        W::CertNotValidYet { .. } => CertificateError::NotValidYet,
        W::InvalidSignatureForPublicKey => CertificateError::BadSignature,
        W::RequiredEkuNotFoundContext(_) => CertificateError::InvalidPurpose,
        W::BadDer | W::BadDerTime => CertificateError::BadEncoding,
        other => CertificateError::Other(OtherError(Arc::new(other))),
    };
    rustls::Error::InvalidCertificate(ce)
}

/// What both sides verify: the chain leads to the trust bundle (read on
/// every handshake, so bundle reloads apply at once) and handshake
/// signatures use the provider's algorithms.
pub(super) struct Chain {
    pub source: Arc<dyn CertSource>,
    pub provider: Arc<CryptoProvider>,
}

impl Chain {
    /// Verifies the chain for `usage`; returns the leaf's SPIFFE id.
    fn verify(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
        usage: webpki::KeyUsage,
    ) -> Result<SpiffeId, rustls::Error> {
        let roots = self.source.roots();
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(webpki_to_rustls)?;
        cert.verify_for_usage(
            self.provider.signature_verification_algorithms.all,
            &roots.anchors,
            intermediates,
            now,
            usage,
            None,
            None,
        )
        .map_err(webpki_to_rustls)?;
        Ok(identity_of(end_entity)?)
    }

    fn tls12(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Server side (port 15008): a client certificate is mandatory and must be of our trust domain.
pub(super) struct SpiffeClientVerifier {
    pub chain: Chain,
    pub trust_domain: String,
}

impl std::fmt::Debug for SpiffeClientVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpiffeClientVerifier")
            .field("trust_domain", &self.trust_domain)
            .finish()
    }
}

impl ClientCertVerifier for SpiffeClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let id = self.chain.verify(
            end_entity,
            intermediates,
            now,
            webpki::KeyUsage::client_auth(),
        )?;
        if id.trust_domain() != self.trust_domain {
            return Err(IdentityError::WrongTrustDomain {
                got: id.trust_domain().to_owned(),
                want: self.trust_domain.clone(),
            }
            .into());
        }
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.schemes()
    }
}

/// Client side: the server must present the destination workload's
/// identity (`expected[0]`) or one of the others its Service names.
pub(super) struct SpiffeServerVerifier {
    pub chain: Chain,
    pub expected: Vec<SpiffeId>,
}

impl std::fmt::Debug for SpiffeServerVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpiffeServerVerifier")
            .field("expected", &self.expected)
            .finish()
    }
}

/// `a`, or `a (or its Service's b, c)`.
fn wanted(expected: &[SpiffeId]) -> String {
    match expected {
        [] => "nobody".into(),
        [one] => one.to_string(),
        [one, rest @ ..] => {
            let rest: Vec<String> = rest.iter().map(ToString::to_string).collect();
            format!("{one} (or its Service's {})", rest.join(", "))
        }
    }
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let id = self.chain.verify(
            end_entity,
            intermediates,
            now,
            webpki::KeyUsage::server_auth(),
        )?;
        if !self.expected.contains(&id) {
            return Err(IdentityError::UnexpectedIdentity {
                got: id.to_string(),
                want: wanted(&self.expected),
            }
            .into());
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.tls12(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.chain.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.chain.schemes()
    }
}
