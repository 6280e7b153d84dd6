//! The gateway's one typed configuration.
//!
//! Layers, lowest first: built-in defaults, the YAML file (`--config`), the
//! environment (`TIDEGATE_<KEY>` with `__` between nesting levels, e.g.
//! `TIDEGATE_LISTENERS__ADMIN=127.0.0.1:16000`) and `--set key.path=value`
//! flags. Everything is parsed once here; no other module reads the
//! environment. A bad value is an error naming the key and the accepted form.
//!
//! This module owns every section's type (`oci:` is in [`oci`]; `policies:`
//! is the policy host's, [`tidegate_policy_host::config`], re-exported here)
//! and every default; other modules take their section from here and import
//! nothing back into it (validation parses a [`crate::identity::SpiffeId`],
//! a leaf). Where a section's type has behaviour that needs another module
//! (the OCI opt-in, the fallback policies, the plugin limits and action
//! bounds), that `impl` block lives in the other module. [`duration`] and
//! [`size`] are leaf modules anyone may use.

mod oci;
mod ranges;

pub use oci::{Cidr, OciAuth, OciConfig, OptIn, OCI_BACKEND_LIMIT};
pub use ranges::{key_ranges, KeyRange};
pub use tidegate_base::{duration, size};
pub use tidegate_policy_host::config::{BindingSpec, Fallback, PluginSpec, PoliciesConfig};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_yaml::{Mapping, Value};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid YAML: {source}")]
    Yaml {
        path: PathBuf,
        source: serde_yaml::Error,
    },
    #[error("config key `{key}`: {message}")]
    Invalid { key: String, message: String },
    #[error("override {input:?} is not of the form key.path=value")]
    Override { input: String },
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_owned(),
        message: message.into(),
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Name of the node this gateway serves; workloads with this `node` are local.
    pub node_name: String,
    /// SPIFFE trust domain of this mesh; peers from other trust domains are refused.
    pub trust_domain: String,
    pub listeners: Listeners,
    pub hbone: HboneConfig,
    pub pool: PoolConfig,
    /// The data path's TCP sockets: congestion control.
    pub tcp: TcpConfig,
    pub certificates: CertificatesConfig,
    pub workloads: WorkloadsConfig,
    pub shutdown: ShutdownConfig,
    pub policies: PoliciesConfig,
    pub drains: DrainsConfig,
    /// How pod traffic reaches the gateway: node-level listeners, or
    /// listeners inside each meshed pod's network namespace.
    pub capture: CaptureConfig,
    /// Routing of captured connections: Services' endpoint choice, the
    /// cluster's address ranges.
    pub outbound: OutboundConfig,
    /// OCI load-balancer backend draining (the `oci-drain` action); off by default.
    pub oci: OciConfig,
    /// Limits of the admin, metrics, readiness and CNI listeners.
    pub control_plane: ControlPlaneConfig,
    /// Optional demo echo backend started in-process (the embedded default uses it).
    pub demo: Option<DemoConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_name: "node-a".into(),
            trust_domain: "cluster.local".into(),
            listeners: Listeners::default(),
            hbone: HboneConfig::default(),
            pool: PoolConfig::default(),
            tcp: TcpConfig::default(),
            certificates: CertificatesConfig::default(),
            workloads: WorkloadsConfig::default(),
            shutdown: ShutdownConfig::default(),
            policies: PoliciesConfig::default(),
            drains: DrainsConfig::default(),
            capture: CaptureConfig::default(),
            outbound: OutboundConfig::default(),
            oci: OciConfig::default(),
            control_plane: ControlPlaneConfig::default(),
            demo: None,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Listeners {
    /// Transparent outbound capture (iptables REDIRECT target).
    pub outbound: SocketAddr,
    /// HBONE inbound (mTLS + HTTP/2 CONNECT).
    pub inbound: SocketAddr,
    /// Admin API; keep it on localhost.
    pub admin: SocketAddr,
    /// Prometheus `/metrics`.
    pub metrics: SocketAddr,
    /// `/healthz/ready`.
    pub readiness: SocketAddr,
}

