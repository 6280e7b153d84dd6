//! The published view of every workload and Service: persistent maps, so a
//! publish shares every unchanged entry with the snapshot before it and
//! costs what changed, not what is held.
//!
//! - A publish starts from the current snapshot (an O(1) copy of its maps)
//!   and writes only what changed: a workload whose spec differs gets a new
//!   allocation, one whose spec is equal keeps the one it had. An update
//!   of one workload ([`Delta`]) touches that workload, its addresses and
//!   the Services it names or named; a source that only has whole sets
//!   (the workload file, Kubernetes) hands those over and the unchanged
//!   entries are still kept ([`WorkloadSnapshot::replaced`]).
//! - Two snapshots diff in O(change) ([`WorkloadSnapshot::changes_from`]):
//!   the maps skip the subtrees they share. Consumers that compare
//!   consecutive snapshots (the drain engine) stay level-triggered — a
//!   transition missed between two looks is still in the diff — without
//!   walking the cluster.
//! - The data path reads a snapshot after one lock-free load of the store
//!   and never writes it.
//!
//! Each address belongs to at most one workload: every source gives an
//! address one owner or none (the workload file refuses a second;
//! Kubernetes discovery and istiod's assembly pick the one of the highest
//! standing, and hold the address closed when two share it), and the index
//! is kept under that rule.
//!
//! Addresses the mesh has known stay known as such ([`FormerlyKnown`]):
//! one a workload gave up (removed, replaced, its address moved) for
//! [`DEPARTED_RETENTION`] (at most [`DEPARTED_MAX`] of them, the oldest
//! forgotten first), and the addresses of a resource discovery refused for
//! as long as it is refused. The data path never sends them plaintext.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use imbl::{HashMap as SharedHashMap, OrdMap, Vector};
use tidegate_authz::PolicyStore;

use super::identities::Identities;
use super::membership::{self, Membership};
use super::services::{self, Conditions, EndpointTarget, Service, ServiceSpec};
use super::{Protocol, Workload, WorkloadSpec};
use crate::config::Cidr;

/// A workload or Service as the snapshot's maps hold it: equal only to
/// itself (the same allocation), which is what lets two snapshots diff by
/// skipping what they share.
#[derive(Debug)]
struct Held<T>(Arc<T>);

impl<T> Clone for Held<T> {
    fn clone(&self) -> Self {
        Held(self.0.clone())
    }
}

impl<T> PartialEq for Held<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// How long an address a workload gave up is held as formerly known.
pub const DEPARTED_RETENTION: Duration = Duration::from_secs(600);
/// At most this many departed addresses are held (the oldest go first).
pub const DEPARTED_MAX: usize = 131_072;

/// Why an address no workload holds now is still the mesh's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FormerlyKnown {
    /// A workload held it until `ago`.
    Departed { uid: Arc<str>, ago: Duration },
    /// Discovery refused the resource that names it.
    Refused { resource: Arc<str> },
}

impl FormerlyKnown {
    pub fn label(&self) -> &'static str {
        match self {
            FormerlyKnown::Departed { .. } => "departed",
            FormerlyKnown::Refused { .. } => "refused",
        }
    }
}

impl std::fmt::Display for FormerlyKnown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormerlyKnown::Departed { uid, ago } => {
                write!(f, "workload {uid} held it until {}s ago", ago.as_secs())
            }
            FormerlyKnown::Refused { resource } => {
                write!(f, "discovery refused {resource}, which names it")
            }
        }
    }
}

/// A delta of at least this many workloads is applied in bulk (a first
/// answer, a reconnect's): its workloads put in uid order, and looked up
/// in a table of their own while its Services are resolved.
const BULK: usize = 1024;

/// One workload's change between two snapshots: (before, now).
pub type WorkloadChange<'a> = (Option<&'a Arc<Workload>>, Option<&'a Arc<Workload>>);

