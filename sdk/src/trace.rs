//! The `trace.yaml` format: a configuration, then events with the exact
//! actions expected for each. `sdk/README.md` ("Trace format") is the
//! normative description; these types are its reference parser, and
//! [`Trace::run`] plays a trace against a policy natively (the host's
//! `tidegate policy test` plays it against the built component).

use serde::{Deserialize, Serialize};

use crate::{Action, Event, Policy};

/// A whole trace file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Trace {
    /// Passed verbatim to `init`. Absent means the empty string.
    #[serde(default)]
    pub config: String,
    /// When present, `init` must fail with an error containing this text,
    /// and `steps` must be empty.
    #[serde(default)]
    pub init_error: Option<String>,
    /// What `host.now-ms` returns during `init` (and steps until one sets
    /// its own). Absent means 0.
    #[serde(default)]
    pub now_ms: u64,
    /// The events, delivered in order to one instance.
    #[serde(default)]
    pub steps: Vec<Step>,
}

/// One event and the actions expected for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Step {
    /// Free text shown in failure messages.
    #[serde(default)]
    pub name: Option<String>,
    /// What `host.now-ms` returns from this step on; never smaller than
    /// the value before it. Absent means unchanged.
    #[serde(default)]
    pub now_ms: Option<u64>,
    /// The event given to `decide`.
    pub event: Event,
    /// The exact list `decide` must return (same actions, same order, same
    /// values; floats compared as parsed `f64`). `[]` for none.
    pub expect: Vec<Action>,
}

impl Trace {
    /// Parses and checks a trace: the YAML shape, `init-error` without
    /// steps, and a clock that never goes backwards.
    pub fn from_yaml(text: &str) -> Result<Self, String> {
        let trace = parse_yaml::<Trace>(text).map_err(|e| format!("trace is not valid: {e}"))?;
        if trace.init_error.is_some() && !trace.steps.is_empty() {
            return Err("trace is not valid: `init-error` and `steps` exclude each other".into());
        }
        let mut now = trace.now_ms;
        for (i, step) in trace.steps.iter().enumerate() {
            if let Some(t) = step.now_ms {
                if t < now {
                    return Err(format!(
                        "trace is not valid: {}: now-ms {t} is before the previous {now}",
                        step.label(i)
                    ));
                }
                now = t;
            }
        }
        Ok(trace)
    }

    /// The clock value for each step (the `now-ms` rule applied).
    pub fn clock(&self) -> Vec<u64> {
        let mut now = self.now_ms;
        self.steps
            .iter()
            .map(|s| {
                now = s.now_ms.unwrap_or(now);
                now
            })
            .collect()
    }

    /// Plays the trace against `P` natively with the host stand-in's clock
    /// set as the trace says. Stops at the first mismatch with a message
    /// that shows the diff.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run<P: Policy>(&self) -> Result<(), String> {
        use crate::host::testing;

        testing::set_now_ms(Some(self.now_ms));
        let result = (|| {
            let mut policy = match (P::init(&self.config), &self.init_error) {
                (Ok(_), Some(want)) => {
                    return Err(format!(
                        "init succeeded, but the trace expects an error containing {want:?}"
                    ))
                }
                (Err(got), Some(want)) if got.contains(want.as_str()) => return Ok(()),
                (Err(got), Some(want)) => {
                    return Err(format!(
                        "init failed with {got:?}, which does not contain {want:?}"
                    ))
                }
                (Err(got), None) => return Err(format!("init failed: {got}")),
                (Ok(p), None) => p,
            };
            // The policy sees what the gateway would hand it: only the
            // metadata it declared.
            let reads = policy.reads();
            for (i, (step, now)) in self.steps.iter().zip(self.clock()).enumerate() {
                testing::set_now_ms(Some(now));
                let mut event = step.event.clone();
                reads.filter(&mut event);
                let actual = policy.decide(&event);
                if let Some(diff) = diff_actions(&step.expect, &actual) {
                    return Err(format!("{}: actions differ\n{diff}", step.label(i)));
                }
            }
            Ok(())
        })();
        testing::set_now_ms(None);
        result
    }
}

impl Step {
    /// `step 3 (network-teardown, "its name")`, counting from 1.
    pub fn label(&self, index: usize) -> String {
        match &self.name {
            Some(name) => format!("step {} ({}, {name:?})", index + 1, self.event.kind()),
            None => format!("step {} ({})", index + 1, self.event.kind()),
        }
    }
}

/// Parses YAML where enums are single-key maps (`goaway: {...}`), the
/// form every enum in a trace uses. (serde_yaml 0.9 alone expects `!tags`
/// for enums; `singleton_map_recursive` makes it read single-key maps.)
pub fn parse_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, serde_yaml::Error> {
    serde_yaml::with::singleton_map_recursive::deserialize(serde_yaml::Deserializer::from_str(text))
}

/// Writes `value` as YAML in the same single-key-map form.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, serde_yaml::Error> {
    let mut out = Vec::new();
    let mut ser = serde_yaml::Serializer::new(&mut out);
    serde_yaml::with::singleton_map_recursive::serialize(value, &mut ser)?;
    Ok(String::from_utf8(out).expect("serde_yaml writes UTF-8"))
}

/// `None` when the lists are equal; otherwise a line diff, one entry per
/// position: `  = [i] kind` for equal actions, `  - [i] …` expected and
/// `  + [i] …` actual (as one-line YAML) where they differ or one is
/// missing.
pub fn diff_actions(expected: &[Action], actual: &[Action]) -> Option<String> {
    if expected == actual {
        return None;
    }
    let mut out = String::new();
    for i in 0..expected.len().max(actual.len()) {
        match (expected.get(i), actual.get(i)) {
            (Some(e), Some(a)) if e == a => out.push_str(&format!("  = [{i}] {}\n", e.kind())),
            (e, a) => {
                if let Some(e) = e {
                    out.push_str(&format!("  - [{i}] {}\n", one_line(e)));
                }
                if let Some(a) = a {
                    out.push_str(&format!("  + [{i}] {}\n", one_line(a)));
                }
            }
        }
    }
    Some(format!(
        "  (- expected, + actual; {} expected, {} actual)\n{out}",
        expected.len(),
        actual.len()
    ))
}

fn one_line(action: &Action) -> String {
    // serde_json gives a compact single line; it shows the same names as YAML.
    serde_json::to_string(action).unwrap_or_else(|e| format!("<unprintable: {e}>"))
}
