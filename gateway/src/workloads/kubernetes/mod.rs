//! Kubernetes discovery: workloads, identities, policy bindings and lifecycle
//! from the API server (kube-rs watchers), published to the [`WorkloadStore`].
//!
//! Watches (RBAC: get/list/watch on each; nothing else):
//! - pods on this node (`fieldSelector=spec.nodeName=<node_name>`) and pods
//!   elsewhere (`spec.nodeName!=<node_name>`), stripped on arrival to what a
//!   workload needs (uid, name, namespace, service account, node, IPs,
//!   phase, labels, annotations, deletionTimestamp, named container ports
//!   and the controller's owner reference) so memory stays bounded;
//! - namespaces, metadata only (mesh opt-in labels, policy label);
//! - `discovery.k8s.io/v1` EndpointSlices (`terminating` conditions: a peer
//!   terminating before its pod object says so);
//! - Services, when `workloads.kubernetes.services` is on (the default),
//!   stripped to ClusterIPs, TCP ports and the
//!   `tidegate.io/oci-backend-draining` annotation: routing by VIP, with
//!   the endpoints their EndpointSlices list (conditions `ready`, `serving`,
//!   `terminating`), target ports by number or by the pod's named
//!   container port;
//! - Istio's `security.istio.io/v1` AuthorizationPolicies and
//!   PeerAuthentications, when `workloads.kubernetes.authorization` is on
//!   (the default): converted as istiod converts them
//!   ([`authorization`]), published with the workloads, each pod naming
//!   the policies that select it. A cluster without the CRDs (404) has
//!   none: logged, and watched until they appear.
//!
//! Level-triggered: every change marks the set dirty; after
//! `workloads.kubernetes.debounce` the whole desired set is rebuilt from the
//! watch stores ([`desired::build`]), with the mesh membership of every pod
//! on this node ([`desired::members`], the rule of
//! [`super::membership`]), and published if it differs. The drain
//! engine derives lifecycle events by comparing snapshots, so a watch restart
//! or a relist after `410 Gone` (the watcher swaps a store only once the
//! relist is complete) republishes the same set and raises nothing, and a
//! transition that happened while a watch was down shows up in the next
//! snapshot exactly once. Nothing is published before every watch completed
//! its first list; [`KubernetesSource::synced`] turns true then (readiness).
//!
//! Failed requests are logged with the resource and retried with kube's
//! default exponential backoff (800 ms doubling to 30 s, with jitter); the
//! gateway keeps serving with the last published set meanwhile.

pub mod authorization;
pub mod desired;
mod metrics;

pub use metrics::KubernetesMetrics;

