//! The workload store: every workload the gateway knows, published by one
//! writer as an immutable snapshot that the data path reads without locks.
//!
//! The writer is the configured source (`workloads.source`): the watched
//! workload file (`file`), Kubernetes discovery ([`kubernetes`]), or
//! istiod ([`istio`]). The first two publish their whole set; istiod's
//! updates are applied as what changed ([`Delta`]). Either way a publish
//! shares everything unchanged with the snapshot before it
//! ([`snapshot`]), and the drain engine derives lifecycle events from
//! the difference between consecutive snapshots, which costs what
//! changed.

pub mod endpoint;
pub mod endpoint_list;
mod file;
mod file_authorization;
mod identities;
pub mod istio;
pub mod kubernetes;
pub mod membership;
pub mod services;
mod snapshot;
mod spec_builder;
mod store;
pub mod waypoint;

pub use snapshot::{
    Delta, EndpointChange, FormerlyKnown, WorkloadChange, WorkloadSnapshot, DEPARTED_MAX,
    DEPARTED_RETENTION,
};
pub use store::{WholeSet, WorkloadStore};

pub use file::{
    parse_file, parse_workload_file, Parsed, WorkloadFile, WorkloadFileError, WorkloadFileMetrics,
    WorkloadFileWatcher,
};

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use tidegate_policy_host::{AsSubject, Subject};
use tidegate_protocol::identity::SpiffeId;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize, Default)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    /// The workload's node runs an HBONE gateway: tunnel to it.
    #[default]
    Hbone,
    /// Plain TCP pass-through.
    Tcp,
}

/// What a workload's `workload_name` names, as istiod says it
/// (`workload_type`): written as ztunnel writes `workloadType`, lowercase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadType {
    Deployment,
    Cronjob,
    Pod,
    Job,
}

/// Whether a workload has an address of its own or shares its node's
/// (istiod's `network_mode`): written as ztunnel writes `networkMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Default)]
pub enum NetworkMode {
    #[default]
    Standard,
    HostNetwork,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LifecycleState {
    #[default]
    Running,
    Terminating,
}

/// One workload, from the workload file or from Kubernetes discovery.
#[derive(Clone, Debug, PartialEq, Hash, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    pub uid: String,
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default = "default_service_account")]
    pub service_account: String,
    pub ips: Vec<IpAddr>,
    pub node: String,
    #[serde(default)]
    pub protocol: Protocol,
    #[serde(default)]
    pub state: LifecycleState,
    /// Shared between workloads with the same labels where the source
    /// interns them (istiod's: replicas carry the same canonical labels).
    #[serde(default, with = "shared_map")]
    pub labels: Arc<BTreeMap<String, String>>,
    /// Shared like `labels` (most workloads carry none, and an empty map
    /// costs a pointer, not a map).
    #[serde(default, with = "shared_map")]
    pub annotations: Arc<BTreeMap<String, String>>,
    /// Inbound authorization: SPIFFE ids (a trailing `*` matches a prefix)
    /// allowed to open streams to this workload. Empty: any peer of the trust domain.
    #[serde(default)]
    pub allow: Vec<String>,
    /// The WORKLOAD_SELECTOR authorization policies that select this
    /// workload, by key (`<namespace>/<name>`); the NAMESPACE and GLOBAL
    /// ones apply without being named ([`tidegate_authz`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authorization_policies: Vec<String>,
    /// Opt-in to OCI load-balancer backend draining: set in the workload file,
    /// or by Kubernetes discovery when a Service selecting the pod carries
    /// `tidegate.io/oci-backend-draining: "true"`.
    #[serde(default)]
    pub oci_backend_draining: bool,
    /// Drain policy named by the workload's namespace (Kubernetes: the
    /// namespace label `workloads.kubernetes.policy_label`). Below the pod
    /// annotation `tidegate.io/drain-policy`, above `policies.bindings`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_policy: Option<String>,
    /// The deadline of a terminating workload, milliseconds since the Unix
    /// epoch (Kubernetes: `deletionTimestamp`, which the API server sets to
    /// the deletion request time plus the grace period). Unset: the drain
    /// engine uses `drains.default_grace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_deadline_unix_ms: Option<u64>,
    /// The Services this workload is an endpoint of: `<name>` (its own
    /// namespace) or `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
    /// Named ports (a Service's `target_port` by name resolves here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<String, u16>,
    /// The workload the pod belongs to, as Istio's metrics name it (its
    /// Deployment or Job; Kubernetes discovery derives it from the pod's
    /// controller). Unset: the pod's `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_name: Option<String>,
    /// Its waypoint (istiod only): traffic addressed to the workload goes
    /// through it. Not a workload-file key. Boxed: few workloads have one,
    /// and every workload would otherwise carry its size.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<Box<waypoint::Waypoint>>,
    /// Reachable only through a network gateway (istiod's
    /// `network_gateway`: another network): refused, never sent in
    /// plaintext. Not a workload-file key.
    #[serde(
        default,
        skip_deserializing,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub other_network: bool,
    /// What `workload_name` names (istiod's `workload_type`); unset from
    /// the other sources. Not a workload-file key.
    #[serde(skip)]
    pub workload_type: Option<WorkloadType>,
    /// istiod's `network_mode` (a host-network pod's `ips` are empty, its
    /// addresses are its Service endpoints'); `Standard` from the other
    /// sources. Not a workload-file key.
    #[serde(skip)]
    pub network_mode: NetworkMode,
}

/// A shared map, read and written as the map itself.
mod shared_map {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(
        map: &Arc<BTreeMap<String, String>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        map.as_ref().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Arc<BTreeMap<String, String>>, D::Error> {
        BTreeMap::deserialize(d).map(super::shared)
    }
}

/// `map` as a workload holds its labels or annotations: an empty one is
/// the one empty map every such workload shares (no allocation each).
pub fn shared(map: BTreeMap<String, String>) -> Arc<BTreeMap<String, String>> {
    static EMPTY: std::sync::OnceLock<Arc<BTreeMap<String, String>>> = std::sync::OnceLock::new();
    if map.is_empty() {
        EMPTY.get_or_init(Default::default).clone()
    } else {
        Arc::new(map)
    }
}

fn default_namespace() -> String {
    "default".into()
}

fn default_service_account() -> String {
    "default".into()
}

/// A workload with its derived identity.
#[derive(Debug, Serialize)]
pub struct Workload {
    #[serde(flatten)]
    pub spec: WorkloadSpec,
    pub identity: SpiffeId,
    /// True when `spec.node` is this gateway's node.
    pub local: bool,
}

impl Workload {
    pub fn uid(&self) -> &str {
        &self.spec.uid
    }

    /// Whether `peer` may open streams to this workload.
    pub fn allows(&self, peer: &SpiffeId) -> bool {
        if self.spec.allow.is_empty() {
            return true;
        }
        let peer = peer.as_str();
        self.spec.allow.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => peer.starts_with(prefix),
            None => *p == peer,
        })
    }
}

/// What the policy host resolves a workload's policy from.
impl AsSubject for Workload {
    fn subject(&self) -> Subject<'_> {
        let s = &self.spec;
        Subject {
            uid: &s.uid,
            name: &s.name,
            namespace: &s.namespace,
            labels: &s.labels,
            annotations: &s.annotations,
            namespace_policy: s.namespace_policy.as_deref(),
        }
    }
}
