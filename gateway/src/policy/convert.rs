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

use tidegate_sdk::span::Text;

use super::bindings::events as ev;
use super::bindings::types as wit;
use super::bindings::v0_2;
use super::bindings::v0_3::exports::tidegate::policy::policy;

/// Writes the events of contract 0.3.0: every string a span of one text,
/// each workload's declared labels and annotations one list.
pub struct EventWriter<'a> {
    text: &'a mut Text,
    reads: &'a sdk::MetadataReads,
}

impl<'a> EventWriter<'a> {
    /// Clears `text` (keeping its allocation) for a new event.
    pub fn new(text: &'a mut Text, reads: &'a sdk::MetadataReads) -> Self {
        text.clear();
        Self { text, reads }
    }

    fn span(&mut self, s: &str) -> ev::Span {
        let (start, len) = self.text.push(s);
        ev::Span { start, len }
    }

    /// The pairs of `m` the policy declared it reads: only those are
    /// written (and copied into the sandbox).
    fn metadata(
        &mut self,
        out: &mut Vec<ev::MetadataEntry>,
        kind: ev::MetadataKind,
        m: &std::collections::BTreeMap<String, String>,
        keys: &sdk::Keys,
    ) {
        let mut push = |w: &mut Self, k: &str, v: &str| {
            out.push(ev::MetadataEntry {
                kind,
                key: w.span(k),
                value: w.span(v),
            })
        };
        match keys {
            sdk::Keys::All => m.iter().for_each(|(k, v)| push(self, k, v)),
            sdk::Keys::Only(keys) => keys
                .iter()
                .filter_map(|k| m.get_key_value(k))
                .for_each(|(k, v)| push(self, k, v)),
        }
    }

    fn workload_info(&mut self, w: &sdk::WorkloadInfo) -> ev::WorkloadInfo {
        let reads = self.reads;
        let mut metadata = Vec::new();
        self.metadata(
            &mut metadata,
            ev::MetadataKind::Label,
            &w.labels,
            &reads.labels,
        );
        self.metadata(
            &mut metadata,
            ev::MetadataKind::Annotation,
            &w.annotations,
            &reads.annotations,
        );
        ev::WorkloadInfo {
            uid: self.span(&w.uid),
            name: self.span(&w.name),
            namespace: self.span(&w.namespace),
            identity: self.span(&w.identity),
            metadata,
        }
    }

    fn workload_state(&mut self, w: &sdk::WorkloadState) -> ev::WorkloadState {
        ev::WorkloadState {
            info: self.workload_info(&w.info),
            inbound_tunnels: w.inbound_tunnels,
            inbound_streams: w.inbound_streams,
            outbound_pooled_tunnels: w.outbound_pooled_tunnels,
            age_ms: w.age_ms,
        }
    }

    fn peer_info(&mut self, p: &sdk::PeerInfo) -> ev::PeerInfo {
        ev::PeerInfo {
            uid: self.span(&p.uid),
            name: self.span(&p.name),
            namespace: self.span(&p.namespace),
            identity: self.span(&p.identity),
            address: self.span(&p.address),
        }
    }

    fn peer_state(&mut self, p: &sdk::PeerState) -> ev::PeerState {
        ev::PeerState {
            peer: self.peer_info(&p.peer),
            pooled_tunnels: p.pooled_tunnels,
            active_streams: p.active_streams,
        }
    }

    /// The event as the policy sees it; its strings are in the text.
    pub fn event(&mut self, e: &sdk::Event) -> ev::Event {
        use sdk::Event as E;
        match e {
            E::WorkloadAdded(w) => ev::Event::WorkloadAdded(self.workload_state(w)),
            E::WorkloadDeleted(w) => ev::Event::WorkloadDeleted(self.workload_state(w)),
            E::ShutdownStarted(s) => ev::Event::ShutdownStarted(ev::ShutdownStarted {
                workload: self.workload_state(&s.workload),
                grace_deadline_ms: s.grace_deadline_ms,
                grace_remaining_ms: s.grace_remaining_ms,
            }),
            E::NetworkTeardown(t) => ev::Event::NetworkTeardown(ev::NetworkTeardown {
                workload: self.workload_state(&t.workload),
                since_shutdown_ms: t.since_shutdown_ms,
                max_hold_ms: t.max_hold_ms,
            }),
            E::PeerTerminating(p) => ev::Event::PeerTerminating(self.peer_state(p)),
            E::PeerDeleted(p) => ev::Event::PeerDeleted(self.peer_state(p)),
            E::ConnectFailing(c) => ev::Event::ConnectFailing(ev::ConnectFailing {
                destination: self.span(&c.destination),
                peer: c.peer.as_ref().map(|p| self.peer_info(p)),
                consecutive_failures: c.consecutive_failures,
                last_error: self.span(&c.last_error),
                failing_for_ms: c.failing_for_ms,
            }),
            E::GatewayShutdown(g) => ev::Event::GatewayShutdown(ev::GatewayShutdown {
                deadline_ms: g.deadline_ms,
                remaining_ms: g.remaining_ms,
                workloads: g.workloads.iter().map(|w| self.workload_state(w)).collect(),
            }),
            E::TimerFired(t) => ev::Event::TimerFired(ev::TimerFired {
                subject: self.span(&t.subject),
                tag: self.span(&t.tag),
                workload: t.workload.as_ref().map(|w| self.workload_state(w)),
            }),
        }
    }
}

/// What a 0.2.0 policy's `init` declared it reads (the same record as 0.3.0's).
pub fn reads_v0_2(r: v0_2::exports::tidegate::policy::policy::MetadataReads) -> sdk::MetadataReads {
    reads(policy::MetadataReads {
        labels: r.labels,
        annotations: r.annotations,
    })
}

/// What a 0.3.0 policy's `init` declared it reads.
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
