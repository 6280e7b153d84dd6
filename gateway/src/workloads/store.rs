//! The single place workloads are published ([`WorkloadStore`]): one writer
//! at a time builds the next [`WorkloadSnapshot`] from the current one and
//! swaps it in; readers load the current one without a lock.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use tidegate_authz::PolicyStore;

use super::identities::Identities;
use super::membership::{self, Membership};
use super::services::ServiceSpec;
use super::snapshot::{Delta, Node, WorkloadSnapshot};
use super::{file, Protocol, WorkloadSpec};
use crate::config::Cidr;
use tidegate_base::sync::Locked;

/// A source's whole set, for [`WorkloadStore::publish`]: its workloads,
/// and what else it gives. Built from the workloads alone (a `Vec` of
/// specs: the Services, policies and addresses held closed stay as held,
/// the local workloads' membership follows their protocol) or from a
/// parsed workload file (its workloads, Services and policies).
#[derive(Debug)]
pub struct WholeSet {
    workloads: Vec<WorkloadSpec>,
    services: Option<Vec<ServiceSpec>>,
    members: Members,
    policies: Option<Arc<PolicyStore>>,
    held_closed: Option<Vec<(String, Vec<IpAddr>)>>,
}

/// How the local pods' membership is known.
#[derive(Debug)]
enum Members {
    /// From each local workload's protocol (HBONE is a member), for this
    /// reason.
    ByProtocol(membership::Reason),
    /// As the source decided, by uid ([`membership::decide`]).
    Decided(BTreeMap<String, Membership>),
}

impl WholeSet {
    pub fn new(workloads: Vec<WorkloadSpec>) -> WholeSet {
        WholeSet {
            workloads,
            services: None,
            members: Members::ByProtocol(membership::Reason::WorkloadFile),
            policies: None,
            held_closed: None,
        }
    }

    /// The Services, in place of those held.
    pub fn services(mut self, services: Vec<ServiceSpec>) -> WholeSet {
        self.services = Some(services);
        self
    }

    /// The authorization policies, in place of those held.
    pub fn policies(mut self, policies: Arc<PolicyStore>) -> WholeSet {
        self.policies = Some(policies);
        self
    }

    /// The local pods' membership as the source decided it, by uid (pods
    /// without an address yet included).
    pub fn members(mut self, members: BTreeMap<String, Membership>) -> WholeSet {
        self.members = Members::Decided(members);
        self
    }

    /// The local workloads' membership from their protocol, for `reason`.
    pub fn members_by_protocol(mut self, reason: membership::Reason) -> WholeSet {
        self.members = Members::ByProtocol(reason);
        self
    }

    /// The addresses held closed (name → addresses: Kubernetes discovery's
    /// addresses two running pods claim, under the istio source's name for
    /// a conflict, `address <ip>`), in place of those held: a name not in
    /// it is no longer held closed.
    pub fn held_closed(mut self, held_closed: Vec<(String, Vec<IpAddr>)>) -> WholeSet {
        self.held_closed = Some(held_closed);
        self
    }
}

impl From<Vec<WorkloadSpec>> for WholeSet {
    fn from(workloads: Vec<WorkloadSpec>) -> WholeSet {
        WholeSet::new(workloads)
    }
}

impl From<file::Parsed> for WholeSet {
    fn from(file: file::Parsed) -> WholeSet {
        WholeSet::new(file.workloads)
            .services(file.services)
            .policies(Arc::new(file.policies))
    }
}

/// The single place workloads are published. Readers call [`WorkloadStore::snapshot`].
#[derive(Debug)]
pub struct WorkloadStore {
    current: ArcSwap<WorkloadSnapshot>,
    trust_domain: String,
    node: String,
    changed: tokio::sync::watch::Sender<u64>,
    /// The cluster's ranges a source learned; the next publish carries them.
    learned_ranges: std::sync::Mutex<Arc<Vec<Cidr>>>,
    /// Workloads removed ([`WorkloadStore::remove`]: the admin API, the
    /// node agent) that the source still lists, with the source's latest
    /// spec: left out of every publish until the source drops them too, or
    /// the node agent hands the pod over again ([`WorkloadStore::restore`]).
    removed: std::sync::Mutex<BTreeMap<String, Option<WorkloadSpec>>>,
    /// Held for a whole publish: the source and a removal never publish
    /// over each other. Guards the identities the workloads share.
    publishing: std::sync::Mutex<Identities>,
}

