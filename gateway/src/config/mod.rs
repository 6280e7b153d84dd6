//! The gateway's one typed configuration.
//!
//! Layers, lowest first: built-in defaults, the YAML file (`--config`), the
//! environment (`TIDEGATE_<KEY>` with `__` between nesting levels, e.g.
//! `TIDEGATE_LISTENERS__ADMIN=127.0.0.1:16000`) and `--set key.path=value`
//! flags. Everything is parsed once here; no other module reads the
//! environment. A bad value is an error naming the key and the accepted form.
//!
//! This module owns the whole and its layering; each section's type and
//! default is a file of its own ([`data_path`]: `listeners:`, `hbone:`,
//! `tcp:`, `pool:`, `outbound:`; [`certificates`]; [`workloads`];
//! [`drains`]: `shutdown:` and `drains:`; [`capture`]; [`dns`]; `control_plane:` ([`tidegate_control::config`]);
//! [`oci`]), except `policies:`, the policy host's
//! ([`tidegate_policy_host::config`]; a section of another crate is imported
//! by that crate's name, never re-exported here); other modules take their section from here and import
//! nothing back into it (validation parses a [`tidegate_protocol::identity::SpiffeId`],
//! a leaf). Where a section's type has behaviour that needs another module
//! (the OCI opt-in, the fallback policies, the plugin limits and action
//! bounds), that `impl` block lives in the other module. Durations and sizes
//! are read by [`tidegate_base::duration`] and [`tidegate_base::size`].

mod capture;
mod certificates;
mod control_plane;
mod data_path;
mod dns;
mod drains;
mod oci;
mod ranges;
mod workloads;

