//! Conversions between the generated WIT bindings and the SDK types, both
//! ways (events come in and actions go out on wasm; tests use the rest).
//!
//! This file is the build-time check that the SDK mirrors the WIT: every
//! SDK → WIT conversion is a struct literal (a WIT field without an SDK
//! source fails to compile), and every WIT → SDK conversion destructures the
//! generated record without `..` and matches every case (a WIT field or case
//! without an SDK mirror fails to compile). Keep it that way: never use `..`
//! or field access on a generated record here. The host's converter
//! (`gateway/src/policy/convert.rs`) follows the same rule.

use std::collections::BTreeMap;

use crate::action::{
    Action, AtCapacity, Backoff, Evict, EvictWhen, Goaway, GoawayMode, GoawayTarget, HoldTeardown,
    LogLevel, LogLine, OciDrain, SetTimer,
};
use crate::bindings::exports::tidegate::policy::policy;
use crate::bindings::tidegate::policy::events as ev;
use crate::bindings::tidegate::policy::types as wit;
use crate::event::{
    ConnectFailing, Event, GatewayShutdown, NetworkTeardown, PeerInfo, PeerState, ShutdownStarted,
    TimerFired, WorkloadInfo, WorkloadState,
};
#[cfg(test)]
use crate::span::Text;

impl From<crate::MetadataReads> for policy::MetadataReads {
    fn from(r: crate::MetadataReads) -> Self {
        Self {
            labels: r.labels.to_list(),
            annotations: r.annotations.to_list(),
        }
    }
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

/// Reads the strings of a 0.3.0 event out of the text it came with.
struct Reader<'a>(&'a str);

impl Reader<'_> {
    /// A span outside the text is a host bug: the guest traps (and the
    /// host falls back) rather than decide on a made-up string.
    fn string(&self, s: ev::Span) -> String {
        let ev::Span { start, len } = s;
        match crate::span::get(self.0, start, len) {
            Some(v) => v.to_owned(),
            None => panic!(
                "tidegate-sdk: span {start}+{len} is not inside the event's text ({} bytes)",
                self.0.len()
            ),
        }
    }

    fn workload_info(&self, w: ev::WorkloadInfo) -> WorkloadInfo {
        let ev::WorkloadInfo {
            uid,
            name,
            namespace,
            identity,
            metadata,
        } = w;
        let mut labels = BTreeMap::new();
        let mut annotations = BTreeMap::new();
        for ev::MetadataEntry { kind, key, value } in metadata {
            let map = match kind {
                ev::MetadataKind::Label => &mut labels,
                ev::MetadataKind::Annotation => &mut annotations,
            };
            map.insert(self.string(key), self.string(value));
        }
        WorkloadInfo {
            uid: self.string(uid),
            name: self.string(name),
            namespace: self.string(namespace),
            identity: self.string(identity),
            labels,
            annotations,
        }
    }

    fn workload_state(&self, w: ev::WorkloadState) -> WorkloadState {
        let ev::WorkloadState {
            info,
            inbound_tunnels,
            inbound_streams,
            outbound_pooled_tunnels,
            age_ms,
        } = w;
        WorkloadState {
            info: self.workload_info(info),
            inbound_tunnels,
            inbound_streams,
            outbound_pooled_tunnels,
            age_ms,
        }
    }

    fn peer_info(&self, p: ev::PeerInfo) -> PeerInfo {
        let ev::PeerInfo {
            uid,
            name,
            namespace,
            identity,
            address,
        } = p;
        PeerInfo {
            uid: self.string(uid),
            name: self.string(name),
            namespace: self.string(namespace),
            identity: self.string(identity),
            address: self.string(address),
        }
    }

    fn peer_state(&self, p: ev::PeerState) -> PeerState {
        let ev::PeerState {
            peer,
            pooled_tunnels,
            active_streams,
        } = p;
        PeerState {
            peer: self.peer_info(peer),
            pooled_tunnels,
            active_streams,
        }
    }

    fn event(&self, e: ev::Event) -> Event {
        match e {
            ev::Event::WorkloadAdded(w) => Event::WorkloadAdded(self.workload_state(w)),
            ev::Event::ShutdownStarted(ev::ShutdownStarted {
                workload,
                grace_deadline_ms,
                grace_remaining_ms,
            }) => Event::ShutdownStarted(ShutdownStarted {
                workload: self.workload_state(workload),
                grace_deadline_ms,
                grace_remaining_ms,
            }),
            ev::Event::NetworkTeardown(ev::NetworkTeardown {
                workload,
                since_shutdown_ms,
                max_hold_ms,
            }) => Event::NetworkTeardown(NetworkTeardown {
                workload: self.workload_state(workload),
                since_shutdown_ms,
                max_hold_ms,
            }),
            ev::Event::WorkloadDeleted(w) => Event::WorkloadDeleted(self.workload_state(w)),
            ev::Event::PeerTerminating(p) => Event::PeerTerminating(self.peer_state(p)),
            ev::Event::PeerDeleted(p) => Event::PeerDeleted(self.peer_state(p)),
            ev::Event::ConnectFailing(ev::ConnectFailing {
                destination,
                peer,
                consecutive_failures,
                last_error,
                failing_for_ms,
            }) => Event::ConnectFailing(ConnectFailing {
                destination: self.string(destination),
                peer: peer.map(|p| self.peer_info(p)),
                consecutive_failures,
                last_error: self.string(last_error),
                failing_for_ms,
            }),
            ev::Event::GatewayShutdown(ev::GatewayShutdown {
                deadline_ms,
                remaining_ms,
                workloads,
            }) => Event::GatewayShutdown(GatewayShutdown {
                deadline_ms,
                remaining_ms,
                workloads: workloads
                    .into_iter()
                    .map(|w| self.workload_state(w))
                    .collect(),
            }),
            ev::Event::TimerFired(ev::TimerFired {
                subject,
                tag,
                workload,
            }) => Event::TimerFired(TimerFired {
                subject: self.string(subject),
                tag: self.string(tag),
                workload: workload.map(|w| self.workload_state(w)),
            }),
        }
    }
}

