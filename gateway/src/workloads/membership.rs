//! Mesh membership: the one rule that decides which pods are in the mesh.
//!
//! A member is captured (`tidegate-cni` ADD installs its rules and hands it
//! to the gateway) and spoken to over HBONE (mTLS, a certificate for its
//! identity); a pod that is not a member is neither: never captured while
//! its peers speak plaintext to it, never spoken to in plaintext while it
//! is captured. Kubernetes discovery ([`super::kubernetes`]) applies
//! [`decide`] to every pod (its `protocol`) and publishes the decision for
//! each local pod, which is what the gateway answers `tidegate-cni` ADD
//! with; the plugin itself applies [`never_meshed_namespace`] only, to let
//! system pods start without asking.
//!
//! The rule, first match wins:
//! 1. a pod on the host network is not a member (it shares the node's
//!    address: no identity of its own, nothing to capture);
//! 2. a pod of `kube-system` is not a member, whatever its labels;
//! 3. a pod label `tidegate.io/mesh=disabled` (the configured
//!    `workloads.kubernetes.mesh_label`) or `istio.io/dataplane-mode=none`
//!    opts the pod out;
//! 4. a pod label `tidegate.io/mesh=enabled` or
//!    `istio.io/dataplane-mode=ambient` opts it in;
//! 5. so does either label on its namespace;
//! 6. anything else is not a member.
//!
//! Istio's label is honoured so that a cluster set up for ambient (where
//! istio-cni captures on `istio.io/dataplane-mode=ambient`) is meshed the
//! same way when tidegate takes ztunnel's place.

use std::collections::BTreeMap;

/// Namespaces whose pods are never members (shared with `tidegate-cni`).
use tidegate_netns::never_meshed::never_meshed_namespace;

/// The mesh label's default name (`workloads.kubernetes.mesh_label`).
pub const MESH_LABEL: &str = "tidegate.io/mesh";
/// Istio ambient's label, on a pod or its namespace.
pub const ISTIO_DATAPLANE_MODE: &str = "istio.io/dataplane-mode";

/// Values of the labels the rule reads.
pub const ENABLED: &str = "enabled";
pub const DISABLED: &str = "disabled";
pub const AMBIENT: &str = "ambient";
pub const NONE: &str = "none";

/// What the rule reads of a pod.
#[derive(Clone, Copy, Debug, Default)]
pub struct PodFacts<'a> {
    pub namespace: &'a str,
    pub pod_labels: Option<&'a BTreeMap<String, String>>,
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    pub host_network: bool,
}

/// Why a pod is, or is not, a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    HostNetwork,
    SystemNamespace,
    PodOptedOut,
    PodOptedIn,
    NamespaceOptedIn,
    NotOptedIn,
    /// The workload file's `protocol` (HBONE: a member; TCP: not).
    WorkloadFile,
    /// istiod's tunnel protocol for the workload (HBONE: a member).
    Istio,
}

impl Reason {
    pub fn describe(self) -> &'static str {
        match self {
            Reason::HostNetwork => "the pod is on the host network",
            Reason::SystemNamespace => "pods of kube-system are never meshed",
            Reason::PodOptedOut => {
                "the pod opts out (mesh label disabled, or istio.io/dataplane-mode=none)"
            }
            Reason::PodOptedIn => "the pod opts in (mesh label enabled, or istio.io/dataplane-mode=ambient)",
            Reason::NamespaceOptedIn => {
                "its namespace opts in (mesh label enabled, or istio.io/dataplane-mode=ambient)"
            }
            Reason::NotOptedIn => {
                "neither the pod nor its namespace has the mesh label enabled or istio.io/dataplane-mode=ambient"
            }
            Reason::WorkloadFile => "the workload file's protocol",
            Reason::Istio => "istiod's tunnel protocol for the workload",
        }
    }
}

/// A decision of the rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Membership {
    pub member: bool,
    pub reason: Reason,
}

impl Membership {
    const fn member(reason: Reason) -> Self {
        Membership {
            member: true,
            reason,
        }
    }

    const fn not_member(reason: Reason) -> Self {
        Membership {
            member: false,
            reason,
        }
    }
}

