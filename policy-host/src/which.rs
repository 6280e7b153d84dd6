//! Which policy a workload gets, as an operator sees and changes it:
//! run-time bindings (`PUT`/`DELETE /workloads/<uid>/policy`) and the
//! per-workload report of `/config_dump` and `tidegate workloads`.

use serde::Serialize;
use tidegate_base::sync::Locked;
use tracing::info;

use super::engine::{PolicyEngine, Selection};
use super::resolve::{SelectedBy, Skipped};
use crate::subject::AsSubject;

/// Why a run-time binding was refused.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(
        "no policy named {name:?} (known: {known}); upload it first with PUT /policies/{name}"
    )]
    UnknownPolicy { name: String, known: String },
}

/// A workload's policy as `/config_dump` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyReport {
    pub name: String,
    /// `admin`, `annotation`, `namespace`, `binding`, `default` or `fallback`.
    pub source: &'static str,
    /// The index in `policies.bindings` when `source` is `binding`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<usize>,
    /// The rule, in words.
    pub why: String,
    /// The version that decides; `None`: the fallback decides.
    pub version: Option<String>,
    pub loaded: bool,
    /// True while a drain is in progress: its policy and version were pinned
    /// when it started, and later changes apply to the next drain.
    pub pinned_by_drain: bool,
    /// Names passed over (e.g. an annotation naming no policy).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
}

impl PolicyEngine {
    /// The run-time binding of workload `uid`, if any.
    pub fn runtime_binding(&self, uid: &str) -> Option<String> {
        self.runtime_bindings.locked().get(uid).cloned()
    }

    /// Binds workload `uid` to `policy` at run time, above its annotation and
    /// the configured bindings; returns the binding it replaced. Not kept
    /// across restarts.
    pub fn bind(&self, uid: &str, policy: &str) -> Result<Option<String>, BindError> {
        if !self.is_known(policy) {
            let known: Vec<String> = self.list().into_iter().map(|p| p.name).collect();
            return Err(BindError::UnknownPolicy {
                name: policy.to_owned(),
                known: known.join(", "),
            });
        }
        let mut bindings = self.runtime_bindings.locked();
        let previous = bindings.insert(uid.to_owned(), policy.to_owned());
        self.metrics.runtime_bindings.set(bindings.len() as i64);
        info!(workload = uid, policy, previous = ?previous, "run-time policy binding set");
        Ok(previous)
    }

    /// Removes the run-time binding of `uid`; returns it.
    pub fn unbind(&self, uid: &str) -> Option<String> {
        let mut bindings = self.runtime_bindings.locked();
        let previous = bindings.remove(uid);
        self.metrics.runtime_bindings.set(bindings.len() as i64);
        if let Some(p) = &previous {
            info!(workload = uid, policy = %p, "run-time policy binding removed");
        }
        previous
    }

    /// What governs `workload`: the selection a drain in progress pinned,
    /// else what [`PolicyEngine::select`] would pick now.
    pub fn report(
        &self,
        workload: &(impl AsSubject + ?Sized),
        pinned: Option<&Selection>,
    ) -> PolicyReport {
        let fresh;
        let sel = match pinned {
            Some(s) => s,
            None => {
                fresh = self.pin(self.resolve(workload));
                &fresh
            }
        };
        let mut why = sel.why.to_string();
        if sel.version.is_none() && sel.by != SelectedBy::Fallback {
            why += &format!(
                "; not loaded, the fallback {} decides",
                self.cfg.fallback.name()
            );
        }
        PolicyReport {
            name: sel.name.clone(),
            source: sel.by.label(),
            binding: match sel.by {
                SelectedBy::Binding(i) => Some(i),
                _ => None,
            },
            why,
            version: sel.version.as_ref().map(|v| v.hash.clone()),
            loaded: sel.version.is_some(),
            pinned_by_drain: pinned.is_some(),
            skipped: sel.skipped.clone(),
        }
    }
}
