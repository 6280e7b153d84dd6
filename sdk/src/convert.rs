//! Conversions between the generated WIT bindings and the SDK types, both
//! ways (events come in and actions go out on wasm; tests use the rest).
//!
//! This file is the build-time check that the SDK mirrors the WIT: every
//! SDK → WIT conversion is a struct literal (a WIT field without an SDK
//! source fails to compile), and every WIT → SDK conversion destructures the
//! generated record without `..` and matches every case (a WIT field or case
//! without an SDK mirror fails to compile). Keep it that way: never use `..`
//! or field access on a generated record here. The host's converter
//! (`policy-host/src/convert.rs`) follows the same rule.

use std::collections::BTreeMap;

use crate::action::{
    Action, AtCapacity, Backoff, Evict, EvictWhen, Goaway, GoawayMode, GoawayTarget, HoldTeardown,
    LogLevel, LogLine, OciDrain, SetTimer,
};
use crate::bindings::exports::tidegate::policy::policy;
use crate::bindings::tidegate::policy::types as wit;
use crate::event::{
    ConnectFailing, Event, GatewayShutdown, NetworkTeardown, PeerInfo, PeerState, ShutdownStarted,
    TimerFired, WorkloadInfo, WorkloadState,
};

impl From<crate::MetadataReads> for policy::MetadataReads {
    fn from(r: crate::MetadataReads) -> Self {
        Self {
            labels: r.labels.to_list(),
            annotations: r.annotations.to_list(),
        }
    }
}

fn map_from(pairs: Vec<(String, String)>) -> BTreeMap<String, String> {
    pairs.into_iter().collect()
}

fn map_into(map: BTreeMap<String, String>) -> Vec<(String, String)> {
    map.into_iter().collect()
}

impl From<wit::LogLevel> for LogLevel {
    fn from(l: wit::LogLevel) -> Self {
        match l {
            wit::LogLevel::Trace => LogLevel::Trace,
            wit::LogLevel::Debug => LogLevel::Debug,
            wit::LogLevel::Info => LogLevel::Info,
            wit::LogLevel::Warn => LogLevel::Warn,
            wit::LogLevel::Error => LogLevel::Error,
        }
    }
}

impl From<LogLevel> for wit::LogLevel {
    fn from(l: LogLevel) -> Self {
        match l {
            LogLevel::Trace => wit::LogLevel::Trace,
            LogLevel::Debug => wit::LogLevel::Debug,
            LogLevel::Info => wit::LogLevel::Info,
            LogLevel::Warn => wit::LogLevel::Warn,
            LogLevel::Error => wit::LogLevel::Error,
        }
    }
}

impl From<wit::WorkloadInfo> for WorkloadInfo {
    fn from(w: wit::WorkloadInfo) -> Self {
        let wit::WorkloadInfo {
            uid,
            name,
            namespace,
            identity,
            labels,
            annotations,
        } = w;
        Self {
            uid,
            name,
            namespace,
            identity,
            labels: map_from(labels),
            annotations: map_from(annotations),
        }
    }
}

impl From<WorkloadInfo> for wit::WorkloadInfo {
    fn from(w: WorkloadInfo) -> Self {
        Self {
            uid: w.uid,
            name: w.name,
            namespace: w.namespace,
            identity: w.identity,
            labels: map_into(w.labels),
            annotations: map_into(w.annotations),
        }
    }
}

impl From<wit::WorkloadState> for WorkloadState {
    fn from(w: wit::WorkloadState) -> Self {
        let wit::WorkloadState {
            info,
            inbound_tunnels,
            inbound_streams,
            outbound_pooled_tunnels,
            age_ms,
        } = w;
        Self {
            info: info.into(),
            inbound_tunnels,
            inbound_streams,
            outbound_pooled_tunnels,
            age_ms,
        }
    }
}

impl From<WorkloadState> for wit::WorkloadState {
    fn from(w: WorkloadState) -> Self {
        Self {
            info: w.info.into(),
            inbound_tunnels: w.inbound_tunnels,
            inbound_streams: w.inbound_streams,
            outbound_pooled_tunnels: w.outbound_pooled_tunnels,
            age_ms: w.age_ms,
        }
    }
}

impl From<wit::PeerInfo> for PeerInfo {
    fn from(p: wit::PeerInfo) -> Self {
        let wit::PeerInfo {
            uid,
            name,
            namespace,
            identity,
            address,
        } = p;
        Self {
            uid,
            name,
            namespace,
            identity,
            address,
        }
    }
}

