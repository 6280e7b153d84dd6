//! The istiod source: holds what the delta ADS stream delivered — every
//! `istio.workload.Address` (a Workload or a Service) and every
//! `istio.security.Authorization`, by resource name — and applies what
//! each response changed to the [`WorkloadStore`]: the resources it names
//! and what they touch ([`Assembly`]), never the whole set.
//!
//! Each resource is decoded and converted on its own ([`convert`]); one
//! that does not read is refused (the client NACKs it, naming it and the
//! reason) and whatever was held under its name before stays. An
//! authorization policy refused with nothing held is held closed
//! ([`tidegate_authz::xds::ConvertError::closed`]): trust never widens
//! because a policy could not be read. Removals are applied as they
//! come; nothing is cleared on a reconnect (the client tells istiod what
//! it holds, and istiod answers with what changed).
//!
//! [`IstioSource::synced`] turns true once the first response of each
//! subscribed type has been applied (readiness waits for it, as
//! ztunnel's does).

use std::collections::BTreeSet;
use std::sync::Arc;

use prost::Message as _;
use tidegate_authz::{Held, PolicyStore};
use tidegate_xds::client::{ADDRESS, AUTHORIZATION};
use tidegate_xds::workload::{address, Address};
use tidegate_xds::{Handler, Rejected, Update};
use tokio::sync::watch;
use tracing::{info, warn};

use super::assembly::Assembly;
use super::convert;
use crate::workloads::WorkloadStore;

/// A response of at least this many resources (a first answer, a
/// reconnect's in a large cluster) leaves tens of MB freed at once: their
/// pages are returned to the kernel as soon as it is applied.
const RETURN_FREED_AFTER: usize = 10_000;

pub struct IstioSource {
    store: Arc<WorkloadStore>,
    held: Assembly,
    policies: PolicyStore,
    /// The policies changed since the last publish.
    policies_changed: bool,
    answered: BTreeSet<String>,
    synced: watch::Sender<bool>,
}

impl IstioSource {
    pub fn new(store: Arc<WorkloadStore>) -> IstioSource {
        IstioSource {
            store,
            held: Assembly::default(),
            policies: PolicyStore::default(),
            policies_changed: false,
            answered: BTreeSet::new(),
            synced: watch::channel(false).0,
        }
    }

    /// True once every subscribed type has been answered.
    pub fn synced(&self) -> watch::Receiver<bool> {
        self.synced.subscribe()
    }

    fn addresses(&mut self, updates: Vec<Update>, removed: Vec<String>) -> Vec<Rejected> {
        let mut rejected = Vec::new();
        self.held.reserve(updates.len());
        for u in updates {
            let refuse = |reason: String| Rejected {
                name: u.name.clone(),
                reason,
            };
            let digest = self.held.digest(&u.value);
            if self.held.holds(&u.name, digest) {
                continue;
            }
            let address = match Address::decode(u.value.as_ref()) {
                Ok(a) => a,
                Err(e) => {
                    rejected.push(refuse(format!(
                        "does not decode as istio.workload.Address: {e}"
                    )));
                    continue;
                }
            };
            match address.r#type {
                Some(address::Type::Workload(w)) => match convert::workload(&w)
                    .and_then(|c| c.check_trust_domain(self.store.trust_domain()).map(|()| c))
                {
                    Ok(c) => self.held.put_workload(u.name, c, digest),
                    Err(e) => {
                        let addresses = convert::addresses_named(&w.addresses);
                        warn!(name = %u.name, reason = %e, ?addresses,
                            "workload refused; its addresses are held closed unless a version is held");
                        self.held.refuse(u.name.clone(), addresses);
                        rejected.push(refuse(e.to_string()));
                    }
                },
                Some(address::Type::Service(s)) => match convert::service(&s) {
                    Ok(c) => self.held.put_service(u.name, c),
                    Err(e) => {
                        let vips = s.addresses.iter().map(|a| a.address.clone());
                        let addresses = convert::addresses_named(&vips.collect::<Vec<_>>());
                        warn!(name = %u.name, reason = %e, ?addresses,
                            "Service refused; its addresses are held closed unless a version is held");
                        self.held.refuse(u.name.clone(), addresses);
                        rejected.push(refuse(e.to_string()));
                    }
                },
                None => rejected.push(refuse(
                    "an Address with neither a workload nor a service".into(),
                )),
            }
        }
        let not_held: Vec<String> = removed
            .into_iter()
            .filter(|name| !self.held.remove(name))
            .collect();
        if !not_held.is_empty() {
            // One line a response, however many names it removes.
            warn!(count = not_held.len(), first = ?&not_held[..not_held.len().min(5)],
                "istiod removed addresses that were not held");
        }
        rejected
    }

    fn authorizations(&mut self, updates: Vec<Update>, removed: Vec<String>) -> Vec<Rejected> {
        let mut rejected = Vec::new();
        self.policies_changed = true;
        for u in updates {
            let converted = tidegate_authz::xds::decode(u.value.as_ref())
                .map_err(|e| {
                    (
                        format!("does not decode as istio.security.Authorization: {e}"),
                        None,
                    )
                })
                .and_then(|a| a.to_policy().map_err(|e| (e.to_string(), e.closed())));
            match converted {
                Ok(policy) => self.policies.insert(u.name, policy),
                Err((reason, closed)) => {
                    let held = if self.policies.get(&u.name).is_some() {
                        warn!(name = %u.name, %reason, "authorization policy refused; its last version stays");
                        Held::LastVersion
                    } else if let Some(closed) = closed {
                        warn!(name = %u.name, %reason, "authorization policy refused; held closed");
                        self.policies.insert(u.name.clone(), closed);
                        Held::Closed
                    } else {
                        warn!(name = %u.name, %reason, "authorization policy refused");
                        Held::Nothing
                    };
                    self.policies.refuse(&u.name, &reason, held);
                    rejected.push(Rejected {
                        name: u.name,
                        reason,
                    });
                }
            }
        }
        for name in removed {
            self.policies.remove(&name);
        }
        rejected
    }

    /// Applies what changed since the last publish.
    fn publish(&mut self) {
        let store = &self.store;
        let mut delta = self.held.take_delta(|uid| store.spec(uid));
        if std::mem::take(&mut self.policies_changed) {
            delta.policies = Some(Arc::new(self.policies.clone()));
        }
        self.store.apply(delta);
    }
}