/// An immutable view of all workloads.
#[derive(Clone, Debug, Default)]
pub struct WorkloadSnapshot {
    /// Keys are shared allocations: a publish copies the path down to the
    /// entry it changes, and a copied node's keys are reference counts
    /// bumped, not strings allocated again (the same for `local` and
    /// `services`).
    by_uid: OrdMap<Arc<str>, Held<Workload>>,
    /// B-trees, not HAMTs, for the maps with an entry a workload or a
    /// Service port: imbl's HAMT holds about 220 bytes an entry at 100,000
    /// entries (sparse 16- and 32-slot nodes), its B-tree about 80.
    by_ip: OrdMap<IpAddr, Arc<Workload>>,
    /// This node's workloads by uid.
    local: OrdMap<Arc<str>, Arc<Workload>>,
    /// This node's workloads by (namespace, name): how a pod handed over
    /// under its Kubernetes uid finds its workload when the source keys
    /// workloads otherwise (istiod: `<cluster>//Pod/<ns>/<name>`).
    local_by_name: SharedHashMap<(String, String), Arc<Workload>>,
    /// Services by key (`namespace/name`).
    services: OrdMap<Arc<str>, Held<Service>>,
    by_vip: OrdMap<(IpAddr, u16), Arc<Service>>,
    /// The mesh membership of each pod on this node, by uid — pods without
    /// an address yet included (a pod's CNI ADD comes before its IP). What
    /// the gateway answers `tidegate-cni` ADD with.
    members: OrdMap<String, Membership>,
    /// Addresses workloads gave up: when, and whose.
    departed: OrdMap<IpAddr, (Instant, Arc<str>)>,
    /// The same, oldest first (entries whose address was claimed again
    /// or departed again later are skipped when they come up).
    departures: Vector<(Instant, IpAddr)>,
    /// Addresses of refused resources, and the resources by name.
    refused: SharedHashMap<IpAddr, Arc<str>>,
    refused_by_name: OrdMap<String, Vec<IpAddr>>,
    /// The authorization policies, published with the workloads so a
    /// decision reads one consistent view.
    pub policies: Arc<PolicyStore>,
    /// The cluster's pod and Service ranges the workload source learned
    /// (beside `outbound.cluster_cidrs`).
    pub cluster_ranges: Arc<Vec<Cidr>>,
    /// Bumped on every publish.
    pub generation: u64,
}

/// What changed for one source update: workloads and Services put
/// (whole, as the source now has them) or removed, and the authorization
/// policies when they changed. Applied by [`super::WorkloadStore::apply`].
#[derive(Clone, Debug, Default)]
pub struct Delta {
    pub workloads: Vec<WorkloadSpec>,
    /// Workload uids.
    pub removed_workloads: Vec<String>,
    pub services: Vec<ServiceSpec>,
    /// Service keys (`namespace/name`).
    pub removed_services: Vec<String>,
    /// Endpoints changed one at a time in Services that did not change
    /// themselves (istiod: a workload of a Service changed): each applied
    /// to its Service at the cost of that endpoint, not of the Service's
    /// endpoints. A Service the delta puts whole carries its endpoints.
    pub endpoints: Vec<EndpointChange>,
    pub policies: Option<Arc<PolicyStore>>,
    /// Resources discovery refused with nothing held under their name, by
    /// name, with the addresses they name (held closed); an empty list:
    /// no longer refused.
    pub refused: Vec<(String, Vec<IpAddr>)>,
}

/// One endpoint of one Service changed: workload `uid`'s entry in the
/// Service of key `service` as it now is.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointChange {
    pub service: String,
    pub uid: Arc<str>,
    /// Its conditions and what it brings of its own (its port mapping,
    /// addresses, weight: none when the Service's own say it all); `None`:
    /// no longer an endpoint.
    pub entry: Option<(Conditions, Option<EndpointTarget>)>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.workloads.is_empty()
            && self.removed_workloads.is_empty()
            && self.services.is_empty()
            && self.removed_services.is_empty()
            && self.endpoints.is_empty()
            && self.policies.is_none()
            && self.refused.is_empty()
    }
}

/// What changed among one Service's endpoints in one delta: entries
/// changed, and workloads changed that are (or were) its endpoints.
#[derive(Default)]
struct Members {
    changed: Vec<EndpointChange>,
    touched: Vec<Arc<str>>,
}