impl From<PeerInfo> for wit::PeerInfo {
    fn from(p: PeerInfo) -> Self {
        Self {
            uid: p.uid,
            name: p.name,
            namespace: p.namespace,
            identity: p.identity,
            address: p.address,
        }
    }
}

impl From<wit::PeerState> for PeerState {
    fn from(p: wit::PeerState) -> Self {
        let wit::PeerState {
            peer,
            pooled_tunnels,
            active_streams,
        } = p;
        Self {
            peer: peer.into(),
            pooled_tunnels,
            active_streams,
        }
    }
}

impl From<PeerState> for wit::PeerState {
    fn from(p: PeerState) -> Self {
        Self {
            peer: p.peer.into(),
            pooled_tunnels: p.pooled_tunnels,
            active_streams: p.active_streams,
        }
    }
}

impl From<wit::Event> for Event {
    fn from(e: wit::Event) -> Self {
        match e {
            wit::Event::WorkloadAdded(w) => Event::WorkloadAdded(w.into()),
            wit::Event::ShutdownStarted(wit::ShutdownStarted {
                workload,
                grace_deadline_ms,
                grace_remaining_ms,
            }) => Event::ShutdownStarted(ShutdownStarted {
                workload: workload.into(),
                grace_deadline_ms,
                grace_remaining_ms,
            }),
            wit::Event::NetworkTeardown(wit::NetworkTeardown {
                workload,
                since_shutdown_ms,
                max_hold_ms,
            }) => Event::NetworkTeardown(NetworkTeardown {
                workload: workload.into(),
                since_shutdown_ms,
                max_hold_ms,
            }),
            wit::Event::WorkloadDeleted(w) => Event::WorkloadDeleted(w.into()),
            wit::Event::PeerTerminating(p) => Event::PeerTerminating(p.into()),
            wit::Event::PeerDeleted(p) => Event::PeerDeleted(p.into()),
            wit::Event::ConnectFailing(wit::ConnectFailing {
                destination,
                peer,
                consecutive_failures,
                last_error,
                failing_for_ms,
            }) => Event::ConnectFailing(ConnectFailing {
                destination,
                peer: peer.map(Into::into),
                consecutive_failures,
                last_error,
                failing_for_ms,
            }),
            wit::Event::GatewayShutdown(wit::GatewayShutdown {
                deadline_ms,
                remaining_ms,
                workloads,
            }) => Event::GatewayShutdown(GatewayShutdown {
                deadline_ms,
                remaining_ms,
                workloads: workloads.into_iter().map(Into::into).collect(),
            }),
            wit::Event::TimerFired(wit::TimerFired {
                subject,
                tag,
                workload,
            }) => Event::TimerFired(TimerFired {
                subject,
                tag,
                workload: workload.map(Into::into),
            }),
        }
    }
}

impl From<Event> for wit::Event {
    fn from(e: Event) -> Self {
        match e {
            Event::WorkloadAdded(w) => wit::Event::WorkloadAdded(w.into()),
            Event::ShutdownStarted(s) => wit::Event::ShutdownStarted(wit::ShutdownStarted {
                workload: s.workload.into(),
                grace_deadline_ms: s.grace_deadline_ms,
                grace_remaining_ms: s.grace_remaining_ms,
            }),
            Event::NetworkTeardown(t) => wit::Event::NetworkTeardown(wit::NetworkTeardown {
                workload: t.workload.into(),
                since_shutdown_ms: t.since_shutdown_ms,
                max_hold_ms: t.max_hold_ms,
            }),
            Event::WorkloadDeleted(w) => wit::Event::WorkloadDeleted(w.into()),
            Event::PeerTerminating(p) => wit::Event::PeerTerminating(p.into()),
            Event::PeerDeleted(p) => wit::Event::PeerDeleted(p.into()),
            Event::ConnectFailing(c) => wit::Event::ConnectFailing(wit::ConnectFailing {
                destination: c.destination,
                peer: c.peer.map(Into::into),
                consecutive_failures: c.consecutive_failures,
                last_error: c.last_error,
                failing_for_ms: c.failing_for_ms,
            }),
            Event::GatewayShutdown(g) => wit::Event::GatewayShutdown(wit::GatewayShutdown {
                deadline_ms: g.deadline_ms,
                remaining_ms: g.remaining_ms,
                workloads: g.workloads.into_iter().map(Into::into).collect(),
            }),
            Event::TimerFired(t) => wit::Event::TimerFired(wit::TimerFired {
                subject: t.subject,
                tag: t.tag,
                workload: t.workload.map(Into::into),
            }),
        }
    }
}

