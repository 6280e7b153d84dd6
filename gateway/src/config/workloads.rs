//! The `workloads:` section: a watched file, Kubernetes discovery, or istiod.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::certificates::default_reload_interval;
use tidegate_base::{duration, size};

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct WorkloadsConfig {
    /// Where workloads come from: `file` (the workload file below, or the
    /// embedded demo set) or `kubernetes` (the API server, see `kubernetes`).
    pub source: WorkloadSourceKind,
    /// YAML workload file, watched and reloaded. Unset: the embedded demo set.
    pub file: Option<PathBuf>,
    #[serde(with = "duration")]
    pub reload_interval: Duration,
    /// Discovery from the Kubernetes API (used when `source: kubernetes`).
    pub kubernetes: KubernetesConfig,
    /// Discovery from istiod over delta xDS (used when `source: istio`).
    pub istio: IstioConfig,
}

impl Default for WorkloadsConfig {
    fn default() -> Self {
        WorkloadsConfig {
            source: WorkloadSourceKind::File,
            file: None,
            reload_interval: default_reload_interval(),
            kubernetes: KubernetesConfig::default(),
            istio: IstioConfig::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadSourceKind {
    #[default]
    File,
    Kubernetes,
    /// istiod's workloads, Services and authorization policies, as
    /// ztunnel receives them.
    Istio,
}

/// `workloads.kubernetes`: node-scoped discovery through the API server.
/// The node is the top-level `node_name` (set it from the downward API:
/// `TIDEGATE_NODE_NAME` from `spec.nodeName`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesConfig {
    /// API server URL without credentials (`kubectl proxy`, tests). Unset:
    /// kube's inference — `KUBECONFIG`/`~/.kube/config`, else in-cluster
    /// service-account credentials.
    pub api_server: Option<String>,
    /// A kubeconfig file to use (its current context) instead of inference.
    pub kubeconfig: Option<PathBuf>,
    /// Label (on the namespace, or on the pod to override it) whose value
    /// `enabled` puts a workload in the mesh (HBONE); others are plain TCP.
    pub mesh_label: String,
    /// Namespace label naming the drain policy of every pod in it (below the
    /// pod annotation `tidegate.io/drain-policy`, above `policies.bindings`).
    pub policy_label: String,
    /// Watch Services: routing by ClusterIP to the endpoints their
    /// EndpointSlices list, and the annotation
    /// `tidegate.io/oci-backend-draining: "true"` that sets
    /// `oci_backend_draining` on those pods. Needs services get/list/watch.
    /// Off: a ClusterIP is no known destination (passthrough, or refused
    /// inside `outbound.cluster_cidrs`).
    pub services: bool,
    /// Watch Istio's `security.istio.io/v1` AuthorizationPolicy and
    /// PeerAuthentication and enforce them as ztunnel fed by istiod would
    /// (`docs/authorization.md`). Needs get/list/watch on both; a cluster
    /// without the CRDs has no policies (logged, and watched until they
    /// appear).
    pub authorization: bool,
    /// Istio's root namespace: its policies without a selector apply to
    /// every workload, and its PeerAuthentication without one is mesh-wide.
    pub root_namespace: String,
    /// Changes arriving within this window are published as one snapshot.
    #[serde(with = "duration")]
    pub debounce: Duration,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            api_server: None,
            kubeconfig: None,
            mesh_label: "tidegate.io/mesh".into(),
            policy_label: "tidegate.io/drain-policy".into(),
            services: true,
            authorization: true,
            root_namespace: "istio-system".into(),
            debounce: Duration::from_millis(50),
        }
    }
}

/// `workloads.istio`: istiod's delta xDS (`istio.workload.Address`,
/// `istio.security.Authorization`), as ztunnel subscribes to it. The
/// stream authenticates with the same token and roots as the Istio CA.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct IstioConfig {
    /// `https://host:port` (ztunnel's `XDS_ADDRESS`), or a Unix socket
    /// spoken in plaintext (`unix:///var/run/cilium/xds.sock`, Cilium's
    /// agent; also `unix:/path`, `unix://localhost/path`); plaintext over
    /// TCP is refused.
    pub address: String,
    /// PEM roots that verify istiod, read for every connection (ztunnel's
    /// `XDS_ROOT_CA`).
    pub roots: PathBuf,
    /// The projected service-account token (audience `istio-ca`), read for
    /// every stream (ztunnel's `AUTH_TOKEN`). Unset: no token is sent.
    pub token: Option<PathBuf>,
    /// Verify istiod as this name instead of the address's host
    /// (ztunnel's `ALT_XDS_HOSTNAME`).
    pub server_name: Option<String>,
    /// Bounds one connection attempt.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// This proxy's pod: its IP, name and namespace make the node id
    /// `ztunnel~<ip>~<name>.<namespace>~<namespace>.svc.cluster.local`
    /// that istiod reads as a node proxy (ztunnel's `INSTANCE_IP`,
    /// `POD_NAME`, `POD_NAMESPACE`; set them from the downward API).
    pub pod_ip: String,
    pub pod_name: String,
    pub pod_namespace: String,
    /// The largest response accepted from istiod (ztunnel's: 200MiB; a
    /// large mesh's first answer is one message). A larger one is refused
    /// from its length prefix, before it is read; the stream is opened
    /// again and everything held stays.
    #[serde(deserialize_with = "size::deserialize_u32")]
    pub max_message_size: u32,
    /// The largest single resource accepted (a Workload is a few hundred
    /// bytes; one Kubernetes object, which each resource is converted
    /// from, is at most 1.5MiB by default). A larger one is refused
    /// (NACKed naming the limit); its previous version stays.
    #[serde(deserialize_with = "size::deserialize_u32")]
    pub max_resource_size: u32,
    /// The server sends Workloads only (Cilium's agent; set by
    /// `control_plane: cilium`): a Service, or a response of a type not
    /// subscribed, is refused (NACKed with its reason), the rest applied.
    pub workloads_only: bool,
}

impl Default for IstioConfig {
    fn default() -> Self {
        IstioConfig {
            address: "https://istiod.istio-system.svc:15012".into(),
            roots: "/var/run/secrets/istio/root-cert.pem".into(),
            token: Some("/var/run/secrets/tokens/istio-token".into()),
            server_name: None,
            connect_timeout: Duration::from_secs(10),
            pod_ip: "1.1.1.1".into(),
            pod_name: "tidegate".into(),
            pod_namespace: "istio-system".into(),
            max_message_size: tidegate_xds::client::MAX_MESSAGE as u32,
            max_resource_size: tidegate_xds::client::MAX_RESOURCE as u32,
            workloads_only: false,
        }
    }
}
