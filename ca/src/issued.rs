//! What the CA answered, checked before it is installed. A certificate is
//! accepted only when
//!
//! - its leaf names the identity asked for (one SPIFFE URI SAN),
//! - its leaf carries the public key of the CSR (else every handshake with
//!   it would fail: the key held is not the certificate's),
//! - the chain leads to the configured roots (`certificates.roots`), the
//!   answer's other certificates serving as intermediates only: an answer
//!   never adds a trust anchor — a new root is trusted once it is in the
//!   roots file,
//! - its leaf is valid now (not expired; not valid only from a time more
//!   than [`CLOCK_SKEW`] ahead).
//!
//! Anything else is refused with its reason; the caller keeps the
//! certificate it holds and retries with backoff.

use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};

use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::{identity_of, provider, Roots};

/// How far ahead of this node's clock a leaf's not-before may be: a CA's
/// clock a little ahead is tolerated (`tidegate-ca` backdates by up to the
/// same), a leaf valid only from later is refused.
pub const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// Why an answer of the CA was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("the CA returned {0}")]
    BadChain(String),
    #[error("the CA returned a certificate for {got}, not the requested identity")]
    SanMismatch { got: String },
    #[error("the CA returned a certificate for another public key than the CSR's; check that the CA signs the CSR's key")]
    KeyMismatch,
    #[error("the CA returned a chain that does not lead to certificates.roots ({reason}); a new root is trusted only once it is in the roots file")]
    UntrustedChain { reason: String },
    #[error("the CA returned a certificate that expired at {not_after}; check the CA's clock")]
    Expired { not_after: String },
    #[error("the CA returned a certificate valid only from {not_before}, {ahead_secs}s ahead of this node's clock (at most {}s is tolerated); check the clocks of the CA and this node", CLOCK_SKEW.as_secs())]
    NotYetValid { not_before: String, ahead_secs: u64 },
}

impl Refused {
    /// A bounded label for `tidegate_ca_fetches_total{result}`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::BadChain(_) => "bad_chain",
            Refused::SanMismatch { .. } => "san_mismatch",
            Refused::KeyMismatch => "key_mismatch",
            Refused::UntrustedChain { .. } => "untrusted_chain",
            Refused::Expired { .. } => "expired",
            Refused::NotYetValid { .. } => "not_yet_valid",
        }
    }
}

/// An accepted certificate.
#[derive(Debug)]
pub struct Accepted {
    /// What handshakes present: the leaf, then the intermediates of the
    /// verified path (never the root, which peers hold).
    pub chain: Vec<CertificateDer<'static>>,
    pub serial: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

/// Checks the CA's answer `pems` (leaf first) to a CSR for `id` carrying
/// `public_key`, against `roots` at `now`.
pub fn check(
    id: &SpiffeId,
    public_key: &[u8],
    pems: &[String],
    roots: &Roots,
    now: SystemTime,
) -> Result<Accepted, Refused> {
    let chain = parse(pems)?;
    let (leaf, rest) = chain
        .split_first()
        .ok_or_else(|| Refused::BadChain("an empty chain".into()))?;
    let got = identity_of(leaf)
        .map_err(|e| Refused::BadChain(format!("a leaf without a SPIFFE id: {e}")))?;
    if got != *id {
        return Err(Refused::SanMismatch {
            got: got.to_string(),
        });
    }
    let (_, cert) = x509_parser::parse_x509_certificate(leaf)
        .map_err(|e| Refused::BadChain(format!("an unparsable leaf: {e}")))?;
    if cert.public_key().subject_public_key.data.as_ref() != public_key {
        return Err(Refused::KeyMismatch);
    }
    let time = |t: x509_parser::time::ASN1Time| {
        SystemTime::UNIX_EPOCH + Duration::from_secs(t.timestamp().max(0) as u64)
    };
    let (not_before, not_after) = (
        time(cert.validity().not_before),
        time(cert.validity().not_after),
    );
    let at = valid_at(not_before, not_after, now)?;
    let intermediates = verify_path(leaf, rest, roots, at)?;
    let mut presented = Vec::with_capacity(1 + intermediates.len());
    presented.push(leaf.clone());
    presented.extend(intermediates);
    Ok(Accepted {
        chain: presented,
        serial: cert.raw_serial_as_string(),
        not_before,
        not_after,
    })
}

/// The certificate an answer of more than one ends with: the root a CA
/// that sends `[leaf, root]` (Cilium's agent, istiod) signs with.
pub fn answer_root(pems: &[String]) -> Option<CertificateDer<'static>> {
    let chain = parse(pems).ok()?;
    if chain.len() < 2 {
        return None;
    }
    chain.into_iter().last()
}

fn parse(pems: &[String]) -> Result<Vec<CertificateDer<'static>>, Refused> {
    let mut chain = Vec::new();
    for pem in pems {
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            chain.push(cert.map_err(|e| Refused::BadChain(format!("a malformed PEM: {e}")))?);
        }
    }
    Ok(chain)
}

/// The time the chain is verified at: now, or the leaf's not-before when
/// that is ahead of now by at most [`CLOCK_SKEW`].
fn valid_at(
    not_before: SystemTime,
    not_after: SystemTime,
    now: SystemTime,
) -> Result<SystemTime, Refused> {
    if not_after <= now {
        return Err(Refused::Expired {
            not_after: httpdate::fmt_http_date(not_after),
        });
    }
    match not_before.duration_since(now) {
        Ok(ahead) if ahead > CLOCK_SKEW => Err(Refused::NotYetValid {
            not_before: httpdate::fmt_http_date(not_before),
            ahead_secs: ahead.as_secs(),
        }),
        Ok(_) => Ok(not_before),
        Err(_) => Ok(now),
    }
}

/// Verifies `leaf` with `rest` as intermediates to `roots`, for both uses
/// an HBONE certificate has (server and client), as peers will; returns the
/// intermediates of the path found.
fn verify_path(
    leaf: &CertificateDer<'static>,
    rest: &[CertificateDer<'static>],
    roots: &Roots,
    at: SystemTime,
) -> Result<Vec<CertificateDer<'static>>, Refused> {
    let untrusted = |e: webpki::Error| Refused::UntrustedChain {
        reason: format!("{e:?}"),
    };
    let end = webpki::EndEntityCert::try_from(leaf).map_err(untrusted)?;
    let at = UnixTime::since_unix_epoch(
        at.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default(),
    );
    let algs = provider().signature_verification_algorithms.all;
    end.verify_for_usage(
        algs,
        &roots.anchors,
        rest,
        at,
        webpki::KeyUsage::client_auth(),
        None,
        None,
    )
    .map_err(untrusted)?;
    let path = end
        .verify_for_usage(
            algs,
            &roots.anchors,
            rest,
            at,
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .map_err(untrusted)?;
    let intermediates = path
        .intermediate_certificates()
        .map(|c| c.der().into_owned())
        .collect();
    Ok(intermediates)
}

#[cfg(test)]
mod tests;