/// Who the snapshot is built for: the workload's identity and locality
/// are derived from them.
pub(super) struct Node<'a> {
    pub trust_domain: &'a str,
    pub name: &'a str,
    /// The identities held, shared by the workloads that carry each.
    pub identities: &'a mut Identities,
}

impl Node<'_> {
    fn workload(&mut self, spec: WorkloadSpec) -> Arc<Workload> {
        let identity =
            self.identities
                .get(self.trust_domain, &spec.namespace, &spec.service_account);
        Arc::new(Workload {
            local: spec.node == self.name,
            identity,
            spec,
        })
    }
}

impl WorkloadSnapshot {
    pub fn by_ip(&self, ip: IpAddr) -> Option<&Arc<Workload>> {
        self.by_ip.get(&ip)
    }

    pub fn by_uid(&self, uid: &str) -> Option<&Arc<Workload>> {
        self.by_uid.get(uid).map(|h| &h.0)
    }

    /// The workload of the pod a node agent handed over as `uid`
    /// (`namespace`/`name`): the local workload of that uid — the
    /// Kubernetes source keys workloads by the pod's uid — else the local
    /// workload of that namespace and name (istiod keys them by
    /// `<cluster>//Pod/<namespace>/<name>`: the uids differ).
    pub fn pod_workload(&self, uid: &str, namespace: &str, name: &str) -> Option<&Arc<Workload>> {
        self.local.get(uid).or_else(|| {
            self.local_by_name
                .get(&(namespace.to_owned(), name.to_owned()))
        })
    }

    /// The Service with `vip` as an address and `port` as a port.
    pub fn service_by_vip(&self, vip: IpAddr, port: u16) -> Option<&Arc<Service>> {
        self.by_vip.get(&(vip, port))
    }

    /// The Service of key `namespace/name`.
    pub fn service(&self, key: &str) -> Option<&Arc<Service>> {
        self.services.get(key).map(|h| &h.0)
    }

