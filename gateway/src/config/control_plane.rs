//! The control-plane switch: `control_plane: cilium` presets what Cilium's agent, as
//! ztunnel's control plane, expects, and honours ztunnel's environment as Cilium's
//! DaemonSet sets it.
//!
//! `control_plane:` is also the section of the control plane's listener limits
//! ([`tidegate_control::config`]); a scalar there is the switch, a mapping the
//! section. The switch comes from the file (`control_plane: cilium`), the
//! environment (`TIDEGATE_CONTROL_PLANE=cilium`) or a flag
//! (`--set control_plane=cilium`), the later winning, and is taken out of the
//! layers before they are read.
//!
//! With `cilium`, the layers are, lowest first: the defaults, the preset
//! ([`preset`]: what `../docs/cilium.md` lists), the YAML file, ztunnel's
//! variables as Cilium's chart sets them ([`ZTUNNEL_ENV`]), `TIDEGATE_*`, `--set`.
//! `standalone` (the default) presets nothing and reads no ztunnel variable.

use serde_yaml::{Mapping, Value};

/// Which control plane drives the gateway.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ControlPlaneKind {
    /// The gateway's own sources (a file, Kubernetes, tidegate-cni) or
    /// istiod's, each set by its keys.
    #[default]
    Standalone,
    /// Cilium's agent: ZDS at `/var/run/cilium/ztunnel.sock`, workloads over
    /// its xDS server, certificates from its CA, its in-pod rules.
    Cilium,
}

/// The accepted spellings, for errors.
pub const ACCEPTED: &str = "standalone or cilium";

impl ControlPlaneKind {
    /// Parses the switch's value; `None` for anything else.
    pub fn parse(value: &str) -> Option<ControlPlaneKind> {
        match value.trim() {
            "standalone" => Some(ControlPlaneKind::Standalone),
            "cilium" => Some(ControlPlaneKind::Cilium),
            _ => None,
        }
    }
}

/// Cilium's agent socket for ZDS (ztunnel's `INPOD_UDS` in Cilium's chart).
pub const CILIUM_ZDS_SOCKET: &str = "/var/run/cilium/ztunnel.sock";
/// Cilium 1.20's workload-discovery server: plaintext gRPC on a Unix socket.
pub const CILIUM_XDS_ADDRESS: &str = "unix:///var/run/cilium/xds.sock";
/// The agent's CA (and, in Cilium 1.19, its xDS server): TLS on loopback.
pub const CILIUM_CA_ADDRESS: &str = "https://127.0.0.1:15012";
/// The bootstrap certificate the agent serves 15012 with, trusted as its root.
pub const CILIUM_BOOTSTRAP_ROOT: &str = "/etc/ztunnel/bootstrap-root.crt";

/// ztunnel's variables honoured under `control_plane: cilium`, and the key
/// each sets (`ISTIO_META_DNS_CAPTURE` and `INSTANCE_IP` are read apart).
pub const ZTUNNEL_ENV: &[(&str, &str)] = &[
    ("INPOD_UDS", "capture.zds_socket"),
    ("XDS_ADDRESS", "workloads.istio.address"),
    ("XDS_ROOT_CA", "workloads.istio.roots"),
    ("CA_ADDRESS", "certificates.address"),
    ("CA_ROOT_CA", "certificates.roots"),
    ("NODE_NAME", "node_name"),
];

/// The keys `kind` sets below the file; `None` for [`ControlPlaneKind::Standalone`].
pub fn preset(kind: ControlPlaneKind) -> Option<Value> {
    match kind {
        ControlPlaneKind::Standalone => None,
        ControlPlaneKind::Cilium => {
            let yaml = format!(
                "capture: {{mode: inpod, zds_socket: {CILIUM_ZDS_SOCKET}, node_listeners: false}}\n\
                 dns: {{enabled: false}}\n\
                 workloads:\n  source: istio\n  istio: {{address: '{CILIUM_XDS_ADDRESS}', roots: {CILIUM_BOOTSTRAP_ROOT}, token: null, workloads_only: true}}\n\
                 certificates: {{source: istio-ca, address: '{CILIUM_CA_ADDRESS}', roots: {CILIUM_BOOTSTRAP_ROOT}, token: null, trust_answer_root: true}}\n"
            );
            Some(serde_yaml::from_str(&yaml).expect("the Cilium preset is valid YAML"))
        }
    }
}

/// ztunnel's variables among `env`, as `(variable, key, value)` layers above the
/// file: those of [`ZTUNNEL_ENV`], `ISTIO_META_DNS_CAPTURE` (`dns.enabled`)
/// and `INSTANCE_IP` (the proxy's own address in the node id it sends).
/// Empty values are ignored, as ztunnel ignores them.
pub fn ztunnel_layers(env: &[(String, String)]) -> Vec<(&'static str, &'static str, String)> {
    let get = |name: &str| {
        env.iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    let mut layers: Vec<(&'static str, &'static str, String)> = ZTUNNEL_ENV
        .iter()
        .filter_map(|(name, key)| get(name).map(|v| (*name, *key, v)))
        .collect();
    if let Some(v) = get("ISTIO_META_DNS_CAPTURE") {
        layers.push(("ISTIO_META_DNS_CAPTURE", "dns.enabled", v));
    }
    if let Some(v) = get("INSTANCE_IP") {
        layers.push(("INSTANCE_IP", "workloads.istio.pod_ip", v));
    }
    layers
}

/// Takes the switch out of a layer's root: a scalar `control_plane` is
/// removed and returned; a mapping (the limits section) stays.
pub fn take_scalar(root: &mut Value) -> Option<Value> {
    let Value::Mapping(map) = root else {
        return None;
    };
    let key = Value::String("control_plane".into());
    match map.get(&key) {
        Some(Value::Mapping(_)) | None => None,
        Some(_) => map.remove(&key),
    }
}

/// Lays `over` onto `base`: mappings merge key by key; anything else
/// replaces. `certificates:` is a tagged section: one whose `source`
/// differs from the base's (another variant) replaces it whole.
pub fn merge(base: &mut Value, over: Value) {
    merge_at(base, over, false);
}

fn merge_at(base: &mut Value, over: Value, tagged: bool) {
    match (base, over) {
        (Value::Mapping(b), Value::Mapping(o)) => {
            let source = Value::String("source".into());
            if tagged && o.get(&source).is_some_and(|s| b.get(&source) != Some(s)) {
                *b = o;
                return;
            }
            for (k, v) in o {
                let tagged = k.as_str() == Some("certificates");
                match b.get_mut(&k) {
                    Some(slot) => merge_at(slot, v, tagged),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// An empty mapping (a file that says nothing).
pub fn empty() -> Value {
    Value::Mapping(Mapping::new())
}

#[cfg(test)]
#[path = "control_plane_tests.rs"]
mod tests;