impl Default for Listeners {
    fn default() -> Self {
        Listeners {
            outbound: ([0, 0, 0, 0], 15001).into(),
            inbound: ([0, 0, 0, 0], 15008).into(),
            admin: ([127, 0, 0, 1], 15000).into(),
            metrics: ([0, 0, 0, 0], 15020).into(),
            readiness: ([0, 0, 0, 0], 15021).into(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HboneConfig {
    /// Port dialed on peer workloads for HBONE.
    pub port: u16,
    #[serde(deserialize_with = "size::deserialize_u32")]
    pub stream_window: u32,
    #[serde(deserialize_with = "size::deserialize_u32")]
    pub connection_window: u32,
    #[serde(deserialize_with = "size::deserialize_u32")]
    pub max_frame_size: u32,
    /// Streams a peer may open concurrently on one inbound tunnel.
    pub max_concurrent_streams: u32,
    #[serde(deserialize_with = "size::deserialize_u32")]
    pub max_header_list_size: u32,
    #[serde(with = "duration")]
    pub keepalive_interval: Duration,
    #[serde(with = "duration")]
    pub keepalive_timeout: Duration,
    /// Bound on TCP connect + TLS + HTTP/2 handshakes, and on dialing upstreams.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// Upstream dials one inbound tunnel may have in flight (rapid-reset bound).
    pub max_dials_in_flight_per_tunnel: usize,
    /// Upstream dials one inbound tunnel may start per second, whatever they
    /// carry; 0 (the default): no such cap. Healthy short connections are
    /// many; the rapid-reset bound is the next key.
    pub max_dials_per_second_per_tunnel: u32,
    /// Wasted upstream dials one inbound tunnel may make per second, on
    /// average (ten seconds' worth at once): dials whose stream the peer reset
    /// before the dial completed, or that carried no byte from the peer (the
    /// rapid-reset bound; see `proxy/inbound/pace.rs`).
    pub max_wasted_dials_per_second_per_tunnel: u32,
    /// Inbound connections held at once — tunnels, and the connections
    /// their streams opened to workloads; tunnels alone at most half of it.
    /// 0 (the default): three quarters of the descriptors the control plane
    /// leaves (see `proxy/inbound/limits.rs`).
    pub max_connections: u32,
    /// The same for one peer identity; 0 (the default): a quarter of
    /// `max_connections`.
    pub max_connections_per_identity: u32,
}

impl Default for HboneConfig {
    fn default() -> Self {
        let tunnel = crate::hbone::Settings::default();
        HboneConfig {
            port: 15008,
            stream_window: tunnel.stream_window,
            connection_window: tunnel.connection_window,
            max_frame_size: tunnel.max_frame_size,
            max_concurrent_streams: tunnel.max_concurrent_streams,
            max_header_list_size: tunnel.max_header_list_size,
            keepalive_interval: tunnel.keepalive_interval,
            keepalive_timeout: tunnel.keepalive_timeout,
            connect_timeout: tunnel.connect_timeout,
            // A well-behaved peer keeps at most 100 streams on one tunnel
            // (our pool and ztunnel's), so it never has more dials in flight.
            max_dials_in_flight_per_tunnel: 100,
            // No cap on healthy dials: ztunnel serves thousands a second
            // over one tunnel, and so must we.
            max_dials_per_second_per_tunnel: 0,
            // A reset loop gets at most this many connections to the
            // workload a second; a client whose streams carry bytes never
            // spends any.
            max_wasted_dials_per_second_per_tunnel: 100,
            max_connections: 0,
            max_connections_per_identity: 0,
        }
    }
}

impl HboneConfig {
    /// What each tunnel is built with (the protocol layer's share of this
    /// section).
    pub fn settings(&self) -> crate::hbone::Settings {
        crate::hbone::Settings {
            stream_window: self.stream_window,
            connection_window: self.connection_window,
            max_frame_size: self.max_frame_size,
            max_concurrent_streams: self.max_concurrent_streams,
            max_header_list_size: self.max_header_list_size,
            keepalive_interval: self.keepalive_interval,
            keepalive_timeout: self.keepalive_timeout,
            connect_timeout: self.connect_timeout,
        }
    }
}

/// `tcp`: congestion control of the data path's sockets (see
/// `proxy/congestion.rs`); an empty name keeps the host's default.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpConfig {
    /// Connections to and from this node's workloads: they never leave the
    /// node, so pacing them (BBR without `fq`) costs CPU and buys nothing.
    pub app_congestion_control: String,
    /// HBONE tunnels between nodes: the host's default unless named.
    pub tunnel_congestion_control: String,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            app_congestion_control: "cubic".into(),
            tunnel_congestion_control: String::new(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// A pooled tunnel carries at most this many streams; ztunnel uses 100.
    pub max_streams_per_tunnel: usize,
    /// A tunnel without streams for this long is closed.
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_streams_per_tunnel: 100,
            idle_timeout: Duration::from_secs(300),
        }
    }
}

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
    /// An Istio CA (istiod, or `tidegate ca`): a certificate per local
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
    /// for every request (ztunnel's `AUTH_TOKEN`).
    pub token: PathBuf,
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
}

impl Default for IstioCaConfig {
    fn default() -> Self {
        IstioCaConfig {
            address: "https://istiod.istio-system.svc:15012".into(),
            roots: "/var/run/secrets/istio/root-cert.pem".into(),
            token: "/var/run/secrets/tokens/istio-token".into(),
            cluster_id: "Kubernetes".into(),
            server_name: None,
            validity: Duration::from_secs(24 * 3600),
            first_use_wait: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
            reload_interval: default_reload_interval(),
        }
    }
}

impl IstioCaConfig {
    pub fn settings(&self) -> crate::ca::certs::IstioCaSettings {
        crate::ca::certs::IstioCaSettings {
            client: crate::ca::client::CaClientConfig {
                address: self.address.clone(),
                roots: self.roots.clone(),
                token: self.token.clone(),
                cluster_id: self.cluster_id.clone(),
                server_name: self.server_name.clone(),
                timeout: self.timeout,
            },
            validity: self.validity,
            first_use_wait: self.first_use_wait,
            reload_interval: self.reload_interval,
        }
    }
}

/// `tidegate ca`'s numeric flags against their ranges: the first out of
/// range, as (flag, message).
pub fn check_ca_server(
    cfg: &crate::ca::server::CaServerConfig,
) -> Result<(), (&'static str, String)> {
    match ranges::ca_server_rows(cfg)
        .iter()
        .find_map(|r| r.check().map(|m| (r.key, m)))
    {
        Some(bad) => Err(bad),
        None => Ok(()),
    }
}

fn default_cert_validity() -> Duration {
    Duration::from_secs(3600)
}

fn default_reload_interval() -> Duration {
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
}

impl Default for WorkloadsConfig {
    fn default() -> Self {
        WorkloadsConfig {
            source: WorkloadSourceKind::File,
            file: None,
            reload_interval: default_reload_interval(),
            kubernetes: KubernetesConfig::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadSourceKind {
    #[default]
    File,
    Kubernetes,
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
            debounce: Duration::from_millis(50),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ShutdownConfig {
    /// After SIGTERM, open streams get this long to finish before they are closed.
    #[serde(with = "duration")]
    pub deadline: Duration,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            deadline: Duration::from_secs(10),
        }
    }
}

/// How drains are executed.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DrainsConfig {
    /// Longest a network teardown is held for a drain (also `max-hold-ms` in events).
    #[serde(with = "duration")]
    pub max_hold: Duration,
    /// Grace period assumed when a source does not give one (workload file).
    #[serde(with = "duration")]
    pub default_grace: Duration,
    /// Hard deadline of a GOAWAY whose action names none.
    #[serde(with = "duration")]
    pub default_goaway_deadline: Duration,
    /// Unix socket `tidegate-cni` asks on CNI DEL; unset: no CNI hook.
    pub cni_socket: Option<PathBuf>,
}

impl Default for DrainsConfig {
    fn default() -> Self {
        DrainsConfig {
            max_hold: Duration::from_secs(30),
            default_grace: Duration::from_secs(30),
            default_goaway_deadline: Duration::from_secs(30),
            cni_socket: None,
        }
    }
}

/// How a Service's endpoint is chosen among the usable ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndpointChoice {
    /// Two endpoints at random, the one with fewer open streams from here.
    #[default]
    P2c,
    /// One endpoint at random.
    Random,
}

/// What becomes of a connection to an address inside the cluster's ranges
/// that is no known workload or Service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnknownInCluster {
    /// Reset, counted (`reason="unknown_in_cluster"`): never plaintext.
    #[default]
    Refuse,
    /// Plain TCP, as for any address outside the cluster.
    Passthrough,
}

