//! `tidegate-ca`: the Istio CA protocol served by tidegate, for clusters
//! without istiod. The root lives in a Secret ([`root`]); callers are
//! authenticated by TokenReview ([`authn`]) and may impersonate only as
//! istiod's node authorizer allows ([`crate::impersonation`], over the
//! pods [`pods`] watches); [`service`] is the gRPC method, served by
//! [`listener`] with a connection cap and timeouts. Metrics are served on
//! `--metrics-listen`.

pub mod authn;
pub mod listener;
pub mod pods;
pub mod root;
pub mod service;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use prometheus_client::registry::Registry;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tidegate_control::http::HttpLimits;
use tidegate_control::limits::{ConnLimit, ControlMetrics, FIXED_DESCRIPTORS};
use tracing::{info, warn};

pub use crate::config::CaServerConfig;
use crate::impersonation::Authorizer;
use tidegate_base::shutdown::ShutdownWatch;

/// Connections the metrics listener serves at once.
const METRICS_MAX_CONNECTIONS: u32 = 32;

#[derive(Debug, thiserror::Error)]
pub enum CaServerError {
    #[error(transparent)]
    Kubernetes(#[from] tidegate_control::kube_client::KubeClientError),
    #[error(transparent)]
    Root(#[from] root::RootError),
    #[error("serving certificate: {0}")]
    Serving(String),
    #[error("--trusted {0:?}: expected namespace/service-account")]
    Trusted(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{flag}: {message}")]
    Flag { flag: &'static str, message: String },
}

/// A started CA.
pub struct RunningCa {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    /// The root certificate (PEM) leaves chain to; the published bundle
    /// may hold further trusted roots (`root::TRUSTED_ROOTS_KEY`).
    pub root_pem: String,
    pub task: tokio::task::JoinHandle<()>,
    registry: Arc<Registry>,
}

impl RunningCa {
    /// What `GET /metrics` answers.
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("metrics encode");
        out
    }
}

/// Loads (or creates) the root, publishes it, waits for the first list of
/// pods, then serves until `drain` fires.
pub async fn start(cfg: CaServerConfig, drain: ShutdownWatch) -> Result<RunningCa, CaServerError> {
    if let Some(bad) = cfg
        .trusted
        .iter()
        .find(|t| t.split('/').count() != 2 || t.starts_with('/') || t.ends_with('/'))
    {
        return Err(CaServerError::Trusted(bad.clone()));
    }
    cfg.check()
        .map_err(|(flag, message)| CaServerError::Flag { flag, message })?;
    let max_connections = connection_cap(cfg.max_connections);
    let client = tidegate_control::kube_client::client(tidegate_control::kube_client::Settings {
        api_server: cfg.api_server.as_deref(),
        api_server_key: "--api-server",
        kubeconfig: cfg.kubeconfig.as_deref(),
        kubeconfig_key: "--kubeconfig",
    })
    .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &cfg.namespace);
    let root = root::load_or_create(&secrets, &cfg.secret, &cfg.trust_domain).await?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &cfg.namespace);
    root::publish(&maps, &cfg.root_configmap, &root.bundle_pem).await?;
    let tls = serving_tls(&root, &cfg.serving_names)?;

    let pods = Arc::new(pods::PodIndex::default());
    let (synced_tx, mut synced) = tokio::sync::watch::channel(false);
    {
        let (pods, client, drain) = (pods.clone(), client.clone(), drain.clone());
        tokio::spawn(async move { pods.follow(client, synced_tx, drain).await });
    }
    info!("waiting for the first list of pods");
    let _ = synced.wait_for(|s| *s).await;

    let (listener, addr) = bind(cfg.listen).await?;
    let (metrics_listener, metrics_addr) = bind(cfg.metrics_listen).await?;
    let root_pem = root.cert_pem.clone();
    let ca = Arc::new(service::Ca {
        root,
        authn: authn::Authenticator::new(client, &cfg.audience),
        authorizer: Authorizer {
            trust_domain: cfg.trust_domain.clone(),
            trusted: cfg.trusted.clone(),
        },
        pods,
        max_validity: cfg.max_validity,
    });
    let mut registry = Registry::with_prefix("tidegate");
    let control = ControlMetrics::register(&mut registry);
    let limits = listener::Limits {
        connections: ConnLimit::new("ca", max_connections, &control),
        handshake_timeout: cfg.handshake_timeout,
        preface_timeout: cfg.preface_timeout,
        idle_timeout: cfg.idle_timeout,
    };
    let registry = Arc::new(registry);
    tokio::spawn(tidegate_control::http::serve(
        metrics_listener,
        registry.clone(),
        |r: Arc<Registry>, req| async move { tidegate_control::http::exposition(&r, &req) },
        HttpLimits {
            connections: ConnLimit::new("metrics", METRICS_MAX_CONNECTIONS, &control),
            header_read_timeout: Duration::from_secs(10),
        },
        drain.clone(),
    ));
    info!(%addr, %metrics_addr, max_connections, trusted = ?cfg.trusted, audience = %cfg.audience, "tidegate-ca serving");
    let task = tokio::spawn(listener::serve(
        listener,
        tls,
        service::CaService(ca),
        limits,
        drain,
    ));
    Ok(RunningCa {
        addr,
        metrics_addr,
        root_pem,
        task,
        registry,
    })
}

async fn bind(addr: SocketAddr) -> Result<(tokio::net::TcpListener, SocketAddr), CaServerError> {
    let err = |source| CaServerError::Listen { addr, source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(err)?;
    let bound = listener.local_addr().map_err(err)?;
    Ok((listener, bound))
}

/// Raises the open-file soft limit to the hard limit and returns `wanted`,
/// or what that limit allows beside the metrics listener's connections
/// and the process's own descriptors (logged), if less.
fn connection_cap(wanted: u32) -> u32 {
    let limit = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
        Ok((_, hard)) => rlimit::increase_nofile_limit(hard).unwrap_or(hard),
        Err(e) => {
            warn!(error = %e, "cannot read the open-file limit");
            return wanted;
        }
    };
    let reserve = FIXED_DESCRIPTORS + u64::from(METRICS_MAX_CONNECTIONS);
    let allowed = limit.saturating_sub(reserve).clamp(1, u64::from(u32::MAX)) as u32;
    if allowed < wanted {
        warn!(
            max_connections = wanted,
            open_file_limit = limit,
            lowered_to = allowed,
            "--max-connections exceeds what the open-file limit allows; lowered"
        );
        return allowed;
    }
    wanted
}

fn serving_tls(
    root: &root::CaRoot,
    names: &[String],
) -> Result<tokio_rustls::TlsAcceptor, CaServerError> {
    let bad = |m: String| CaServerError::Serving(m);
    let (cert_pem, key_pem) = root.serving_cert(names).map_err(|e| bad(e.to_string()))?;
    let chain = vec![
        CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| bad(e.to_string()))?,
        CertificateDer::from_pem_slice(root.cert_pem.as_bytes()).map_err(|e| bad(e.to_string()))?,
    ];
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| bad(e.to_string()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(tidegate_protocol::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("ring supports TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| bad(e.to_string()))?;
    cfg.alpn_protocols = vec![tidegate_protocol::tls::ALPN_H2.to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}
