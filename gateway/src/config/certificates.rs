//! The `certificates:` section: the development CA, a directory, or an Istio CA.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use tidegate_base::duration;

/// Where workload certificates come from.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "source", rename_all = "kebab-case", deny_unknown_fields)]
pub enum CertificatesConfig {
    /// Built-in development CA minting short-lived certificates in memory.
    DevCa {
        /// Keep the CA's root certificate and key here so other processes
        /// (`tidegate connect`, a second gateway) share the CA. In memory only if unset.
        #[serde(default)]
        state_dir: Option<PathBuf>,
        /// Also write the root certificate (PEM) here for peers to trust.
        #[serde(default)]
        root_out: Option<PathBuf>,
        #[serde(default = "default_cert_validity", with = "duration")]
        validity: Duration,
    },
    /// A directory of `<name>.crt`/`<name>.key` PEM pairs and a trust bundle,
    /// reloaded when files change.
    Dir {
        dir: PathBuf,
        trust_bundle: PathBuf,
        #[serde(default = "default_reload_interval", with = "duration")]
        reload_interval: Duration,
    },
    /// An Istio CA (istiod, or `tidegate-ca`): a certificate per local
    /// identity, asked for on the pods' behalf (`ImpersonatedIdentity`),
    /// renewed at half-life.
    IstioCa(IstioCaConfig),
}

/// `certificates.source: istio-ca`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct IstioCaConfig {
    /// `https://host:port` (ztunnel's `CA_ADDRESS`).
    pub address: String,
    /// PEM roots that verify the CA's serving certificate, re-read every
    /// `reload_interval` (ztunnel's `CA_ROOT_CA`). Also trusted for peers.
    pub roots: PathBuf,
    /// The projected service-account token, audience `istio-ca`, re-read
    /// for every request (ztunnel's `AUTH_TOKEN`). Unset: no token is sent
    /// (Cilium's agent checks none).
    pub token: Option<PathBuf>,
    /// Sent as the `clusterid` header.
    pub cluster_id: String,
    /// Verify the CA as this name instead of the address's host.
    pub server_name: Option<String>,
    /// Requested validity (`validity_duration`; ztunnel's `SECRET_TTL`).
    #[serde(with = "duration")]
    pub validity: Duration,
    /// How long a handshake waits for an identity's first certificate.
    #[serde(with = "duration")]
    pub first_use_wait: Duration,
    /// Per request to the CA.
    #[serde(with = "duration")]
    pub timeout: Duration,
    #[serde(with = "duration")]
    pub reload_interval: Duration,
    /// Trust the root each answer ends with, once the answer checks
    /// against it (the CA's TLS is verified against `roots`): Cilium's
    /// agent, whose `roots` is the bootstrap certificate it serves TLS
    /// with, not the root that signs workloads (set by
    /// `control_plane: cilium`). Off: only `roots` are trust anchors.
    pub trust_answer_root: bool,
}

impl Default for IstioCaConfig {
    fn default() -> Self {
        IstioCaConfig {
            address: "https://istiod.istio-system.svc:15012".into(),
            roots: "/var/run/secrets/istio/root-cert.pem".into(),
            token: Some("/var/run/secrets/tokens/istio-token".into()),
            cluster_id: "Kubernetes".into(),
            server_name: None,
            validity: Duration::from_secs(24 * 3600),
            first_use_wait: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
            reload_interval: default_reload_interval(),
            trust_answer_root: false,
        }
    }
}

fn default_cert_validity() -> Duration {
    Duration::from_secs(3600)
}

pub(super) fn default_reload_interval() -> Duration {
    Duration::from_secs(2)
}

impl Default for CertificatesConfig {
    fn default() -> Self {
        CertificatesConfig::DevCa {
            state_dir: None,
            root_out: None,
            validity: default_cert_validity(),
        }
    }
}