impl Handler for IstioSource {
    fn handle(
        &mut self,
        type_url: &str,
        updates: Vec<Update>,
        removed: Vec<String>,
    ) -> Vec<Rejected> {
        let resources = updates.len();
        let rejected = match type_url {
            ADDRESS => self.addresses(updates, removed),
            AUTHORIZATION => self.authorizations(updates, removed),
            _ => return Vec::new(),
        };
        self.publish();
        if resources >= RETURN_FREED_AFTER {
            // The response and what was converted from it are freed: give
            // the pages back now, not over the allocator's decay time.
            if let Some((before, after)) = crate::allocator::return_freed() {
                info!(
                    resources,
                    returned_mib = before.saturating_sub(after) >> 20,
                    "a large response applied; its freed memory returned to the kernel"
                );
            }
        }
        if self.answered.insert(type_url.to_owned()) && self.answered.len() == 2 {
            info!(
                workloads = self.held.workloads_len(),
                services = self.held.services_len(),
                policies = self.policies.len(),
                "istiod's first answers applied"
            );
            self.synced.send_replace(true);
        }
        rejected
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tidegate_xds::workload::{Workload, WorkloadStatus, WorkloadType};

    use super::*;
    use crate::workloads::FormerlyKnown;

    fn pod(trust_domain: &str) -> Update {
        let w = Workload {
            uid: "Kubernetes//Pod/shop/web-1".into(),
            name: "web-1".into(),
            namespace: "shop".into(),
            addresses: vec![Bytes::from_static(&[10, 9, 0, 1])],
            trust_domain: trust_domain.into(),
            service_account: "web".into(),
            node: "node-b".into(),
            status: WorkloadStatus::Healthy as i32,
            workload_type: WorkloadType::Pod as i32,
            ..Default::default()
        };
        let value = Address {
            r#type: Some(address::Type::Workload(w)),
        };
        Update {
            name: "Kubernetes//Pod/shop/web-1".into(),
            version: "1".into(),
            value: value.encode_to_vec().into(),
        }
    }

    /// A workload only tidegate refuses (another trust domain) makes its
    /// address more closed, never less: refused, not unknown; accepted
    /// later, it is routed; removed, it stays the mesh's as departed.
    #[test]
    fn a_refused_workloads_address_is_held_closed() {
        let store = WorkloadStore::new("cluster.local", "node-a");
        let mut source = IstioSource::new(store.clone());
        let ip = std::net::IpAddr::from([10, 9, 0, 1]);
        let rejected = source.handle(ADDRESS, vec![pod("other.domain")], vec![]);
        assert_eq!(rejected.len(), 1, "NACKed");
        let known = store.snapshot().formerly_known(ip);
        assert!(
            matches!(&known, Some(FormerlyKnown::Refused { resource }) if resource.contains("web-1")),
            "{known:?}"
        );
        assert!(source.handle(ADDRESS, vec![pod("")], vec![]).is_empty());
        let snap = store.snapshot();
        assert_eq!(snap.formerly_known(ip), None);
        assert!(snap.by_ip(ip).is_some());
        let gone = vec!["Kubernetes//Pod/shop/web-1".to_owned()];
        assert!(source.handle(ADDRESS, vec![], gone).is_empty());
        let label = store.snapshot().formerly_known(ip).map(|k| k.label());
        assert_eq!(label, Some("departed"));
    }
}
