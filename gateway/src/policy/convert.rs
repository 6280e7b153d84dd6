//! Conversions between the SDK's native types (the gateway's domain model
//! for events and actions) and the generated WIT bindings.

use tidegate_sdk as sdk;

use super::bindings::tidegate::policy::types as wit;

fn pairs(m: &std::collections::BTreeMap<String, String>) -> Vec<(String, String)> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn workload_info(w: &sdk::WorkloadInfo) -> wit::WorkloadInfo {
    wit::WorkloadInfo {
        uid: w.uid.clone(),
        name: w.name.clone(),
        namespace: w.namespace.clone(),
        identity: w.identity.clone(),
        labels: pairs(&w.labels),
        annotations: pairs(&w.annotations),
    }
}

fn workload_state(w: &sdk::WorkloadState) -> wit::WorkloadState {
    wit::WorkloadState {
        info: workload_info(&w.info),
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

pub fn event(e: &sdk::Event) -> wit::Event {
    use sdk::Event as E;
    match e {
        E::WorkloadAdded(w) => wit::Event::WorkloadAdded(workload_state(w)),
        E::WorkloadDeleted(w) => wit::Event::WorkloadDeleted(workload_state(w)),
        E::ShutdownStarted(s) => wit::Event::ShutdownStarted(wit::ShutdownStarted {
            workload: workload_state(&s.workload),
            grace_deadline_ms: s.grace_deadline_ms,
            grace_remaining_ms: s.grace_remaining_ms,
        }),
        E::NetworkTeardown(t) => wit::Event::NetworkTeardown(wit::NetworkTeardown {
            workload: workload_state(&t.workload),
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
            workloads: g.workloads.iter().map(workload_state).collect(),
        }),
        E::TimerFired(t) => wit::Event::TimerFired(wit::TimerFired {
            subject: t.subject.clone(),
            tag: t.tag.clone(),
            workload: t.workload.as_ref().map(workload_state),
        }),
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
        A::Goaway(g) => sdk::Action::Goaway(sdk::Goaway {
            workload: g.workload,
            target: match g.target {
                wit::GoawayTarget::Inbound => sdk::GoawayTarget::Inbound,
                wit::GoawayTarget::Outbound => sdk::GoawayTarget::Outbound,
                wit::GoawayTarget::Both => sdk::GoawayTarget::Both,
            },
            delay_ms: g.delay_ms,
            mode: match g.mode {
                wit::GoawayMode::Graceful => sdk::GoawayMode::Graceful,
                wit::GoawayMode::Immediate => sdk::GoawayMode::Immediate,
            },
            hard_deadline_ms: g.hard_deadline_ms,
            close_notify: g.close_notify,
        }),
        A::Evict(e) => sdk::Action::Evict(sdk::Evict {
            peer: e.peer,
            when: match e.when {
                wit::EvictWhen::Now => sdk::EvictWhen::Now,
                wit::EvictWhen::WhenIdle => sdk::EvictWhen::WhenIdle,
            },
        }),
        A::Backoff(b) => sdk::Action::Backoff(sdk::Backoff {
            destination: b.destination,
            initial_ms: b.initial_ms,
            max_ms: b.max_ms,
            multiplier: b.multiplier,
            jitter: b.jitter,
        }),
        A::OciDrain(o) => sdk::Action::OciDrain(sdk::OciDrain {
            workload: o.workload,
            drain: o.drain,
            at_capacity: match o.at_capacity {
                wit::AtCapacity::RemoveEarly => sdk::AtCapacity::RemoveEarly,
                wit::AtCapacity::Keep => sdk::AtCapacity::Keep,
            },
        }),
        A::HoldTeardown(h) => sdk::Action::HoldTeardown(sdk::HoldTeardown {
            workload: h.workload,
            bound_ms: h.bound_ms,
        }),
        A::SetTimer(t) => sdk::Action::SetTimer(sdk::SetTimer {
            subject: t.subject,
            tag: t.tag,
            after_ms: t.after_ms,
        }),
        A::Log(l) => sdk::Action::Log(sdk::LogLine {
            level: log_level(l.level),
            message: l.message,
        }),
    }
}
