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

    /// Loads `ca.crt`/`ca.key` from `dir`, creating them on first use.
    pub fn open(dir: &Path, validity: Duration) -> Result<Self, DevCaError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| DevCaError::Io { path, source }
        };
        let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
        if !crt.exists() || !key.exists() {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
            let k = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
            let cert = ca_params().self_signed(&k)?;
            write_private(&key, &k.serialize_pem()).map_err(io(&key))?;
            std::fs::write(&crt, cert.pem()).map_err(io(&crt))?;
        }
        let crt_pem = std::fs::read_to_string(&crt).map_err(io(&crt))?;
        let key_pem = std::fs::read_to_string(&key).map_err(io(&key))?;
        let k = KeyPair::from_pem(&key_pem)?;
        let der = pem_to_der(&crt_pem).map_err(io(&crt))?;
        let issuer = Issuer::from_ca_cert_pem(&crt_pem, k)?;
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
        if let Some((k, renew_at)) = self.minted.lock().unwrap().get(id) {
            if now < *renew_at {
                return Ok(k.clone());
            }
        }
        // Minting happens outside the lock; a racing duplicate mint is harmless.
        let k = self.mint_certified(id)?;
        let renew_at = now + self.validity / 2;
        self.minted
            .lock()
            .unwrap()
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
