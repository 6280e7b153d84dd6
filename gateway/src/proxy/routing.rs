//! How captured connections to addresses that are no workload IP are
//! routed — a Service's endpoint choice, the cluster's ranges, how long an
//! unknown address waits — and the counters of those decisions.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::proxy::endpoints::EndpointPicker;

/// How destinations that are no workload IP are routed: Services, and the
/// cluster's ranges.
pub struct Routing {
    pub picker: EndpointPicker,
    pub cluster_cidrs: Vec<crate::config::Cidr>,
    pub unknown_in_cluster: crate::config::UnknownInCluster,
    /// How long an unknown address inside the ranges waits for discovery.
    pub unknown_wait: std::time::Duration,
    /// `tidegate_outbound_unknown_in_cluster_waits_total{result}`: waits
    /// for discovery that ended with the address `learned` or `refused`.
    waits: Family<ResultLabel, Counter>,
    /// `tidegate_outbound_unknown_in_cluster_waiting`: connections waiting now.
    pub(super) waiting: prometheus_client::metrics::gauge::Gauge,
    /// `tidegate_outbound_waypoint_total{result}`: connections to a
    /// destination with a waypoint, or on another network.
    waypoints: Family<ResultLabel, Counter>,
    /// `tidegate_outbound_passthrough_total`: connections sent on in plain
    /// TCP to their original destination (no workload, no Service).
    pub passthrough: prometheus_client::metrics::counter::Counter,
    /// `outbound.connect_attempts`.
    pub connect_attempts: u32,
    /// `tidegate_outbound_connect_retries_total{result}`: connections to a
    /// Service tried on another endpoint after a failed connect, by how
    /// they ended (`connected`, `failed`).
    retries: Family<ResultLabel, Counter>,
}

impl Routing {
    pub(super) fn waited(&self, result: &'static str) {
        self.waits.get_or_create(&ResultLabel { result }).inc();
    }

    pub(super) fn waypoint(&self, result: &'static str) {
        self.waypoints.get_or_create(&ResultLabel { result }).inc();
    }

    pub(super) fn retried(&self, result: &'static str) {
        self.retries.get_or_create(&ResultLabel { result }).inc();
    }

    pub fn new(
        picker: EndpointPicker,
        cfg: &crate::config::OutboundConfig,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Arc<Self> {
        let passthrough = prometheus_client::metrics::counter::Counter::default();
        registry.register(
            "outbound_passthrough",
            "Captured connections passed through in plain TCP (destination is no workload and no Service)",
            passthrough.clone(),
        );
        let waits = Family::default();
        registry.register(
            "outbound_unknown_in_cluster_waits",
            "Connections to an unknown address inside the cluster's ranges that waited for \
             discovery, by result (learned: it became known; refused: it did not in time)",
            waits.clone(),
        );
        let waypoints = Family::default();
        registry.register(
            "outbound_waypoint",
            "Connections to a destination with a waypoint, by result (routed: through it; \
             from_waypoint: the source is the waypoint, sent straight on; waypoint_*: refused, \
             never sent around it; other_network: a destination on another network, refused)",
            waypoints.clone(),
        );
        let retries = Family::default();
        registry.register(
            "outbound_connect_retries",
            "Connections to a Service tried on another endpoint after an endpoint's connect failed \
             (outbound.connect_attempts), by result (connected, failed)",
            retries.clone(),
        );
        let waiting = prometheus_client::metrics::gauge::Gauge::default();
        registry.register(
            "outbound_unknown_in_cluster_waiting",
            "Connections waiting now for discovery to learn their address",
            waiting.clone(),
        );
        Arc::new(Routing {
            picker,
            cluster_cidrs: cfg.cluster_cidrs.clone(),
            unknown_in_cluster: cfg.unknown_in_cluster,
            unknown_wait: cfg.unknown_in_cluster_wait,
            waits,
            waypoints,
            waiting,
            passthrough,
            connect_attempts: cfg.connect_attempts,
            retries,
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}
