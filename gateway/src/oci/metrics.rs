//! The drainer's metrics: retries, work-request latency, lifecycle event →
//! drain SUCCEEDED latency, re-asserted drains, capacity events, drains
//! that stopped on an error. The API calls themselves are counted by the
//! client (`tidegate_oci::CallMetrics`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabels {
    /// `etag` (412), `conflict` (409), `throttled` (429), `server` (5xx), `transport`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapacityLabels {
    /// What the policy chose: `remove-early` or `keep`.
    pub choice: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `drained`, `removed`, `undrained`, `failed`.
    pub result: &'static str,
}

#[derive(Clone, Debug)]
pub struct OciMetrics {
    pub(super) retries: Family<RetryLabels, Counter>,
    pub(super) work_request: Histogram,
    pub(super) drain_latency: Histogram,
    pub(super) reasserted: Counter,
    pub(super) capacity: Family<CapacityLabels, Counter>,
    pub(super) backends: Family<OutcomeLabels, Counter>,
}

impl OciMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = OciMetrics {
            retries: Family::default(),
            work_request: Histogram::new(exponential_buckets(1e-3, 2.0, 18)),
            drain_latency: Histogram::new(exponential_buckets(1e-3, 2.0, 18)),
            reasserted: Counter::default(),
            capacity: Family::default(),
            backends: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("oci");
        r.register(
            "retries",
            "OCI calls retried, by reason (etag, conflict, throttled, server, transport)",
            m.retries.clone(),
        );
        r.register(
            "work_request_seconds",
            "Time from a mutation's acceptance to its work request SUCCEEDED or FAILED",
            m.work_request.clone(),
        );
        r.register(
            "drain_latency_seconds",
            "Time from the lifecycle event to a backend's drain work request SUCCEEDED",
            m.drain_latency.clone(),
        );
        r.register(
            "drains_reasserted",
            "Backends found undrained again (another controller reset them) and drained again",
            m.reasserted.clone(),
        );
        r.register(
            "capacity_events",
            "Backend sets found at the configured backend limit, by the policy's choice",
            m.capacity.clone(),
        );
        r.register(
            "backends",
            "Backend changes completed, by result (drained, removed, undrained, failed)",
            m.backends.clone(),
        );
        m
    }

    pub(super) fn retry(&self, reason: &'static str) {
        self.retries.get_or_create(&RetryLabels { reason }).inc();
    }
}
