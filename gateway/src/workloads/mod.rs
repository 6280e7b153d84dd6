//! The workload store: every workload the gateway knows, published by one
//! writer as an immutable snapshot that the data path reads without locks.
//!
//! The writer is the configured source (`workloads.source`): the watched
//! workload file (`file`) or Kubernetes discovery ([`kubernetes`]). Both
//! publish the whole set; the drain engine derives lifecycle events by
//! comparing consecutive snapshots.

mod file;
mod file_authorization;
pub mod istio;
pub mod kubernetes;
pub mod membership;
pub mod services;
pub mod waypoint;

pub use file::{
    parse_file, parse_workload_file, Parsed, WorkloadFile, WorkloadFileError, WorkloadFileMetrics,
    WorkloadFileWatcher,
};

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

use crate::config::Cidr;
use crate::identity::SpiffeId;
use crate::policy::{AsSubject, Subject};
use crate::sync::Locked;
use membership::Membership;
use tidegate_authz::PolicyStore;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    /// The workload's node runs an HBONE gateway: tunnel to it.
    #[default]
    Hbone,
    /// Plain TCP pass-through.
    Tcp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LifecycleState {
    #[default]
    Running,
    Terminating,
}

/// One workload, from the workload file or from Kubernetes discovery.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    pub uid: String,
    pub name: String,
    #[serde(default = "default_namespace")]
    pub namespace: String,
    #[serde(default = "default_service_account")]
    pub service_account: String,
    pub ips: Vec<IpAddr>,
    pub node: String,
    #[serde(default)]
    pub protocol: Protocol,
    #[serde(default)]
    pub state: LifecycleState,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Inbound authorization: SPIFFE ids (a trailing `*` matches a prefix)
    /// allowed to open streams to this workload. Empty: any peer of the trust domain.
    #[serde(default)]
    pub allow: Vec<String>,
    /// The WORKLOAD_SELECTOR authorization policies that select this
    /// workload, by key (`<namespace>/<name>`); the NAMESPACE and GLOBAL
    /// ones apply without being named ([`tidegate_authz`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authorization_policies: Vec<String>,
    /// Opt-in to OCI load-balancer backend draining: set in the workload file,
    /// or by Kubernetes discovery when a Service selecting the pod carries
    /// `tidegate.io/oci-backend-draining: "true"`.
    #[serde(default)]
    pub oci_backend_draining: bool,
    /// Drain policy named by the workload's namespace (Kubernetes: the
    /// namespace label `workloads.kubernetes.policy_label`). Below the pod
    /// annotation `tidegate.io/drain-policy`, above `policies.bindings`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_policy: Option<String>,
    /// The deadline of a terminating workload, milliseconds since the Unix
    /// epoch (Kubernetes: `deletionTimestamp`, which the API server sets to
    /// the deletion request time plus the grace period). Unset: the drain
    /// engine uses `drains.default_grace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_deadline_unix_ms: Option<u64>,
    /// The Services this workload is an endpoint of: `<name>` (its own
    /// namespace) or `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
    /// Named ports (a Service's `target_port` by name resolves here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<String, u16>,
    /// The workload the pod belongs to, as Istio's metrics name it (its
    /// Deployment or Job; Kubernetes discovery derives it from the pod's
    /// controller). Unset: the pod's `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_name: Option<String>,
    /// Its waypoint (istiod only): traffic addressed to the workload goes
    /// through it. Not a workload-file key.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<waypoint::Waypoint>,
    /// Reachable only through a network gateway (istiod's
    /// `network_gateway`: another network): refused, never sent in
    /// plaintext. Not a workload-file key.
    #[serde(
        default,
        skip_deserializing,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub other_network: bool,
}

fn default_namespace() -> String {
    "default".into()
}

fn default_service_account() -> String {
    "default".into()
}

/// A workload with its derived identity.
#[derive(Debug, Serialize)]
pub struct Workload {
    #[serde(flatten)]
    pub spec: WorkloadSpec,
    pub identity: SpiffeId,
    /// True when `spec.node` is this gateway's node.
    pub local: bool,
}

impl Workload {
    pub fn uid(&self) -> &str {
        &self.spec.uid
    }

    /// Whether `peer` may open streams to this workload.
    pub fn allows(&self, peer: &SpiffeId) -> bool {
        if self.spec.allow.is_empty() {
            return true;
        }
        let peer = peer.to_string();
        self.spec.allow.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => peer.starts_with(prefix),
            None => *p == peer,
        })
    }
}

/// What the policy host resolves a workload's policy from.
impl AsSubject for Workload {
    fn subject(&self) -> Subject<'_> {
        let s = &self.spec;
        Subject {
            uid: &s.uid,
            name: &s.name,
            namespace: &s.namespace,
            labels: &s.labels,
            annotations: &s.annotations,
            namespace_policy: s.namespace_policy.as_deref(),
        }
    }
}

