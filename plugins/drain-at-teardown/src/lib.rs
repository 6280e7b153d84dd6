//! Drain option 2: nothing when shutdown starts. At the network teardown
//! (CNI DEL: the app has exited, the network is still there) send GOAWAY
//! with TLS close_notify to the workload's inbound tunnels, and hold the
//! teardown until they are idle or a bound passes, then acknowledge. A
//! workload without inbound tunnels is torn down at once.
//!
//! Configuration (JSON object, every key optional):
//! - `hold-ms` (integer 0..=3600000, default 10000): longest hold (the host
//!   also caps it at the event's `max-hold-ms`); also the GOAWAY's hard
//!   deadline.
//! - `mode` (`"graceful"` or `"immediate"`, default `"graceful"`).
//! - `close-notify` (boolean, default true).

use tidegate_sdk::config::Config;
use tidegate_sdk::{export_policy, Action, Event, GoawayMode, MetadataReads, Policy};

const MAX_MS: u64 = 3_600_000;

/// See the crate documentation.
#[derive(Debug)]
pub struct DrainAtTeardown {
    hold_ms: u64,
    mode: GoawayMode,
    close_notify: bool,
}

impl Policy for DrainAtTeardown {
    fn init(config: &str) -> Result<Self, String> {
        let mut c = Config::parse(config)?;
        let policy = Self {
            hold_ms: c.u64("hold-ms", 10_000, 0..=MAX_MS)?,
            mode: c.choice(
                "mode",
                GoawayMode::Graceful,
                &[
                    ("graceful", GoawayMode::Graceful),
                    ("immediate", GoawayMode::Immediate),
                ],
            )?,
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
        let Event::NetworkTeardown(t) = event else {
            return vec![];
        };
        if t.workload.inbound_tunnels == 0 {
            return vec![];
        }
        let bound = self.hold_ms.min(t.max_hold_ms);
        let goaway = Action::goaway_inbound(&t.workload)
            .mode(self.mode)
            .hard_deadline_ms(bound)
            .close_notify(self.close_notify);
        vec![goaway.into(), Action::hold_teardown(&t.workload, bound)]
    }
}

export_policy!(DrainAtTeardown);

#[cfg(test)]
mod tests {
    use tidegate_sdk::trace::Trace;
    use tidegate_sdk::{NetworkTeardown, ShutdownStarted, WorkloadInfo, WorkloadState};

    use super::*;

    fn teardown(tunnels: u32, max_hold_ms: u64) -> Event {
        Event::NetworkTeardown(NetworkTeardown {
            workload: WorkloadState::new(WorkloadInfo::new("w")).with_inbound(tunnels, 4),
            since_shutdown_ms: Some(20_000),
            max_hold_ms,
        })
    }

    #[test]
    fn teardown_with_tunnels_sends_goaway_and_holds() {
        let mut p = DrainAtTeardown::init("").unwrap();
        assert_eq!(
            p.decide(&teardown(2, 60_000)),
            vec![
                Action::goaway_inbound("w")
                    .graceful()
                    .hard_deadline_ms(10_000)
                    .close_notify(true)
                    .into(),
                Action::hold_teardown("w", 10_000),
            ]
        );
    }

    #[test]
    fn hold_respects_the_hosts_maximum_and_config() {
        let mut p = DrainAtTeardown::init(
            r#"{"hold-ms": 8000, "mode": "immediate", "close-notify": false}"#,
        )
        .unwrap();
        assert_eq!(
            p.decide(&teardown(1, 3_000)),
            vec![
                Action::goaway_inbound("w")
                    .immediate()
                    .hard_deadline_ms(3_000)
                    .into(),
                Action::hold_teardown("w", 3_000),
            ]
        );
    }

    #[test]
    fn nothing_without_tunnels_or_at_shutdown_start() {
        let mut p = DrainAtTeardown::init("").unwrap();
        assert!(p.decide(&teardown(0, 60_000)).is_empty());
        let start = Event::ShutdownStarted(ShutdownStarted {
            workload: WorkloadState::new(WorkloadInfo::new("w")).with_inbound(3, 3),
            grace_deadline_ms: 30_000,
            grace_remaining_ms: 30_000,
        });
        assert!(p.decide(&start).is_empty());
    }

    #[test]
    fn bad_config_names_the_key() {
        let e = DrainAtTeardown::init(r#"{"mode": "gentle"}"#).unwrap_err();
        assert!(e.contains("`mode`") && e.contains("\"graceful\""), "{e}");
        let e = DrainAtTeardown::init(r#"{"hold-ms": 99999999}"#).unwrap_err();
        assert!(e.contains("`hold-ms`"), "{e}");
    }

    #[test]
    fn the_sdk_readme_trace_example_passes() {
        let readme = include_str!("../../../sdk/README.md");
        let start = readme.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
        let len = readme[start..].find("```").expect("the block's end");
        Trace::from_yaml(&readme[start..start + len])
            .unwrap()
            .run::<DrainAtTeardown>()
            .unwrap();
    }

    #[test]
    fn trace_passes() {
        Trace::from_yaml(include_str!("../trace.yaml"))
            .unwrap()
            .run::<DrainAtTeardown>()
            .unwrap();
    }
}
