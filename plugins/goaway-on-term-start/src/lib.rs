//! Drain option 1: as soon as a workload's shutdown starts, send a graceful
//! GOAWAY to its inbound tunnels, with a hard deadline a margin before the
//! grace period ends.
//!
//! Configuration (JSON object, every key optional):
//! - `delay-ms` (integer 0..=3600000, default 0): wait before sending.
//! - `deadline-margin-ms` (integer 0..=3600000, default 2000): the hard
//!   deadline falls this long before the grace period ends, but no earlier
//!   than half the remaining grace, and never before the GOAWAY is sent.
//! - `close-notify` (boolean, default true): TLS close_notify on close.

use tidegate_sdk::config::Config;
use tidegate_sdk::{export_policy, Action, Event, MetadataReads, Policy};

const MAX_MS: u64 = 3_600_000;

/// See the crate documentation.
#[derive(Debug)]
pub struct GoawayOnTermStart {
    delay_ms: u64,
    deadline_margin_ms: u64,
    close_notify: bool,
}

impl Policy for GoawayOnTermStart {
    fn init(config: &str) -> Result<Self, String> {
        let mut c = Config::parse(config)?;
        let policy = Self {
            delay_ms: c.u64("delay-ms", 0, 0..=MAX_MS)?,
            deadline_margin_ms: c.u64("deadline-margin-ms", 2_000, 0..=MAX_MS)?,
            close_notify: c.bool("close-notify", true)?,
        };
        c.finish()?;
        Ok(policy)
    }

    /// No label and no annotation: the decision never looks at them.
    fn reads(&self) -> MetadataReads {
        MetadataReads::none()
    }

    fn decide(&mut self, event: &Event) -> Vec<Action> {
        let Event::ShutdownStarted(s) = event else {
            return vec![];
        };
        let remaining = s.grace_remaining_ms;
        let hard = remaining
            .saturating_sub(self.deadline_margin_ms)
            .max(remaining / 2)
            .max(self.delay_ms);
        vec![Action::goaway_inbound(&s.workload)
            .graceful()
            .delay_ms(self.delay_ms)
            .hard_deadline_ms(hard)
            .close_notify(self.close_notify)
            .into()]
    }
}

export_policy!(GoawayOnTermStart);

#[cfg(test)]
mod tests {
    use tidegate_sdk::trace::Trace;
    use tidegate_sdk::{PeerInfo, PeerState, ShutdownStarted, WorkloadInfo, WorkloadState};

    use super::*;

    fn shutdown(remaining: u64) -> Event {
        Event::ShutdownStarted(ShutdownStarted {
            workload: WorkloadState::new(WorkloadInfo::new("web-uid")).with_inbound(2, 5),
            grace_deadline_ms: 1_000_000 + remaining,
            grace_remaining_ms: remaining,
        })
    }

    #[test]
    fn shutdown_start_sends_graceful_goaway_with_deadline_before_grace_end() {
        let mut p = GoawayOnTermStart::init("").unwrap();
        assert_eq!(
            p.decide(&shutdown(30_000)),
            vec![Action::goaway_inbound("web-uid")
                .graceful()
                .hard_deadline_ms(28_000)
                .close_notify(true)
                .into()]
        );
    }

    #[test]
    fn deadline_never_precedes_the_delayed_goaway() {
        let mut p =
            GoawayOnTermStart::init(r#"{"delay-ms": 5000, "close-notify": false}"#).unwrap();
        assert_eq!(
            p.decide(&shutdown(6_000)),
            vec![Action::goaway_inbound("web-uid")
                .delay_ms(5_000)
                .hard_deadline_ms(5_000)
                .into()]
        );
    }

    #[test]
    fn grace_shorter_than_the_margin_keeps_half_of_it() {
        let mut p = GoawayOnTermStart::init("").unwrap();
        let out = p.decide(&shutdown(1_000));
        assert!(
            matches!(&out[..], [Action::Goaway(g)] if g.hard_deadline_ms == Some(500)),
            "{out:?}"
        );
    }

    #[test]
    fn other_events_get_no_action() {
        let mut p = GoawayOnTermStart::init("{}").unwrap();
        let w = WorkloadState::new(WorkloadInfo::new("web-uid")).with_inbound(1, 1);
        assert!(p.decide(&Event::WorkloadAdded(w.clone())).is_empty());
        assert!(p.decide(&Event::WorkloadDeleted(w)).is_empty());
        let peer = PeerState {
            peer: PeerInfo::new("p"),
            ..PeerState::default()
        };
        assert!(p.decide(&Event::PeerDeleted(peer)).is_empty());
    }

    #[test]
    fn bad_config_names_the_key() {
        let e = GoawayOnTermStart::init(r#"{"deadline-margin-ms": -1}"#).unwrap_err();
        assert!(e.contains("`deadline-margin-ms`"), "{e}");
        let e = GoawayOnTermStart::init(r#"{"delay": 1}"#).unwrap_err();
        assert!(e.contains("`delay`"), "{e}");
    }

    #[test]
    fn trace_passes() {
        Trace::from_yaml(include_str!("../trace.yaml"))
            .unwrap()
            .run::<GoawayOnTermStart>()
            .unwrap();
    }
}
