//! The phase machine of one workload's drain, as a pure function.
//!
//! Transitions only move forward — running → shutting down → torn down →
//! deleted — so the same transition seen twice (from the workload file and
//! the admin API, or a retried CNI DEL) is a duplicate, and an event behind
//! the current phase (a late shutdown after the teardown) is one too.

use std::time::Duration;

use serde::Serialize;

/// A lifecycle transition of a local workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// Termination started; the pod's grace period.
    ShutdownStarted { grace: Duration },
    /// The app exited; the network is about to go (CNI DEL).
    Teardown,
    /// The workload is gone.
    Deleted,
}

/// Where a local workload is in its lifecycle, as the drain engine saw it
/// (`GET /drains`, `/config_dump`): `running`, `shutting-down`, `torn-down`, `deleted`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Running,
    ShuttingDown,
    TornDown,
    Deleted,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::ShuttingDown => "shutting-down",
            Phase::TornDown => "torn-down",
            Phase::Deleted => "deleted",
        }
    }
}

/// What an event does to a drain in a given phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Transition {
    /// The first lifecycle event of a running workload: the drain starts.
    Start(Phase),
    /// A drain moves forward to the phase.
    Advance(Phase),
    /// Already there (or past it): nothing is decided again.
    Duplicate,
}

impl Lifecycle {
    pub(super) fn phase(self) -> Phase {
        match self {
            Lifecycle::ShutdownStarted { .. } => Phase::ShuttingDown,
            Lifecycle::Teardown => Phase::TornDown,
            Lifecycle::Deleted => Phase::Deleted,
        }
    }

    pub(super) fn kind(self) -> &'static str {
        match self {
            Lifecycle::ShutdownStarted { .. } => "shutdown-started",
            Lifecycle::Teardown => "network-teardown",
            Lifecycle::Deleted => "workload-deleted",
        }
    }
}

/// The transition `event` makes from `current`.
pub(super) fn transition(current: Phase, event: Lifecycle) -> Transition {
    let next = event.phase();
    if current >= next {
        Transition::Duplicate
    } else if current == Phase::Running {
        Transition::Start(next)
    } else {
        Transition::Advance(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHUTDOWN: Lifecycle = Lifecycle::ShutdownStarted {
        grace: Duration::from_secs(30),
    };

    #[test]
    fn the_transition_table() {
        use Phase::*;
        use Transition::*;
        let table = [
            (Running, SHUTDOWN, Start(ShuttingDown)),
            (Running, Lifecycle::Teardown, Start(TornDown)),
            (Running, Lifecycle::Deleted, Start(Deleted)),
            (ShuttingDown, SHUTDOWN, Duplicate),
            (ShuttingDown, Lifecycle::Teardown, Advance(TornDown)),
            (ShuttingDown, Lifecycle::Deleted, Advance(Deleted)),
            (TornDown, SHUTDOWN, Duplicate),
            (TornDown, Lifecycle::Teardown, Duplicate),
            (TornDown, Lifecycle::Deleted, Advance(Deleted)),
            (Deleted, SHUTDOWN, Duplicate),
            (Deleted, Lifecycle::Teardown, Duplicate),
            (Deleted, Lifecycle::Deleted, Duplicate),
        ];
        for (current, event, expected) in table {
            assert_eq!(
                transition(current, event),
                expected,
                "{current:?} + {event:?}"
            );
        }
    }

    #[test]
    fn a_grace_does_not_change_the_transition() {
        let huge = Lifecycle::ShutdownStarted {
            grace: Duration::MAX,
        };
        assert_eq!(
            transition(Phase::Running, huge),
            Transition::Start(Phase::ShuttingDown)
        );
        assert_eq!(transition(Phase::ShuttingDown, huge), Transition::Duplicate);
    }
}