/// `outbound`: routing of captured connections.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboundConfig {
    /// The cluster's pod and Service ranges (`10.0.0.0/8`): a destination
    /// inside them that is no known workload or Service is handled by
    /// `unknown_in_cluster`. Empty: every unknown address is passed through.
    pub cluster_cidrs: Vec<Cidr>,
    pub unknown_in_cluster: UnknownInCluster,
    pub endpoint_choice: EndpointChoice,
    /// How long a GOAWAY received from a tunnel to an endpoint keeps it out
    /// of the choice (a new tunnel to it ends it sooner).
    #[serde(with = "duration")]
    pub goaway_skip: Duration,
}

impl Default for OutboundConfig {
    fn default() -> Self {
        OutboundConfig {
            cluster_cidrs: Vec::new(),
            unknown_in_cluster: UnknownInCluster::Refuse,
            endpoint_choice: EndpointChoice::P2c,
            goaway_skip: Duration::from_secs(10),
        }
    }
}

/// Where the gateway's capture listeners live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaptureMode {
    /// `listeners.outbound` / `listeners.inbound` in the gateway's own
    /// namespace, fed by iptables REDIRECT on the node (the lab and the demo).
    #[default]
    Node,
    /// 15001, 15006 and 15008 inside each meshed pod's namespace, handed
    /// over by `tidegate-cni` (`drains.cni_socket`) or istio-cni (`capture.zds_socket`).
    Inpod,
}

