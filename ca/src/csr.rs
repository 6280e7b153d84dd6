//! Keys and certificate signing requests as the Istio CA protocol uses them
//! (ztunnel's `CsrOptions::generate`): ECDSA P-256 with SHA-256, an empty
//! subject, one URI SAN — the SPIFFE id —, the key as PKCS#8. The CA side
//! reads a CSR, checks its signature, and signs a leaf for the identity it
//! decided on (istiod overwrites the SAN with the impersonated identity).

use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, ExtendedKeyUsagePurpose,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SigningKey, PKCS_ECDSA_P256_SHA256,
};

use rustls_pki_types::CertificateSigningRequestDer;

use tidegate_protocol::identity::SpiffeId;

#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    #[error("cannot generate a key or CSR: {0}")]
    Generate(rcgen::Error),
    #[error("malformed CSR: {0}")]
    Malformed(rcgen::Error),
    #[error("the CSR must carry exactly one URI SAN and no other name; it has {0}")]
    Names(String),
    #[error("cannot sign: {0}")]
    Sign(rcgen::Error),
}

/// A fresh key and the CSR that asks for `identity`.
pub struct KeyAndCsr {
    /// PKCS#8 PEM.
    pub key_pem: String,
    pub csr_pem: String,
    /// The public key the CSR carries (the uncompressed P-256 point), which
    /// the issued leaf must carry too.
    pub public_key: Vec<u8>,
}

pub fn generate(identity: &SpiffeId) -> Result<KeyAndCsr, CsrError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CsrError::Generate)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    let uri = identity
        .to_string()
        .try_into()
        .map_err(CsrError::Generate)?;
    params.subject_alt_names = vec![SanType::URI(uri)];
    let csr = params.serialize_request(&key).map_err(CsrError::Generate)?;
    Ok(KeyAndCsr {
        key_pem: key.serialize_pem(),
        csr_pem: csr.pem().map_err(CsrError::Generate)?,
        public_key: key.public_key_raw().to_vec(),
    })
}

/// A CSR whose signature checked out.
pub struct ReadCsr {
    request: CertificateSigningRequestParams,
    /// The one URI SAN it asks for.
    pub uri: String,
}

/// Parses `pem`, checks its self-signature and that it names exactly one URI.
pub fn read(pem: &str) -> Result<ReadCsr, CsrError> {
    use rustls_pki_types::pem::PemObject;
    let der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
        .map_err(|_| CsrError::Malformed(rcgen::Error::CouldNotParseCertificationRequest))?;
    read_der(&der)
}

/// [`read`], from DER.
pub fn read_der(der: &CertificateSigningRequestDer<'_>) -> Result<ReadCsr, CsrError> {
    let request = CertificateSigningRequestParams::from_der(der).map_err(CsrError::Malformed)?;
    let names = &request.params.subject_alt_names;
    let uri = match names.as_slice() {
        [SanType::URI(uri)] => uri.as_str().to_owned(),
        other => {
            return Err(CsrError::Names(if other.is_empty() {
                "none".into()
            } else {
                format!("{other:?}")
            }))
        }
    };
    Ok(ReadCsr { request, uri })
}

impl ReadCsr {
    /// A leaf for `identity` (whatever the CSR asked for: the CA decided),
    /// with the CSR's public key, valid from a little before now (clock skew: a tenth of
    /// the validity, at most 5 minutes)
    /// for `validity`.
    pub fn sign(
        self,
        identity: &SpiffeId,
        validity: Duration,
        issuer: &Issuer<'_, impl SigningKey>,
    ) -> Result<rcgen::Certificate, CsrError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(
            identity.to_string().try_into().map_err(CsrError::Sign)?,
        )];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let now = SystemTime::now();
        // Backdated for clock skew, by at most a tenth of the validity so
        // that half-life (when clients renew) stays in the future.
        params.not_before = (now - (validity / 10).min(Duration::from_secs(300))).into();
        params.not_after = (now + validity).into();
        params.serial_number = Some(rcgen::SerialNumber::from_slice(
            &fastrand::u64(..).to_be_bytes(),
        ));
        CertificateSigningRequestParams {
            params,
            public_key: self.request.public_key,
        }
        .signed_by(issuer)
        .map_err(CsrError::Sign)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, IsCa};

    fn issuer() -> (Issuer<'static, KeyPair>, rcgen::Certificate) {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = CertificateParams::default();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let root = p.self_signed(&key).unwrap();
        (Issuer::new(p, key), root)
    }

    #[test]
    fn a_generated_csr_reads_back_with_its_one_uri_and_signs_for_the_decided_identity() {
        let asked: SpiffeId = "spiffe://cluster.local/ns/a/sa/b".parse().unwrap();
        let k = generate(&asked).unwrap();
        assert!(k.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let read = read(&k.csr_pem).unwrap();
        assert_eq!(read.uri, asked.to_string());
        let decided: SpiffeId = "spiffe://cluster.local/ns/c/sa/d".parse().unwrap();
        let (issuer, _root) = issuer();
        let leaf = read
            .sign(&decided, Duration::from_secs(3600), &issuer)
            .unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.der()).unwrap();
        let sans: Vec<String> = cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(sans, [format!("URI({decided})")]);
        // The leaf carries the CSR's key.
        let key = KeyPair::from_pem(&k.key_pem).unwrap();
        assert_eq!(
            cert.public_key().subject_public_key.data.as_ref(),
            key.public_key_raw()
        );
        assert_eq!(k.public_key, key.public_key_raw());
    }

    #[test]
    fn a_tampered_or_nameless_csr_is_refused() {
        let id: SpiffeId = "spiffe://td/ns/a/sa/b".parse().unwrap();
        use rustls_pki_types::pem::PemObject;
        let pem = generate(&id).unwrap().csr_pem;
        let good = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes()).unwrap();
        assert!(read_der(&good).is_ok());
        // Flip a bit of the public key, inside the signed body.
        let mut der = good.as_ref().to_vec();
        let at = der.len() / 3;
        der[at] ^= 0x01;
        assert!(matches!(
            read_der(&der.as_slice().into()),
            Err(CsrError::Malformed(_))
        ));
        assert!(matches!(read("not a csr"), Err(CsrError::Malformed(_))));
        // No SAN at all.
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let nameless = CertificateParams::default()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap();
        assert!(matches!(read(&nameless), Err(CsrError::Names(_))));
    }
}