    /// Every Service, by key.
    pub fn services(&self) -> impl Iterator<Item = &Arc<Service>> + '_ {
        self.services.values().map(|h| &h.0)
    }

    pub fn services_len(&self) -> usize {
        self.services.len()
    }

    /// Every workload, by uid.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Workload>> + '_ {
        self.by_uid.values().map(|h| &h.0)
    }

    /// This node's workloads, by uid (without walking the others).
    pub fn locals(&self) -> impl Iterator<Item = &Arc<Workload>> + '_ {
        self.local.values()
    }

    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    /// Whether this snapshot holds the very local workloads `other` holds
    /// (their map shared, not compared): O(1). False says only that they
    /// may differ.
    pub fn same_locals(&self, other: &WorkloadSnapshot) -> bool {
        self.local.ptr_eq(&other.local)
    }

    /// The mesh membership of the local pod `uid`, when its source knows it.
    pub fn membership(&self, uid: &str) -> Option<Membership> {
        self.members.get(uid).copied()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }

    /// Why `ip`, which no workload holds, is still the mesh's: a workload
    /// gave it up less than [`DEPARTED_RETENTION`] ago, or a refused
    /// resource names it. `None`: never known (or long gone).
    pub fn formerly_known(&self, ip: IpAddr) -> Option<FormerlyKnown> {
        if let Some(resource) = self.refused.get(&ip) {
            return Some(FormerlyKnown::Refused {
                resource: resource.clone(),
            });
        }
        let (at, uid) = self.departed.get(&ip)?;
        let ago = at.elapsed();
        (ago < DEPARTED_RETENTION).then(|| FormerlyKnown::Departed {
            uid: uid.clone(),
            ago,
        })
    }

    /// How many addresses are held as formerly known (departed, refused).
    pub fn formerly_known_len(&self) -> (usize, usize) {
        (self.departed.len(), self.refused.len())
    }

    /// The workloads that differ between `previous` and this snapshot, as
    /// (before, now) pairs by uid: added `(None, Some)`, removed
    /// `(Some, None)`, republished with another spec `(Some, Some)`. A
    /// workload republished with an equal spec keeps its allocation and is
    /// not listed. O(change) between snapshots of one store; any two
    /// snapshots compare correctly (one that shares nothing costs a walk).
    pub fn changes_from<'a>(
        &'a self,
        previous: &'a WorkloadSnapshot,
    ) -> impl Iterator<Item = WorkloadChange<'a>> + 'a {
        previous.by_uid.diff(&self.by_uid).map(|d| match d {
            imbl::ordmap::DiffItem::Add(_, w) => (None, Some(&w.0)),
            imbl::ordmap::DiffItem::Remove(_, w) => (Some(&w.0), None),
            imbl::ordmap::DiffItem::Update { old, new } => (Some(&old.1 .0), Some(&new.1 .0)),
        })
    }

    /// The Services that differ between `previous` and this snapshot, as
    /// (before, now) pairs by key; O(change), as [`Self::changes_from`].
    pub fn service_changes_from<'a>(
        &'a self,
        previous: &'a WorkloadSnapshot,
    ) -> impl Iterator<Item = (Option<&'a Arc<Service>>, Option<&'a Arc<Service>>)> + 'a {
        previous.services.diff(&self.services).map(|d| match d {
            imbl::ordmap::DiffItem::Add(_, s) => (None, Some(&s.0)),
            imbl::ordmap::DiffItem::Remove(_, s) => (Some(&s.0), None),
            imbl::ordmap::DiffItem::Update { old, new } => (Some(&old.1 .0), Some(&new.1 .0)),
        })
    }

    /// The next generation: this snapshot's maps, shared; departed
    /// addresses past their retention (or over the bound) forgotten.
    fn next(&self) -> WorkloadSnapshot {
        let mut next = WorkloadSnapshot {
            generation: self.generation + 1,
            ..self.clone()
        };
        while let Some((at, ip)) = next.departures.front().copied() {
            if at.elapsed() < DEPARTED_RETENTION && next.departures.len() <= DEPARTED_MAX {
                break;
            }
            next.departures.pop_front();
            if next.departed.get(&ip).is_some_and(|(t, _)| *t == at) {
                next.departed.remove(&ip);
            }
        }
        next
    }

    /// Puts `w` in place of whatever was held under its uid; the one it
    /// replaced.
    fn put(&mut self, w: Arc<Workload>) -> Option<Arc<Workload>> {
        let uid: Arc<str> = Arc::from(w.spec.uid.as_str());
        let old = self
            .by_uid
            .insert(uid.clone(), Held(w.clone()))
            .map(|h| h.0);
        if let Some(old) = &old {
            self.unindex(old, &w.spec.ips);
        }
        for ip in &w.spec.ips {
            self.by_ip.insert(*ip, w.clone());
            self.departed.remove(ip);
        }
        if w.local {
            let key = (w.spec.namespace.clone(), w.spec.name.clone());
            self.local_by_name.insert(key, w.clone());
            self.local.insert(uid, w.clone());
        }
        old
    }

    fn take(&mut self, uid: &str) -> Option<Arc<Workload>> {
        let old = self.by_uid.remove(uid)?.0;
        self.unindex(&old, &[]);
        Some(old)
    }

    /// Drops `old`'s index entries that are still its own; its addresses
    /// other than `kept` (those its next version holds) departed.
    fn unindex(&mut self, old: &Arc<Workload>, kept: &[IpAddr]) {
        let own = |w: Option<&Arc<Workload>>| w.is_some_and(|w| Arc::ptr_eq(w, old));
        let now = Instant::now();
        for ip in &old.spec.ips {
            if own(self.by_ip.get(ip)) {
                self.by_ip.remove(ip);
                if !kept.contains(ip) {
                    self.departed
                        .insert(*ip, (now, Arc::from(old.spec.uid.as_str())));
                    self.departures.push_back((now, *ip));
                }
            }
        }
        if old.local {
            let key = (old.spec.namespace.clone(), old.spec.name.clone());
            if own(self.local_by_name.get(&key)) {
                self.local_by_name.remove(&key);
            }
            if own(self.local.get(old.spec.uid.as_str())) {
                self.local.remove(old.spec.uid.as_str());
            }
        }
    }

    fn put_service(&mut self, svc: Arc<Service>) {
        if let Some(old) = self
            .services
            .insert(Arc::from(svc.key()), Held(svc.clone()))
        {
            self.unindex_service(&old.0);
        }
        for vip in &svc.spec.vips {
            for p in svc.spec.ports.iter().filter(|p| p.protocol == "TCP") {
                self.by_vip.insert((*vip, p.port), svc.clone());
            }
        }
    }

    fn take_service(&mut self, key: &str) -> Option<Arc<Service>> {
        let old = self.services.remove(key)?.0;
        self.unindex_service(&old);
        Some(old)
    }

    fn unindex_service(&mut self, old: &Arc<Service>) {
        for vip in &old.spec.vips {
            for p in &old.spec.ports {
                let key = (*vip, p.port);
                if self.by_vip.get(&key).is_some_and(|s| Arc::ptr_eq(s, old)) {
                    self.by_vip.remove(&key);
                }
            }
        }
    }

    /// The next snapshot holding exactly `specs` and `services` (a source's
    /// whole set): entries whose spec did not change keep their allocation,
    /// so the diff from this snapshot is what changed. Every Service is
    /// resolved again (O(endpoints)).
    pub(super) fn replaced(
        &self,
        node: &mut Node<'_>,
        specs: Vec<WorkloadSpec>,
        services: Vec<ServiceSpec>,
        members: BTreeMap<String, Membership>,
        policies: Arc<PolicyStore>,
    ) -> WorkloadSnapshot {
        let mut next = self.next();
        let listed: std::collections::HashSet<String> =
            specs.iter().map(|s| s.uid.clone()).collect();
        let gone: Vec<Arc<str>> = self
            .by_uid
            .keys()
            .filter(|uid| !listed.contains(&***uid))
            .cloned()
            .collect();
        for uid in gone {
            next.take(&uid);
        }
        for spec in specs {
            if !self.by_uid(&spec.uid).is_some_and(|w| w.spec == spec) {
                next.put(node.workload(spec));
            }
        }
        next.members = members.into_iter().collect();
        next.policies = policies;
        next.services = OrdMap::new();
        next.by_vip = OrdMap::new();
        let naming = services
            .iter()
            .any(|s| s.endpoints.is_none())
            .then(|| naming(&next));
        for spec in services {
            let named = naming
                .as_ref()
                .and_then(|n| n.get(&spec.key()))
                .map_or(&[][..], Vec::as_slice);
            let svc = services::resolve_one(spec, |uid| next.by_uid(uid), named);
            next.put_service(Arc::new(svc));
        }
        next
    }

    /// The next snapshot with `delta` applied: each workload put or
    /// removed, the Services put or removed, and every Service that one of
    /// the changed workloads names or named resolved again against the
    /// new workloads. With a `reason` (a source's update), the local
    /// workloads' membership follows their protocol; without (a removal by
    /// the node agent or the admin API, a restore), it stays as it was.
    pub(super) fn applied(
        &self,
        node: &mut Node<'_>,
        delta: Delta,
        reason: Option<membership::Reason>,
    ) -> WorkloadSnapshot {
        let mut next = self.next();
        // The Services put whole, and whether each is to be resolved (it
        // changed, or a changed workload names or named it); the endpoints
        // to resolve again one by one in the others, by Service key. A
        // Service the delta puts is looked up by the name a workload gives
        // it without allocating a key.
        let mut put: foldhash::HashMap<String, (ServiceSpec, bool)> = Default::default();
        for spec in delta.services {
            put.insert(spec.key(), (spec, false));
        }
        let mut members: foldhash::HashMap<String, Members> = Default::default();
        let mut touched = |w: &Workload| {
            for s in &w.spec.services {
                let key = service_key(w, s);
                match put.get_mut(&*key) {
                    Some((_, d)) => *d = true,
                    None => {
                        let m = members.entry(key.into_owned()).or_default();
                        m.touched.push(Arc::from(w.spec.uid.as_str()));
                    }
                }
            }
        };
        for uid in &delta.removed_workloads {
            if let Some(old) = next.take(uid) {
                touched(&old);
            }
            // Also when the node agent removed it first.
            if reason.is_some() {
                next.members.remove(uid);
            }
        }
        // The first answer puts every workload into an empty snapshot:
        // nothing to compare with. Into a snapshot without Services
        // either, every Service is put and resolved whole: none is to be
        // marked touched.
        let first = self.by_uid.is_empty();
        let untouched = first && self.services.is_empty();
        let mut workloads = delta.workloads;
        let bulk = workloads.len() >= BULK;
        if bulk {
            // In uid order, each insert lands beside the one before it.
            workloads.sort_unstable_by(|a, b| a.uid.cmp(&b.uid));
        }
        let mut fresh = Vec::with_capacity(if bulk { workloads.len() } else { 0 });
        for spec in workloads {
            if !first && self.by_uid(&spec.uid).is_some_and(|w| w.spec == spec) {
                continue;
            }
            let w = node.workload(spec);
            if bulk {
                fresh.push(w.clone());
            }
            if let Some(old) = next.put(w.clone()) {
                touched(&old);
                if old.local && !w.local && reason.is_some() {
                    next.members.remove(&old.spec.uid);
                }
            }
            if !untouched {
                touched(&w);
            }
            if let (true, Some(reason)) = (w.local, reason) {
                let m = Membership {
                    member: w.spec.protocol == Protocol::Hbone,
                    reason,
                };
                next.members.insert(w.spec.uid.clone(), m);
            }
        }
        for change in delta.endpoints {
            if !put.contains_key(&change.service) {
                let m = members.entry(change.service.clone()).or_default();
                m.changed.push(change);
            }
        }
        for key in &delta.removed_services {
            next.take_service(key);
            members.remove(key);
        }
        for (key, m) in members {
            next.update_members(&key, m);
        }
        let changed = put.into_values().filter_map(|(spec, touched)| {
            let same = next.service(&spec.key()).is_some_and(|s| s.spec == spec);
            (touched || !same).then_some(spec)
        });
        let resolve: Vec<ServiceSpec> = changed.collect();
        // A large delta's workloads are looked up by uid in a hash table of
        // their own while its Services are resolved: one probe an endpoint,
        // not a walk down the uid tree (the same workloads: each was just
        // put under its uid, nothing removed after).
        let lookup: foldhash::HashMap<&str, &Arc<Workload>> = if bulk && !resolve.is_empty() {
            fresh.iter().map(|w| (w.spec.uid.as_str(), w)).collect()
        } else {
            Default::default()
        };
        for spec in resolve {
            next.resolve_whole(spec, &lookup);
        }
        drop(lookup);
        if let Some(policies) = delta.policies {
            next.policies = policies;
        }
        for (name, ips) in delta.refused {
            next.refuse(name, ips);
        }
        next
    }

    /// Resolves `spec` whole and puts it in place of its Service.
    /// `fresh`: workloads just put, looked up there first.
    fn resolve_whole(
        &mut self,
        spec: ServiceSpec,
        fresh: &foldhash::HashMap<&str, &Arc<Workload>>,
    ) {
        let named: Vec<Arc<Workload>> = if spec.endpoints.is_none() {
            // Members by name (the workload file): found by a walk.
            self.iter().filter(|w| names(w, &spec)).cloned().collect()
        } else {
            Vec::new()
        };
        let svc = services::resolve_one(
            spec,
            |uid| fresh.get(uid).copied().or_else(|| self.by_uid(uid)),
            &named,
        );
        self.put_service(Arc::new(svc));
    }

    /// The Service of `key` with `m` applied: its changed endpoints'
    /// entries, then each endpoint changed or touched resolved again
    /// alone (O(endpoints changed), not O(endpoints)). A Service whose
    /// members are named (the workload file) is resolved whole.
    fn update_members(&mut self, key: &str, m: Members) {
        let Some(held) = self.service(key) else {
            return;
        };
        if held.spec.endpoints.is_none() {
            self.resolve_whole(held.spec.clone(), &Default::default());
            return;
        }
        let mut svc = Service::clone(held);
        let mut uids = m.touched;
        for change in m.changed {
            let spec = &mut svc.spec;
            let endpoints = spec.endpoints.get_or_insert_with(Default::default);
            match change.entry {
                Some((conditions, target)) => {
                    endpoints.insert(change.uid.clone(), conditions);
                    match target {
                        Some(t) => spec.endpoint_targets.insert(change.uid.clone(), t),
                        None => spec.endpoint_targets.remove(&change.uid),
                    };
                }
                None => {
                    endpoints.remove(&change.uid);
                    spec.endpoint_targets.remove(&change.uid);
                }
            }
            uids.push(change.uid);
        }
        uids.sort_unstable();
        uids.dedup();
        for uid in uids {
            svc.resolve_member(&uid, self.by_uid(&uid));
        }
        self.put_service(Arc::new(svc));
    }

    /// Holds the addresses `ips` of refused resource `name` closed (empty:
    /// it is no longer refused).
    fn refuse(&mut self, name: String, ips: Vec<IpAddr>) {
        if let Some(old) = self.refused_by_name.remove(&name) {
            for ip in old {
                if self.refused.get(&ip).is_some_and(|r| **r == *name) {
                    self.refused.remove(&ip);
                }
            }
        }
        if ips.is_empty() {
            return;
        }
        let resource: Arc<str> = Arc::from(name.as_str());
        for ip in &ips {
            self.refused.insert(*ip, resource.clone());
        }
        self.refused_by_name.insert(name, ips);
    }

    /// Holds exactly `refused` closed (a whole set, by name): names held
    /// and not in it are lifted, the others held as they now read.
    pub(super) fn refuse_all(&mut self, refused: Vec<(String, Vec<IpAddr>)>) {
        let listed: std::collections::HashSet<&str> =
            refused.iter().map(|(n, _)| n.as_str()).collect();
        let lifted: Vec<String> = self
            .refused_by_name
            .keys()
            .filter(|n| !listed.contains(n.as_str()))
            .cloned()
            .collect();
        for name in lifted {
            self.refuse(name, Vec::new());
        }
        for (name, ips) in refused {
            if self.refused_by_name.get(&name) != Some(&ips) {
                self.refuse(name, ips);
            }
        }
    }

    /// The same snapshot, learned ranges replaced.
    pub(super) fn with_ranges(mut self, ranges: Arc<Vec<Cidr>>) -> WorkloadSnapshot {
        self.cluster_ranges = ranges;
        self
    }
}

