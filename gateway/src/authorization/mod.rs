//! Istio's L4 authorization on the inbound paths — CONNECTs on 15008 and
//! plaintext on 15006 — with the decision of [`tidegate_authz`] over the
//! policies of the current workload snapshot.
//!
//! Every inbound connection is registered before its first check
//! ([`Authorizer::admit`]); whenever the snapshot changes what a decision
//! reads (the policies, or the workload a connection goes to), the
//! connections it concerns are checked again and those no longer allowed
//! are told to close, logged with the reason and counted
//! ([`Authorizer::recheck_on_change`]). Registered first, a connection
//! cannot slip between its check and a change.

mod live;
mod metrics;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;

use tidegate_authz::{Connection, Decision, Denial, Destination, Identity};
use tracing::{debug, info};

pub use live::Admitted;
pub use metrics::AuthorizationMetrics;

use crate::workloads::{WorkloadSnapshot, WorkloadStore};
use tidegate_base::shutdown::ShutdownWatch;
use tidegate_protocol::identity::SpiffeId;

/// Which listener a connection came in on, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// A CONNECT in an HBONE tunnel (15008): the peer's identity is known.
    Hbone,
    /// Plaintext to a captured pod (15006): no identity.
    Plaintext,
}

impl Transport {
    fn label(self) -> &'static str {
        match self {
            Transport::Hbone => "hbone",
            Transport::Plaintext => "plaintext",
        }
    }
}

/// What a decision reads of one connection, fixed when it is accepted.
#[derive(Clone, Debug)]
pub struct Facts {
    /// The peer's address.
    pub src: SocketAddr,
    /// The workload's address and the target port (never 15008).
    pub dst: SocketAddr,
    /// The peer's identity; `None` on plaintext.
    pub identity: Option<Arc<Identity>>,
    /// The destination workload.
    pub workload_uid: String,
    pub transport: Transport,
}

/// Why a connection was not admitted.
#[derive(Debug)]
pub enum NotAdmitted {
    /// A policy refused it.
    Policy(Denial),
    /// Its workload left the snapshot between routing and the check.
    WorkloadGone,
}

/// The rules' view of a SPIFFE id, built once per tunnel.
pub fn identity_of(id: &SpiffeId) -> Arc<Identity> {
    Arc::new(Identity::new(
        id.trust_domain(),
        id.namespace(),
        id.service_account(),
    ))
}

/// The decision point: the live connections and what counts them.
pub struct Authorizer {
    workloads: Arc<WorkloadStore>,
    live: live::Registry,
    metrics: AuthorizationMetrics,
}

impl Authorizer {
    pub fn new(workloads: Arc<WorkloadStore>, metrics: AuthorizationMetrics) -> Arc<Self> {
        Arc::new(Authorizer {
            workloads,
            live: live::Registry::default(),
            metrics,
        })
    }

    /// Registers the connection, then decides on the current snapshot:
    /// its registration (told to close if a later change refuses it), or
    /// why it is refused — a policy, or its workload gone since it was
    /// routed (no decision can be made for a workload not held).
    pub fn admit(self: &Arc<Self>, facts: Facts) -> Result<Admitted, NotAdmitted> {
        let transport = facts.transport;
        let admitted = live::Registry::register(self, facts);
        match decide(&self.workloads.snapshot(), admitted.facts()) {
            Some(Decision::Allow) => Ok(admitted),
            Some(Decision::Deny(denial)) => {
                self.metrics.denied(transport.label(), &denial);
                debug!(reason = %denial, "connection refused by authorization policy");
                Err(NotAdmitted::Policy(denial))
            }
            None => {
                debug!(workload = %admitted.facts().workload_uid,
                    "connection refused: its workload left discovery after it was routed");
                Err(NotAdmitted::WorkloadGone)
            }
        }
    }

    /// Checks the live connections again after each change of the
    /// workload snapshot, until drained: all of them when the policies
    /// changed ([`Self::recheck`]), else those going to a workload that
    /// changed (O(change) to find out, nothing to check for a publish that
    /// changed only other workloads).
    pub async fn recheck_on_change(self: Arc<Self>, mut drain: ShutdownWatch) {
        let mut changed = self.workloads.subscribe();
        let mut previous = self.workloads.snapshot();
        self.metrics.policies(previous.policies.len());
        loop {
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                _ = drain.signaled() => return,
            }
            let current = self.workloads.snapshot();
            self.on_change(&previous, &current);
            previous = current;
        }
    }

    /// Checks what the change from `previous` to `current` concerns: every
    /// live connection when the policies changed, else those going to a
    /// workload that changed.
    fn on_change(&self, previous: &WorkloadSnapshot, current: &WorkloadSnapshot) -> Rechecked {
        if !Arc::ptr_eq(&current.policies, &previous.policies) {
            return self.recheck_where(current, |_| true);
        }
        let workloads: HashSet<&str> = current
            .changes_from(previous)
            .filter_map(|(old, new)| old.or(new))
            .map(|w| w.uid())
            .collect();
        if workloads.is_empty() {
            return Rechecked::default();
        }
        self.recheck_where(current, |uid| workloads.contains(uid))
    }

    /// Checks every live connection against the current snapshot and
    /// tells those now refused to close; how many were.
    pub fn recheck(&self) -> usize {
        self.recheck_where(&self.workloads.snapshot(), |_| true)
            .closed
    }

    /// Checks the live connections to the workloads `concerned` (by uid)
    /// against `snapshot`, and tells those now refused to close.
    fn recheck_where(
        &self,
        snapshot: &WorkloadSnapshot,
        concerned: impl Fn(&str) -> bool,
    ) -> Rechecked {
        self.metrics.policies(snapshot.policies.len());
        let mut done = Rechecked::default();
        for entry in self.live.entries() {
            if !concerned(&entry.facts().workload_uid) {
                continue;
            }
            done.checked += 1;
            if let Some(Decision::Deny(denial)) = decide(snapshot, entry.facts()) {
                let facts = entry.facts();
                info!(src = %facts.src, dst = %facts.dst, workload = %facts.workload_uid,
                    reason = %denial, "live connection closed by authorization policy");
                self.metrics.closed(facts.transport.label(), &denial);
                entry.close(denial);
                done.closed += 1;
            }
        }
        done
    }
}

/// What one recheck did: connections checked, and closed.
#[derive(Debug, Default, PartialEq, Eq)]
struct Rechecked {
    checked: usize,
    closed: usize,
}

/// The decision for `facts` on `snapshot`; `None` when the workload is
/// gone (its connections end with it, not by policy).
fn decide(snapshot: &WorkloadSnapshot, facts: &Facts) -> Option<Decision> {
    let workload = snapshot.by_uid(&facts.workload_uid)?;
    let dest = Destination {
        namespace: &workload.spec.namespace,
        policies: &workload.spec.authorization_policies,
    };
    let conn = Connection {
        src: facts.src,
        dst: facts.dst,
        identity: facts.identity.as_deref(),
    };
    Some(snapshot.policies.decide(&dest, &conn))
}

#[cfg(test)]
mod tests;
