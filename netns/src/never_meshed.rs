//! The Kubernetes namespaces whose pods are never meshed, so never
//! captured, whatever their labels. The gateway's membership rule
//! (`tidegate::workloads::membership`) applies this before anything else;
//! `tidegate-cni` ADD applies it alone, so the cluster's system pods start
//! without asking the gateway, whether it is up or not.

/// Namespaces whose pods are never members: the cluster's own system pods
/// must start whether or not the node's gateway is up.
pub const NEVER_MESHED_NAMESPACES: [&str; 1] = ["kube-system"];

/// Whether pods of `namespace` are never members, whatever their labels.
pub fn never_meshed_namespace(namespace: &str) -> bool {
    NEVER_MESHED_NAMESPACES.contains(&namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kube_system_is_never_meshed() {
        assert!(never_meshed_namespace("kube-system"));
        for other in ["default", "kube-public", "Kube-System", "kube-system-2", ""] {
            assert!(!never_meshed_namespace(other), "{other}");
        }
    }
}
