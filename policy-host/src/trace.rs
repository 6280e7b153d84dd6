//! `tidegate policy test` and `tidegate policy check`: a plugin in the real
//! host, without a gateway — under the limits, action bounds and quarantine
//! rule of the `policies:` section the gateway would run it with.

use std::path::Path;
use std::sync::Arc;

use tidegate_sdk::trace::{diff_actions, Trace};

use super::plugin::{self_test_event, PluginVersion};
use super::runtime::{Clock, PolicyRuntime};
use super::validate::validate;
use super::PolicyMetrics;
use crate::config::PoliciesConfig;

fn runtime(cfg: &PoliciesConfig) -> Result<Arc<PolicyRuntime>, String> {
    PolicyRuntime::new(cfg.runtime_limits(), PolicyMetrics::default())
        .map_err(|e| format!("policy runtime: {e:#}"))
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Plays `trace` against the plugin; `Ok` carries the report, `Err` the
/// first problem (init, or every mismatching step with its diff).
pub fn test(plugin: &Path, trace: &Path, cfg: &PoliciesConfig) -> Result<String, String> {
    let bytes = read(plugin)?;
    let text =
        String::from_utf8(read(trace)?).map_err(|_| format!("{} is not UTF-8", trace.display()))?;
    let parsed = Trace::from_yaml(&text).map_err(|e| format!("{}: {e}", trace.display()))?;
    run_trace(&bytes, &parsed, cfg)
}

pub fn run_trace(bytes: &[u8], trace: &Trace, cfg: &PoliciesConfig) -> Result<String, String> {
    let rt = runtime(cfg)?;
    let bounds = cfg.bounds();
    let loaded = PluginVersion::load_unchecked(
        &rt,
        "trace",
        bytes,
        &trace.config,
        cfg.quarantine_rule(),
        Clock::Fixed(trace.now_ms),
    );
    let version = match (loaded, &trace.init_error) {
        (Ok(_), Some(want)) => {
            return Err(format!(
                "init succeeded, but the trace expects an error containing {want:?}"
            ))
        }
        (Err(super::LoadError::Init(got)), Some(want)) if got.contains(want.as_str()) => {
            return Ok(format!(
                "ok: init refused the configuration as expected: {got}"
            ))
        }
        (Err(e), Some(want)) => {
            return Err(format!(
                "expected an init error containing {want:?}, got: {e}"
            ))
        }
        (Err(e), None) => return Err(format!("plugin refused: {e}")),
        (Ok(v), None) => v,
    };
    let mut report = String::new();
    let mut failures = Vec::new();
    for (i, (step, now)) in trace.steps.iter().zip(trace.clock()).enumerate() {
        let label = step.label(i);
        match version.call_raw(&step.event, Clock::Fixed(now)) {
            Ok(actual) => {
                if let Some(diff) = diff_actions(&step.expect, &actual) {
                    failures.push(format!("{label}: actions differ\n{diff}"));
                    continue;
                }
                let v = validate(&step.event, actual, &bounds);
                let mut note = String::new();
                if !v.ignored.is_empty() {
                    note += &format!(" ({} would be ignored by the gateway)", v.ignored.len());
                }
                if v.clamped > 0 {
                    note += &format!(" ({} numbers would be clamped)", v.clamped);
                }
                report += &format!("  ok {label}{note}\n");
            }
            Err(f) => failures.push(format!("{label}: the plugin failed: {f}")),
        }
    }
    if failures.is_empty() {
        Ok(format!("{report}ok: {} steps passed", trace.steps.len()))
    } else {
        Err(format!(
            "{report}{}\nFAILED: {} of {} steps",
            failures.join("\n"),
            failures.len(),
            trace.steps.len()
        ))
    }
}

/// Validates a plugin as a swap would (version, imports, init with
/// `config`, the self-test event) and describes it.
pub fn check(plugin: &Path, config: &str, cfg: &PoliciesConfig) -> Result<String, String> {
    let bytes = read(plugin)?;
    let rt = runtime(cfg)?;
    let v = PluginVersion::load(&rt, "check", &bytes, config, cfg.quarantine_rule())
        .map_err(|e| format!("refused: {e}"))?;
    let event = self_test_event();
    let actions = v
        .call_raw(&event, Clock::Wall)
        .map_err(|f| format!("self-test event failed on a fresh instance: {f}"))?;
    let validated = validate(&event, actions, &cfg.bounds());
    let (exports, imports) = v.interface();
    let yaml = tidegate_sdk::trace::to_yaml(&validated.actions).unwrap_or_default();
    Ok(format!(
        "ok: {}\n  size: {} bytes\n  version: {}\n  contract: tidegate:policy@{} (host implements {})\n  reads: {}\n  exports: {}\n  imports: {}\n  self-test (shutdown-started) → {} action(s), {} ignored, {} clamped:\n{}",
        plugin.display(),
        v.size,
        v.hash,
        v.contract,
        super::version::HOST_CONTRACTS.join(", "),
        v.reads().map_or_else(|| "unknown".to_owned(), |r| describe_reads(&r)),
        exports.join(", "),
        if imports.is_empty() { "none".into() } else { imports.join(", ") },
        validated.actions.len(),
        validated.ignored.len(),
        validated.clamped,
        yaml.lines().map(|l| format!("    {l}\n")).collect::<String>()
    ))
}

/// `labels [app], annotations every key` for `tidegate policy check`.
fn describe_reads(r: &tidegate_sdk::MetadataReads) -> String {
    let keys = |k: &tidegate_sdk::Keys| match k {
        tidegate_sdk::Keys::All => "every key".to_owned(),
        tidegate_sdk::Keys::Only(keys) if keys.is_empty() => "none".to_owned(),
        tidegate_sdk::Keys::Only(keys) => format!("[{}]", keys.join(", ")),
    };
    format!(
        "labels {}, annotations {}",
        keys(&r.labels),
        keys(&r.annotations)
    )
}
