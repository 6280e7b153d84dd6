//! `tidegate ca`'s settings: flags and environment (`tidegate ca --help`),
//! checked against their ranges like every other key.

use std::net::SocketAddr;
use std::time::Duration;

use super::ranges;

/// The token audience `tidegate ca` expects by default (istiod's
/// `TOKEN_AUDIENCES`).
pub const DEFAULT_AUDIENCE: &str = "istio-ca";

/// `tidegate ca`'s settings (flags and environment, see `tidegate ca --help`).
#[derive(Clone, Debug, clap::Args)]
pub struct CaServerConfig {
    /// Address to serve gRPC (TLS) on.
    #[arg(long, env = "TIDEGATE_CA_LISTEN", default_value = "0.0.0.0:15012")]
    pub listen: SocketAddr,
    /// Namespace of the root Secret and the root ConfigMap (the pod's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "tidegate-system")]
    pub namespace: String,
    /// Secret holding the root (`ca-cert.pem`, `ca-key.pem`); created when absent.
    #[arg(long, env = "TIDEGATE_CA_SECRET", default_value = "tidegate-ca-root")]
    pub secret: String,
    /// ConfigMap the root certificate is published in (`root-cert.pem`).
    #[arg(
        long,
        env = "TIDEGATE_CA_ROOT_CONFIGMAP",
        default_value = "tidegate-ca-root"
    )]
    pub root_configmap: String,
    #[arg(long, env = "TIDEGATE_TRUST_DOMAIN", default_value = "cluster.local")]
    pub trust_domain: String,
    /// `namespace/service-account` of node agents allowed to impersonate
    /// (istiod's `CA_TRUSTED_NODE_ACCOUNTS`).
    #[arg(
        long = "trusted",
        env = "TIDEGATE_CA_TRUSTED",
        value_delimiter = ',',
        default_value = "tidegate-system/tidegate"
    )]
    pub trusted: Vec<String>,
    /// The audience tokens must carry (istiod's `TOKEN_AUDIENCES`).
    #[arg(long, env = "TIDEGATE_CA_AUDIENCE", default_value = DEFAULT_AUDIENCE)]
    pub audience: String,
    /// Names (DNS or IP) in the CA's serving certificate.
    #[arg(
        long = "serving-name",
        env = "TIDEGATE_CA_SERVING_NAMES",
        value_delimiter = ',',
        default_value = "tidegate-ca.tidegate-system.svc,tidegate-ca.tidegate-system.svc.cluster.local"
    )]
    pub serving_names: Vec<String>,
    /// Longest validity issued (a request asking for more gets this).
    #[arg(long, env = "TIDEGATE_CA_MAX_VALIDITY", default_value = "24h", value_parser = tidegate_base::duration::parse)]
    pub max_validity: Duration,
    /// Most gRPC connections open at once (1 to 1000000); one more is
    /// closed at once. Lowered to what the open-file limit allows.
    #[arg(long, env = "TIDEGATE_CA_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: u32,
    /// A TLS handshake not done within this is closed (100ms to 5m).
    #[arg(long, env = "TIDEGATE_CA_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = tidegate_base::duration::parse)]
    pub handshake_timeout: Duration,
    /// A connection without a request this long after its handshake is
    /// closed (100ms to 5m).
    #[arg(long, env = "TIDEGATE_CA_PREFACE_TIMEOUT", default_value = "10s", value_parser = tidegate_base::duration::parse)]
    pub preface_timeout: Duration,
    /// A connection without a request in flight this long is closed with a
    /// GOAWAY (1s to 24h).
    #[arg(long, env = "TIDEGATE_CA_IDLE_TIMEOUT", default_value = "5m", value_parser = tidegate_base::duration::parse)]
    pub idle_timeout: Duration,
    /// Address to serve `GET /metrics` on.
    #[arg(
        long,
        env = "TIDEGATE_CA_METRICS_LISTEN",
        default_value = "0.0.0.0:15014"
    )]
    pub metrics_listen: SocketAddr,
    /// API server URL without credentials (`kubectl proxy`, tests); unset:
    /// in-cluster credentials or the kubeconfig.
    #[arg(long, env = "TIDEGATE_CA_API_SERVER")]
    pub api_server: Option<String>,
    #[arg(long, env = "KUBECONFIG_FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

/// `tidegate ca`'s numeric flags against their ranges: the first out of
/// range, as (flag, message).
pub fn check_ca_server(cfg: &CaServerConfig) -> Result<(), (&'static str, String)> {
    match ranges::ca_server_rows(cfg)
        .iter()
        .find_map(|r| r.check().map(|m| (r.key, m)))
    {
        Some(bad) => Err(bad),
        None => Ok(()),
    }
}
