//! A peer's drain, seen from its clients' gateway: peer-terminating and
//! peer-deleted decided by the terminating peer's policy (or a local client's
//! override), executed on this gateway's pooled tunnels to that peer, and
//! remembered for `GET /drains` (`peer_drains`) with the connect-failing
//! decisions (backoffs) of the same peer.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;
use tidegate_sdk as sdk;
use tokio::time::Instant;
use tracing::info;

use super::engine::{lock, DrainEngine, Outcome, RETAIN};
use crate::identity::SpiffeId;
use crate::policy::{Selection, PEER_POLICY_ANNOTATION};
use crate::proxy::pool::Tunnel;
use crate::workloads::{Workload, WorkloadSnapshot};

/// Decisions kept per peer (the oldest go first).
const MAX_DECISIONS: usize = 32;

/// One decision about a peer, as `GET /drains` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PeerDecision {
    /// `peer-terminating`, `peer-deleted` or `connect-failing`.
    pub event: &'static str,
    pub policy: String,
    pub version: Option<String>,
    /// Why that policy: `annotation`, `client-override`, `default`, … (see
    /// the README's precedence).
    pub selected_by: &'static str,
    /// The local source identities it was decided for.
    pub clients: Vec<String>,
    pub actions: Vec<String>,
    /// Pooled tunnels to the peer evicted by these actions.
    pub tunnels_evicted: usize,
    pub at_unix_ms: u128,
}

/// A peer's drain: who it is and what this gateway decided about it.
#[derive(Clone, Debug, Serialize)]
pub struct PeerDrainView {
    /// The peer's uid, or its address when no workload is known there.
    pub peer: String,
    /// `namespace/name`, when known.
    pub workload: Option<String>,
    pub identity: Option<String>,
    pub decisions: Vec<PeerDecision>,
}

/// The policy deciding a peer's event for some local clients.
struct Decider {
    selection: Selection,
    /// A local workload of the group (the decision's subject for timers).
    client: Arc<Workload>,
    /// The group's source identities: its actions touch their tunnels only.
    sources: Vec<SpiffeId>,
}

pub(super) struct PeerDrain {
    view: PeerDrainView,
    last: Instant,
}

impl DrainEngine {
    /// A peer we pool tunnels to is terminating or was deleted: decided, for
    /// the local clients with tunnels to it, by the peer's own policy (what
    /// discovery says of it) unless a client names another with
    /// `tidegate.io/peer-drain-policy`; clients with different answers get
    /// a decision each, acting on their own tunnels only. Nothing happens
    /// when no tunnel (pooled or draining) goes to the peer. Returns one
    /// outcome per decision.
    pub fn on_peer(self: &Arc<Self>, peer: &Arc<Workload>, deleted: bool) -> Vec<Outcome> {
        // Draining ones too: evicted "when idle" at peer-terminating, they
        // may still carry streams a peer-deleted decision cuts.
        let tunnels: Vec<_> = self
            .pool
            .tunnels()
            .into_iter()
            .chain(self.pool.draining())
            .filter(|t| t.key.dst_uid == peer.uid())
            .collect();
        let kind = if deleted {
            "peer-deleted"
        } else {
            "peer-terminating"
        };
        let snapshot = self.workloads.snapshot();
        let mut outcomes = Vec::new();
        for Decider {
            selection,
            client,
            sources,
        } in self.deciders(peer, &tunnels, &snapshot)
        {
            let mine: Vec<&Arc<Tunnel>> = tunnels
                .iter()
                .filter(|t| sources.contains(&t.key.src))
                .collect();
            let state = sdk::PeerState {
                peer: peer_info(peer, &mine[0].key.dst_addr.to_string()),
                pooled_tunnels: mine.len() as u32,
                active_streams: mine.iter().map(|t| t.streams()).sum::<usize>() as u32,
            };
            let event = if deleted {
                sdk::Event::PeerDeleted(state)
            } else {
                sdk::Event::PeerTerminating(state)
            };
            let decision = self.policies.decide(&selection, &event);
            let executed =
                self.execute_for(&client, &decision.actions, Instant::now(), Some(&sources));
            info!(
                peer = peer.uid(),
                event = kind,
                policy = %decision.policy,
                selected_by = selection.by.label(),
                actions = ?executed.descriptions,
                "peer decision"
            );
            self.remember_peer(
                peer.uid(),
                Some(peer),
                PeerDecision {
                    event: kind,
                    policy: decision.policy.clone(),
                    version: decision.version.clone(),
                    selected_by: selection.by.label(),
                    clients: sources.iter().map(ToString::to_string).collect(),
                    actions: executed.descriptions.clone(),
                    tunnels_evicted: executed.tunnels_evicted,
                    at_unix_ms: now_unix_ms(),
                },
            );
            outcomes.push(Outcome {
                uid: peer.uid().to_owned(),
                event: kind,
                duplicate: false,
                policy: Some(decision.policy),
                version: decision.version,
                fallback: decision
                    .fallback
                    .map(|f| format!("{}: {}", f.kind, f.detail)),
                actions: executed.descriptions,
                teardown: None,
            });
        }
        outcomes
    }