use crate::workloads::WholeSet;
use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, Namespace, Pod, PodSpec, PodStatus, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::core::{ApiResource, DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::Store;
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{watch, Notify};
use tracing::{info, warn};

use super::WorkloadStore;
use crate::config::KubernetesConfig;
use metrics::ResourceLabels;
use tidegate_authz::kubernetes::Conversion;
use tidegate_authz::PolicyStore;
use tidegate_base::shutdown::ShutdownWatch;
use tidegate_base::sync::Locked;
use tidegate_control::kube_client::{self, KubeClientError};

/// What discovery reads, as RBAC names it (API group, resource): the
/// ClusterRoles of a rendered `deploy/` kustomization grant get/list/watch on
/// exactly these and nothing else (services, Istio's security resources,
/// nodes and servicecidrs only when the config keeps those watches on, as
/// the base does);
/// `gateway/tests/manifests.rs` checks it.
pub const WATCHED_RESOURCES: [(&str, &str); 8] = [
    (
        <Pod as k8s_openapi::Resource>::GROUP,
        <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT,
    ),
    (
        <Namespace as k8s_openapi::Resource>::GROUP,
        <Namespace as k8s_openapi::Resource>::URL_PATH_SEGMENT,
    ),
    (
        <Service as k8s_openapi::Resource>::GROUP,
        <Service as k8s_openapi::Resource>::URL_PATH_SEGMENT,
    ),
    (
        <EndpointSlice as k8s_openapi::Resource>::GROUP,
        <EndpointSlice as k8s_openapi::Resource>::URL_PATH_SEGMENT,
    ),
    ("security.istio.io", "authorizationpolicies"),
    ("security.istio.io", "peerauthentications"),
    (
        <Node as k8s_openapi::Resource>::GROUP,
        <Node as k8s_openapi::Resource>::URL_PATH_SEGMENT,
    ),
    (
        <ServiceCIDR as k8s_openapi::Resource>::GROUP,
        <ServiceCIDR as k8s_openapi::Resource>::URL_PATH_SEGMENT,
    ),
];

/// The client `workloads.kubernetes` asks for.
pub async fn client_for(cfg: &KubernetesConfig) -> Result<Client, KubeClientError> {
    kube_client::client(kube_client::Settings {
        api_server: cfg.api_server.as_deref(),
        api_server_key: "workloads.kubernetes.api_server",
        kubeconfig: cfg.kubeconfig.as_deref(),
        kubeconfig_key: "workloads.kubernetes.kubeconfig",
    })
    .await
}

/// Watches the API server and publishes the workload set.
pub struct KubernetesSource {
    client: Client,
    node: String,
    cfg: KubernetesConfig,
    /// `outbound.learn_cluster_ranges`: watch Nodes and ServiceCIDRs.
    learn_ranges: bool,
    store: Arc<WorkloadStore>,
    metrics: KubernetesMetrics,
    synced: watch::Sender<bool>,
}

/// The watch stores, read whole when the set is rebuilt.
struct Readers {
    local_pods: Store<Pod>,
    remote_pods: Store<Pod>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    slices: Store<EndpointSlice>,
    services: Option<Store<Service>>,
    /// AuthorizationPolicies and PeerAuthentications.
    authorization: Option<(Store<DynamicObject>, Store<DynamicObject>)>,
    /// Nodes (their pod ranges) and ServiceCIDRs.
    ranges: Option<(Store<Node>, Store<ServiceCIDR>)>,
}

/// What the watch tasks tell the publisher.
struct Progress {
    dirty: Notify,
    listed: Mutex<HashSet<&'static str>>,
    expected: usize,
}

impl KubernetesSource {
    pub fn new(
        client: Client,
        node: &str,
        cfg: KubernetesConfig,
        store: Arc<WorkloadStore>,
        metrics: KubernetesMetrics,
        learn_ranges: bool,
    ) -> Self {
        KubernetesSource {
            client,
            node: node.to_owned(),
            cfg,
            learn_ranges,
            store,
            metrics,
            synced: watch::channel(false).0,
        }
    }

    /// True once every watch completed its first list and the set was published.
    pub fn synced(&self) -> watch::Receiver<bool> {
        self.synced.subscribe()
    }

    /// Runs the watches and the publisher until the drain signal fires.
    pub async fn run(self, mut drain: ShutdownWatch) {
        let progress = Arc::new(Progress {
            dirty: Notify::new(),
            listed: Mutex::new(HashSet::new()),
            expected: 4
                + usize::from(self.cfg.services)
                + 2 * usize::from(self.cfg.authorization)
                + 2 * usize::from(self.learn_ranges),
        });
        let mut tasks = tokio::task::JoinSet::new();
        let mut w = Watches {
            client: &self.client,
            progress: &progress,
            metrics: &self.metrics,
            tasks: &mut tasks,
        };
        let local = format!("spec.nodeName={}", self.node);
        let remote = format!("spec.nodeName!={}", self.node);
        let readers = Readers {
            local_pods: w.start_pods("local-pods", &local),
            remote_pods: w.start_pods("remote-pods", &remote),
            namespaces: w.start_meta::<Namespace>("namespaces"),
            slices: w.start::<EndpointSlice>(
                "endpointslices",
                watcher::Config::default(),
                strip_slice,
            ),
            services: self
                .cfg
                .services
                .then(|| w.start("services", watcher::Config::default(), strip_service)),
            authorization: self.cfg.authorization.then(|| {
                (
                    w.start_istio("authorizationpolicies", authorization::AUTHORIZATION_POLICY),
                    w.start_istio("peerauthentications", authorization::PEER_AUTHENTICATION),
                )
            }),
            ranges: self.learn_ranges.then(|| {
                let cidrs = Api::<ServiceCIDR>::all(self.client.clone());
                (
                    w.start("nodes", watcher::Config::default(), strip_node),
                    w.spawn(
                        "servicecidrs",
                        cidrs,
                        watcher::Config::default(),
                        Writer::default(),
                        strip_service_cidr,
                        true,
                    ),
                )
            }),
        };
        tokio::select! {
            _ = self.publish_loop(&readers, &progress) => {}
            _ = drain.signaled() => {}
        }
        tasks.abort_all();
    }

    async fn publish_loop(&self, readers: &Readers, progress: &Progress) {
        let mut last: Option<Published> = None;
        let mut last_unknown: Vec<String> = Vec::new();
        let mut last_outcomes = BTreeMap::new();
        loop {
            progress.dirty.notified().await;
            if progress.listed.locked().len() < progress.expected {
                continue;
            }
            // Coalesce a burst of events (a relist, a rollout) into one snapshot.
            tokio::time::sleep(self.cfg.debounce).await;
            let local_pods = readers.local_pods.state();
            let namespaces = readers.namespaces.state();
            let members = desired::members(&local_pods, &namespaces, &self.cfg);
            let stores = desired::Stores {
                pods: local_pods
                    .into_iter()
                    .chain(readers.remote_pods.state())
                    .collect(),
                namespaces,
                slices: readers.slices.state(),
                services: readers
                    .services
                    .as_ref()
                    .map(|s| s.state())
                    .unwrap_or_default(),
            };
            let previous = self.store.snapshot().policies.clone();
            let conversion = match &readers.authorization {
                Some((aps, pas)) => authorization::convert(
                    &self.cfg.root_namespace,
                    &aps.state(),
                    &pas.state(),
                    &previous,
                ),
                None => Conversion::default(),
            };
            authorization::report(&conversion.outcomes, &last_outcomes, &self.metrics);
            let desired = desired::build(&stores, &self.cfg, &conversion);
            last_outcomes = conversion.outcomes;
            let ranges = match &readers.ranges {
                Some((nodes, cidrs)) => desired::cluster_ranges(&nodes.state(), &cidrs.state()),
                None => Vec::new(),
            };
            if desired.unknown_endpoints != last_unknown {
                if !desired.unknown_endpoints.is_empty() {
                    info!(
                        count = desired.unknown_endpoints.len(),
                        endpoints = ?desired.unknown_endpoints.iter().take(5).collect::<Vec<_>>(),
                        "EndpointSlice endpoints name pods not (or no longer) in the pod store; \
                         ignored until the pod watch catches up"
                    );
                } else {
                    info!("EndpointSlice endpoints all resolved to known pods");
                }
                self.metrics
                    .unknown_endpoints
                    .set(desired.unknown_endpoints.len() as i64);
                last_unknown = desired.unknown_endpoints;
            }
            report_conflicts(
                last.as_ref().map_or(&[][..], |l| &l.5[..]),
                &desired.conflicts,
            );
            self.metrics
                .address_conflicts
                .set(desired.conflicts.len() as i64);
            let set = (
                desired.specs,
                desired.services,
                members,
                conversion.policies,
                ranges,
                desired.conflicts,
            );
            if last.as_ref() != Some(&set) {
                if last.as_ref().is_none_or(|l| l.4 != set.4) {
                    let ranges: Vec<String> = set.4.iter().map(ToString::to_string).collect();
                    info!(?ranges, "the cluster's pod and Service ranges (an unknown address inside them is never sent in plaintext)");
                }
                self.store.learn_cluster_ranges(set.4.clone());
                self.metrics.workloads.set(set.0.len() as i64);
                self.metrics.services.set(set.1.len() as i64);
                self.metrics.publishes.inc();
                self.store.publish(
                    WholeSet::new(set.0.clone())
                        .services(set.1.clone())
                        .members(set.2.clone())
                        .policies(Arc::new(set.3.clone()))
                        .held_closed(set.5.iter().map(|c| (c.resource(), vec![c.ip])).collect()),
                );
                if last.is_none() {
                    info!(
                        workloads = set.0.len(),
                        services = set.1.len(),
                        node = %self.node,
                        "Kubernetes discovery: first full sync published"
                    );
                }
                last = Some(set);
            }
            if !*self.synced.borrow() {
                self.metrics.synced.set(1);
                self.synced.send_replace(true);
            }
        }
    }
}

/// What the publisher last published: workloads, Services, local pods'
/// mesh membership, authorization policies, the cluster's ranges, the
/// addresses in conflict (held closed).
type Published = (
    Vec<super::WorkloadSpec>,
    Vec<super::services::ServiceSpec>,
    BTreeMap<String, super::membership::Membership>,
    PolicyStore,
    Vec<crate::config::Cidr>,
    Vec<desired::IpConflict>,
);

/// Says so once when an address comes into conflict (naming the pods)
/// and once when it leaves it, not on every rebuild.
fn report_conflicts(before: &[desired::IpConflict], now: &[desired::IpConflict]) {
    for c in now.iter().filter(|c| !before.contains(c)) {
        warn!(ip = %c.ip, pods = ?c.pods,
            "an address two running pods claim: neither is served on it, and connections to it are refused, until one of them leaves it");
    }
    for c in before.iter().filter(|c| !now.iter().any(|n| n.ip == c.ip)) {
        info!(ip = %c.ip, pods = ?c.pods, "an address's conflict is resolved");
    }
}

/// Starts watch tasks; each returns the reader of its store.
struct Watches<'a> {
    client: &'a Client,
    progress: &'a Arc<Progress>,
    metrics: &'a KubernetesMetrics,
    tasks: &'a mut tokio::task::JoinSet<()>,
}

