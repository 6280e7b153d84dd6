//! The 0.1.0 and 0.2.0 events: every string a WIT string of its own (one
//! copy into the sandbox each). Both versions share these types. The
//! newest contract's events and every version's actions are in
//! `convert.rs`, which follows the same rules.

use tidegate_sdk as sdk;

use super::bindings::types as wit;

/// The pairs of `m` the policy declared it reads: only those are copied
/// (here, and again into the sandbox).
fn pairs(
    m: &std::collections::BTreeMap<String, String>,
    keys: &sdk::Keys,
) -> Vec<(String, String)> {
    match keys {
        sdk::Keys::All => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        sdk::Keys::Only(keys) => keys
            .iter()
            .filter_map(|k| m.get_key_value(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

fn workload_info(w: &sdk::WorkloadInfo, reads: &sdk::MetadataReads) -> wit::WorkloadInfo {
    wit::WorkloadInfo {
        uid: w.uid.clone(),
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        identity: w.identity.clone(),
        labels: pairs(&w.labels, &reads.labels),
        annotations: pairs(&w.annotations, &reads.annotations),
    }
}

fn workload_state(w: &sdk::WorkloadState, reads: &sdk::MetadataReads) -> wit::WorkloadState {
    wit::WorkloadState {
        info: workload_info(&w.info, reads),
        inbound_tunnels: w.inbound_tunnels,
        inbound_streams: w.inbound_streams,
        outbound_pooled_tunnels: w.outbound_pooled_tunnels,
        age_ms: w.age_ms,
    }
}

fn peer_info(p: &sdk::PeerInfo) -> wit::PeerInfo {
    wit::PeerInfo {
        uid: p.uid.clone(),
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        identity: p.identity.clone(),
        address: p.address.clone(),
    }
}

fn peer_state(p: &sdk::PeerState) -> wit::PeerState {
    wit::PeerState {
        peer: peer_info(&p.peer),
        pooled_tunnels: p.pooled_tunnels,
        active_streams: p.active_streams,
    }
}

/// The event as the policy sees it: labels and annotations limited to
/// what it declared it `reads`.
pub fn event(e: &sdk::Event, reads: &sdk::MetadataReads) -> wit::Event {
    use sdk::Event as E;
    let state = |w: &sdk::WorkloadState| workload_state(w, reads);
    match e {
        E::WorkloadAdded(w) => wit::Event::WorkloadAdded(state(w)),
        E::WorkloadDeleted(w) => wit::Event::WorkloadDeleted(state(w)),
        E::ShutdownStarted(s) => wit::Event::ShutdownStarted(wit::ShutdownStarted {
            workload: state(&s.workload),
            grace_deadline_ms: s.grace_deadline_ms,
            grace_remaining_ms: s.grace_remaining_ms,
        }),
        E::NetworkTeardown(t) => wit::Event::NetworkTeardown(wit::NetworkTeardown {
            workload: state(&t.workload),
            since_shutdown_ms: t.since_shutdown_ms,
            max_hold_ms: t.max_hold_ms,
        }),
        E::PeerTerminating(p) => wit::Event::PeerTerminating(peer_state(p)),
        E::PeerDeleted(p) => wit::Event::PeerDeleted(peer_state(p)),
        E::ConnectFailing(c) => wit::Event::ConnectFailing(wit::ConnectFailing {
            destination: c.destination.clone(),
            peer: c.peer.as_ref().map(peer_info),
            consecutive_failures: c.consecutive_failures,
            last_error: c.last_error.clone(),
            failing_for_ms: c.failing_for_ms,
        }),
        E::GatewayShutdown(g) => wit::Event::GatewayShutdown(wit::GatewayShutdown {
            deadline_ms: g.deadline_ms,
            remaining_ms: g.remaining_ms,
            workloads: g.workloads.iter().map(state).collect(),
        }),
        E::TimerFired(t) => wit::Event::TimerFired(wit::TimerFired {
            subject: t.subject.clone(),
            tag: t.tag.clone(),
            workload: t.workload.as_ref().map(state),
        }),
    }
}
