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

/// The workloads an event carries, in the order [`event`] lowers them:
/// the one it is about ([`sdk::Event::workload`]) or a `gateway-shutdown`'s.
fn workloads(e: &sdk::Event) -> impl Iterator<Item = &sdk::WorkloadState> {
    let many: &[sdk::WorkloadState] = match e {
        sdk::Event::GatewayShutdown(g) => &g.workloads,
        _ => &[],
    };
    e.workload().into_iter().chain(many)
}

/// Lowers `e` as the policy sees it (labels and annotations limited to
/// what it declared it `reads`), borrowed from `e`, and hands it to `f`.
pub fn with_event<R>(
    e: &sdk::Event,
    reads: &sdk::MetadataReads,
    f: impl FnOnce(wit::Event<'_>) -> R,
) -> R {
    let declared = Declared::new(e, reads);
    let shutdown_workloads = declared.shutdown_workloads(e);
    f(event(e, &declared, &shutdown_workloads))
}

/// The label and annotation pairs an event hands the policy (only the keys
/// it declared it reads), borrowed from the event: what the lowered event's
/// lists point into. Nothing is copied on the host; wasmtime copies each
/// string once, into the sandbox.
struct Declared<'a> {
    /// Every handed pair, workload after workload: its labels, then its
    /// annotations.
    pairs: Vec<(&'a str, &'a str)>,
    /// Where each workload's labels end, then where its annotations end.
    cuts: Vec<usize>,
}

impl<'a> Declared<'a> {
    fn new(e: &'a sdk::Event, reads: &sdk::MetadataReads) -> Self {
        let mut d = Declared {
            pairs: Vec::new(),
            cuts: Vec::new(),
        };
        for w in workloads(e) {
            for (m, keys) in [
                (&w.info.labels, &reads.labels),
                (&w.info.annotations, &reads.annotations),
            ] {
                match keys {
                    sdk::Keys::All => d.pairs.extend(m.iter().map(|(k, v)| (&**k, &**v))),
                    sdk::Keys::Only(keys) => d.pairs.extend(
                        keys.iter()
                            .filter_map(|k| m.get_key_value(k))
                            .map(|(k, v)| (&**k, &**v)),
                    ),
                }
                d.cuts.push(d.pairs.len());
            }
        }
        d
    }

    /// The `nth` workload of the event (in [`workloads`] order), lowered.
    fn state(&'a self, nth: usize, w: &'a sdk::WorkloadState) -> wit::WorkloadState<'a> {
        let start = if nth == 0 { 0 } else { self.cuts[2 * nth - 1] };
        let (labels_end, end) = (self.cuts[2 * nth], self.cuts[2 * nth + 1]);
        wit::WorkloadState {
            info: wit::WorkloadInfo {
                uid: &w.info.uid,
                name: &w.info.name,
                namespace: &w.info.namespace,
                identity: &w.info.identity,
                labels: &self.pairs[start..labels_end],
                annotations: &self.pairs[labels_end..end],
            },
            inbound_tunnels: w.inbound_tunnels,
            inbound_streams: w.inbound_streams,
            outbound_pooled_tunnels: w.outbound_pooled_tunnels,
            age_ms: w.age_ms,
        }
    }

    /// The lowered workloads of a `gateway-shutdown` event (none for any
    /// other): [`event`] borrows its list.
    fn shutdown_workloads(&'a self, e: &'a sdk::Event) -> Vec<wit::WorkloadState<'a>> {
        match e {
            sdk::Event::GatewayShutdown(g) => g
                .workloads
                .iter()
                .enumerate()
                .map(|(n, w)| self.state(n, w))
                .collect(),
            _ => Vec::new(),
        }
    }
}

fn peer_info(p: &sdk::PeerInfo) -> wit::PeerInfo<'_> {
    wit::PeerInfo {
        uid: &p.uid,
        name: &p.name,
        namespace: &p.namespace,
        identity: &p.identity,
        address: &p.address,
    }
}

fn peer_state(p: &sdk::PeerState) -> wit::PeerState<'_> {
    wit::PeerState {
        peer: peer_info(&p.peer),
        pooled_tunnels: p.pooled_tunnels,
        active_streams: p.active_streams,
    }
}