impl Watches<'_> {
    fn start_pods(&mut self, resource: &'static str, fields: &str) -> Store<Pod> {
        self.start::<Pod>(
            resource,
            watcher::Config::default().fields(fields),
            strip_pod,
        )
    }

    fn start_meta<K>(&mut self, resource: &'static str) -> Store<PartialObjectMeta<K>>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        self.start::<PartialObjectMeta<K>>(resource, watcher::Config::default(), |m| {
            m.metadata.managed_fields = None;
        })
    }

    fn start<K>(
        &mut self,
        resource: &'static str,
        config: watcher::Config,
        strip: fn(&mut K),
    ) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        let api = Api::<K>::all(self.client.clone());
        self.spawn(resource, api, config, Writer::default(), strip, false)
    }

    /// A `security.istio.io/v1` resource; a 404 (the CRD is not installed)
    /// counts as an empty first list, logged, and the watch keeps retrying.
    fn start_istio(&mut self, resource: &'static str, kind: &str) -> Store<DynamicObject> {
        let ar: ApiResource = authorization::api_resource(kind);
        let api = Api::<DynamicObject>::all_with(self.client.clone(), &ar);
        let strip = |o: &mut DynamicObject| {
            o.metadata.managed_fields = None;
            o.data.as_object_mut().map(|d| d.remove("status"));
        };
        self.spawn(
            resource,
            api,
            watcher::Config::default(),
            Writer::new(ar),
            strip,
            true,
        )
    }

    fn spawn<K>(
        &mut self,
        resource: &'static str,
        api: Api<K>,
        config: watcher::Config,
        mut writer: Writer<K>,
        strip: fn(&mut K),
        absent_is_empty: bool,
    ) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Eq + Hash + Clone + Send + Sync,
    {
        let reader = writer.as_reader();
        let progress = self.progress.clone();
        let metrics = self.metrics.clone();
        let labels = ResourceLabels { resource };
        let objects = reader.clone();
        self.tasks.spawn(async move {
            let mut events = std::pin::pin!(watcher(api, config).default_backoff());
            let mut absent_logged = false;
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(e) => e.modify(strip),
                    Err(watcher::Error::InitialListFailed(kube::Error::Api(s)))
                        if absent_is_empty && s.code == 404 =>
                    {
                        if !absent_logged {
                            info!(
                                resource,
                                "not served by the API server (CRD not installed): none \
                                 enforced; watching until it appears"
                            );
                            absent_logged = true;
                        }
                        if progress.listed.locked().insert(resource) {
                            progress.dirty.notify_one();
                        }
                        continue;
                    }
                    Err(e) => {
                        metrics.watch_errors.get_or_create(&labels).inc();
                        warn!(resource, error = %e, "Kubernetes list/watch failed; retrying with backoff");
                        continue;
                    }
                };
                writer.apply_watcher_event(&event);
                match event {
                    Event::Init => {
                        metrics.lists.get_or_create(&labels).inc();
                        continue;
                    }
                    Event::InitApply(_) => continue,
                    Event::InitDone => {
                        progress.listed.locked().insert(resource);
                    }
                    Event::Apply(_) | Event::Delete(_) => {}
                }
                metrics
                    .objects
                    .get_or_create(&labels)
                    .set(objects.len() as i64);
                progress.dirty.notify_one();
            }
        });
        reader
    }
}

