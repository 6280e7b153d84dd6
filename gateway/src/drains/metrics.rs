//! Drain metrics (ztunnel has none): drains by policy and trigger, how they
//! ended, duplicate events, teardown holds.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DrainLabels {
    pub policy: String,
    pub trigger: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndLabels {
    pub policy: String,
    /// `completed` (idle in time) or `forced` (a bound or deadline cut it).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    pub event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeadlineLabels {
    /// `goaway_delay`, `goaway_hard_deadline` or `teardown_hold`.
    pub deadline: &'static str,
}

#[derive(Clone, Debug)]
pub struct DrainMetrics {
    pub(super) started: Family<DrainLabels, Counter>,
    pub(super) ended: Family<EndLabels, Counter>,
    pub(super) duplicates: Family<EventLabels, Counter>,
    pub(super) actions: Family<ActionLabels, Counter>,
    pub(super) cut_to_grace: Family<DeadlineLabels, Counter>,
    pub(super) streams_at_start: Histogram,
    pub(super) streams_at_end: Histogram,
    pub(super) teardown_ack: Histogram,
    pub(super) teardown_timeouts: Counter,
}

impl DrainMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = DrainMetrics {
            started: Family::default(),
            ended: Family::default(),
            duplicates: Family::default(),
            actions: Family::default(),
            cut_to_grace: Family::default(),
            streams_at_start: Histogram::new(exponential_buckets(1.0, 4.0, 10)),
            streams_at_end: Histogram::new(exponential_buckets(1.0, 4.0, 10)),
            teardown_ack: Histogram::new(exponential_buckets(1e-3, 2.0, 16)),
            teardown_timeouts: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("drain");
        r.register(
            "started",
            "Drains started, by policy and trigger (admin, workload-file, cni, gateway)",
            m.started.clone(),
        );
        r.register(
            "ended",
            "Drains ended, by policy and result (completed, forced)",
            m.ended.clone(),
        );
        r.register(
            "duplicate_events",
            "Lifecycle transitions seen again (from another source) and ignored",
            m.duplicates.clone(),
        );
        r.register(
            "actions",
            "Actions executed, by action and result",
            m.actions.clone(),
        );
        r.register(
            "deadlines_cut_to_grace",
            "Deadlines about a terminating pod (GOAWAY delay and hard deadline, \
             teardown hold) cut to what was left of its termination grace",
            m.cut_to_grace.clone(),
        );
        r.register(
            "streams_at_start",
            "Inbound streams open when a drain started",
            m.streams_at_start.clone(),
        );
        r.register(
            "streams_at_end",
            "Inbound streams still open when a drain ended (cut if forced)",
            m.streams_at_end.clone(),
        );
        r.register(
            "teardown_ack_seconds",
            "Time from network teardown to its acknowledgement",
            m.teardown_ack.clone(),
        );
        r.register(
            "teardown_timeouts",
            "Teardowns acknowledged because the hold bound expired",
            m.teardown_timeouts.clone(),
        );
        m
    }

    pub(super) fn cut_to_grace(&self, deadline: &'static str) {
        self.cut_to_grace
            .get_or_create(&DeadlineLabels { deadline })
            .inc();
    }

    pub(super) fn action(&self, action: &'static str, result: &'static str) {
        self.actions
            .get_or_create(&ActionLabels { action, result })
            .inc();
    }
}
