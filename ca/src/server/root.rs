//! The CA's root: a P-256 key and self-signed certificate kept in a
//! Kubernetes Secret (`ca-cert.pem`, `ca-key.pem`, the names istiod's
//! `istio-ca-secret` uses), created on first start when absent; and the
//! root certificate published in a ConfigMap (`root-cert.pem`) for the
//! gateways to mount as `certificates.roots`.
//!
//! Rotation without a failed handshake (deploy/README.md, "Rotating the
//! root"): put the new `ca-cert.pem`/`ca-key.pem` in the Secret and the
//! old certificate in its optional `trusted-roots.pem`, restart `tidegate
//! ca`: it signs with the new root and publishes both, so every gateway
//! (re-reading `root-cert.pem`) accepts leaves of either while they renew at
//! half-life; after the longest validity has passed, drop
//! `trusted-roots.pem` and restart again.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tracing::info;

use crate::csr::CsrError;

pub const CERT_KEY: &str = "ca-cert.pem";
pub const KEY_KEY: &str = "ca-key.pem";
pub const ROOT_CERT_KEY: &str = "root-cert.pem";
/// Optional: further roots still trusted (the previous one, during a rotation).
pub const TRUSTED_ROOTS_KEY: &str = "trusted-roots.pem";

#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error("Kubernetes API ({what}): {source}")]
    Api { what: String, source: kube::Error },
    #[error("Secret {secret}: {message}")]
    Invalid { secret: String, message: String },
    #[error("cannot generate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// The root: its certificate (PEM), the issuer that signs leaves, and the
/// bundle published for verifiers (this root, then any still trusted).
pub struct CaRoot {
    pub cert_pem: String,
    pub issuer: Issuer<'static, KeyPair>,
    pub bundle_pem: String,
}

impl CaRoot {
    /// A fresh root for `trust_domain`, valid ten years.
    pub fn generate(trust_domain: &str) -> Result<CaRoot, RootError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut p = CertificateParams::default();
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name
            .push(DnType::OrganizationName, trust_domain);
        p.distinguished_name.push(DnType::CommonName, "tidegate CA");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = SystemTime::now();
        p.not_before = (now - Duration::from_secs(300)).into();
        p.not_after = (now + Duration::from_secs(10 * 365 * 24 * 3600)).into();
        let cert = p.self_signed(&key)?;
        Ok(CaRoot {
            cert_pem: cert.pem(),
            issuer: Issuer::new(p, key),
            bundle_pem: cert.pem(),
        })
    }

    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<CaRoot, rcgen::Error> {
        let key = KeyPair::from_pem(key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)?;
        Ok(CaRoot {
            cert_pem: cert_pem.to_owned(),
            issuer,
            bundle_pem: cert_pem.to_owned(),
        })
    }

    /// The CA's serving certificate: DNS (or IP) SANs `names`, signed by
    /// the root, valid one year. Returns (chain PEM, key PEM).
    pub fn serving_cert(&self, names: &[String]) -> Result<(String, String), CsrError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(CsrError::Generate)?;
        let mut p = CertificateParams::default();
        p.distinguished_name = DistinguishedName::new();
        p.subject_alt_names = names
            .iter()
            .map(|n| match n.parse() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => n.clone().try_into().map(SanType::DnsName),
            })
            .collect::<Result<_, _>>()
            .map_err(CsrError::Generate)?;
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let now = SystemTime::now();
        p.not_before = (now - Duration::from_secs(300)).into();
        p.not_after = (now + Duration::from_secs(365 * 24 * 3600)).into();
        let cert = p.signed_by(&key, &self.issuer).map_err(CsrError::Sign)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> RootError {
    let what = what.into();
    move |source| RootError::Api { what, source }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Reads the root from `namespace/name`, creating it when absent (a
/// concurrent creator wins: its root is read back).
pub async fn load_or_create(
    secrets: &Api<Secret>,
    name: &str,
    trust_domain: &str,
) -> Result<CaRoot, RootError> {
    if let Some(s) = secrets
        .get_opt(name)
        .await
        .map_err(api_err(format!("get secret {name}")))?
    {
        return from_secret(name, &s);
    }
    let root = CaRoot::generate(trust_domain)?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_owned(),
                "tidegate-ca".to_owned(),
            )])),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (
                CERT_KEY.to_owned(),
                ByteString(root.cert_pem.clone().into_bytes()),
            ),
            (
                KEY_KEY.to_owned(),
                ByteString(root.issuer.key().serialize_pem().into_bytes()),
            ),
        ])),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            info!(secret = name, "no CA root found; created a new one");
            Ok(root)
        }
        Err(e) if is_status(&e, 409) => {
            let s = secrets
                .get(name)
                .await
                .map_err(api_err(format!("get secret {name}")))?;
            from_secret(name, &s)
        }
        Err(e) => Err(api_err(format!("create secret {name}"))(e)),
    }
}

fn from_secret(name: &str, s: &Secret) -> Result<CaRoot, RootError> {
    let invalid = |message: String| RootError::Invalid {
        secret: name.to_owned(),
        message,
    };
    let field = |k: &str| -> Result<String, RootError> {
        let b = s
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .ok_or_else(|| invalid(format!("no data key {k}")))?;
        String::from_utf8(b.0.clone()).map_err(|_| invalid(format!("{k} is not PEM text")))
    };
    let mut root = CaRoot::from_pem(&field(CERT_KEY)?, &field(KEY_KEY)?)
        .map_err(|e| invalid(format!("{CERT_KEY}/{KEY_KEY}: {e}")))?;
    let has_extra = s
        .data
        .as_ref()
        .is_some_and(|d| d.contains_key(TRUSTED_ROOTS_KEY));
    if has_extra {
        let extra = field(TRUSTED_ROOTS_KEY)?;
        let certs = CertificateDer::pem_slice_iter(extra.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(format!("{TRUSTED_ROOTS_KEY}: {e}")))?;
        if certs.is_empty() {
            return Err(invalid(format!("{TRUSTED_ROOTS_KEY}: no certificate")));
        }
        if !root.bundle_pem.ends_with('\n') {
            root.bundle_pem.push('\n');
        }
        root.bundle_pem.push_str(&extra);
        info!(
            secret = name,
            extra = certs.len(),
            "CA root loaded, with further trusted roots"
        );
    } else {
        info!(secret = name, "CA root loaded");
    }
    Ok(root)
}

/// Writes `root-cert.pem` into the ConfigMap `name` (created or replaced).
pub async fn publish(maps: &Api<ConfigMap>, name: &str, root_pem: &str) -> Result<(), RootError> {
    let data = BTreeMap::from([(ROOT_CERT_KEY.to_owned(), root_pem.to_owned())]);
    match maps
        .get_opt(name)
        .await
        .map_err(api_err(format!("get configmap {name}")))?
    {
        Some(cm) if cm.data.as_ref() == Some(&data) => Ok(()),
        Some(mut cm) => {
            cm.data = Some(data);
            maps.replace(name, &PostParams::default(), &cm)
                .await
                .map_err(api_err(format!("replace configmap {name}")))?;
            info!(configmap = name, "CA root published (replaced)");
            Ok(())
        }
        None => {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..Default::default()
                },
                data: Some(data),
                ..Default::default()
            };
            maps.create(&PostParams::default(), &cm)
                .await
                .map_err(api_err(format!("create configmap {name}")))?;
            info!(configmap = name, "CA root published");
            Ok(())
        }
    }
}
