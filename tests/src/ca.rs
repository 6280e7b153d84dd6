//! `tidegate-ca` over the Kubernetes API double, as the CA tests and the
//! `ca` bench run it: the node agents' pods and tokens, and the CA's settings.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::json;
use tidegate::app::App;
use tidegate_ca::server::CaServerConfig;

use crate::kube_api::{FakeApiServer, Kind, TokenInfo};

/// The namespace of the node agents (service account `tidegate`) and of the CA.
pub const NS: &str = "tidegate-system";

/// A gateway pod `name` (service account `tidegate`) on `node`, and a
/// pod-bound `token` for it with the CA's audience.
pub fn gateway_pod(api: &FakeApiServer, name: &str, node: &str, token: &str) {
    api.apply(
        Kind::Pod,
        json!({
            "metadata": {"name": name, "namespace": NS, "uid": format!("{name}-uid")},
            "spec": {"nodeName": node, "serviceAccountName": "tidegate", "containers": [{"name": "gw", "image": "tidegate"}]},
            "status": {"phase": "Running"},
        }),
    );
    api.add_token(
        token,
        TokenInfo {
            username: format!("system:serviceaccount:{NS}:tidegate"),
            audiences: vec![tidegate_ca::DEFAULT_AUDIENCE.into()],
            pod: Some((name.into(), format!("{name}-uid"))),
        },
    );
}

/// `tidegate-ca` on `listen`, trusting the gateways of [`gateway_pod`],
/// serving as 127.0.0.1, reading `api`.
pub fn ca_config(
    api: &FakeApiServer,
    listen: SocketAddr,
    max_validity: Duration,
) -> CaServerConfig {
    CaServerConfig {
        listen,
        namespace: NS.into(),
        secret: "tidegate-ca-root".into(),
        root_configmap: "tidegate-ca-root".into(),
        trust_domain: "cluster.local".into(),
        trusted: vec![format!("{NS}/tidegate")],
        audience: tidegate_ca::DEFAULT_AUDIENCE.into(),
        serving_names: vec!["127.0.0.1".into()],
        max_validity,
        max_connections: 4096,
        handshake_timeout: Duration::from_secs(10),
        preface_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(300),
        metrics_listen: "127.0.0.1:0".parse().unwrap(),
        api_server: Some(api.url()),
        kubeconfig: None,
    }
}

/// Waits until `app`'s workload store knows a workload at `ip` (after a
/// write of the workload file).
pub async fn until_known(app: &App, ip: IpAddr) {
    let mut changes = app.workloads.subscribe();
    while app.workloads.snapshot().by_ip(ip).is_none() {
        changes
            .changed()
            .await
            .expect("the store outlives the wait");
    }
}

/// A CA client for `tidegate-ca` at `addr`, trusting `root_pem`, presenting
/// `token` (files written under `dir`).
pub fn agent(
    dir: &std::path::Path,
    addr: SocketAddr,
    root_pem: &str,
    token: &str,
) -> tidegate_ca::client::CaClient {
    let roots = dir.join("agent-root.pem");
    std::fs::write(&roots, root_pem).unwrap();
    let token_file = dir.join(format!("agent-{token}"));
    std::fs::write(&token_file, token).unwrap();
    tidegate_ca::client::CaClient::new(tidegate_ca::client::CaClientConfig {
        address: format!("https://{addr}"),
        roots,
        token: Some(token_file),
        cluster_id: "Kubernetes".into(),
        server_name: None,
        timeout: Duration::from_secs(5),
    })
    .unwrap()
}

/// Asks for the caller's own identity (no impersonation); returns the
/// leaf's identity.
pub async fn own_identity(
    client: &tidegate_ca::client::CaClient,
) -> Result<tidegate_protocol::identity::SpiffeId, tidegate_ca::client::CaClientError> {
    use rustls_pki_types::pem::PemObject;
    let id = tidegate_protocol::identity::SpiffeId::new("cluster.local", NS, "tidegate");
    let csr = tidegate_ca::csr::generate(&id).unwrap().csr_pem;
    let chain = client
        .create_certificate(tidegate_ca::messages::IstioCertificateRequest {
            csr,
            validity_duration: 3600,
            metadata: None,
        })
        .await?;
    let leaf = rustls_pki_types::CertificateDer::from_pem_slice(chain[0].as_bytes()).unwrap();
    Ok(tidegate_protocol::tls::identity_of(&leaf).unwrap())
}

/// Waits until the server closes `conn` (EOF or reset), within `within`;
/// panics naming `what` otherwise. Any bytes read before are ignored.
pub async fn closed_by_server<S: tokio::io::AsyncRead + Unpin>(
    what: &str,
    mut conn: S,
    within: Duration,
) {
    use tokio::io::AsyncReadExt;
    let closed = async {
        let mut buf = [0u8; 1024];
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, closed)
        .await
        .unwrap_or_else(|_| panic!("{what}: still open after {within:?}"));
}
