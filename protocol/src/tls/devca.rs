//! The development CA: mints short-lived ECDSA P-256 certificates per
//! identity (URI SAN only, EKU serverAuth + clientAuth — what ztunnel
//! expects of a peer) for local runs and tests. It can keep its root and
//! key in a state directory so that other processes share it, and write its
//! root to a file for peers to trust. Never use it in production.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

use super::{provider, CertError, CertSource, Roots};
use crate::identity::SpiffeId;
use tidegate_base::sync::Locked;

#[derive(Debug, thiserror::Error)]
pub enum DevCaError {
    #[error("cannot generate certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot use {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot load key: {0}")]
    Key(#[from] rustls::Error),
    #[error("invalid CA root: {0}")]
    Root(#[from] webpki::Error),
}

type Minted = (Arc<CertifiedKey>, SystemTime);

pub struct DevCa {
    issuer: Issuer<'static, KeyPair>,
    root_pem: String,
    roots: Arc<Roots>,
    validity: Duration,
    minted: Mutex<HashMap<SpiffeId, Minted>>,
}

impl DevCa {
    /// A fresh CA held in memory only.
    pub fn new(validity: Duration) -> Result<Self, DevCaError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let params = ca_params();
        let cert = params.self_signed(&key)?;
        Self::from_parts(
            cert.pem(),
            cert.der().clone(),
            Issuer::new(params, key),
            validity,
        )
    }

    /// Loads the CA from `dir/ca.pem` (certificate and key), creating it on
    /// first use. Creation is atomic (a hard link that fails if another
    /// process won the race), so gateways and `tidegate connect` starting
    /// together always end up sharing one CA. The root alone is also written
    /// to `dir/ca.crt` for peers to trust.
    pub fn open(dir: &Path, validity: Duration) -> Result<Self, DevCaError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| DevCaError::Io { path, source }
        };
        let pem_path = dir.join("ca.pem");
        if !pem_path.exists() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
            let k = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
            let cert = ca_params().self_signed(&k)?;
            let tmp = dir.join(unique_tmp("ca.pem"));
            write_private(&tmp, &format!("{}{}", cert.pem(), k.serialize_pem()))
                .map_err(io(&tmp))?;
            let linked = std::fs::hard_link(&tmp, &pem_path);
            let _ = std::fs::remove_file(&tmp);
            match linked {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(&pem_path)(e)),
            }
        }
        let both = std::fs::read_to_string(&pem_path).map_err(io(&pem_path))?;
        let (crt_pem, key_pem) = split_pem(&both).ok_or_else(|| {
            io(&pem_path)(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "expected a CERTIFICATE and a PRIVATE KEY block",
            ))
        })?;
        let k = KeyPair::from_pem(&key_pem)?;
        let der = pem_to_der(&crt_pem).map_err(io(&pem_path))?;
        let issuer = Issuer::from_ca_cert_pem(&crt_pem, k)?;
        let crt_path = dir.join("ca.crt");
        if std::fs::read_to_string(&crt_path).ok().as_deref() != Some(crt_pem.as_str()) {
            let tmp = dir.join(unique_tmp("ca.crt"));
            std::fs::write(&tmp, &crt_pem).map_err(io(&tmp))?;
            std::fs::rename(&tmp, &crt_path).map_err(io(&crt_path))?;
        }
        Self::from_parts(crt_pem, der, issuer, validity)
    }

    fn from_parts(
        root_pem: String,
        root_der: CertificateDer<'static>,
        issuer: Issuer<'static, KeyPair>,
        validity: Duration,
    ) -> Result<Self, DevCaError> {
        Ok(DevCa {
            issuer,
            root_pem,
            roots: Arc::new(Roots::from_certs(vec![root_der])?),
            validity,
            minted: Mutex::new(HashMap::new()),
        })
    }

    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    pub fn write_root(&self, path: &Path) -> Result<(), DevCaError> {
        std::fs::write(path, &self.root_pem).map_err(|source| DevCaError::Io {
            path: path.to_owned(),
            source,
        })
    }

    /// Mints a certificate for `id`; returns (certificate PEM, key PEM).
    pub fn mint_pem(&self, id: &SpiffeId) -> Result<(String, String), DevCaError> {
        let (cert, key) = self.mint(id)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    fn mint(&self, id: &SpiffeId) -> Result<(rcgen::Certificate, KeyPair), DevCaError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut p = CertificateParams::default();
        p.subject_alt_names = vec![SanType::URI(id.to_string().try_into()?)];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let now = SystemTime::now();
        // Tolerate a little clock skew between nodes.
        p.not_before = (now - Duration::from_secs(300)).into();
        p.not_after = (now + self.validity).into();
        let cert = p.signed_by(&key, &self.issuer)?;
        Ok((cert, key))
    }

    fn mint_certified(&self, id: &SpiffeId) -> Result<Arc<CertifiedKey>, DevCaError> {
        let (cert, key) = self.mint(id)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = provider().key_provider.load_private_key(der)?;
        Ok(Arc::new(CertifiedKey::new(
            vec![cert.der().clone()],
            signer,
        )))
    }
}

