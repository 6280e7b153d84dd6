//! The policies by key and by scope, and the decision for a connection to
//! a workload, in ztunnel's order (`DemandProxyState::assert_rbac`):
//!
//! 1. the policies in scope: GLOBAL ones, NAMESPACE ones of the workload's
//!    namespace, and the WORKLOAD_SELECTOR ones the workload names (a
//!    named policy not held is skipped, with a warning);
//! 2. dry-run DENY policies that match are logged only;
//! 3. any matching DENY refuses: `explicitly denied by: <ns>/<name>`;
//! 4. dry-run ALLOW policies are logged (and that none matched, when only
//!    dry-run ALLOWs exist);
//! 5. no ALLOW policy: allowed; a matching ALLOW: allowed; else refused:
//!    `allow policies exist, but none allowed`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use tracing::{info, warn};

use crate::policy::{Action, Connection, Policy, Scope};

/// The key GLOBAL policies are indexed under.
const GLOBAL: &str = "";

/// Every policy held, by key (`namespace/name` as its source names it),
/// with the GLOBAL and NAMESPACE ones also indexed by namespace (so a
/// decision walks its namespace's policies without a lookup per key).
#[derive(Clone, Debug, Default)]
pub struct PolicyStore {
    by_key: HashMap<String, Arc<Policy>>,
    by_namespace: BTreeMap<String, BTreeMap<String, Arc<Policy>>>,
    /// Keys whose latest version was refused, and why: what is held under
    /// them is an earlier version or the policy held closed (shown by
    /// `/config_dump`, never read by a decision).
    refused: HashMap<String, Refusal>,
}

/// Why the latest version of a policy was refused, and what stands in its
/// place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Arc<str>,
    pub held: Held,
}

/// What a refused policy's key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Held {
    /// The version before the refused one, still enforced.
    LastVersion,
    /// The policy held closed ([`crate::xds::ConvertError::closed`]).
    Closed,
    /// Nothing: its scope or action could not be read.
    Nothing,
}

/// Two stores are equal when they hold the same policies under the same
/// keys, refused for the same reasons.
impl PartialEq for PolicyStore {
    fn eq(&self, other: &Self) -> bool {
        self.by_key == other.by_key && self.refused == other.refused
    }
}

/// The destination as the decision reads it.
#[derive(Clone, Copy, Debug)]
pub struct Destination<'a> {
    pub namespace: &'a str,
    /// The keys of the WORKLOAD_SELECTOR policies that select it.
    pub policies: &'a [String],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny(Denial),
}

/// Why a connection is refused; displayed as ztunnel writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial {
    ExplicitlyDenied { namespace: String, name: String },
    NotAllowed,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::ExplicitlyDenied { namespace, name } => {
                write!(f, "explicitly denied by: {namespace}/{name}")
            }
            Denial::NotAllowed => f.write_str("allow policies exist, but none allowed"),
        }
    }
}

impl Decision {
    pub fn is_allow(&self) -> bool {
        matches!(self, Decision::Allow)
    }
}

fn index_of(p: &Policy) -> Option<&str> {
    match p.scope {
        Scope::Global => Some(GLOBAL),
        Scope::Namespace => Some(&p.namespace),
        Scope::WorkloadSelector => None,
    }
}

impl PolicyStore {
    /// Adds or replaces the policy under `key`, re-indexed by its scope
    /// (a policy whose scope changed leaves its old index).
    pub fn insert(&mut self, key: String, policy: Policy) {
        self.remove(&key);
        self.refused.remove(&key);
        let policy = Arc::new(policy);
        if let Some(ns) = index_of(&policy) {
            self.by_namespace
                .entry(ns.to_owned())
                .or_default()
                .insert(key.clone(), policy.clone());
        }
        self.by_key.insert(key, policy);
    }

    /// Marks the latest version under `key` as refused for `reason`, and
    /// says what is held in its place (insert a closed policy first).
    /// Cleared by the next insert or remove of `key`.
    pub fn refuse(&mut self, key: &str, reason: &str, held: Held) {
        let reason = reason.into();
        self.refused
            .insert(key.to_owned(), Refusal { reason, held });
    }

    /// Why the latest version under `key` was refused, if it was.
    pub fn refusal(&self, key: &str) -> Option<&Refusal> {
        self.refused.get(key)
    }