/// `capture`: how pod traffic reaches the gateway.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CaptureConfig {
    pub mode: CaptureMode,
    /// Istio ambient: istio-cni's node agent socket
    /// (`/var/run/ztunnel/ztunnel.sock`); unset: no ZDS client.
    pub zds_socket: Option<PathBuf>,
    /// Where `tidegate-cni` records each pod it handed over (one file per
    /// pod uid naming its namespace path); read at start to re-adopt them.
    pub state_dir: Option<PathBuf>,
    /// In-pod mode: the most pods served at once; beyond it a pod handed
    /// over is refused (ZDS NACK, CNI ADD error) naming the limit. Each
    /// pod holds four descriptors (its namespace, three listeners).
    pub max_pods: u32,
    /// `tidegate-cni` ADD: how long the gateway waits for its workload
    /// source to learn of the pod (the pod watch can trail the kubelet)
    /// before answering that its mesh membership is unknown — the ADD then
    /// fails with "try again later" and the kubelet retries. Keep it below
    /// the plugin's `timeout_ms`.
    #[serde(with = "duration")]
    pub membership_wait: Duration,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            mode: CaptureMode::default(),
            zds_socket: None,
            state_dir: None,
            max_pods: crate::inpod::admission::DEFAULT_MAX_PODS,
            membership_wait: Duration::from_secs(5),
        }
    }
}

/// The largest `capture.max_pods`.
pub const MAX_PODS_LIMIT: u64 = 100_000;

/// The most connections `control_plane.max_connections` and
/// `control_plane.cni_max_connections` may allow each.
pub const CONTROL_PLANE_MAX_CONNECTIONS: u64 = 1_024;