/// The event as the policy sees it, borrowed from `e`: labels and
/// annotations limited to what `declared` holds (made from the same
/// event), a `gateway-shutdown`'s list from
/// [`Declared::shutdown_workloads`]. [`with_event`] makes all three.
fn event<'a>(
    e: &'a sdk::Event,
    declared: &'a Declared<'a>,
    shutdown_workloads: &'a [wit::WorkloadState<'a>],
) -> wit::Event<'a> {
    use sdk::Event as E;
    let state = |w| declared.state(0, w);
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
            destination: &c.destination,
            peer: c.peer.as_ref().map(peer_info),
            consecutive_failures: c.consecutive_failures,
            last_error: &c.last_error,
            failing_for_ms: c.failing_for_ms,
        }),
        E::GatewayShutdown(g) => wit::Event::GatewayShutdown(wit::GatewayShutdown {
            deadline_ms: g.deadline_ms,
            remaining_ms: g.remaining_ms,
            workloads: shutdown_workloads,
        }),
        E::TimerFired(t) => wit::Event::TimerFired(wit::TimerFired {
            subject: &t.subject,
            tag: &t.tag,
            workload: t.workload.as_ref().map(state),
        }),
    }
}

/// What a 0.2.0 or 0.3.0 policy's `init` declared it reads (the same
/// record in both, generated once per version).
macro_rules! reads_from {
    ($($v:ident),*) => {$(
        impl From<super::bindings::$v::exports::tidegate::policy::policy::MetadataReads>
            for sdk::MetadataReads
        {
            fn from(r: super::bindings::$v::exports::tidegate::policy::policy::MetadataReads) -> Self {
                let super::bindings::$v::exports::tidegate::policy::policy::MetadataReads {
                    labels,
                    annotations,
                } = r;
                sdk::MetadataReads {
                    labels: sdk::Keys::from_list(labels),
                    annotations: sdk::Keys::from_list(annotations),
                }
            }
        }
    )*};
}
reads_from!(v0_2, v0_3);

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

#[cfg(test)]
mod tests {
    use super::*;

    fn workload(uid: &str, n: usize) -> sdk::WorkloadState {
        let mut info = sdk::WorkloadInfo::new(uid).named("ns", uid);
        for i in 0..n {
            info = info
                .with_label(format!("l{i}"), format!("{uid}-l{i}"))
                .with_annotation(format!("a{i}"), format!("{uid}-a{i}"));
        }
        sdk::WorkloadState::new(info)
    }

    /// Each lowered workload's uid and its `key=value` pairs.
    fn lowered(e: &sdk::Event, reads: &sdk::MetadataReads) -> Vec<(String, Vec<String>)> {
        let owned = |s: &wit::WorkloadState<'_>| {
            let pairs = s.info.labels.iter().chain(s.info.annotations);
            let pairs = pairs.map(|(k, v)| format!("{k}={v}")).collect();
            (s.info.uid.to_owned(), pairs)
        };
        with_event(e, reads, |lowered| match lowered {
            wit::Event::GatewayShutdown(g) => g.workloads.iter().map(owned).collect(),
            wit::Event::ShutdownStarted(s) => vec![owned(&s.workload)],
            wit::Event::TimerFired(t) => t.workload.iter().map(owned).collect(),
            _ => vec![],
        })
    }

    #[test]
    fn every_workload_gets_its_own_declared_pairs() {
        let e = sdk::Event::GatewayShutdown(sdk::GatewayShutdown {
            deadline_ms: 1,
            remaining_ms: 1,
            workloads: vec![workload("w0", 0), workload("w1", 3), workload("w2", 2)],
        });
        let reads = sdk::MetadataReads {
            labels: sdk::Keys::Only(vec!["l1".into(), "missing".into()]),
            annotations: sdk::Keys::Only(vec!["a0".into()]),
        };
        assert_eq!(
            lowered(&e, &reads),
            [
                ("w0".into(), vec![]),
                ("w1".into(), vec!["l1=w1-l1".into(), "a0=w1-a0".into()]),
                ("w2".into(), vec!["l1=w2-l1".into(), "a0=w2-a0".into()]),
            ]
        );
        let every = lowered(&e, &sdk::MetadataReads::everything());
        assert_eq!(every[1].1.len(), 6, "{every:?}");
        assert_eq!(every[2].1, ["l0=w2-l0", "l1=w2-l1", "a0=w2-a0", "a1=w2-a1"]);
    }

    #[test]
    fn single_workload_events_and_none() {
        let reads = sdk::MetadataReads {
            labels: sdk::Keys::Only(vec![]),
            annotations: sdk::Keys::Only(vec!["a1".into()]),
        };
        let e = sdk::Event::ShutdownStarted(sdk::ShutdownStarted {
            workload: workload("w", 2),
            grace_deadline_ms: 1,
            grace_remaining_ms: 1,
        });
        assert_eq!(lowered(&e, &reads), [("w".into(), vec!["a1=w-a1".into()])]);
        let timer = sdk::Event::TimerFired(sdk::TimerFired {
            subject: "w".into(),
            tag: "t".into(),
            workload: None,
        });
        assert_eq!(lowered(&timer, &reads), []);
    }
}
