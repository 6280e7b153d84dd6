//! What this gateway decided about peers — the decisions of a peer's drain
//! seen from its clients' node, and connect-failing decisions — for
//! `GET /drains` (`peer_drains`). Bounded: the last decisions per peer, and
//! peers without a decision for a while are forgotten.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use tidegate_sdk as sdk;
use tokio::time::Instant;

use crate::workloads::Workload;

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

struct PeerDrain {
    view: PeerDrainView,
    last: Instant,
}

/// The peers this gateway decided about, by peer uid (or destination
/// address for a connect-failing one).
#[derive(Default)]
pub(super) struct PeerBook {
    peers: BTreeMap<String, PeerDrain>,
}

impl PeerBook {
    /// Records a decision about a peer; forgets peers without a decision for `retain`.
    pub(super) fn record(
        &mut self,
        key: &str,
        peer: Option<&Workload>,
        d: PeerDecision,
        retain: Duration,
    ) {
        let entry = self
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
        self.peers
            .retain(|k, p| k == key || p.last.elapsed() <= retain);
    }

    pub(super) fn views(&self) -> Vec<PeerDrainView> {
        self.peers.values().map(|p| p.view.clone()).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(n: usize) -> PeerDecision {
        PeerDecision {
            event: "peer-deleted",
            policy: format!("p{n}"),
            version: None,
            selected_by: "annotation",
            clients: vec![],
            actions: vec![],
            tunnels_evicted: n,
            at_unix_ms: 0,
        }
    }

    #[test]
    fn keeps_the_last_decisions_per_peer_and_forgets_quiet_peers() {
        let mut book = PeerBook::default();
        let hour = Duration::from_secs(3600);
        for n in 0..MAX_DECISIONS + 5 {
            book.record("a", None, decision(n), hour);
        }
        let views = book.views();
        assert_eq!(views.len(), 1);
        let kept = &views[0].decisions;
        assert_eq!(kept.len(), MAX_DECISIONS);
        assert_eq!(kept[0].tunnels_evicted, 5, "the oldest went first");
        // A record with no retention forgets every other quiet peer.
        book.record("b", None, decision(0), Duration::ZERO);
        let peers: Vec<_> = book.views().into_iter().map(|v| v.peer).collect();
        assert_eq!(peers, ["b"]);
    }
}