/// The key of the Service that workload `w` names as `named` (`name` in
/// its own namespace, or `namespace/name`).
fn service_key<'a>(w: &Workload, named: &'a str) -> std::borrow::Cow<'a, str> {
    if named.contains('/') {
        std::borrow::Cow::Borrowed(named)
    } else {
        std::borrow::Cow::Owned(format!("{}/{named}", w.spec.namespace))
    }
}

/// Whether workload `w` names the Service `svc`.
fn names(w: &Workload, svc: &ServiceSpec) -> bool {
    w.spec.services.iter().any(|s| match s.split_once('/') {
        Some((ns, name)) => ns == svc.namespace && name == svc.name,
        None => w.spec.namespace == svc.namespace && *s == svc.name,
    })
}

/// Service key → the workloads naming it, in uid order.
fn naming(snapshot: &WorkloadSnapshot) -> HashMap<String, Vec<Arc<Workload>>> {
    let mut out: HashMap<String, Vec<Arc<Workload>>> = HashMap::new();
    for w in snapshot.iter() {
        for s in &w.spec.services {
            let list = out.entry(service_key(w, s).into_owned()).or_default();
            // Named twice: one endpoint.
            if !list.last().is_some_and(|l| Arc::ptr_eq(l, w)) {
                list.push(w.clone());
            }
        }
    }
    out
}
