//! The `capture:` section: node mode or in-pod mode, and its limits.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use tidegate_base::duration;

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
    /// pod holds eight descriptors (its namespace, three listeners, the DNS
    /// proxy's four on 15053: UDP and TCP on 127.0.0.1 and ::1), four with
    /// `dns.enabled: false`: the pods' share of the open-file limit is
    /// sized from it (see `descriptor_budget.rs`), and a limit too low for
    /// it serves fewer (`tidegate_inpod_max_pods`).
    pub max_pods: u32,
    /// `tidegate-cni` ADD: how long the gateway waits for its workload
    /// source to learn of the pod (the pod watch can trail the kubelet)
    /// before answering that its mesh membership is unknown — the ADD then
    /// fails with "try again later" and the kubelet retries. Keep it below
    /// the plugin's `timeout_ms`.
    #[serde(with = "duration")]
    pub membership_wait: Duration,
    /// In-pod mode: also listen on `listeners.outbound` and
    /// `listeners.inbound` in the gateway's own namespace (a node that
    /// captures some pods at node level beside the in-pod ones). Off, the
    /// default: nothing of the data path listens there — only admin,
    /// metrics and readiness, as ztunnel in in-pod mode — so the node's
    /// address takes no HBONE handshake. Node mode always listens.
    pub node_listeners: bool,
}

impl CaptureConfig {
    /// Whether `listeners.outbound` and `listeners.inbound` are bound.
    pub fn binds_node_listeners(&self) -> bool {
        self.mode == CaptureMode::Node || self.node_listeners
    }
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            mode: CaptureMode::default(),
            zds_socket: None,
            state_dir: None,
            max_pods: DEFAULT_MAX_PODS,
            membership_wait: Duration::from_secs(5),
            node_listeners: false,
        }
    }
}

/// The default of `capture.max_pods`: well above the pods a Kubernetes
/// node runs (110 by default, a few hundred when raised).
pub const DEFAULT_MAX_PODS: u32 = 1_000;

/// The largest `capture.max_pods`.
pub const MAX_PODS_LIMIT: u64 = 100_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_pod_mode_binds_no_node_listeners_unless_asked() {
        let node = CaptureConfig::default();
        assert!(node.binds_node_listeners(), "node mode always listens");
        let inpod = CaptureConfig {
            mode: CaptureMode::Inpod,
            ..CaptureConfig::default()
        };
        assert!(!inpod.binds_node_listeners());
        let mixed = CaptureConfig {
            node_listeners: true,
            ..inpod
        };
        assert!(mixed.binds_node_listeners());
    }
}
