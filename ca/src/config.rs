//! `tidegate-ca`'s settings: flags and environment (`tidegate-ca --help`),
//! each number checked against its range as the gateway checks its keys
//! ([`tidegate_base::range`]).

use std::net::SocketAddr;
use std::time::Duration;

use tidegate_base::range::{count, dur, first_out_of_range, millis, secs, Row, DAY, MIN};

/// The token audience `tidegate-ca` expects by default (istiod's
/// `TOKEN_AUDIENCES`).
pub const DEFAULT_AUDIENCE: &str = "istio-ca";

/// `tidegate-ca`'s settings (flags and environment, see `tidegate-ca --help`).
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "tidegate-ca",
    version,
    about = "The Istio CA protocol for clusters without istiod: a certificate for each pod a node agent may speak for"
)]
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
    /// The trust domain of the identities issued (and of the callers).
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
    /// A kubeconfig file, read when no API server URL is given.
    #[arg(long, env = "KUBECONFIG_FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

/// The numeric flags, each with its range.
fn rows(c: &CaServerConfig) -> Vec<Row> {
    vec![
        count("--max-connections", c.max_connections.into(), 1, 1_000_000)
            .because("each connection holds a descriptor"),
        dur(
            "--handshake-timeout",
            c.handshake_timeout,
            millis(100),
            5 * MIN,
        ),
        dur("--preface-timeout", c.preface_timeout, millis(100), 5 * MIN),
        dur("--idle-timeout", c.idle_timeout, secs(1), DAY),
    ]
}

impl CaServerConfig {
    /// The first flag out of its range, as (flag, message).
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        first_out_of_range(&rows(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn flags_out_of_range_are_refused_naming_the_flag() {
        let check = |args: &[&str]| {
            CaServerConfig::try_parse_from(
                std::iter::once("tidegate-ca").chain(args.iter().copied()),
            )
            .unwrap()
            .check()
        };
        assert_eq!(check(&[]), Ok(()), "the defaults are in range");
        for (arg, flag, range) in [
            ("--max-connections=0", "--max-connections", "1 and 1000000"),
            (
                "--handshake-timeout=0s",
                "--handshake-timeout",
                "100ms and 5m",
            ),
            ("--preface-timeout=1h", "--preface-timeout", "100ms and 5m"),
            ("--idle-timeout=0s", "--idle-timeout", "1s and 24h"),
        ] {
            let (got, message) = check(&[arg]).unwrap_err();
            assert_eq!(got, flag);
            assert!(message.contains(range), "{arg}: {message}");
        }
    }
}