impl From<Action> for wit::Action {
    fn from(a: Action) -> Self {
        match a {
            Action::Goaway(g) => wit::Action::Goaway(wit::Goaway {
                workload: g.workload,
                target: match g.target {
                    GoawayTarget::Inbound => wit::GoawayTarget::Inbound,
                    GoawayTarget::Outbound => wit::GoawayTarget::Outbound,
                    GoawayTarget::Both => wit::GoawayTarget::Both,
                },
                delay_ms: g.delay_ms,
                mode: match g.mode {
                    GoawayMode::Graceful => wit::GoawayMode::Graceful,
                    GoawayMode::Immediate => wit::GoawayMode::Immediate,
                },
                hard_deadline_ms: g.hard_deadline_ms,
                close_notify: g.close_notify,
            }),
            Action::Evict(e) => wit::Action::Evict(wit::Evict {
                peer: e.peer,
                when: match e.when {
                    EvictWhen::Now => wit::EvictWhen::Now,
                    EvictWhen::WhenIdle => wit::EvictWhen::WhenIdle,
                },
            }),
            Action::Backoff(b) => wit::Action::Backoff(wit::Backoff {
                destination: b.destination,
                initial_ms: b.initial_ms,
                max_ms: b.max_ms,
                multiplier: b.multiplier,
                jitter: b.jitter,
            }),
            Action::OciDrain(o) => wit::Action::OciDrain(wit::OciDrain {
                workload: o.workload,
                drain: o.drain,
                at_capacity: match o.at_capacity {
                    AtCapacity::RemoveEarly => wit::AtCapacity::RemoveEarly,
                    AtCapacity::Keep => wit::AtCapacity::Keep,
                },
            }),
            Action::HoldTeardown(h) => wit::Action::HoldTeardown(wit::HoldTeardown {
                workload: h.workload,
                bound_ms: h.bound_ms,
            }),
            Action::SetTimer(t) => wit::Action::SetTimer(wit::SetTimer {
                subject: t.subject,
                tag: t.tag,
                after_ms: t.after_ms,
            }),
            Action::Log(l) => wit::Action::Log(wit::LogLine {
                level: l.level.into(),
                message: l.message,
            }),
        }
    }
}

impl From<wit::Action> for Action {
    fn from(a: wit::Action) -> Self {
        match a {
            wit::Action::Goaway(wit::Goaway {
                workload,
                target,
                delay_ms,
                mode,
                hard_deadline_ms,
                close_notify,
            }) => Action::Goaway(Goaway {
                workload,
                target: match target {
                    wit::GoawayTarget::Inbound => GoawayTarget::Inbound,
                    wit::GoawayTarget::Outbound => GoawayTarget::Outbound,
                    wit::GoawayTarget::Both => GoawayTarget::Both,
                },
                delay_ms,
                mode: match mode {
                    wit::GoawayMode::Graceful => GoawayMode::Graceful,
                    wit::GoawayMode::Immediate => GoawayMode::Immediate,
                },
                hard_deadline_ms,
                close_notify,
            }),
            wit::Action::Evict(wit::Evict { peer, when }) => Action::Evict(Evict {
                peer,
                when: match when {
                    wit::EvictWhen::Now => EvictWhen::Now,
                    wit::EvictWhen::WhenIdle => EvictWhen::WhenIdle,
                },
            }),
            wit::Action::Backoff(wit::Backoff {
                destination,
                initial_ms,
                max_ms,
                multiplier,
                jitter,
            }) => Action::Backoff(Backoff {
                destination,
                initial_ms,
                max_ms,
                multiplier,
                jitter,
            }),
            wit::Action::OciDrain(wit::OciDrain {
                workload,
                drain,
                at_capacity,
            }) => Action::OciDrain(OciDrain {
                workload,
                drain,
                at_capacity: match at_capacity {
                    wit::AtCapacity::RemoveEarly => AtCapacity::RemoveEarly,
                    wit::AtCapacity::Keep => AtCapacity::Keep,
                },
            }),
            wit::Action::HoldTeardown(wit::HoldTeardown { workload, bound_ms }) => {
                Action::HoldTeardown(HoldTeardown { workload, bound_ms })
            }
            wit::Action::SetTimer(wit::SetTimer {
                subject,
                tag,
                after_ms,
            }) => Action::SetTimer(SetTimer {
                subject,
                tag,
                after_ms,
            }),
            wit::Action::Log(wit::LogLine { level, message }) => Action::Log(LogLine {
                level: level.into(),
                message,
            }),
        }
    }
}
