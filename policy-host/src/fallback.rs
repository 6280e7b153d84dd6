//! Built-in fallback policies: what decides an event when the plugin cannot
//! (trap, timeout, memory, invalid result, quarantine, not loaded).

use tidegate_sdk as sdk;

pub use crate::config::Fallback;

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
