//! The drain book: what the engine remembers of workloads, their drains and
//! its peers' drains, and the transitions that change it — each takes the
//! book and one event and returns what the engine then does outside its lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use tokio::time::Instant;

use super::peer_book::PeerBook;
use super::state::{DrainState, PodKey};
use crate::workloads::Workload;

/// What the engine remembers about workloads and their drains.
#[derive(Default)]
pub(super) struct DrainBook {
    pub(super) drains: BTreeMap<String, DrainState>,
    pub(super) first_seen: HashMap<String, Instant>,
    /// Workloads removed from the store recently, so actions can still name them.
    pub(super) removed: HashMap<String, (Arc<Workload>, Instant)>,
    /// Peers' drains as this gateway (their client) handled them, by peer
    /// uid (or destination address for a connect-failing one).
    pub(super) peers: PeerBook,
    /// In-pod mode: the pods the node agent handed over (`workload-added`
    /// waits for both the handover and discovery), by uid and by
    /// `namespace/name` ([`PodKey::name_key`]).
    handed_over: HashSet<String>,
}

impl DrainBook {
    /// The node agent handed `pod` over: it is known by its uid and by its
    /// `namespace/name` from now on. True when its uid is new (a repeated
    /// hand-over, a retried CNI ADD, is not a new pod).
    pub(super) fn hand_over(&mut self, pod: &PodKey<'_>) -> bool {
        self.handed_over.insert(pod.name_key());
        self.handed_over.insert(pod.uid.to_owned())
    }

    /// The node agent took `pod` back: neither its uid nor its name is
    /// handed over any more.
    pub(super) fn take_back(&mut self, pod: &PodKey<'_>) {
        self.handed_over.remove(pod.uid);
        self.handed_over.remove(&pod.name_key());
    }

    /// Whether the node agent handed over the pod of local workload `w`
    /// (under `w`'s uid, or under the pod's own uid when the source keys
    /// workloads otherwise: by namespace and name).
    pub(super) fn was_handed_over(&self, w: &Workload) -> bool {
        self.handed_over.contains(w.uid())
            || self
                .handed_over
                .contains(&format!("{}/{}", w.spec.namespace, w.spec.name))
    }
}

#[cfg(test)]
mod tests;