pub use capture::{CaptureConfig, CaptureMode, DEFAULT_MAX_PODS, MAX_PODS_LIMIT};
pub use certificates::{CertificatesConfig, IstioCaConfig};
pub use control_plane::{ControlPlaneKind, CILIUM_XDS_ADDRESS, CILIUM_ZDS_SOCKET};
pub use data_path::{
    EndpointChoice, HboneConfig, Listeners, OutboundConfig, PoolConfig, TcpConfig, UnknownInCluster,
};
pub use dns::{DnsCacheConfig, DnsConfig, Upstream, DNS_CAPTURE_PORT};
pub use drains::{DrainsConfig, ShutdownConfig};
pub use oci::{Cidr, OciAuth, OciConfig, OptIn, OCI_BACKEND_LIMIT};
pub use ranges::key_ranges;
pub use workloads::{IstioConfig, KubernetesConfig, WorkloadSourceKind, WorkloadsConfig};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_yaml::{Mapping, Value};
use tidegate_control::config::ControlPlaneConfig;
use tidegate_policy_host::config::PoliciesConfig;

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
    /// This cluster's id, as Istio's metrics report it (`*_cluster`
    /// labels); istiod's default.
    pub cluster_id: String,
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
    /// In-pod mode: the DNS proxy on 15053 inside each captured pod.
    pub dns: DnsConfig,
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
            cluster_id: "Kubernetes".into(),
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
            dns: DnsConfig::default(),
            outbound: OutboundConfig::default(),
            oci: OciConfig::default(),
            control_plane: ControlPlaneConfig::default(),
            demo: None,
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
        Self::load_as(file, env, sets, ControlPlaneKind::Standalone)
    }

    /// [`Config::load`] with the control plane taken when no layer names
    /// one (`tidegate proxy ztunnel`: Cilium's).
    pub fn load_as<E>(
        file: Option<&Path>,
        env: E,
        sets: &[String],
        default_kind: ControlPlaneKind,
    ) -> Result<Config, ConfigError>
    where
        E: IntoIterator<Item = (String, String)>,
    {
        let mut from_file = match file {
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
                    Value::Null => control_plane::empty(),
                    v => v,
                }
            }
            None => control_plane::empty(),
        };
        let all_env: Vec<(String, String)> = env.into_iter().collect();
        let mut env: Vec<(String, String)> = all_env
            .iter()
            .filter_map(|(k, v)| env_key(k).map(|k| (k, v.clone())))
            .collect();
        env.sort();
        let mut sets = sets
            .iter()
            .map(|s| {
                s.split_once('=')
                    .map(|(k, v)| (k.trim().to_owned(), v.to_owned()))
                    .ok_or_else(|| ConfigError::Override { input: s.clone() })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The switch, from the highest layer that names it; taken out of
        // the layers, so `control_plane:` is read as the limits section.
        let mut switch = control_plane::take_scalar(&mut from_file).map(|v| {
            let text = match v {
                Value::String(s) => s,
                other => serde_yaml::to_string(&other)
                    .unwrap_or_default()
                    .trim()
                    .to_owned(),
            };
            (text, String::new())
        });
        for (layer, origin) in [
            (
                &mut env,
                " (set by the environment variable TIDEGATE_CONTROL_PLANE)",
            ),
            (&mut sets, " (set by --set)"),
        ] {
            layer.retain(|(k, v)| {
                if k != "control_plane" || v.trim_start().starts_with('{') {
                    return true;
                }
                switch = Some((v.clone(), origin.to_owned()));
                false
            });
        }
        let kind = match switch {
            None => default_kind,
            Some((value, origin)) => ControlPlaneKind::parse(&value).ok_or_else(|| {
                invalid(
                    "control_plane",
                    format!(
                        "{value:?} is not a control plane: {} (or a mapping of the control plane listeners' limits){origin}",
                        control_plane::ACCEPTED
                    ),
                )
            })?,
        };
        let mut root = control_plane::preset(kind).unwrap_or_else(control_plane::empty);
        control_plane::merge(&mut root, from_file);
        let ztunnel = match kind {
            ControlPlaneKind::Cilium => control_plane::ztunnel_layers(&all_env),
            ControlPlaneKind::Standalone => Vec::new(),
        };
        for (_, key, value) in &ztunnel {
            set_path(&mut root, key, value)?;
        }
        for (key, value) in env.iter().chain(&sets) {
            set_path(&mut root, key, value)?;
        }
        Self::from_value(root).map_err(|e| match e {
            // Say where a key came from when the environment set it.
            ConfigError::Invalid { key, message } => {
                // The higher layer first: TIDEGATE_* outranks ztunnel's.
                let origins = env
                    .iter()
                    .map(|(k, _)| {
                        (
                            k.as_str(),
                            format!("TIDEGATE_{}", k.to_ascii_uppercase().replace('.', "__")),
                        )
                    })
                    .chain(ztunnel.iter().map(|(name, k, _)| (*k, (*name).to_owned())));
                let from_env = origins.into_iter().find(|(k, _)| {
                    let (parent, last) = k.rsplit_once('.').unwrap_or(("", k));
                    let parent_matches = key.trim_matches('.') == parent;
                    *k == key
                        || parent_matches && message.contains(&format!("unknown field `{last}`"))
                });
                match from_env {
                    Some((_, variable)) => ConfigError::Invalid {
                        key,
                        message: format!("{message} (set by the environment variable {variable})"),
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
        self.hbone
            .check_connection_caps()
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
        dns::check_cluster_domain(&self.dns.cluster_domain)
            .map_err(|m| invalid("dns.cluster_domain", m))?;
        dns::check_upstreams(&self.dns.upstream).map_err(|m| invalid("dns.upstream", m))?;
        if let CertificatesConfig::IstioCa(ca) = &self.certificates {
            check_https_address("certificates.address", &ca.address)?;
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
        if self.workloads.source == WorkloadSourceKind::Istio {
            self.check_istio()?;
        }
        if k.mesh_label.is_empty() || k.policy_label.is_empty() {
            return Err(invalid(
                "workloads.kubernetes.mesh_label",
                "mesh_label and policy_label must not be empty",
            ));
        }
        if self.cluster_id.is_empty() {
            return Err(invalid(
                "cluster_id",
                "must not be empty (istiod's default is Kubernetes)",
            ));
        }
        if k.root_namespace.is_empty() {
            return Err(invalid(
                "workloads.kubernetes.root_namespace",
                "must name Istio's root namespace (istio-system by default)",
            ));
        }
        if tidegate_protocol::identity::SpiffeId::new(&self.trust_domain, "x", "y")
            .to_string()
            .parse::<tidegate_protocol::identity::SpiffeId>()
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

/// An istiod address (xDS or CA): `https://host[:port]`, the port (443
/// when absent) one a connection can be made to.
fn check_https_address(key: &str, address: &str) -> Result<(), ConfigError> {
    let uri = address
        .parse::<http::Uri>()
        .ok()
        .filter(|u| u.scheme_str() == Some("https") && u.host().is_some());
    let Some(uri) = uri else {
        return Err(invalid(
            key,
            format!(
                "{address:?} is not an https:// URL like https://istiod.istio-system.svc:15012 (never plaintext)"
            ),
        ));
    };
    // The port as written (`Uri::port` is `None` for one past 65535): after
    // the host, and after an IPv6 literal's `]`.
    let authority = uri.authority().map_or("", |a| a.as_str());
    let after_host = authority.rsplit(']').next().unwrap_or(authority);
    if let Some((_, port)) = after_host.rsplit_once(':') {
        if !port.parse::<u16>().is_ok_and(|p| p > 0) {
            return Err(invalid(
                key,
                format!("{address:?}: port {port} is not 1 to 65535"),
            ));
        }
    }
    Ok(())
}

impl Config {
    /// `workloads.source: istio`: an `https` address, a pod to name the node after.
    fn check_istio(&self) -> Result<(), ConfigError> {
        let i = &self.workloads.istio;
        if self.workloads.file.is_some() {
            return Err(invalid(
                "workloads.file",
                "cannot be combined with workloads.source: istio",
            ));
        }
        match tidegate_xds::transport::unix_path(&i.address) {
            Some(Ok(_)) => {}
            Some(Err(message)) => {
                return Err(invalid(
                    "workloads.istio.address",
                    format!("{:?}: {message}", i.address),
                ))
            }
            None => check_https_address("workloads.istio.address", &i.address)?,
        }
        if i.pod_ip.parse::<std::net::IpAddr>().is_err() {
            return Err(invalid(
                "workloads.istio.pod_ip",
                format!("{:?} is not an IP address", i.pod_ip),
            ));
        }
        if i.pod_name.is_empty() || i.pod_namespace.is_empty() {
            return Err(invalid(
                "workloads.istio.pod_name",
                "pod_name and pod_namespace must not be empty (istiod names the node proxy after them)",
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
    use std::time::Duration;

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

    /// An istiod address whose port no connection can be made to is
    /// refused at load, naming the key (it would dial 443 instead); so is
    /// a DNS upstream that cannot answer or is the proxy itself.
    #[test]
    fn addresses_that_cannot_work_are_refused_naming_the_key() {
        let istio = |address: &str| {
            load(
                &format!(
                    "workloads: {{source: istio, istio: {{address: '{address}', pod_ip: 10.0.0.1, pod_name: p, pod_namespace: n}}}}"
                ),
                &[],
                &[],
            )
        };
        istio("https://istiod.istio-system.svc:15012").unwrap();
        istio("https://10.0.0.2").unwrap();
        istio("https://[fd00::2]:15012").unwrap();
        for bad in [
            "https://127.0.0.1:99999",
            "https://127.0.0.1:0",
            "https://[fd00::2]:65536",
            "http://istiod:15012",
        ] {
            let e = istio(bad).unwrap_err().to_string();
            assert!(e.contains("workloads.istio.address"), "{bad}: {e}");
        }
        let e = load(
            "certificates: {source: istio-ca, address: 'https://istiod:70000'}",
            &[],
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("certificates.address") && e.contains("70000"),
            "{e}"
        );
        let e = load("", &[], &["dns.upstream=[127.0.0.1:15053]"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("dns.upstream") && e.contains("itself"), "{e}");
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
        let limits = tidegate_policy_host::RuntimeLimits::default();
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
            tidegate_policy_host::Bounds::default().max_hold,
            p.max_hold,
            "one default for the action bounds"
        );
    }
}
