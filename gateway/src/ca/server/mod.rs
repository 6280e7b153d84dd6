//! `tidegate ca`: the Istio CA protocol served by tidegate, for clusters
//! without istiod. The root lives in a Secret ([`root`]); callers are
//! authenticated by TokenReview ([`authn`]) and may impersonate only as
//! istiod's node authorizer allows ([`crate::ca::impersonation`], over the
//! pods [`pods`] watches); [`service`] is the gRPC method.

pub mod authn;
pub mod pods;
pub mod root;
pub mod service;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tracing::{info, warn};

use crate::ca::impersonation::Authorizer;
use crate::config::KubernetesConfig;
use crate::shutdown::ShutdownWatch;

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
    #[arg(long, env = "TIDEGATE_CA_AUDIENCE", default_value = crate::ca::DEFAULT_AUDIENCE)]
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
    #[arg(long, env = "TIDEGATE_CA_MAX_VALIDITY", default_value = "24h", value_parser = crate::config::duration::parse)]
    pub max_validity: Duration,
    /// API server URL without credentials (`kubectl proxy`, tests); unset:
    /// in-cluster credentials or the kubeconfig.
    #[arg(long, env = "TIDEGATE_CA_API_SERVER")]
    pub api_server: Option<String>,
    #[arg(long, env = "KUBECONFIG_FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum CaServerError {
    #[error(transparent)]
    Kubernetes(#[from] crate::workloads::kubernetes::KubernetesError),
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
}

/// A started CA.
pub struct RunningCa {
    pub addr: SocketAddr,
    /// The root certificate (PEM) leaves chain to; the published bundle
    /// may hold further trusted roots (`root::TRUSTED_ROOTS_KEY`).
    pub root_pem: String,
    pub task: tokio::task::JoinHandle<()>,
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
    let client = crate::workloads::kubernetes::client_for(&KubernetesConfig {
        api_server: cfg.api_server.clone(),
        kubeconfig: cfg.kubeconfig.clone(),
        ..KubernetesConfig::default()
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

    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| CaServerError::Listen {
            addr: cfg.listen,
            source,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|source| CaServerError::Listen {
            addr: cfg.listen,
            source,
        })?;
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
    info!(%addr, trusted = ?cfg.trusted, audience = %cfg.audience, "tidegate ca serving");
    let task = tokio::spawn(serve(listener, tls, service::CaService(ca), drain));
    Ok(RunningCa {
        addr,
        root_pem,
        task,
    })
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
    let mut cfg = rustls::ServerConfig::builder_with_provider(crate::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("ring supports TLS 1.3")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| bad(e.to_string()))?;
    cfg.alpn_protocols = vec![crate::tls::ALPN_H2.to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

/// Accepts TCP, handshakes TLS off the accept loop, hands streams to tonic.
async fn serve(
    listener: tokio::net::TcpListener,
    tls: tokio_rustls::TlsAcceptor,
    svc: service::CaService,
    mut drain: ShutdownWatch,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<TlsConn, std::io::Error>>(64);
    let mut stop = drain.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => { warn!(error = %e, "accept failed"); continue; }
                },
                _ = stop.signaled() => return,
            };
            let (tls, tx) = (tls.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(Duration::from_secs(10), tls.accept(tcp)).await {
                    Ok(Ok(s)) => {
                        let _ = tx.send(Ok(TlsConn(s))).await;
                    }
                    Ok(Err(e)) => info!(%peer, error = %e, "TLS handshake with a CA client failed"),
                    Err(_) => info!(%peer, "TLS handshake with a CA client timed out"),
                }
            });
        }
    });
    let incoming = futures::stream::unfold(rx, |mut rx| async move {
        let c = rx.recv().await?;
        Some((c, rx))
    });
    let result = tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(svc, incoming, async move {
            drain.signaled().await;
        })
        .await;
    if let Err(e) = result {
        warn!(error = %e, "CA server ended");
    }
}

/// A TLS connection tonic can serve.
struct TlsConn(tokio_rustls::server::TlsStream<TcpStream>);

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.get_ref().0.connect_info()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}
