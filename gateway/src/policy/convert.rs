//! Conversions between the SDK's native types (the gateway's domain model
//! for events and actions) and the generated WIT bindings.
//!
//! Like `sdk/src/convert.rs`, this is the build-time check that the host
//! converts every part of the WIT: events are built with struct literals (a
//! new WIT field fails to compile until it is filled), actions are
//! destructured without `..` and matched on every case (a new WIT field or
//! case fails to compile until it is converted). `tidegate-sdk`'s
//! `wit_contract` test checks that every record and case of the WIT is named
//! in both converters.

use tidegate_sdk as sdk;

use super::bindings::types as wit;
use super::bindings::v0_2::exports::tidegate::policy::policy;

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

/// What a 0.2.0 policy's `init` declared it reads.
pub fn reads(r: policy::MetadataReads) -> sdk::MetadataReads {
    let policy::MetadataReads {
        labels,
        annotations,
    } = r;
    sdk::MetadataReads {
        labels: sdk::Keys::from_list(labels),
        annotations: sdk::Keys::from_list(annotations),
    }
}

pub fn log_level(l: wit::LogLevel) -> sdk::LogLevel {
    match l {
        wit::LogLevel::Trace => sdk::LogLevel::Trace,
        wit::LogLevel::Debug => sdk::LogLevel::Debug,
        wit::LogLevel::Info => sdk::LogLevel::Info,
        wit::LogLevel::Warn => sdk::LogLevel::Warn,
        wit::LogLevel::Error => sdk::LogLevel::Error,
    }
}

pub fn action(a: wit::Action) -> sdk::Action {
    use wit::Action as A;
    match a {
        A::Goaway(wit::Goaway {
            workload,
            target,
            delay_ms,
            mode,
            hard_deadline_ms,
            close_notify,
        }) => sdk::Action::Goaway(sdk::Goaway {
            workload,
            target: match target {
                wit::GoawayTarget::Inbound => sdk::GoawayTarget::Inbound,
                wit::GoawayTarget::Outbound => sdk::GoawayTarget::Outbound,
                wit::GoawayTarget::Both => sdk::GoawayTarget::Both,
            },
            delay_ms,
            mode: match mode {
                wit::GoawayMode::Graceful => sdk::GoawayMode::Graceful,
                wit::GoawayMode::Immediate => sdk::GoawayMode::Immediate,
            },
            hard_deadline_ms,
            close_notify,
        }),
        A::Evict(wit::Evict { peer, when }) => sdk::Action::Evict(sdk::Evict {
            peer,
            when: match when {
                wit::EvictWhen::Now => sdk::EvictWhen::Now,
                wit::EvictWhen::WhenIdle => sdk::EvictWhen::WhenIdle,
            },
        }),
        A::Backoff(wit::Backoff {
            destination,
            initial_ms,
            max_ms,
            multiplier,
            jitter,
        }) => sdk::Action::Backoff(sdk::Backoff {
            destination,
            initial_ms,
            max_ms,
            multiplier,
            jitter,
        }),
        A::OciDrain(wit::OciDrain {
            workload,
            drain,
            at_capacity,
        }) => sdk::Action::OciDrain(sdk::OciDrain {
            workload,
            drain,
            at_capacity: match at_capacity {
                wit::AtCapacity::RemoveEarly => sdk::AtCapacity::RemoveEarly,
                wit::AtCapacity::Keep => sdk::AtCapacity::Keep,
            },
        }),
        A::HoldTeardown(wit::HoldTeardown { workload, bound_ms }) => {
            sdk::Action::HoldTeardown(sdk::HoldTeardown { workload, bound_ms })
        }
        A::SetTimer(wit::SetTimer {
            subject,
            tag,
            after_ms,
        }) => sdk::Action::SetTimer(sdk::SetTimer {
            subject,
            tag,
            after_ms,
        }),
        A::Log(wit::LogLine { level, message }) => sdk::Action::Log(sdk::LogLine {
            level: log_level(level),
            message,
        }),
    }
}
