//! Who handed a pod over ([`Source`]): `tidegate-cni`'s CNI socket,
//! istio-cni's ZDS or the state directory, and what that decides — who
//! rules on its mesh membership, which drain trigger takes it back.

use crate::drains::Trigger;

/// Who handed a pod over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// `tidegate-cni` ADD over the CNI socket: the gateway decides whether
    /// the pod is a mesh member (from its workload source).
    Cni,
    /// istio-cni's node agent over ZDS: the agent decided.
    Zds,
    /// A record `tidegate-cni` left in the node state directory, re-adopted
    /// at start: decided at its ADD.
    StateDir,
}

impl Source {
    /// `cni`, `zds` or `state-dir` (logs, `/config_dump`).
    pub fn label(self) -> &'static str {
        match self {
            Source::Cni => "cni",
            Source::Zds => "zds",
            Source::StateDir => "state-dir",
        }
    }

    /// Whether the gateway, not the node agent, decides the pod's mesh
    /// membership.
    pub fn gateway_decides_membership(self) -> bool {
        self == Source::Cni
    }

    /// The drain trigger of this source's pods taken back (the state
    /// directory's pods are `tidegate-cni`'s).
    pub fn trigger(self) -> Trigger {
        match self {
            Source::Cni | Source::StateDir => Trigger::Cni,
            Source::Zds => Trigger::Zds,
        }
    }
}