/// Keeps what a workload needs of a pod (bounded memory at cluster scale).
fn strip_pod(pod: &mut Pod) {
    let m = &mut pod.metadata;
    m.managed_fields = None;
    // The controller only (the workload name Istio's metrics report).
    m.owner_references = m.owner_references.take().and_then(|refs| {
        let controller = refs.into_iter().find(|r| r.controller == Some(true))?;
        Some(vec![controller])
    });
    if let Some(a) = m.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    pod.spec = pod.spec.take().map(|s| PodSpec {
        host_network: s.host_network,
        node_name: s.node_name,
        service_account_name: s.service_account_name,
        // Named ports only (a Service's targetPort by name).
        containers: s
            .containers
            .into_iter()
            .map(|c| Container {
                ports: c.ports.map(|ps| {
                    ps.into_iter()
                        .filter(|p| p.name.is_some())
                        .map(|p| ContainerPort {
                            name: p.name,
                            container_port: p.container_port,
                            protocol: p.protocol,
                            ..Default::default()
                        })
                        .collect()
                }),
                ..Default::default()
            })
            .filter(|c| c.ports.as_ref().is_some_and(|p| !p.is_empty()))
            .collect(),
        ..Default::default()
    });
    pod.status = pod.status.take().map(|s| PodStatus {
        phase: s.phase,
        pod_ip: s.pod_ip,
        pod_ips: s.pod_ips,
        ..Default::default()
    });
}