/// The SDK event of a 0.3.0 event and its text (what `decide` receives).
pub(crate) fn event_from_wit(e: ev::Event, text: &str) -> Event {
    Reader(text).event(e)
}

/// Writes an SDK event as a 0.3.0 event and its text, as the host does
/// (`gateway/src/policy/convert.rs`); the SDK's tests use it.
#[cfg(test)]
struct Writer(Text);

#[cfg(test)]
impl Writer {
    fn span(&mut self, s: &str) -> ev::Span {
        let (start, len) = self.0.push(s);
        ev::Span { start, len }
    }

    fn workload_info(&mut self, w: &WorkloadInfo) -> ev::WorkloadInfo {
        let mut metadata = Vec::with_capacity(w.labels.len() + w.annotations.len());
        for (kind, map) in [
            (ev::MetadataKind::Label, &w.labels),
            (ev::MetadataKind::Annotation, &w.annotations),
        ] {
            for (k, v) in map {
                metadata.push(ev::MetadataEntry {
                    kind,
                    key: self.span(k),
                    value: self.span(v),
                });
            }
        }
        ev::WorkloadInfo {
            uid: self.span(&w.uid),
            name: self.span(&w.name),
            namespace: self.span(&w.namespace),
            identity: self.span(&w.identity),
            metadata,
        }
    }

    fn workload_state(&mut self, w: &WorkloadState) -> ev::WorkloadState {
        ev::WorkloadState {
            info: self.workload_info(&w.info),
            inbound_tunnels: w.inbound_tunnels,
            inbound_streams: w.inbound_streams,
            outbound_pooled_tunnels: w.outbound_pooled_tunnels,
            age_ms: w.age_ms,
        }
    }

    fn peer_info(&mut self, p: &PeerInfo) -> ev::PeerInfo {
        ev::PeerInfo {
            uid: self.span(&p.uid),
            name: self.span(&p.name),
            namespace: self.span(&p.namespace),
            identity: self.span(&p.identity),
            address: self.span(&p.address),
        }
    }

    fn peer_state(&mut self, p: &PeerState) -> ev::PeerState {
        ev::PeerState {
            peer: self.peer_info(&p.peer),
            pooled_tunnels: p.pooled_tunnels,
            active_streams: p.active_streams,
        }
    }

    fn event(&mut self, e: &Event) -> ev::Event {
        match e {
            Event::WorkloadAdded(w) => ev::Event::WorkloadAdded(self.workload_state(w)),
            Event::ShutdownStarted(s) => ev::Event::ShutdownStarted(ev::ShutdownStarted {
                workload: self.workload_state(&s.workload),
                grace_deadline_ms: s.grace_deadline_ms,
                grace_remaining_ms: s.grace_remaining_ms,
            }),
            Event::NetworkTeardown(t) => ev::Event::NetworkTeardown(ev::NetworkTeardown {
                workload: self.workload_state(&t.workload),
                since_shutdown_ms: t.since_shutdown_ms,
                max_hold_ms: t.max_hold_ms,
            }),
            Event::WorkloadDeleted(w) => ev::Event::WorkloadDeleted(self.workload_state(w)),
            Event::PeerTerminating(p) => ev::Event::PeerTerminating(self.peer_state(p)),
            Event::PeerDeleted(p) => ev::Event::PeerDeleted(self.peer_state(p)),
            Event::ConnectFailing(c) => ev::Event::ConnectFailing(ev::ConnectFailing {
                destination: self.span(&c.destination),
                peer: c.peer.as_ref().map(|p| self.peer_info(p)),
                consecutive_failures: c.consecutive_failures,
                last_error: self.span(&c.last_error),
                failing_for_ms: c.failing_for_ms,
            }),
            Event::GatewayShutdown(g) => ev::Event::GatewayShutdown(ev::GatewayShutdown {
                deadline_ms: g.deadline_ms,
                remaining_ms: g.remaining_ms,
                workloads: g.workloads.iter().map(|w| self.workload_state(w)).collect(),
            }),
            Event::TimerFired(t) => ev::Event::TimerFired(ev::TimerFired {
                subject: self.span(&t.subject),
                tag: self.span(&t.tag),
                workload: t.workload.as_ref().map(|w| self.workload_state(w)),
            }),
        }
    }
}

/// An SDK event as a 0.3.0 event and its text.
#[cfg(test)]
pub(crate) fn event_to_wit(e: &Event) -> (ev::Event, String) {
    let mut w = Writer(Text::new());
    let event = w.event(e);
    (event, w.0.as_str().to_owned())
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