impl WorkloadStore {
    pub fn new(trust_domain: &str, node: &str) -> Arc<Self> {
        Arc::new(WorkloadStore {
            current: ArcSwap::from_pointee(WorkloadSnapshot::default()),
            trust_domain: trust_domain.to_owned(),
            node: node.to_owned(),
            learned_ranges: Default::default(),
            removed: Default::default(),
            publishing: Default::default(),
            changed: tokio::sync::watch::channel(0).0,
        })
    }

    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    pub fn snapshot(&self) -> Arc<WorkloadSnapshot> {
        self.current.load_full()
    }

    /// Workload `uid`'s spec as its source last published it: from the
    /// snapshot, or — removed ([`WorkloadStore::remove`]) while the source
    /// still lists it — the latest the source gave. What a source that
    /// does not keep its own copy assembles a workload again from.
    pub fn spec(&self, uid: &str) -> Option<WorkloadSpec> {
        if let Some(w) = self.current.load().by_uid(uid) {
            return Some(w.spec.clone());
        }
        self.removed.locked().get(uid).cloned().flatten()
    }

    /// Notified with the generation after every publish.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn node<'a>(&'a self, identities: &'a mut Identities) -> Node<'a> {
        Node {
            trust_domain: &self.trust_domain,
            name: &self.node,
            identities,
        }
    }

    /// Replaces what a source holds with its whole `set` (the workload
    /// file, Kubernetes discovery; istiod's delta xDS is applied with
    /// [`WorkloadStore::apply`]): the workloads, and the Services, the
    /// local pods' membership, the authorization policies and the
    /// addresses held closed where the set gives them; what it does not
    /// give stays (the Services resolved again against the new workloads).
    /// The specs were validated by their source (the file parser;
    /// Kubernetes discovery gives each IP at most one owner).
    pub fn publish(&self, set: impl Into<WholeSet>) {
        let set = set.into();
        let mut one = self.publishing.locked();
        let current = self.current.load_full();
        let members = match set.members {
            Members::ByProtocol(reason) => self.members_by_protocol(&set.workloads, reason),
            Members::Decided(members) => members,
        };
        let services = set
            .services
            .unwrap_or_else(|| current.services().map(|s| s.spec.clone()).collect());
        let policies = set.policies.unwrap_or_else(|| current.policies.clone());
        let specs = self.without_removed(set.workloads);
        let mut next =
            current.replaced(&mut self.node(&mut one), specs, services, members, policies);
        if let Some(held_closed) = set.held_closed {
            next.refuse_all(held_closed);
        }
        self.swap_in(next);
    }

    /// The local workloads' membership from their protocol (HBONE is a
    /// member), for sources that say nothing else of it.
    fn members_by_protocol(
        &self,
        specs: &[WorkloadSpec],
        reason: membership::Reason,
    ) -> BTreeMap<String, Membership> {
        specs
            .iter()
            .filter(|s| s.node == self.node)
            .map(|s| {
                let m = Membership {
                    member: s.protocol == Protocol::Hbone,
                    reason,
                };
                (s.uid.clone(), m)
            })
            .collect()
    }

    /// Applies what changed (istiod's updates): only the workloads and
    /// Services in `delta`, and the Services the changed workloads name or
    /// named, are touched; the rest is shared with the current snapshot.
    /// The local workloads' membership follows their protocol.
    pub fn apply(&self, mut delta: Delta) {
        let mut one = self.publishing.locked();
        {
            let mut removed = self.removed.locked();
            if !removed.is_empty() {
                delta
                    .workloads
                    .retain(|spec| match removed.get_mut(&spec.uid) {
                        Some(latest) => {
                            *latest = Some(spec.clone());
                            false
                        }
                        None => true,
                    });
                for uid in &delta.removed_workloads {
                    removed.remove(uid);
                }
            }
        }
        self.apply_unlocked(&mut one, delta, Some(membership::Reason::Istio));
    }

    /// Applies `delta` under the publish lock (`identities`, its guarded
    /// table).
    fn apply_unlocked(
        &self,
        identities: &mut Identities,
        delta: Delta,
        reason: Option<membership::Reason>,
    ) {
        let current = self.current.load_full();
        let next = current.applied(&mut self.node(identities), delta, reason);
        self.swap_in(next);
    }

    /// The cluster's ranges as the source now knows them; published with
    /// its next snapshot.
    pub fn learn_cluster_ranges(&self, ranges: Vec<Cidr>) {
        *self.learned_ranges.locked() = Arc::new(ranges);
    }

    /// Removes workload `uid` from the published set now, whatever its
    /// source still says: every Service loses it as an endpoint in the
    /// same publish. It stays out until the source no longer lists it (or
    /// [`WorkloadStore::restore`]). `false`: not listed.
    pub fn remove(&self, uid: &str) -> bool {
        let mut one = self.publishing.locked();
        let current = self.current.load_full();
        let Some(w) = current.by_uid(uid) else {
            return false;
        };
        self.removed
            .locked()
            .insert(uid.to_owned(), Some(w.spec.clone()));
        self.apply_unlocked(
            &mut one,
            Delta {
                removed_workloads: vec![uid.to_owned()],
                ..Default::default()
            },
            None,
        );
        true
    }

    /// The pod `uid` (`namespace`/`name`) is back — its node agent handed
    /// it over again — and with it its workload, if removed: published
    /// again as its source last listed it (matched as
    /// [`WorkloadSnapshot::pod_workload`] matches).
    pub fn restore(&self, uid: &str, namespace: &str, name: &str) {
        let mut one = self.publishing.locked();
        let spec = {
            let mut removed = self.removed.locked();
            let key = removed
                .iter()
                .find(|(k, spec)| {
                    *k == uid
                        || spec.as_ref().is_some_and(|s| {
                            s.node == self.node && s.namespace == namespace && s.name == name
                        })
                })
                .map(|(k, _)| k.clone());
            key.and_then(|k| removed.remove(&k)).flatten()
        };
        if let Some(spec) = spec {
            self.apply_unlocked(
                &mut one,
                Delta {
                    workloads: vec![spec],
                    ..Default::default()
                },
                None,
            );
        }
    }

    /// `specs` (a source's whole set) less the removed workloads, whose
    /// latest spec is kept; removed workloads the source no longer lists
    /// are forgotten.
    fn without_removed(&self, specs: Vec<WorkloadSpec>) -> Vec<WorkloadSpec> {
        let mut removed = self.removed.locked();
        if removed.is_empty() {
            return specs;
        }
        // One pass over the source's set, not one per removal.
        let listed: std::collections::HashSet<&str> =
            specs.iter().map(|s| s.uid.as_str()).collect();
        removed.retain(|uid, _| listed.contains(uid.as_str()));
        let mut kept = Vec::with_capacity(specs.len());
        for spec in specs {
            match removed.get_mut(&spec.uid) {
                Some(latest) => *latest = Some(spec),
                None => kept.push(spec),
            }
        }
        kept
    }

    fn swap_in(&self, next: WorkloadSnapshot) {
        let generation = next.generation;
        let next = next.with_ranges(self.learned_ranges.locked().clone());
        self.current.store(Arc::new(next));
        self.changed.send_replace(generation);
    }

    /// The mesh membership of the local pod `uid`, waiting up to `wait` for
    /// its source to learn of it (a pod's CNI ADD can come before the pod
    /// watch delivers it). `None`: still unknown.
    pub async fn membership(&self, uid: &str, wait: std::time::Duration) -> Option<Membership> {
        // Subscribed before the first look: a publish in between is seen.
        let mut changed = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(m) = self.snapshot().membership(uid) {
                return Some(m);
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(Ok(())) => continue,
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