/// Keeps what routing needs of a Service: ClusterIPs, ports, the OCI opt-in.
fn strip_service(svc: &mut Service) {
    let m = &mut svc.metadata;
    m.managed_fields = None;
    m.owner_references = None;
    m.labels = None;
    m.annotations = m.annotations.take().and_then(|mut a| {
        let keep = a.remove(desired::OCI_DRAINING_ANNOTATION)?;
        Some([(desired::OCI_DRAINING_ANNOTATION.to_owned(), keep)].into())
    });
    svc.spec = svc.spec.take().map(|s| ServiceSpec {
        cluster_ip: s.cluster_ip,
        cluster_ips: s.cluster_ips,
        ports: s.ports.map(|ps| {
            ps.into_iter()
                .map(|p| ServicePort {
                    port: p.port,
                    target_port: p.target_port,
                    protocol: p.protocol,
                    ..Default::default()
                })
                .collect()
        }),
        ..Default::default()
    });
    svc.status = None;
}

/// Keeps a Node's pod ranges.
fn strip_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    node.metadata.labels = None;
    node.spec = node.spec.take().map(|s| NodeSpec {
        pod_cidr: s.pod_cidr,
        pod_cidrs: s.pod_cidrs,
        ..Default::default()
    });
    node.status = None;
}

/// Keeps a ServiceCIDR's ranges.
fn strip_service_cidr(c: &mut ServiceCIDR) {
    c.metadata.managed_fields = None;
    c.metadata.annotations = None;
    c.status = None;
}

fn strip_slice(slice: &mut EndpointSlice) {
    slice.metadata.managed_fields = None;
    slice.metadata.annotations = None;
    for ep in &mut slice.endpoints {
        ep.hints = None;
        ep.deprecated_topology = None;
        ep.hostname = None;
        ep.zone = None;
    }
}