/// An immutable view of all workloads.
#[derive(Debug, Default)]
pub struct WorkloadSnapshot {
    by_uid: BTreeMap<String, Arc<Workload>>,
    by_ip: HashMap<IpAddr, Arc<Workload>>,
    /// This node's workloads by (namespace, name): how a pod handed over
    /// under its Kubernetes uid finds its workload when the source keys
    /// workloads otherwise (istiod: `<cluster>//Pod/<ns>/<name>`).
    local_by_name: HashMap<(String, String), Arc<Workload>>,
    services: Vec<Arc<services::Service>>,
    by_vip: services::VipIndex,
    /// The mesh membership of each pod on this node, by uid — pods without
    /// an address yet included (a pod's CNI ADD comes before its IP). What
    /// the gateway answers `tidegate-cni` ADD with.
    members: BTreeMap<String, Membership>,
    /// The authorization policies, published with the workloads so a
    /// decision reads one consistent view.
    pub policies: Arc<PolicyStore>,
    /// The cluster's pod and Service ranges the workload source learned
    /// (beside `outbound.cluster_cidrs`).
    pub cluster_ranges: Arc<Vec<Cidr>>,
    /// Bumped on every publish.
    pub generation: u64,
}

impl WorkloadSnapshot {
    pub fn by_ip(&self, ip: IpAddr) -> Option<&Arc<Workload>> {
        self.by_ip.get(&ip)
    }

    pub fn by_uid(&self, uid: &str) -> Option<&Arc<Workload>> {
        self.by_uid.get(uid)
    }

    /// The workload of the pod a node agent handed over as `uid`
    /// (`namespace`/`name`): the local workload of that uid — the
    /// Kubernetes source keys workloads by the pod's uid — else the local
    /// workload of that namespace and name (istiod keys them by
    /// `<cluster>//Pod/<namespace>/<name>`: the uids differ).
    pub fn pod_workload(&self, uid: &str, namespace: &str, name: &str) -> Option<&Arc<Workload>> {
        self.by_uid.get(uid).filter(|w| w.local).or_else(|| {
            self.local_by_name
                .get(&(namespace.to_owned(), name.to_owned()))
        })
    }

    /// The Service with `vip` as an address and `port` as a port.
    pub fn service_by_vip(&self, vip: IpAddr, port: u16) -> Option<&Arc<services::Service>> {
        self.by_vip.get(&(vip, port))
    }