/// The rule (module docs); `mesh_label` is `workloads.kubernetes.mesh_label`.
pub fn decide(mesh_label: &str, pod: PodFacts<'_>) -> Membership {
    if pod.host_network {
        return Membership::not_member(Reason::HostNetwork);
    }
    if never_meshed_namespace(pod.namespace) {
        return Membership::not_member(Reason::SystemNamespace);
    }
    let says = |labels: Option<&BTreeMap<String, String>>, tidegate: &str, istio: &str| {
        labels.is_some_and(|l| {
            l.get(mesh_label).is_some_and(|v| v == tidegate)
                || l.get(ISTIO_DATAPLANE_MODE).is_some_and(|v| v == istio)
        })
    };
    if says(pod.pod_labels, DISABLED, NONE) {
        return Membership::not_member(Reason::PodOptedOut);
    }
    if says(pod.pod_labels, ENABLED, AMBIENT) {
        return Membership::member(Reason::PodOptedIn);
    }
    if says(pod.namespace_labels, ENABLED, AMBIENT) {
        return Membership::member(Reason::NamespaceOptedIn);
    }
    Membership::not_member(Reason::NotOptedIn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    type Labels<'a> = &'a [(&'a str, &'a str)];

    #[test]
    fn the_rule_decides_from_pod_labels_namespace_labels_and_namespace_name() {
        let m = MESH_LABEL;
        let i = ISTIO_DATAPLANE_MODE;
        // (namespace, pod labels, namespace labels, host network) → member, reason
        #[rustfmt::skip]
        let cases: &[(&str, Labels<'_>, Labels<'_>, bool, bool, Reason)] = &[
            // Nothing opts in: not a member (a fresh install captures nothing).
            ("shop", &[], &[], false, false, Reason::NotOptedIn),
            ("shop", &[("app", "web")], &[("team", "a")], false, false, Reason::NotOptedIn),
            // The namespace opts in, with either label.
            ("shop", &[], &[(m, "enabled")], false, true, Reason::NamespaceOptedIn),
            ("shop", &[], &[(i, "ambient")], false, true, Reason::NamespaceOptedIn),
            // The pod opts in without its namespace.
            ("shop", &[(m, "enabled")], &[], false, true, Reason::PodOptedIn),
            ("shop", &[(i, "ambient")], &[], false, true, Reason::PodOptedIn),
            // The pod opts out of a meshed namespace, with either label.
            ("shop", &[(m, "disabled")], &[(m, "enabled")], false, false, Reason::PodOptedOut),
            ("shop", &[(i, "none")], &[(i, "ambient")], false, false, Reason::PodOptedOut),
            ("shop", &[(i, "none")], &[(m, "enabled")], false, false, Reason::PodOptedOut),
            // An opt-out wins over an opt-in on the same pod.
            ("shop", &[(m, "enabled"), (i, "none")], &[], false, false, Reason::PodOptedOut),
            // A namespace's `disabled` does not override the pod's opt-in;
            // values the rule does not know opt nothing in.
            ("shop", &[(m, "enabled")], &[(m, "disabled")], false, true, Reason::PodOptedIn),
            ("shop", &[(m, "true")], &[(i, "sidecar")], false, false, Reason::NotOptedIn),
            ("shop", &[], &[(m, "disabled")], false, false, Reason::NotOptedIn),
            // kube-system never, whatever the labels.
            ("kube-system", &[(m, "enabled")], &[(m, "enabled")], false, false, Reason::SystemNamespace),
            ("kube-system", &[], &[(i, "ambient")], false, false, Reason::SystemNamespace),
            // The host network never.
            ("shop", &[(m, "enabled")], &[(m, "enabled")], true, false, Reason::HostNetwork),
        ];
        for (ns, pod, namespace, host, member, reason) in cases {
            let (pod, namespace) = (labels(pod), labels(namespace));
            let got = decide(
                MESH_LABEL,
                PodFacts {
                    namespace: ns,
                    pod_labels: Some(&pod),
                    namespace_labels: Some(&namespace),
                    host_network: *host,
                },
            );
            assert_eq!(
                (got.member, got.reason),
                (*member, *reason),
                "namespace {ns} {namespace:?}, pod {pod:?}, host network {host}"
            );
        }
    }

    #[test]
    fn the_configured_mesh_label_is_the_one_read() {
        let pod = labels(&[("example.org/mesh", "enabled")]);
        let facts = PodFacts {
            namespace: "shop",
            pod_labels: Some(&pod),
            ..Default::default()
        };
        assert!(decide("example.org/mesh", facts).member);
        assert!(!decide(MESH_LABEL, facts).member);
        // Istio's label is read whatever the mesh label is called.
        let ambient = labels(&[(ISTIO_DATAPLANE_MODE, "ambient")]);
        let facts = PodFacts {
            namespace: "shop",
            namespace_labels: Some(&ambient),
            ..Default::default()
        };
        assert!(decide("example.org/mesh", facts).member);
    }

    #[test]
    fn absent_labels_are_no_labels() {
        let facts = PodFacts {
            namespace: "shop",
            ..Default::default()
        };
        assert_eq!(decide(MESH_LABEL, facts).reason, Reason::NotOptedIn);
    }
}
