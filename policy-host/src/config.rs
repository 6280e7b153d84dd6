//! The `policies:` section of the gateway's configuration: its types and
//! defaults. The gateway's `config` module re-exports them (its `Config`
//! holds one [`PoliciesConfig`]) and checks their ranges; the limits and
//! bounds they give the host are in `runtime.rs`, `plugin.rs` and
//! `validate.rs`, the fallbacks' behaviour in `fallback.rs`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_yaml::Value;
use tidegate_base::{duration, size};

/// Drain policies: plugins by name, bindings to workloads, limits.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoliciesConfig {
    /// Policy for workloads no annotation or binding selects. Unset: the fallback.
    pub default: Option<String>,
    /// Built-in policy used when a plugin cannot decide (trap, timeout, memory,
    /// invalid result, quarantine, not loaded).
    pub fallback: Fallback,
    /// Bound on one `decide` call (epoch deadline).
    #[serde(with = "duration")]
    pub call_deadline: Duration,
    /// Bound on `init` when an instance is (re)created.
    #[serde(with = "duration")]
    pub init_deadline: Duration,
    /// Linear memory cap per plugin instance.
    #[serde(deserialize_with = "size::deserialize_u32")]
    pub memory_limit: u32,
    /// A plugin version failing this many calls within `quarantine_window` is quarantined.
    pub quarantine_failures: usize,
    #[serde(with = "duration")]
    pub quarantine_window: Duration,
    /// Most actions taken from one decision.
    pub max_actions: usize,
    #[serde(with = "duration")]
    pub max_delay: Duration,
    #[serde(with = "duration")]
    pub max_deadline: Duration,
    #[serde(with = "duration")]
    pub max_hold: Duration,
    #[serde(with = "duration")]
    pub max_backoff: Duration,
    #[serde(with = "duration")]
    pub max_timer: Duration,
    /// How often plugin files are checked for changes.
    #[serde(with = "duration")]
    pub reload_interval: Duration,
    /// Policies by name.
    pub plugins: BTreeMap<String, PluginSpec>,
    /// First match wins; the workload annotation `tidegate.io/drain-policy` overrides.
    pub bindings: Vec<BindingSpec>,
}

impl Default for PoliciesConfig {
    fn default() -> Self {
        PoliciesConfig {
            default: None,
            fallback: Fallback::default(),
            call_deadline: Duration::from_millis(5),
            init_deadline: Duration::from_millis(200),
            memory_limit: 16 << 20,
            quarantine_failures: 5,
            quarantine_window: Duration::from_secs(60),
            max_actions: 32,
            max_delay: Duration::from_secs(60),
            max_deadline: Duration::from_secs(600),
            max_hold: Duration::from_secs(30),
            max_backoff: Duration::from_secs(300),
            max_timer: Duration::from_secs(3600),
            reload_interval: Duration::from_secs(2),
            plugins: Default::default(),
            bindings: Vec::new(),
        }
    }
}

/// `policies.fallback`: the built-in policy used when a plugin cannot decide
/// (its behaviour is in `fallback.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fallback {
    /// Option 4: do nothing; keepalives eventually notice dead tunnels.
    #[default]
    KeepaliveOnly,
    /// Option 1: graceful GOAWAY to the workload's inbound tunnels when its
    /// shutdown starts, hard deadline one second before the grace period ends.
    GoawayOnTermStart,
}

/// One policy: a component file and the configuration passed to its `init`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSpec {
    pub file: PathBuf,
    /// A string is passed verbatim; a mapping is passed as JSON.
    #[serde(default)]
    pub config: Value,
}

impl PluginSpec {
    pub fn config_text(&self) -> String {
        match &self.config {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            other => serde_json::to_string(other).unwrap_or_default(),
        }
    }
}

/// Binds workloads (by namespace and/or labels) to a policy.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BindingSpec {
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub selector: BTreeMap<String, String>,
    pub policy: String,
}
