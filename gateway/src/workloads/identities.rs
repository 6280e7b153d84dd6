//! Workload identities held once however many workloads carry them: a
//! Deployment's replicas share a service account, so the snapshot holds
//! one `spiffe://…` allocation for all of them, and building a workload
//! formats its identity only the first time it is seen.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};

use foldhash::HashSet;

use tidegate_protocol::identity::SpiffeId;

/// The identities the published workloads carry, by URI. One a workload
/// no longer holds is let go when the table has doubled since it was
/// last swept (amortised O(1) a workload).
#[derive(Debug, Default)]
pub(super) struct Identities {
    held: HashSet<ByUri>,
    swept_at: usize,
    /// The URI of the identity being looked up (reused: no allocation a
    /// lookup).
    scratch: String,
    /// The identity found last: a Deployment's replicas come one after
    /// another (a first answer in uid order), and theirs is found without
    /// formatting its URI. Held, it is never swept.
    last: Option<SpiffeId>,
}

impl Identities {
    /// The identity of `service_account` in `namespace` of `trust_domain`,
    /// shared with every workload that has it.
    pub fn get(&mut self, trust_domain: &str, namespace: &str, service_account: &str) -> SpiffeId {
        if let Some(last) = &self.last {
            let same = last.service_account() == service_account
                && last.namespace() == namespace
                && last.trust_domain() == trust_domain;
            if same {
                return last.clone();
            }
        }
        self.scratch.clear();
        SpiffeId::write_uri(&mut self.scratch, trust_domain, namespace, service_account);
        if let Some(held) = self.held.get(self.scratch.as_str()) {
            let id = held.0.clone();
            self.last = Some(id.clone());
            return id;
        }
        if self.held.len() >= 2 * self.swept_at + 1024 {
            self.held.retain(|id| id.0.is_shared());
            self.swept_at = self.held.len();
        }
        let id = SpiffeId::new(trust_domain, namespace, service_account);
        self.held.insert(ByUri(id.clone()));
        self.last = Some(id.clone());
        id
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.held.len()
    }
}

/// An identity hashed and compared by its URI, so the table is looked up
/// with a `&str`.
#[derive(Debug)]
struct ByUri(SpiffeId);

impl Hash for ByUri {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.as_str().hash(state);
    }
}

impl PartialEq for ByUri {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for ByUri {}

impl Borrow<str> for ByUri {
    fn borrow(&self) -> &str {
        self.0.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_allocation_per_identity_equal_to_a_fresh_one() {
        let mut ids = Identities::default();
        let a = ids.get("td", "shop", "web");
        let b = ids.get("td", "shop", "web");
        assert_eq!(a, SpiffeId::new("td", "shop", "web"));
        assert!(std::ptr::eq(a.as_str(), b.as_str()), "shared");
        let c = ids.get("td", "shop", "db");
        assert_ne!(a, c);
        assert_eq!(c.service_account(), "db");
        assert_eq!(ids.len(), 2);
    }

    #[test]
    fn identities_no_workload_holds_are_let_go() {
        let mut ids = Identities::default();
        let kept = ids.get("td", "ns", "kept");
        for i in 0..5000 {
            drop(ids.get("td", "ns", &format!("sa-{i}")));
        }
        assert!(ids.len() < 2100, "swept: {}", ids.len());
        let again = ids.get("td", "ns", "kept");
        assert!(
            std::ptr::eq(kept.as_str(), again.as_str()),
            "a held one stays"
        );
    }
}
