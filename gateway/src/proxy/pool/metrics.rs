//! The pool's metrics (`tidegate_pool_*`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabel {
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Default)]
pub(super) struct PoolMetrics {
    pub(super) tunnels: Gauge,
    pub(super) opened: Counter,
    pub(super) dial_failures: Family<ReasonLabel, Counter>,
    pub(super) connect_refusals: Family<ReasonLabel, Counter>,
    pub(super) goaways_received: Counter,
    pub(super) closed: Family<ReasonLabel, Counter>,
    pub(super) backoffs: Counter,
    pub(super) fast_failed: Counter,
    pub(super) probes: Family<OutcomeLabel, Counter>,
}

impl PoolMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let m = PoolMetrics::default();
        let r = registry.sub_registry_with_prefix("pool");
        r.register(
            "tunnels",
            "Pooled outbound tunnels open now",
            m.tunnels.clone(),
        );
        r.register(
            "tunnels_opened",
            "Outbound tunnels dialed",
            m.opened.clone(),
        );
        r.register(
            "dial_failures",
            "Outbound tunnel dials that failed, by reason",
            m.dial_failures.clone(),
        );
        r.register(
            "connect_refusals",
            "CONNECTs whose failure marks their workload failing (5xx, a reset, no answer), by reason",
            m.connect_refusals.clone(),
        );
        r.register(
            "goaways_received",
            "Pooled tunnels that received GOAWAY from the peer",
            m.goaways_received.clone(),
        );
        r.register(
            "tunnels_closed",
            "Pooled tunnels closed, by reason",
            m.closed.clone(),
        );
        r.register(
            "backoff_activations",
            "Backoffs a policy set on a destination after connect failures",
            m.backoffs.clone(),
        );
        r.register(
            "backoff_fast_failures",
            "Application connections failed by their destination's backoff without a dial of their own: \
             at once when another endpoint may take them, else once the probe they waited for failed",
            m.fast_failed.clone(),
        );
        r.register(
            "backoff_probes",
            "Connections let through a backoff to a destination with no alternative, one at a time, \
             by outcome (succeeded: the backoff ended; failed: it runs on)",
            m.probes.clone(),
        );
        m
    }
}
