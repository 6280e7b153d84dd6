//! Kubernetes discovery metrics: what the watches hold (store size), how
//! often they fail and relist, what was published, and informer skew.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// `local-pods`, `remote-pods`, `namespaces`, `endpointslices`, `services`,
    /// `authorizationpolicies`, `peerauthentications`.
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `enforced`, `http_attributes_ignored`, `skipped`, `refused`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug)]
pub struct KubernetesMetrics {
    pub(super) objects: Family<ResourceLabels, Gauge>,
    pub(super) watch_errors: Family<ResourceLabels, Counter>,
    pub(super) lists: Family<ResourceLabels, Counter>,
    pub(super) workloads: Gauge,
    pub(super) services: Gauge,
    pub(super) publishes: Counter,
    pub(super) unknown_endpoints: Gauge,
    pub(super) address_conflicts: Gauge,
    pub(super) synced: Gauge,
    pub(super) authorization_resources: Family<OutcomeLabels, Gauge>,
}

impl KubernetesMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = KubernetesMetrics {
            objects: Family::default(),
            watch_errors: Family::default(),
            lists: Family::default(),
            workloads: Gauge::default(),
            services: Gauge::default(),
            publishes: Counter::default(),
            unknown_endpoints: Gauge::default(),
            address_conflicts: Gauge::default(),
            synced: Gauge::default(),
            authorization_resources: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("kubernetes");
        r.register(
            "objects",
            "Objects held by each watch (the discovery store size), by resource",
            m.objects.clone(),
        );
        r.register(
            "watch_errors",
            "Failed list/watch requests (retried with backoff), by resource",
            m.watch_errors.clone(),
        );
        r.register(
            "lists",
            "Full lists (the first sync and every relist, e.g. after 410 Gone), by resource",
            m.lists.clone(),
        );
        r.register(
            "workloads",
            "Workloads in the last published snapshot",
            m.workloads.clone(),
        );
        r.register(
            "services",
            "Services with a ClusterIP in the last published snapshot",
            m.services.clone(),
        );
        r.register(
            "publishes",
            "Snapshots published to the workload store",
            m.publishes.clone(),
        );
        r.register(
            "unknown_endpoints",
            "EndpointSlice endpoints naming a pod UID the pod watches do not hold (informer skew)",
            m.unknown_endpoints.clone(),
        );
        r.register(
            "address_conflicts",
            "Addresses two running pods claim: neither is served on them, and they are held \
             closed (connections refused, reason refused_address) until one pod leaves",
            m.address_conflicts.clone(),
        );
        r.register(
            "synced",
            "1 once every watch completed its first full list",
            m.synced.clone(),
        );
        r.register(
            "authorization_resources",
            "AuthorizationPolicy and PeerAuthentication resources by outcome: enforced, \
             http_attributes_ignored (enforced at L4 only), skipped (not for a node proxy), \
             refused (malformed: held at its last good version or closed)",
            m.authorization_resources.clone(),
        );
        m
    }
}
