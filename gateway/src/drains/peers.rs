//! A peer's drain, seen from its clients' gateway: peer-terminating and
//! peer-deleted decided by the terminating peer's policy (or a local client's
//! override), executed on this gateway's pooled tunnels to that peer, and
//! recorded in the [`PeerBook`](super::peer_book::PeerBook) for `GET /drains`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use tidegate_sdk as sdk;
use tokio::time::Instant;
use tracing::info;

use super::engine::{DrainEngine, Outcome};
use super::peer_book::PeerDrainView;
use super::peer_book::{peer_info, PeerDecision};
use super::state::unix_ms;
use crate::proxy::pool::Tunnel;
use crate::workloads::{Workload, WorkloadSnapshot};
use tidegate_base::sync::Locked;
use tidegate_policy_host::{Selection, PEER_POLICY_ANNOTATION};
use tidegate_protocol::identity::SpiffeId;

/// The policy deciding a peer's event for some local clients.
struct Decider {
    selection: Selection,
    /// A local workload of the group (the decision's subject for timers).
    client: Arc<Workload>,
    /// The group's source identities: its actions touch their tunnels only.
    sources: Vec<SpiffeId>,
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
            self.book.locked().record_peer(
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
                    at_unix_ms: unix_ms(SystemTime::now()),
                },
            );
            outcomes.push(Outcome::decided(
                peer.uid(),
                kind,
                decision,
                executed.descriptions,
            ));
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
            let mut locals = snapshot.locals().filter(|w| w.identity == *src);
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

    /// `GET /drains` `peer_drains`: the peers this gateway decided about.
    pub fn peer_drains(&self) -> Vec<PeerDrainView> {
        self.book.locked().peer_views()
    }
}
