//! Built-in fallback policies: what decides an event when the plugin cannot
//! (trap, timeout, memory, invalid result, quarantine, not loaded).

use serde::{Deserialize, Serialize};
use tidegate_sdk as sdk;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fallback {
    /// Option 4: do nothing; keepalives eventually notice dead tunnels.
    #[default]
    KeepaliveOnly,
    /// Option 1: graceful GOAWAY to the workload's inbound tunnels when its
    /// shutdown starts, hard deadline one second before the grace period ends.
    GoawayOnTermStart,
}

impl Fallback {
    pub fn name(self) -> &'static str {
        match self {
            Fallback::KeepaliveOnly => "builtin:keepalive-only",
            Fallback::GoawayOnTermStart => "builtin:goaway-on-term-start",
        }
    }

    pub fn decide(self, event: &sdk::Event) -> Vec<sdk::Action> {
        match (self, event) {
            (Fallback::KeepaliveOnly, _) => vec![],
            (Fallback::GoawayOnTermStart, sdk::Event::ShutdownStarted(s)) => {
                vec![sdk::Action::goaway_inbound(&s.workload)
                    .graceful()
                    .hard_deadline_ms(s.grace_remaining_ms.saturating_sub(1_000))
                    .close_notify(true)
                    .into()]
            }
            (Fallback::GoawayOnTermStart, _) => vec![],
        }
    }
}