    /// The local clients of `tunnels` grouped by the policy that decides the
    /// peer's events for them.
    fn deciders(
        &self,
        peer: &Workload,
        tunnels: &[Arc<Tunnel>],
        snapshot: &WorkloadSnapshot,
    ) -> Vec<Decider> {
        let mut groups: BTreeMap<String, Decider> = BTreeMap::new();
        for t in tunnels {
            let src = &t.key.src;
            if groups.values().any(|d| d.sources.contains(src)) {
                continue;
            }
            // Pooled tunnels are shared by the local workloads of one
            // identity: one of them that overrides speaks for them all.
            let mut locals = snapshot.iter().filter(|w| w.local && w.identity == *src);
            let Some(first) = locals.next() else { continue };
            let client = std::iter::once(first)
                .chain(locals)
                .find(|w| w.spec.annotations.contains_key(PEER_POLICY_ANNOTATION))
                .unwrap_or(first)
                .clone();
            let selection = self.policies.select_for_peer(peer, &client);
            groups
                .entry(selection.name.clone())
                .or_insert_with(|| Decider {
                    selection,
                    client,
                    sources: Vec::new(),
                })
                .sources
                .push(src.clone());
        }
        groups.into_values().collect()
    }

    /// Records a decision about a peer (by uid, or destination address).
    pub(super) fn remember_peer(&self, key: &str, peer: Option<&Workload>, d: PeerDecision) {
        let mut book = lock(&self.book);
        let entry = book
            .peers
            .entry(key.to_owned())
            .or_insert_with(|| PeerDrain {
                view: PeerDrainView {
                    peer: key.to_owned(),
                    workload: peer.map(|p| format!("{}/{}", p.spec.namespace, p.spec.name)),
                    identity: peer.map(|p| p.identity.to_string()),
                    decisions: Vec::new(),
                },
                last: Instant::now(),
            });
        if entry.view.decisions.len() == MAX_DECISIONS {
            entry.view.decisions.remove(0);
        }
        entry.view.decisions.push(d);
        entry.last = Instant::now();
        // Bounded under churn: peers without a decision for RETAIN go.
        book.peers.retain(|_, p| p.last.elapsed() <= RETAIN);
    }

    /// `GET /drains` `peer_drains`: the peers this gateway decided about.
    pub fn peer_drains(&self) -> Vec<PeerDrainView> {
        lock(&self.book)
            .peers
            .values()
            .map(|p| p.view.clone())
            .collect()
    }
}

/// What a policy is told about a peer.
pub(super) fn peer_info(peer: &Workload, address: &str) -> sdk::PeerInfo {
    sdk::PeerInfo {
        uid: peer.uid().to_owned(),
        name: peer.spec.name.clone(),
        namespace: peer.spec.namespace.clone(),
        identity: peer.identity.to_string(),
        address: address.to_owned(),
    }
}

pub(super) fn now_unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}
