//! Drain option 3: when a peer is deleted, evict the pooled tunnels to it
//! right away; when connects to a destination fail `failure-threshold`
//! times in a row, back off exponentially with jitter. Optionally evict
//! when idle as soon as a peer starts terminating.
//!
//! Configuration (JSON object, every key optional):
//! - `on-peer-terminating` (`"nothing"` or `"evict-when-idle"`, default
//!   `"nothing"`).
//! - `failure-threshold` (integer 1..=1000, default 3): consecutive
//!   failures before backing off.
//! - `backoff-initial-ms` (integer 1..=600000, default 100).
//! - `backoff-max-ms` (integer 1..=600000, default 10000; not below
//!   `backoff-initial-ms`).
//! - `backoff-multiplier` (number 1.0..=10.0, default 2.0).
//! - `backoff-jitter` (number 0.0..=1.0, default 0.2).

use tidegate_sdk::config::Config;
use tidegate_sdk::{export_policy, Action, Backoff, Event, MetadataReads, Policy};

/// See the crate documentation.
#[derive(Debug)]
pub struct EvictOnDelete {
    evict_on_terminating: bool,
    failure_threshold: u32,
    backoff: Backoff,
}

/// Reads `failure-threshold` and the `backoff-*` keys (the `recommended`
/// policy reads the same keys the same way).
fn backoff_config(c: &mut Config) -> Result<(u32, Backoff), String> {
    let threshold = c.u32("failure-threshold", 3, 1..=1000)?;
    let backoff = Action::backoff("")
        .initial_ms(c.u64("backoff-initial-ms", 100, 1..=600_000)?)
        .max_ms(c.u64("backoff-max-ms", 10_000, 1..=600_000)?)
        .multiplier(c.f64("backoff-multiplier", 2.0, 1.0..=10.0)?)
        .jitter(c.f64("backoff-jitter", 0.2, 0.0..=1.0)?);
    if backoff.max_ms < backoff.initial_ms {
        return Err(format!(
            "config key `backoff-max-ms`: {} is below `backoff-initial-ms` {}",
            backoff.max_ms, backoff.initial_ms
        ));
    }
    Ok((threshold, backoff))
}

impl Policy for EvictOnDelete {
    fn init(config: &str) -> Result<Self, String> {
        let mut c = Config::parse(config)?;
        let evict_on_terminating = c.choice(
            "on-peer-terminating",
            false,
            &[("nothing", false), ("evict-when-idle", true)],
        )?;
        let (failure_threshold, backoff) = backoff_config(&mut c)?;
        c.finish()?;
        Ok(Self {
            evict_on_terminating,
            failure_threshold,
            backoff,
        })
    }

    /// No label and no annotation: the decision never looks at them.
    fn reads(&self) -> MetadataReads {
        MetadataReads::none()
    }

    fn decide(&mut self, event: &Event) -> Vec<Action> {
        match event {
            Event::PeerDeleted(p) => vec![Action::evict_now(p)],
            Event::PeerTerminating(p) if self.evict_on_terminating => {
                vec![Action::evict_when_idle(p)]
            }
            Event::ConnectFailing(f) if f.consecutive_failures >= self.failure_threshold => {
                let mut backoff = self.backoff.clone();
                backoff.destination.clone_from(&f.destination);
                vec![backoff.into()]
            }
            _ => vec![],
        }
    }
}

export_policy!(EvictOnDelete);

#[cfg(test)]
mod tests {
    use tidegate_sdk::trace::Trace;
    use tidegate_sdk::{ConnectFailing, PeerInfo, PeerState};

    use super::*;

    fn peer() -> PeerState {
        PeerState {
            peer: PeerInfo::new("db-uid"),
            pooled_tunnels: 2,
            active_streams: 1,
        }
    }

    fn failing(n: u32) -> Event {
        Event::ConnectFailing(ConnectFailing {
            destination: "10.1.2.3:15008".into(),
            peer: None,
            consecutive_failures: n,
            last_error: "connection refused".into(),
            failing_for_ms: 300,
        })
    }

    #[test]
    fn deleted_peer_is_evicted_now_terminating_peer_left_alone() {
        let mut p = EvictOnDelete::init("").unwrap();
        assert_eq!(
            p.decide(&Event::PeerDeleted(peer())),
            vec![Action::evict_now("db-uid")]
        );
        assert!(p.decide(&Event::PeerTerminating(peer())).is_empty());
    }

    #[test]
    fn terminating_peer_evicted_when_idle_if_configured() {
        let mut p = EvictOnDelete::init(r#"{"on-peer-terminating": "evict-when-idle"}"#).unwrap();
        assert_eq!(
            p.decide(&Event::PeerTerminating(peer())),
            vec![Action::evict_when_idle("db-uid")]
        );
    }

    #[test]
    fn backoff_starts_at_the_threshold_with_configured_numbers() {
        let mut p = EvictOnDelete::init(
            r#"{"failure-threshold": 2, "backoff-initial-ms": 50, "backoff-max-ms": 5000,
                "backoff-multiplier": 1.5, "backoff-jitter": 0.5}"#,
        )
        .unwrap();
        assert!(p.decide(&failing(1)).is_empty());
        let want: Action = Action::backoff("10.1.2.3:15008")
            .initial_ms(50)
            .max_ms(5_000)
            .multiplier(1.5)
            .jitter(0.5)
            .into();
        assert_eq!(p.decide(&failing(2)), vec![want.clone()]);
        assert_eq!(p.decide(&failing(9)), vec![want]);
    }

    #[test]
    fn bad_config_names_the_key() {
        let e = EvictOnDelete::init(r#"{"backoff-initial-ms": 500, "backoff-max-ms": 100}"#)
            .unwrap_err();
        assert!(
            e.contains("`backoff-max-ms`") && e.contains("`backoff-initial-ms`"),
            "{e}"
        );
        let e = EvictOnDelete::init(r#"{"backoff-jitter": 1.5}"#).unwrap_err();
        assert!(e.contains("`backoff-jitter`"), "{e}");
        let e = EvictOnDelete::init(r#"{"failure-threshold": 0}"#).unwrap_err();
        assert!(e.contains("`failure-threshold`"), "{e}");
    }

    #[test]
    fn trace_passes() {
        Trace::from_yaml(include_str!("../trace.yaml"))
            .unwrap()
            .run::<EvictOnDelete>()
            .unwrap();
    }
}
