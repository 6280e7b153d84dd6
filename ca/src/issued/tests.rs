use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
    PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateSigningRequestDer;

use super::*;
use crate::csr;

fn id() -> SpiffeId {
    "spiffe://cluster.local/ns/demo/sa/web".parse().unwrap()
}

/// A CA certificate named `name`, self-signed or signed by `parent`.
fn ca(name: &str, parent: Option<&Issuer<'static, KeyPair>>) -> (Issuer<'static, KeyPair>, String) {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = match parent {
        Some(issuer) => p.signed_by(&key, issuer).unwrap(),
        None => p.self_signed(&key).unwrap(),
    };
    (Issuer::new(p, key), cert.pem())
}

/// A leaf for `who` with the public key of `csr_pem`, valid from `from` to `to`.
fn leaf(
    csr_pem: &str,
    who: &SpiffeId,
    from: SystemTime,
    to: SystemTime,
    issuer: &Issuer<'static, KeyPair>,
) -> String {
    let der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes()).unwrap();
    let request = CertificateSigningRequestParams::from_der(&der).unwrap();
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.subject_alt_names = vec![SanType::URI(who.to_string().try_into().unwrap())];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.not_before = from.into();
    p.not_after = to.into();
    CertificateSigningRequestParams {
        params: p,
        public_key: request.public_key,
    }
    .signed_by(issuer)
    .unwrap()
    .pem()
}

fn roots(pems: &[&str]) -> Roots {
    Roots::from_certs(
        pems.iter()
            .map(|p| CertificateDer::from_pem_slice(p.as_bytes()).unwrap())
            .collect(),
    )
    .unwrap()
}

const HOUR: Duration = Duration::from_secs(3600);

struct Case {
    key: csr::KeyAndCsr,
    root: (Issuer<'static, KeyPair>, String),
    now: SystemTime,
}

impl Case {
    fn new() -> Case {
        Case {
            key: csr::generate(&id()).unwrap(),
            root: ca("root", None),
            now: SystemTime::now(),
        }
    }

    fn leaf(&self, from: SystemTime, to: SystemTime) -> String {
        leaf(&self.key.csr_pem, &id(), from, to, &self.root.0)
    }

    fn check(&self, pems: &[String]) -> Result<Accepted, Refused> {
        check(
            &id(),
            &self.key.public_key,
            pems,
            &roots(&[&self.root.1]),
            self.now,
        )
    }
}

#[test]
fn a_leaf_of_the_configured_root_is_accepted_and_presented_without_the_root() {
    let c = Case::new();
    let leaf = c.leaf(c.now - HOUR, c.now + HOUR);
    let ok = c.check(&[leaf.clone(), c.root.1.clone()]).unwrap();
    assert_eq!(ok.chain.len(), 1, "the root is the peers' to hold");
    assert_eq!(
        ok.chain[0],
        CertificateDer::from_pem_slice(leaf.as_bytes()).unwrap()
    );
    assert!(ok.not_before < c.now && c.now < ok.not_after);
    // The leaf alone verifies too: the root is configured.
    assert!(c.check(&[leaf]).is_ok());
}

#[test]
fn intermediates_of_the_answer_are_presented_when_they_lead_to_a_configured_root() {
    let c = Case::new();
    let (inter, inter_pem) = ca("intermediate", Some(&c.root.0));
    let leaf = leaf(&c.key.csr_pem, &id(), c.now - HOUR, c.now + HOUR, &inter);
    let ok = c
        .check(&[leaf, inter_pem.clone(), c.root.1.clone()])
        .unwrap();
    assert_eq!(ok.chain.len(), 2);
    assert_eq!(
        ok.chain[1],
        CertificateDer::from_pem_slice(inter_pem.as_bytes()).unwrap()
    );
}

#[test]
fn a_leaf_for_another_key_is_refused() {
    let c = Case::new();
    let other = csr::generate(&id()).unwrap();
    let leaf = leaf(&other.csr_pem, &id(), c.now - HOUR, c.now + HOUR, &c.root.0);
    let e = c.check(&[leaf, c.root.1.clone()]).unwrap_err();
    assert!(matches!(e, Refused::KeyMismatch), "{e}");
    assert_eq!(e.reason(), "key_mismatch");
}

#[test]
fn a_chain_to_a_root_outside_the_configured_ones_is_refused() {
    let c = Case::new();
    let (other_root, other_pem) = ca("another root", None);
    let leaf = leaf(
        &c.key.csr_pem,
        &id(),
        c.now - HOUR,
        c.now + HOUR,
        &other_root,
    );
    let e = c.check(&[leaf.clone(), other_pem.clone()]).unwrap_err();
    assert!(matches!(e, Refused::UntrustedChain { .. }), "{e}");
    assert_eq!(e.reason(), "untrusted_chain");
    assert!(e.to_string().contains("certificates.roots"), "{e}");
    // Also through an intermediate the answer carries.
    let (inter, inter_pem) = ca("intermediate", Some(&other_root));
    let leaf = self::leaf(&c.key.csr_pem, &id(), c.now - HOUR, c.now + HOUR, &inter);
    let e = c.check(&[leaf, inter_pem, other_pem]).unwrap_err();
    assert!(matches!(e, Refused::UntrustedChain { .. }), "{e}");
}

#[test]
fn an_expired_leaf_is_refused_and_a_leaf_ahead_of_the_clock_only_within_the_skew() {
    let c = Case::new();
    let e = c
        .check(&[c.leaf(c.now - 2 * HOUR, c.now - HOUR)])
        .unwrap_err();
    assert!(matches!(e, Refused::Expired { .. }), "{e}");
    assert_eq!(e.reason(), "expired");
    let e = c
        .check(&[c.leaf(c.now + HOUR, c.now + 2 * HOUR)])
        .unwrap_err();
    assert!(matches!(e, Refused::NotYetValid { .. }), "{e}");
    assert_eq!(e.reason(), "not_yet_valid");
    // A CA clock a minute ahead is tolerated.
    let ahead = c.now + Duration::from_secs(60);
    assert!(c.check(&[c.leaf(ahead, c.now + HOUR)]).is_ok());
}

#[test]
fn a_leaf_for_another_identity_or_an_empty_or_malformed_answer_is_refused() {
    let c = Case::new();
    let other: SpiffeId = "spiffe://cluster.local/ns/demo/sa/db".parse().unwrap();
    let leaf = leaf(
        &c.key.csr_pem,
        &other,
        c.now - HOUR,
        c.now + HOUR,
        &c.root.0,
    );
    let e = c.check(&[leaf]).unwrap_err();
    assert_eq!(e.reason(), "san_mismatch", "{e}");
    assert_eq!(c.check(&[]).unwrap_err().reason(), "bad_chain");
    let e = c
        .check(&["-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----\n".into()])
        .unwrap_err();
    assert_eq!(e.reason(), "bad_chain", "{e}");
}
