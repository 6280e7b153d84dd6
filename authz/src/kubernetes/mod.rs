//! Istio's security resources straight from Kubernetes, without istiod:
//! `AuthorizationPolicy` and `PeerAuthentication` converted as istiod
//! converts them for a node proxy, and the policies each workload names.
//!
//! - [`resources`]: the objects as the API server holds them;
//! - [`authorization_policy`]: one `AuthorizationPolicy` → one policy (or
//!   none, when it is not for a node proxy);
//! - [`peer_authentication`]: PeerAuthentication → the shared STRICT
//!   policy and the per-workload port exceptions;
//! - [`Conversion`]: all of them at once, as published, and
//!   [`Conversion::policies_for`] a workload.

pub mod authorization_policy;
pub mod peer_authentication;
pub mod resources;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use crate::store::PolicyStore;
use crate::xds::ConvertError;
use crate::Policy;
use resources::{AuthorizationPolicySpec, Object, PeerAuthenticationSpec, WorkloadSelector};

/// How a resource came through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Converted whole.
    Enforced,
    /// Converted; HTTP attributes are left to waypoints (the message says
    /// which and what that does to the policy).
    HttpIgnored(String),
    /// Not for a node proxy (why); nothing is held for it.
    Skipped(String),
    /// Malformed (the error names the entry); held closed.
    Refused(String),
}

impl Outcome {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Enforced => "enforced",
            Outcome::HttpIgnored(_) => "http_attributes_ignored",
            Outcome::Skipped(_) => "skipped",
            Outcome::Refused(_) => "refused",
        }
    }
}

/// One resource's conversion: the key it is held under, the policy held
/// (none when skipped), and how.
#[derive(Clone, Debug, PartialEq)]
pub struct Converted {
    pub key: String,
    pub policy: Option<Policy>,
    pub outcome: Outcome,
}

impl Converted {
    /// A refused resource, held closed ([`ConvertError::closed`]).
    pub(crate) fn refused(key: String, err: &ConvertError) -> Converted {
        Converted {
            key,
            policy: err.closed(),
            outcome: Outcome::Refused(err.to_string()),
        }
    }
}

/// Every resource converted: the store to publish, each resource's
/// outcome, and what decides which policies a workload names.
#[derive(Debug, Default)]
pub struct Conversion {
    pub policies: PolicyStore,
    /// By key (`<namespace>/<name>` of the resource's policy).
    pub outcomes: BTreeMap<String, Outcome>,
    root_namespace: String,
    /// Held AuthorizationPolicies with a selector: (key, namespace, selector).
    selecting: Vec<(String, String, WorkloadSelector)>,
    peer_authentications: Vec<Object<PeerAuthenticationSpec>>,
}

impl Conversion {
    /// Converts every resource. `previous` holds the policies published
    /// last: a refused resource keeps its previous version in force
    /// rather than being held closed.
    pub fn new(
        root_namespace: &str,
        authorization_policies: &[Object<AuthorizationPolicySpec>],
        peer_authentications: Vec<Object<PeerAuthenticationSpec>>,
        previous: &PolicyStore,
    ) -> Conversion {
        let mut c = Conversion {
            root_namespace: root_namespace.to_owned(),
            ..Conversion::default()
        };
        for ap in authorization_policies {
            let converted = authorization_policy::convert(root_namespace, ap);
            if converted.policy.is_some() {
                if let Some(sel) = &ap.spec.selector {
                    c.selecting
                        .push((converted.key.clone(), ap.namespace.clone(), sel.clone()));
                }
            }
            c.hold(converted, previous);
        }
        for pa in &peer_authentications {
            if let Some(converted) =
                peer_authentication::convert(root_namespace, pa, &peer_authentications)
            {
                c.hold(converted, previous);
            }
        }
        if !peer_authentications.is_empty() {
            let strict = peer_authentication::static_strict(root_namespace);
            c.policies.insert(strict.key(), strict);
        }
        c.selecting.sort_by(|a, b| a.0.cmp(&b.0));
        c.peer_authentications = peer_authentications;
        c
    }

    fn hold(&mut self, converted: Converted, previous: &PolicyStore) {
        let Converted {
            key,
            policy,
            outcome,
        } = converted;
        let policy = match (&outcome, previous.get(&key)) {
            (Outcome::Refused(_), Some(last)) => Some(Policy::clone(last)),
            _ => policy,
        };
        if let Some(p) = policy {
            self.policies.insert(key.clone(), p);
        }
        self.outcomes.insert(key, outcome);
    }

    /// A resource whose spec does not read: refused, its last good
    /// version kept in force (nothing is known of it to hold it closed).
    pub fn unreadable(&mut self, key: String, message: String, previous: &PolicyStore) {
        if let Some(last) = previous.get(&key) {
            self.policies.insert(key.clone(), Policy::clone(last));
        }
        self.outcomes.insert(key, Outcome::Refused(message));
    }

    /// The keys of the WORKLOAD_SELECTOR policies a workload names, as
    /// istiod lists them: the AuthorizationPolicies of its namespace or
    /// of the root namespace whose selector selects it (sorted), then
    /// the PeerAuthentication-derived ones.
    pub fn policies_for(&self, namespace: &str, labels: &BTreeMap<String, String>) -> Vec<String> {
        let mut keys: Vec<String> = self
            .selecting
            .iter()
            .filter(|(_, ns, sel)| {
                (ns == namespace || *ns == self.root_namespace)
                    && sel.match_labels.is_some()
                    && sel.selects(labels)
            })
            .map(|(key, _, _)| key.clone())
            .collect();
        keys.extend(peer_authentication::keys_for(
            &self.root_namespace,
            &self.peer_authentications,
            namespace,
            labels,
        ));
        keys
    }
}