/// `control_plane`: the admin (127.0.0.1:15000), metrics (15020), readiness
/// (15021) and CNI socket listeners. Their connection caps are small and
/// fixed so that together they can never take the descriptors the data path
/// needs (the budget is checked at start, see `control_plane.rs`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ControlPlaneConfig {
    /// An HTTP request's head (request line and headers) must arrive within
    /// this, and an idle keep-alive connection is closed after it.
    #[serde(with = "duration")]
    pub header_read_timeout: Duration,
    /// Connections open at once on each of the admin, metrics and readiness
    /// listeners; beyond it a new connection is closed at once.
    pub max_connections: u32,
    /// The CNI socket: a peer's request line must arrive within this.
    #[serde(with = "duration")]
    pub cni_read_timeout: Duration,
    /// Connections open at once on the CNI socket (one per pod deletion in
    /// progress, held while the pod drains).
    pub cni_max_connections: u32,
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        ControlPlaneConfig {
            header_read_timeout: Duration::from_secs(10),
            max_connections: 32,
            cni_read_timeout: Duration::from_secs(5),
            cni_max_connections: 256,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DemoConfig {
    /// Address of the in-process echo backend.
    pub echo: SocketAddr,
    /// More echo backends (the demo Service's other endpoints).
    #[serde(default)]
    pub more_echoes: Vec<SocketAddr>,
}

impl Config {
    /// Builds the config from an optional file, environment pairs and `--set` overrides.
    pub fn load<E>(file: Option<&Path>, env: E, sets: &[String]) -> Result<Config, ConfigError>
    where
        E: IntoIterator<Item = (String, String)>,
    {
        let mut root = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                let v: Value = serde_yaml::from_str(&text).map_err(|source| ConfigError::Yaml {
                    path: path.to_owned(),
                    source,
                })?;
                match v {
                    Value::Null => Value::Mapping(Mapping::new()),
                    v => v,
                }
            }
            None => Value::Mapping(Mapping::new()),
        };
        let mut env: Vec<(String, String)> = env
            .into_iter()
            .filter_map(|(k, v)| env_key(&k).map(|k| (k, v)))
            .collect();
        env.sort();
        for (key, value) in &env {
            set_path(&mut root, key, value)?;
        }
        for s in sets {
            let (key, value) = s
                .split_once('=')
                .ok_or_else(|| ConfigError::Override { input: s.clone() })?;
            set_path(&mut root, key.trim(), value)?;
        }
        Self::from_value(root).map_err(|e| match e {
            // Say where a key came from when the environment set it.
            ConfigError::Invalid { key, message } => {
                let from_env = env.iter().find(|(k, _)| {
                    let (parent, last) = k.rsplit_once('.').unwrap_or(("", k));
                    let parent_matches = key.trim_matches('.') == parent;
                    *k == key
                        || parent_matches && message.contains(&format!("unknown field `{last}`"))
                });
                match from_env {
                    Some((k, _)) => ConfigError::Invalid {
                        key,
                        message: format!(
                            "{message} (set by the environment variable TIDEGATE_{})",
                            k.to_ascii_uppercase().replace('.', "__")
                        ),
                    },
                    None => ConfigError::Invalid { key, message },
                }
            }
            other => other,
        })
    }

    /// Parses a YAML document (used by tests and the embedded default).
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        let v: Value = serde_yaml::from_str(text).map_err(|e| invalid("<root>", e.to_string()))?;
        Self::from_value(v)
    }

    fn from_value(v: Value) -> Result<Config, ConfigError> {
        let cfg: Config = serde_path_to_error::deserialize(v).map_err(|e| {
            let key = e.path().to_string();
            invalid(&key, e.into_inner().to_string())
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.oci
            .check()
            .map_err(|(key, message)| invalid(key, message))?;
        // Every duration, size, count and port against its range (ranges.rs).
        if let Some((key, message)) = ranges::rows(self)
            .iter()
            .find_map(|r| r.check().map(|m| (r.key, m)))
        {
            return Err(invalid(key, message));
        }
        let p = &self.policies;
        if let Some(d) = &p.default {
            if !p.plugins.contains_key(d) {
                return Err(invalid(
                    "policies.default",
                    format!("names {d:?}, which is not under policies.plugins"),
                ));
            }
        }
        for (i, b) in p.bindings.iter().enumerate() {
            if !p.plugins.contains_key(&b.policy) {
                return Err(invalid(
                    &format!("policies.bindings[{i}].policy"),
                    format!("names {:?}, which is not under policies.plugins", b.policy),
                ));
            }
        }
        if self.node_name.is_empty() {
            return Err(invalid("node_name", "must not be empty"));
        }
        let c = &self.capture;
        if c.mode == CaptureMode::Inpod
            && c.zds_socket.is_none()
            && self.drains.cni_socket.is_none()
        {
            return Err(invalid(
                "capture.mode",
                "inpod needs a source of pods: set drains.cni_socket (tidegate-cni) or capture.zds_socket (istio-cni)",
            ));
        }
        if c.mode == CaptureMode::Inpod && self.hbone.port != 15008 {
            return Err(invalid(
                "hbone.port",
                "must be 15008 with capture.mode: inpod (the port the in-pod capture rules leave to HBONE, as istio-cni's do)",
            ));
        }
        if c.mode == CaptureMode::Node && (c.zds_socket.is_some() || c.state_dir.is_some()) {
            return Err(invalid(
                "capture.mode",
                "capture.zds_socket and capture.state_dir only apply to capture.mode: inpod",
            ));
        }
        let k = &self.workloads.kubernetes;
        if self.workloads.source == WorkloadSourceKind::Kubernetes {
            if self.workloads.file.is_some() {
                return Err(invalid(
                    "workloads.file",
                    "cannot be combined with workloads.source: kubernetes",
                ));
            }
            if k.api_server.is_some() && k.kubeconfig.is_some() {
                return Err(invalid(
                    "workloads.kubernetes.kubeconfig",
                    "set either api_server or kubeconfig, not both",
                ));
            }
            if let Some(url) = &k.api_server {
                if url
                    .parse::<http::Uri>()
                    .map_or(true, |u| u.scheme().is_none())
                {
                    return Err(invalid(
                        "workloads.kubernetes.api_server",
                        format!("{url:?} is not a URL like http://127.0.0.1:8001"),
                    ));
                }
            }
        }
        if k.mesh_label.is_empty() || k.policy_label.is_empty() {
            return Err(invalid(
                "workloads.kubernetes.mesh_label",
                "mesh_label and policy_label must not be empty",
            ));
        }
        if crate::identity::SpiffeId::new(&self.trust_domain, "x", "y")
            .to_string()
            .parse::<crate::identity::SpiffeId>()
            .is_err()
        {
            return Err(invalid(
                "trust_domain",
                "must be a DNS-like name (letters, digits, '-', '.')",
            ));
        }
        Ok(())
    }
}

/// `TIDEGATE_LISTENERS__ADMIN` → `listeners.admin`. Variables that are flags
/// of their own (`TIDEGATE_CONFIG`, `TIDEGATE_LOG`) are not config keys.
fn env_key(name: &str) -> Option<String> {
    let rest = name.strip_prefix("TIDEGATE_")?;
    if matches!(rest, "CONFIG" | "LOG" | "SET") || rest.is_empty() {
        return None;
    }
    Some(rest.to_ascii_lowercase().replace("__", "."))
}

fn set_path(root: &mut Value, key: &str, raw: &str) -> Result<(), ConfigError> {
    if key.is_empty() || key.split('.').any(str::is_empty) {
        return Err(ConfigError::Override {
            input: format!("{key}={raw}"),
        });
    }
    let value: Value = serde_yaml::from_str(raw).unwrap_or_else(|_| Value::String(raw.into()));
    let mut cur = root;
    let segments: Vec<&str> = key.split('.').collect();
    for (i, seg) in segments.iter().enumerate() {
        let map = match cur {
            Value::Mapping(m) => m,
            other => {
                *other = Value::Mapping(Mapping::new());
                match other {
                    Value::Mapping(m) => m,
                    _ => unreachable!(),
                }
            }
        };
        let k = Value::String((*seg).to_owned());
        if i == segments.len() - 1 {
            map.insert(k, value);
            return Ok(());
        }
        cur = map.entry(k).or_insert(Value::Mapping(Mapping::new()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str, env: &[(&str, &str)], sets: &[&str]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, yaml).unwrap();
        Config::load(
            Some(&path),
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
            &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    }

    #[test]
    fn defaults_follow_ztunnel_ports_and_windows() {
        let c = Config::load(None, Vec::new(), &[]).unwrap();
        assert_eq!(c.listeners.inbound.port(), 15008);
        assert_eq!(c.listeners.outbound.port(), 15001);
        assert_eq!(c.listeners.admin.to_string(), "127.0.0.1:15000");
        assert_eq!(c.hbone.stream_window, 4 << 20);
        assert_eq!(c.hbone.connection_window, 16 << 20);
        assert_eq!(c.pool.max_streams_per_tunnel, 100);
    }

    #[test]
    fn kubernetes_source_from_env_and_its_errors() {
        let c = load(
            "",
            &[
                ("TIDEGATE_WORKLOADS__SOURCE", "kubernetes"),
                ("TIDEGATE_NODE_NAME", "worker-3"),
            ],
            &["workloads.kubernetes.debounce=200ms"],
        )
        .unwrap();
        assert_eq!(c.workloads.source, WorkloadSourceKind::Kubernetes);
        assert_eq!(c.node_name, "worker-3");
        assert_eq!(c.workloads.kubernetes.debounce, Duration::from_millis(200));
        assert_eq!(c.workloads.kubernetes.mesh_label, "tidegate.io/mesh");
        let e = load("workloads: {source: kubernetes, file: w.yaml}\n", &[], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`workloads.file`"), "{e}");
        let e = load(
            "workloads: {source: kubernetes, kubernetes: {api_server: 'http://a', kubeconfig: k}}\n",
            &[],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`workloads.kubernetes.kubeconfig`"), "{e}");
        let e = load("workloads: {source: k8s}\n", &[], &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("workloads.source") && e.contains("kubernetes"),
            "{e}"
        );
    }

    #[test]
    fn layers_apply_file_then_env_then_flags() {
        let c = load(
            "node_name: from-file\nhbone:\n  stream_window: 1MiB\n  keepalive_interval: 250ms\n",
            &[
                ("TIDEGATE_NODE_NAME", "from-env"),
                ("TIDEGATE_LISTENERS__ADMIN", "127.0.0.1:16000"),
                ("UNRELATED", "x"),
            ],
            &["listeners.admin=127.0.0.1:17000"],
        )
        .unwrap();
        assert_eq!(c.node_name, "from-env");
        assert_eq!(c.listeners.admin.port(), 17000);
        assert_eq!(c.hbone.stream_window, 1 << 20);
        assert_eq!(c.hbone.keepalive_interval, Duration::from_millis(250));
    }

    #[test]
    fn bad_values_name_the_key() {
        let e = load("listeners:\n  admin: nope\n", &[], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`listeners.admin`"), "{e}");
        let e = load("hbone:\n  keepalive_timeout: soon\n", &[], &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`hbone.keepalive_timeout`") && e.contains("500ms"),
            "{e}"
        );
        let e = load("pool:\n  max_streams_per_tunel: 3\n", &[], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `max_streams_per_tunel`"), "{e}");
        let e = load("", &[], &["hbone.max_frame_size=10"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`hbone.max_frame_size`"), "{e}");
        let e = load("", &[("TIDEGATE_BENCH_MODE", "x")], &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown field `bench_mode`") && e.contains("TIDEGATE_BENCH_MODE"),
            "{e}"
        );
        let e = load("", &[("TIDEGATE_POOL__IDLE_TIMEOUT", "later")], &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`pool.idle_timeout`") && e.contains("TIDEGATE_POOL__IDLE_TIMEOUT"),
            "{e}"
        );
        let e = load("", &[], &["no-equals-sign"]).unwrap_err().to_string();
        assert!(e.contains("key.path=value"), "{e}");
        let e = load("certificates:\n  source: vault\n", &[], &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`certificates.source`") && e.contains("dev-ca"),
            "{e}"
        );
    }

    #[test]
    fn absurd_durations_are_errors_naming_the_key_and_range() {
        for set in [
            "drains.default_grace=99999999999999h",
            "drains.default_grace=307445734561825861m",
            "drains.default_grace=400000000000000000",
        ] {
            let e = load("", &[], &[set]).unwrap_err().to_string();
            assert!(
                e.contains("`drains.default_grace`") && e.contains("between 0ms and 8784h"),
                "{set}: {e}"
            );
        }
        let e = load("", &[("TIDEGATE_SHUTDOWN__DEADLINE", "9999999h")], &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`shutdown.deadline`") && e.contains("TIDEGATE_SHUTDOWN__DEADLINE"),
            "{e}"
        );
        let e = load(
            "hbone:\n  stream_window: 18446744073709551615MiB\n",
            &[],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`hbone.stream_window`"), "{e}");
    }

    #[test]
    fn plugin_limits_and_bounds_are_the_policies_section() {
        // `tidegate policy test/check` and the gateway used to disagree
        // (init deadline 100 ms vs 200 ms): both now come from here.
        let p = PoliciesConfig::default();
        let limits = crate::policy::RuntimeLimits::default();
        assert_eq!(limits.init_deadline, p.init_deadline);
        assert_eq!(limits.call_deadline, p.call_deadline);
        assert_eq!(limits.memory_bytes, p.memory_limit as usize);
        let c = load(
            "",
            &[],
            &["policies.init_deadline=750ms", "policies.max_hold=7s"],
        )
        .unwrap();
        assert_eq!(
            c.policies.runtime_limits().init_deadline,
            Duration::from_millis(750)
        );
        assert_eq!(c.policies.bounds().max_hold, Duration::from_secs(7));
        assert_eq!(
            crate::policy::Bounds::default().max_hold,
            p.max_hold,
            "one default for the action bounds"
        );
    }
}