    /// Every refusal, by key (one that holds nothing is listed here only).
    pub fn refusals(&self) -> impl Iterator<Item = (&str, &Refusal)> {
        self.refused.iter().map(|(k, r)| (k.as_str(), r))
    }

    /// Every policy held, by key, in key order (for `/config_dump`).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Policy)> {
        let mut all: Vec<(&str, &Policy)> = self
            .by_key
            .iter()
            .map(|(k, p)| (k.as_str(), p.as_ref()))
            .collect();
        all.sort_unstable_by_key(|(k, _)| *k);
        all.into_iter()
    }

    /// Removes the policy under `key`; whether one was held.
    pub fn remove(&mut self, key: &str) -> bool {
        self.refused.remove(key);
        let Some(old) = self.by_key.remove(key) else {
            return false;
        };
        if let Some(ns) = index_of(&old) {
            if let Some(keys) = self.by_namespace.get_mut(ns) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_namespace.remove(ns);
                }
            }
        }
        true
    }

    pub fn get(&self, key: &str) -> Option<&Arc<Policy>> {
        self.by_key.get(key)
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The policies in scope for `dest`, as a decision walks them: its
    /// namespace's, the global ones, then those it names (unknown keys
    /// skipped with a warning). A policy both indexed and named comes
    /// twice, which no decision can tell.
    fn walk<'a>(&'a self, dest: &Destination<'a>) -> impl Iterator<Item = &'a Policy> + Clone {
        let (namespace, names) = (dest.namespace, dest.policies);
        let indexed = |ns: &str| {
            self.by_namespace
                .get(ns)
                .into_iter()
                .flat_map(|m| m.values())
        };
        let global = (!namespace.is_empty()).then(|| indexed(GLOBAL));
        let named = names.iter().filter_map(|k| {
            let p = self.by_key.get(k);
            if p.is_none() {
                warn!(policy = %k, "skipping unknown policy");
            }
            p
        });
        indexed(namespace)
            .chain(global.into_iter().flatten())
            .chain(named)
            .map(Arc::as_ref)
    }

    /// The policies in scope for `dest`, each once.
    pub fn in_scope<'a>(&'a self, dest: &Destination<'a>) -> Vec<&'a Policy> {
        let mut seen = BTreeSet::new();
        self.walk(dest)
            .filter(|p| seen.insert((p.namespace.as_str(), p.name.as_str())))
            .collect()
    }

    /// The decision for `conn` to `dest`.
    pub fn decide(&self, dest: &Destination<'_>, conn: &Connection<'_>) -> Decision {
        if self.by_key.is_empty() {
            return Decision::Allow;
        }
        decide_over(self.walk(dest), conn)
    }
}

/// The decision for `conn` under `policies` (those in scope).
pub fn decide(policies: &[&Policy], conn: &Connection<'_>) -> Decision {
    decide_over(policies.iter().copied(), conn)
}

fn decide_over<'p>(
    policies: impl Iterator<Item = &'p Policy> + Clone,
    conn: &Connection<'_>,
) -> Decision {
    let of = |action: Action, dry: bool| {
        policies
            .clone()
            .filter(move |p| p.action == action && p.dry_run == dry)
    };
    for p in of(Action::Deny, true) {
        if p.matches(conn) {
            info!(policy = %p.key(), "dry-run: deny policy match");
        }
    }
    if let Some(p) = of(Action::Deny, false).find(|p| p.matches(conn)) {
        return Decision::Deny(Denial::ExplicitlyDenied {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
        });
    }
    let mut dry_allow_matched = false;
    let mut dry_allows = false;
    for p in of(Action::Allow, true) {
        dry_allows = true;
        if p.matches(conn) {
            dry_allow_matched = true;
            info!(policy = %p.key(), "dry-run: allow policy match");
        }
    }
    let mut allows = of(Action::Allow, false).peekable();
    if allows.peek().is_none() {
        if dry_allows && !dry_allow_matched {
            info!("dry-run: no allow policies match");
        }
        return Decision::Allow;
    }
    if allows.any(|p| p.matches(conn)) {
        Decision::Allow
    } else {
        Decision::Deny(Denial::NotAllowed)
    }
}