    pub fn services(&self) -> &[Arc<services::Service>] {
        &self.services
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.by_uid.values()
    }

    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    /// The mesh membership of the local pod `uid`, when its source knows it.
    pub fn membership(&self, uid: &str) -> Option<Membership> {
        self.members.get(uid).copied()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
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
    /// over each other.
    publishing: std::sync::Mutex<()>,
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

    /// Notified with the generation after every publish.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Replaces the whole set atomically. The specs were validated by their
    /// source (the file parser; Kubernetes discovery gives each IP one owner).
    /// Replaces the workloads, keeping the Services (resolved again
    /// against the new workloads).
    pub fn publish(&self, specs: Vec<WorkloadSpec>) {
        let services = self
            .current
            .load()
            .services
            .iter()
            .map(|s| s.spec.clone())
            .collect();
        self.publish_all(specs, services);
    }

    /// Replaces the workloads and the Services together. The membership of
    /// each local workload is its `protocol` (the workload file's rule:
    /// HBONE is a member).
    pub fn publish_all(&self, specs: Vec<WorkloadSpec>, services: Vec<services::ServiceSpec>) {
        let members = self.members_by_protocol(&specs, membership::Reason::WorkloadFile);
        let policies = self.current.load().policies.clone();
        self.publish_with_members(specs, services, members, policies);
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

    /// Replaces the workloads, the Services, the local pods' mesh
    /// membership and the authorization policies together (Kubernetes
    /// discovery: [`membership::decide`]).
    pub fn publish_with_members(
        &self,
        specs: Vec<WorkloadSpec>,
        services: Vec<services::ServiceSpec>,
        members: BTreeMap<String, Membership>,
        policies: Arc<PolicyStore>,
    ) {
        self.publish_snapshot(specs, services, members, policies);
    }

    /// Replaces the workloads, the Services and the authorization policies
    /// together (the workload file).
    pub fn publish_file(&self, file: file::Parsed) {
        let members = self.members_by_protocol(&file.workloads, membership::Reason::WorkloadFile);
        self.publish_snapshot(
            file.workloads,
            file.services,
            members,
            Arc::new(file.policies),
        );
    }

    /// Replaces the workloads, the Services and the authorization policies
    /// together (istiod's delta xDS).
    pub fn publish_istio(
        &self,
        specs: Vec<WorkloadSpec>,
        services: Vec<services::ServiceSpec>,
        policies: Arc<PolicyStore>,
    ) {
        let members = self.members_by_protocol(&specs, membership::Reason::Istio);
        self.publish_snapshot(specs, services, members, policies);
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
        let _one = self.publishing.locked();
        let current = self.current.load_full();
        let Some(w) = current.by_uid(uid) else {
            return false;
        };
        self.removed
            .locked()
            .insert(uid.to_owned(), Some(w.spec.clone()));
        self.republish(&current, None);
        true
    }

    /// The pod `uid` (`namespace`/`name`) is back — its node agent handed
    /// it over again — and with it its workload, if removed: published
    /// again as its source last listed it (matched as
    /// [`WorkloadSnapshot::pod_workload`] matches).
    pub fn restore(&self, uid: &str, namespace: &str, name: &str) {
        let _one = self.publishing.locked();
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
            self.republish(&self.current.load_full(), Some(spec));
        }
    }

    /// `current` again (with `extra`), through the removed workloads.
    fn republish(&self, current: &WorkloadSnapshot, extra: Option<WorkloadSpec>) {
        let specs = current
            .iter()
            .map(|w| w.spec.clone())
            .chain(extra)
            .collect();
        let services = current.services.iter().map(|s| s.spec.clone()).collect();
        let (members, policies) = (current.members.clone(), current.policies.clone());
        self.publish_unlocked(specs, services, members, policies, false);
    }

    /// A source's publish.
    fn publish_snapshot(
        &self,
        specs: Vec<WorkloadSpec>,
        services: Vec<services::ServiceSpec>,
        members: BTreeMap<String, Membership>,
        policies: Arc<PolicyStore>,
    ) {
        let _one = self.publishing.locked();
        self.publish_unlocked(specs, services, members, policies, true);
    }

    /// `from_source`: `specs` is the source's whole set, which removed
    /// workloads are checked against (kept out while it lists them, their
    /// latest spec kept; forgotten once it does not).
    fn publish_unlocked(
        &self,
        specs: Vec<WorkloadSpec>,
        services: Vec<services::ServiceSpec>,
        members: BTreeMap<String, Membership>,
        policies: Arc<PolicyStore>,
        from_source: bool,
    ) {
        let specs = {
            let mut removed = self.removed.locked();
            if from_source && !removed.is_empty() {
                // One pass over the source's set, not one per removal.
                let listed: std::collections::HashSet<&str> =
                    specs.iter().map(|s| s.uid.as_str()).collect();
                removed.retain(|uid, _| listed.contains(uid.as_str()));
            }
            if removed.is_empty() {
                specs
            } else {
                let mut kept = Vec::with_capacity(specs.len());
                for spec in specs {
                    match removed.get_mut(&spec.uid) {
                        Some(latest) => *latest = Some(spec),
                        None => kept.push(spec),
                    }
                }
                kept
            }
        };
        let generation = self.current.load().generation + 1;
        let mut snap = WorkloadSnapshot {
            generation,
            members,
            policies,
            cluster_ranges: self.learned_ranges.locked().clone(),
            ..Default::default()
        };
        for spec in specs {
            let identity =
                SpiffeId::new(&self.trust_domain, &spec.namespace, &spec.service_account);
            let w = Arc::new(Workload {
                local: spec.node == self.node,
                identity,
                spec,
            });
            for ip in &w.spec.ips {
                snap.by_ip.insert(*ip, w.clone());
            }
            if w.local {
                let key = (w.spec.namespace.clone(), w.spec.name.clone());
                snap.local_by_name.insert(key, w.clone());
            }
            snap.by_uid.insert(w.spec.uid.clone(), w);
        }
        (snap.services, snap.by_vip) = services::resolve(services, &snap.by_uid);
        self.current.store(Arc::new(snap));
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
mod tests {
    use super::*;
    use std::time::Duration;

    fn spec(uid: &str, node: &str, protocol: Protocol) -> WorkloadSpec {
        WorkloadSpec {
            uid: uid.into(),
            name: uid.into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
            ips: vec![],
            node: node.into(),
            protocol,
            state: LifecycleState::Running,
            labels: Default::default(),
            annotations: Default::default(),
            allow: vec![],
            authorization_policies: vec![],
            workload_name: None,
            waypoint: None,
            other_network: false,
            oci_backend_draining: false,
            namespace_policy: None,
            deletion_deadline_unix_ms: None,
            services: vec![],
            ports: Default::default(),
        }
    }

    #[test]
    fn a_workload_lends_the_policy_host_what_resolves_its_policy() {
        let mut s = spec("u", "n1", Protocol::Hbone);
        s.name = "w".into();
        s.labels.insert("app".into(), "web".into());
        s.annotations
            .insert(crate::policy::POLICY_ANNOTATION.into(), "a".into());
        s.namespace_policy = Some("d".into());
        let store = WorkloadStore::new("td", "n1");
        store.publish(vec![s.clone()]);
        let snap = store.snapshot();
        let w = snap.by_uid("u").unwrap();
        let got = w.subject();
        assert_eq!(
            (got.uid, got.name, got.namespace, got.namespace_policy),
            ("u", "w", "ns", Some("d"))
        );
        assert_eq!(got.labels, &s.labels);
        assert_eq!(got.annotations, &s.annotations);
    }

    #[test]
    fn a_workload_files_local_members_are_its_hbone_workloads() {
        let store = WorkloadStore::new("td", "n1");
        store.publish(vec![
            spec("a", "n1", Protocol::Hbone),
            spec("b", "n1", Protocol::Tcp),
            spec("c", "n2", Protocol::Hbone),
        ]);
        let snap = store.snapshot();
        assert_eq!(snap.membership("a").map(|m| m.member), Some(true));
        assert_eq!(snap.membership("b").map(|m| m.member), Some(false));
        assert_eq!(snap.membership("c"), None, "another node's pod");
    }

    #[tokio::test]
    async fn membership_waits_for_the_pod_to_be_published_and_no_longer() {
        let store = WorkloadStore::new("td", "n1");
        assert_eq!(store.membership("a", Duration::ZERO).await, None);
        let waiting = {
            let store = store.clone();
            tokio::spawn(async move { store.membership("a", Duration::from_secs(60)).await })
        };
        // Published once the waiter is subscribed or not: either way it sees it.
        store.publish(vec![spec("other", "n1", Protocol::Hbone)]);
        store.publish(vec![spec("a", "n1", Protocol::Hbone)]);
        let got = waiting.await.unwrap().expect("published while waiting");
        assert!(got.member);
        assert_eq!(got.reason, membership::Reason::WorkloadFile);
    }

    #[test]
    fn a_removed_workload_leaves_its_services_now_and_stays_out_while_its_source_lists_it() {
        use services::{ServicePort, ServiceSpec};
        let store = WorkloadStore::new("td", "n1");
        let mut a = spec("a", "n1", Protocol::Hbone);
        a.ips = vec![IpAddr::from([10, 0, 0, 1])];
        a.services = vec!["web".into()];
        let mut b = spec("b", "n2", Protocol::Hbone);
        b.ips = vec![IpAddr::from([10, 0, 0, 2])];
        b.services = vec!["web".into()];
        let web = ServiceSpec {
            name: "web".into(),
            namespace: "ns".into(),
            vips: vec![IpAddr::from([10, 96, 0, 1])],
            ports: vec![ServicePort {
                port: 80,
                target_port: None,
                protocol: "TCP".into(),
            }],
            endpoints: None,
            endpoint_targets: Default::default(),
            hostname: None,
            subject_alt_names: vec![],
            waypoints: vec![],
        };
        store.publish_all(vec![a.clone(), b.clone()], vec![web.clone()]);
        let endpoints = |store: &WorkloadStore| -> Vec<String> {
            let snap = store.snapshot();
            let svc = snap
                .service_by_vip(IpAddr::from([10, 96, 0, 1]), 80)
                .unwrap();
            svc.endpoints[&80]
                .iter()
                .map(|e| e.workload.uid().to_owned())
                .collect()
        };
        assert_eq!(endpoints(&store), ["a", "b"]);
        assert!(store.remove("a"));
        assert!(!store.remove("nobody"));
        assert_eq!(
            endpoints(&store),
            ["b"],
            "out of the Service in the same publish"
        );
        // The source still lists it (a changed spec): it stays out, its
        // latest spec kept.
        let mut a2 = a.clone();
        a2.labels.insert("v".into(), "2".into());
        store.publish_all(vec![a2.clone(), b.clone()], vec![web.clone()]);
        assert_eq!(endpoints(&store), ["b"]);
        // Handed over again: back, as the source last listed it.
        store.restore("other-uid", "ns", "a");
        assert_eq!(endpoints(&store), ["a", "b"]);
        assert_eq!(store.snapshot().by_uid("a").unwrap().spec.labels, a2.labels);
        // Removed again, then the source drops it: forgotten (listed
        // again later, it is a new workload and published).
        assert!(store.remove("a"));
        store.publish_all(vec![b.clone()], vec![web.clone()]);
        store.publish_all(vec![a.clone(), b.clone()], vec![web]);
        assert_eq!(endpoints(&store), ["a", "b"]);
    }
}
