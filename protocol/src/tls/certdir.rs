//! Certificates from a directory: `<name>.crt` (leaf first, then any chain)
//! beside `<name>.key`, plus a trust bundle of PEM roots. The identity of a
//! pair is its leaf's URI SAN, so certificates from any CA (cert-manager,
//! SPIRE, istiod, another HBONE implementation's) work. Reloaded when the
//! files change; established tunnels keep the certificate they started with.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

use super::{identity_of, provider, CertError, CertSource, Roots};
use crate::identity::SpiffeId;
use tidegate_base::shutdown::ShutdownWatch;

#[derive(Debug, thiserror::Error)]
pub enum CertDirError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

struct Snapshot {
    keys: HashMap<SpiffeId, Arc<CertifiedKey>>,
    roots: Arc<Roots>,
    digest: u64,
}

pub struct CertDir {
    dir: PathBuf,
    bundle: PathBuf,
    current: ArcSwap<Snapshot>,
}

impl CertDir {
    pub fn load(dir: &Path, bundle: &Path) -> Result<Arc<Self>, CertDirError> {
        let (files, digest) = read_all(dir, bundle)?;
        let snap = parse(&files, digest)?;
        info!(dir = %dir.display(), identities = snap.keys.len(), "certificates loaded");
        Ok(Arc::new(CertDir {
            dir: dir.to_owned(),
            bundle: bundle.to_owned(),
            current: ArcSwap::from_pointee(snap),
        }))
    }

    /// Re-reads the files; returns true when a new set was published.
    pub fn reload(&self) -> Result<bool, CertDirError> {
        let (files, digest) = read_all(&self.dir, &self.bundle)?;
        if digest == self.current.load().digest {
            return Ok(false);
        }
        let snap = parse(&files, digest)?;
        info!(identities = snap.keys.len(), "certificates reloaded");
        self.current.store(Arc::new(snap));
        Ok(true)
    }

    pub fn identities(&self) -> Vec<SpiffeId> {
        let mut ids: Vec<_> = self.current.load().keys.keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Polls for changes until drained. A broken set is logged and ignored.
    pub async fn watch(self: Arc<Self>, interval: Duration, mut drain: ShutdownWatch) {
        let mut tick = tokio::time::interval(interval);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Err(e) = self.reload() {
                        warn!(error = %e, "certificate reload failed; keeping the previous certificates");
                    }
                }
                _ = drain.signaled() => return,
            }
        }
    }
}

impl CertSource for CertDir {
    fn certified_key(&self, id: &SpiffeId) -> Result<Arc<CertifiedKey>, CertError> {
        self.current
            .load()
            .keys
            .get(id)
            .cloned()
            .ok_or_else(|| CertError::NoCertificate(id.clone()))
    }

    fn roots(&self) -> Arc<Roots> {
        self.current.load().roots.clone()
    }
}

struct Files {
    bundle: Vec<u8>,
    /// (cert path, cert pem, key pem)
    pairs: Vec<(PathBuf, Vec<u8>, Vec<u8>)>,
}

fn read(path: &Path) -> Result<Vec<u8>, CertDirError> {
    std::fs::read(path).map_err(|source| CertDirError::Io {
        path: path.to_owned(),
        source,
    })
}

fn read_all(dir: &Path, bundle: &Path) -> Result<(Files, u64), CertDirError> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let bundle_pem = read(bundle)?;
    bundle_pem.hash(&mut h);
    let mut crts: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| CertDirError::Io {
            path: dir.to_owned(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "crt"))
        .collect();
    crts.sort();
    let mut pairs = Vec::new();
    for crt in crts {
        let key = crt.with_extension("key");
        if !key.exists() {
            continue; // a bundle or a half-written pair; the next poll sees it whole
        }
        let (c, k) = (read(&crt)?, read(&key)?);
        crt.hash(&mut h);
        c.hash(&mut h);
        k.hash(&mut h);
        pairs.push((crt, c, k));
    }
    Ok((
        Files {
            bundle: bundle_pem,
            pairs,
        },
        h.finish(),
    ))
}

fn parse(files: &Files, digest: u64) -> Result<Snapshot, CertDirError> {
    let invalid = |path: &Path, message: String| CertDirError::Invalid {
        path: path.to_owned(),
        message,
    };
    let roots: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&files.bundle)
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(Path::new("trust bundle"), e.to_string()))?;
    if roots.is_empty() {
        return Err(invalid(
            Path::new("trust bundle"),
            "no PEM certificates found".into(),
        ));
    }
    let roots =
        Roots::from_certs(roots).map_err(|e| invalid(Path::new("trust bundle"), e.to_string()))?;
    let mut keys = HashMap::new();
    for (path, cert_pem, key_pem) in &files.pairs {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(path, e.to_string()))?;
        let leaf = chain
            .first()
            .ok_or_else(|| invalid(path, "no PEM certificate".into()))?;
        let id = identity_of(leaf).map_err(|e| invalid(path, e.to_string()))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| invalid(&path.with_extension("key"), e.to_string()))?;
        let signer = provider()
            .key_provider
            .load_private_key(key)
            .map_err(|e| invalid(&path.with_extension("key"), e.to_string()))?;
        keys.insert(id, Arc::new(CertifiedKey::new(chain, signer)));
    }
    Ok(Snapshot {
        keys,
        roots: Arc::new(roots),
        digest,
    })
}