impl CertSource for DevCa {
    fn certified_key(&self, id: &SpiffeId) -> Result<Arc<CertifiedKey>, CertError> {
        let now = SystemTime::now();
        if let Some((k, renew_at)) = self.minted.locked().get(id) {
            if now < *renew_at {
                return Ok(k.clone());
            }
        }
        // Minting happens outside the lock; a racing duplicate mint is harmless.
        let k = self.mint_certified(id)?;
        let renew_at = now + self.validity / 2;
        self.minted
            .locked()
            .insert(id.clone(), (k.clone(), renew_at));
        Ok(k)
    }

    fn roots(&self) -> Arc<Roots> {
        self.roots.clone()
    }
}

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, "tidegate development CA");
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = SystemTime::now();
    p.not_before = (now - Duration::from_secs(300)).into();
    p.not_after = (now + Duration::from_secs(365 * 24 * 3600)).into();
    p
}

/// A temporary file name no other process or thread uses.
fn unique_tmp(name: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(".{name}.{}.{n}.tmp", std::process::id())
}

/// Splits a file holding one certificate and one private key (either order).
fn split_pem(text: &str) -> Option<(String, String)> {
    let block = |label: &str| {
        let begin = format!("-----BEGIN {label}-----");
        let end = format!("-----END {label}-----");
        let a = text.find(&begin)?;
        let b = text[a..].find(&end)? + a + end.len();
        Some(format!("{}\n", &text[a..b]))
    };
    Some((block("CERTIFICATE")?, block("PRIVATE KEY")?))
}

fn pem_to_der(pem: &str) -> std::io::Result<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::identity_of;

    #[test]
    fn minted_certificates_carry_only_the_identity() {
        let ca = DevCa::new(Duration::from_secs(60)).unwrap();
        let id: SpiffeId = "spiffe://td/ns/a/sa/b".parse().unwrap();
        let key = ca.certified_key(&id).unwrap();
        assert_eq!(identity_of(&key.cert[0]).unwrap(), id);
        // Cached until half-life.
        assert!(Arc::ptr_eq(&key, &ca.certified_key(&id).unwrap()));
    }

    #[test]
    fn processes_opening_one_state_dir_share_the_ca() {
        let dir = tempfile::tempdir().unwrap();
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let d = dir.path().to_owned();
                std::thread::spawn(move || {
                    DevCa::open(&d, Duration::from_secs(60))
                        .unwrap()
                        .root_pem()
                        .to_owned()
                })
            })
            .collect();
        let roots: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(
            roots.windows(2).all(|w| w[0] == w[1]),
            "all openers must see one CA"
        );
        assert_eq!(
            std::fs::read_to_string(dir.path().join("ca.crt")).unwrap(),
            roots[0]
        );
    }
}
