//! Policy metrics: decisions, latency, failures, swaps, quarantines,
//! validation, and the counters plugins write through `host.metric`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

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
            let mut names = self.plugin_names.lock().unwrap();
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
