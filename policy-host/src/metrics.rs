//! Policy metrics: decisions, latency, failures, swaps, quarantines,
//! validation, and the counters plugins write through `host.metric`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tidegate_base::sync::Locked;
use tidegate_sdk::EVENT_KINDS;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub policy: String,
    pub event: &'static str,
    /// `plugin` or the fallback's name.
    pub decided_by: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub policy: String,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginCounterLabels {
    pub policy: String,
    pub name: String,
}

type HistogramFamily = Family<PolicyLabels, Histogram, fn() -> Histogram>;

/// Most distinct `host.metric` names one policy may create.
const PLUGIN_COUNTERS_PER_POLICY: usize = 16;

#[derive(Clone)]
pub struct PolicyMetrics {
    pub(super) decisions: Family<DecisionLabels, Counter>,
    pub(super) latency: HistogramFamily,
    pub(super) failures: Family<KindLabels, Counter>,
    pub(super) swaps: Family<KindLabels, Counter>,
    pub(super) quarantines: Family<PolicyLabels, Counter>,
    pub(super) ignored: Family<KindLabels, Counter>,
    pub(super) clamped: Family<PolicyLabels, Counter>,
    /// Run-time bindings in force (`PUT /workloads/<uid>/policy`).
    pub(super) runtime_bindings: Gauge,
    plugin_counters: Family<PluginCounterLabels, Counter>,
    plugin_names: Arc<Mutex<HashMap<String, HashSet<String>>>>,
}

impl std::fmt::Debug for PolicyMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PolicyMetrics")
    }
}

fn latency_histogram() -> Histogram {
    // 250 ns .. ~65 ms
    Histogram::new(exponential_buckets(250e-9, 2.0, 19))
}

impl Default for PolicyMetrics {
    fn default() -> Self {
        PolicyMetrics {
            decisions: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            failures: Family::default(),
            swaps: Family::default(),
            quarantines: Family::default(),
            ignored: Family::default(),
            clamped: Family::default(),
            runtime_bindings: Gauge::default(),
            plugin_counters: Family::default(),
            plugin_names: Arc::default(),
        }
    }
}

/// One plugin version's series of `policy_decisions` (decided by the
/// plugin, per event kind) and `policy_decision_latency_seconds`, looked
/// up in their families once, on first use, instead of on every decision
/// (a label clone, a hash and a lock each: a fifth of the engine's own
/// cost per decision, measured).
pub(super) struct DecisionSeries {
    metrics: PolicyMetrics,
    policy: String,
    decided: [OnceLock<Counter>; EVENT_KINDS.len()],
    latency: OnceLock<Histogram>,
}

impl DecisionSeries {
    pub(super) fn new(metrics: &PolicyMetrics, policy: &str) -> Self {
        DecisionSeries {
            metrics: metrics.clone(),
            policy: policy.to_owned(),
            decided: Default::default(),
            latency: OnceLock::new(),
        }
    }

    /// `policy_decisions{policy, event, decided_by="plugin"}`.
    pub(super) fn decided(&self, event: &'static str) -> &Counter {
        let i = EVENT_KINDS
            .iter()
            .position(|k| *k == event)
            .expect("an event kind of EVENT_KINDS");
        self.decided[i].get_or_init(|| {
            self.metrics
                .decisions
                .get_or_create(&DecisionLabels {
                    policy: self.policy.clone(),
                    event,
                    decided_by: PLUGIN,
                })
                .clone()
        })
    }

    /// `policy_decision_latency_seconds{policy}`.
    pub(super) fn latency(&self) -> &Histogram {
        self.latency.get_or_init(|| {
            self.metrics
                .latency
                .get_or_create(&PolicyLabels {
                    policy: self.policy.clone(),
                })
                .clone()
        })
    }
}

/// `decided_by` of a decision the plugin made.
pub(super) const PLUGIN: &str = "plugin";

impl PolicyMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = PolicyMetrics::default();
        let r = registry.sub_registry_with_prefix("policy");
        r.register(
            "decisions",
            "Events decided, by policy, event kind and who decided (plugin or fallback)",
            m.decisions.clone(),
        );
        r.register(
            "decision_latency_seconds",
            "Time to decide one event with a warm instance",
            m.latency.clone(),
        );
        r.register(
            "failures",
            "Plugin calls that failed, by kind (trap, timeout, memory, invalid, init, quarantined)",
            m.failures.clone(),
        );
        r.register(
            "swaps",
            "Policy loads and swaps, by result (ok or the refusal reason)",
            m.swaps.clone(),
        );
        r.register(
            "quarantines",
            "Plugin versions quarantined after repeated failures",
            m.quarantines.clone(),
        );
        r.register(
            "actions_ignored",
            "Actions dropped by validation, by reason",
            m.ignored.clone(),
        );
        r.register(
            "actions_clamped",
            "Numbers in actions clamped to the configured bounds",
            m.clamped.clone(),
        );
        r.register(
            "runtime_bindings",
            "Workloads bound to a policy at run time (PUT /workloads/<uid>/policy)",
            m.runtime_bindings.clone(),
        );
        r.register(
            "plugin_counter",
            "Counters written by plugins through host.metric",
            m.plugin_counters.clone(),
        );
        m
    }

    /// `host.metric`: names are `[a-z0-9_]{1,64}`, at most 16 per policy.
    pub(super) fn plugin_counter(&self, policy: &str, name: &str, delta: u64) {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !valid {
            return;
        }
        {
            let mut names = self.plugin_names.locked();
            let set = names.entry(policy.to_owned()).or_default();
            if !set.contains(name) {
                if set.len() >= PLUGIN_COUNTERS_PER_POLICY {
                    return;
                }
                set.insert(name.to_owned());
            }
        }
        self.plugin_counters
            .get_or_create(&PluginCounterLabels {
                policy: policy.to_owned(),
                name: name.to_owned(),
            })
            .inc_by(delta);
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    /// The cached series are the families' own: what a decision counts
    /// through them is what `/metrics` shows, per event kind.
    #[test]
    fn cached_series_count_in_the_exported_families() {
        let mut registry = Registry::default();
        let m = PolicyMetrics::register(&mut registry);
        let series = DecisionSeries::new(&m, "p");
        series.decided("shutdown-started").inc();
        series.decided("shutdown-started").inc();
        series.decided("timer-fired").inc();
        series.latency().observe(1e-6);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        for line in [
            r#"policy_decisions_total{policy="p",event="shutdown-started",decided_by="plugin"} 2"#,
            r#"policy_decisions_total{policy="p",event="timer-fired",decided_by="plugin"} 1"#,
            r#"policy_decision_latency_seconds_count{policy="p"} 1"#,
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        // No series for a kind that was never decided.
        assert!(!text.contains(r#"event="workload-added""#), "{text}");
    }
}
