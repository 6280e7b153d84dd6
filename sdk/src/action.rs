//! Actions: what a policy asks the gateway to do.
//!
//! Build them with the constructors on [`Action`] and the chained setters
//! on each payload, then `.into()` an [`Action`]:
//!
//! ```
//! use tidegate_sdk::{Action, WorkloadInfo};
//! let w = WorkloadInfo::new("uid-1");
//! let a: Action = Action::goaway_inbound(&w).graceful().hard_deadline_ms(25_000).into();
//! assert_eq!(a.subject(), Some("uid-1"));
//! ```

use serde::{Deserialize, Serialize};

use crate::event::Subject;

/// Severity of a log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogLevel {
    /// Very detailed.
    Trace,
    /// Detailed.
    Debug,
    /// Normal.
    Info,
    /// Something looks wrong.
    Warn,
    /// Something is wrong.
    Error,
}

/// Which tunnels a GOAWAY is sent on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GoawayTarget {
    /// Inbound tunnels terminating at the local workload.
    Inbound,
    /// Pooled outbound tunnels to the peer (or from the local workload).
    Outbound,
    /// Both.
    Both,
}

/// How a GOAWAY is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GoawayMode {
    /// Two-phase GOAWAY (RFC 9113 §6.8).
    Graceful,
    /// One final GOAWAY right away.
    Immediate,
}

/// Send GOAWAY on a set of tunnels. Defaults from the constructors:
/// no delay, graceful, host's default hard deadline, no close_notify.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Goaway {
    /// Uid of the workload or peer the tunnels belong to.
    pub workload: String,
    /// Which tunnels.
    pub target: GoawayTarget,
    /// Milliseconds after the decision before sending.
    pub delay_ms: u64,
    /// Graceful or immediate.
    pub mode: GoawayMode,
    /// Milliseconds after the decision at which open streams are reset;
    /// `None` means the host's default bound.
    #[serde(default)]
    pub hard_deadline_ms: Option<u64>,
    /// Send TLS close_notify when closing.
    pub close_notify: bool,
}

impl Goaway {
    fn new(subject: &(impl Subject + ?Sized), target: GoawayTarget) -> Self {
        Self {
            workload: subject.subject().to_owned(),
            target,
            delay_ms: 0,
            mode: GoawayMode::Graceful,
            hard_deadline_ms: None,
            close_notify: false,
        }
    }

    /// Two-phase GOAWAY (the default).
    pub fn graceful(mut self) -> Self {
        self.mode = GoawayMode::Graceful;
        self
    }

    /// One final GOAWAY right away.
    pub fn immediate(mut self) -> Self {
        self.mode = GoawayMode::Immediate;
        self
    }

    /// Graceful or immediate, chosen at run time (e.g. from configuration).
    pub fn mode(mut self, mode: GoawayMode) -> Self {
        self.mode = mode;
        self
    }

    /// Wait this long after the decision before sending.
    pub fn delay_ms(mut self, ms: u64) -> Self {
        self.delay_ms = ms;
        self
    }

    /// Reset streams still open this long after the decision.
    pub fn hard_deadline_ms(mut self, ms: u64) -> Self {
        self.hard_deadline_ms = Some(ms);
        self
    }

    /// Send TLS close_notify when closing.
    pub fn close_notify(mut self, yes: bool) -> Self {
        self.close_notify = yes;
        self
    }
}

/// When pooled tunnels are evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EvictWhen {
    /// Right away.
    Now,
    /// Once each tunnel has no open stream.
    WhenIdle,
}

/// Evict the pooled outbound tunnels to a peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Evict {
    /// Uid of the peer.
    pub peer: String,
    /// Now or when idle.
    pub when: EvictWhen,
}

/// Exponential backoff for connects to a destination. Defaults from
/// [`Action::backoff`]: 100 ms initial, 10 s max, ×2, ±20 % jitter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Backoff {
    /// Destination key from [`crate::ConnectFailing::destination`].
    pub destination: String,
    /// First wait, ms.
    pub initial_ms: u64,
    /// Longest wait, ms.
    pub max_ms: u64,
    /// Growth factor per retry (>= 1.0).
    pub multiplier: f64,
    /// Randomisation ratio (0.0 to 1.0).
    pub jitter: f64,
}

impl Backoff {
    /// First wait.
    pub fn initial_ms(mut self, ms: u64) -> Self {
        self.initial_ms = ms;
        self
    }

    /// Longest wait.
    pub fn max_ms(mut self, ms: u64) -> Self {
        self.max_ms = ms;
        self
    }

    /// Growth factor per retry.
    pub fn multiplier(mut self, m: f64) -> Self {
        self.multiplier = m;
        self
    }

    /// Randomisation ratio.
    pub fn jitter(mut self, j: f64) -> Self {
        self.jitter = j;
        self
    }
}

/// What to do with a draining OCI backend when its set is at capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AtCapacity {
    /// Remove it early to make room.
    RemoveEarly,
    /// Keep it until the workload is deleted.
    Keep,
}

/// Drain (or undrain) the workload's OCI load-balancer backends. Defaults
/// from [`Action::oci_drain`]: drain, keep at capacity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct OciDrain {
    /// Uid of the local workload.
    pub workload: String,
    /// True to drain, false to undo.
    pub drain: bool,
    /// Behaviour at capacity.
    pub at_capacity: AtCapacity,
}

impl OciDrain {
    /// Undo a drain instead.
    pub fn undrain(mut self) -> Self {
        self.drain = false;
        self
    }

    /// Behaviour at capacity.
    pub fn at_capacity(mut self, at: AtCapacity) -> Self {
        self.at_capacity = at;
        self
    }
}

/// Hold a network teardown until the inbound tunnels are idle or a bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct HoldTeardown {
    /// Uid of the local workload.
    pub workload: String,
    /// Longest hold, ms.
    pub bound_ms: u64,
}

/// Ask for a [`crate::Event::TimerFired`] later.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SetTimer {
    /// A subject of the current event; repeated when the timer fires.
    pub subject: String,
    /// Free text repeated when the timer fires.
    pub tag: String,
    /// Milliseconds until it fires.
    pub after_ms: u64,
}

/// A log line that is part of the decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct LogLine {
    /// Severity.
    pub level: LogLevel,
    /// Text.
    pub message: String,
}

/// What the policy wants done.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// Send GOAWAY.
    Goaway(Goaway),
    /// Evict pooled tunnels.
    Evict(Evict),
    /// Back off connects.
    Backoff(Backoff),
    /// Drain OCI backends.
    OciDrain(OciDrain),
    /// Hold the network teardown.
    HoldTeardown(HoldTeardown),
    /// Set a timer.
    SetTimer(SetTimer),
    /// Log a line.
    Log(LogLine),
}

impl Action {
    /// GOAWAY on the inbound tunnels of a local workload.
    pub fn goaway_inbound(workload: &(impl Subject + ?Sized)) -> Goaway {
        Goaway::new(workload, GoawayTarget::Inbound)
    }

    /// GOAWAY on the pooled outbound tunnels to a peer (or from a local
    /// workload).
    pub fn goaway_outbound(peer: &(impl Subject + ?Sized)) -> Goaway {
        Goaway::new(peer, GoawayTarget::Outbound)
    }

    /// GOAWAY on both inbound and outbound tunnels of a workload.
    pub fn goaway_both(workload: &(impl Subject + ?Sized)) -> Goaway {
        Goaway::new(workload, GoawayTarget::Both)
    }

    /// Evict the pooled tunnels to a peer right away.
    pub fn evict_now(peer: &(impl Subject + ?Sized)) -> Action {
        Action::Evict(Evict {
            peer: peer.subject().to_owned(),
            when: EvictWhen::Now,
        })
    }

    /// Evict the pooled tunnels to a peer once each is idle.
    pub fn evict_when_idle(peer: &(impl Subject + ?Sized)) -> Action {
        Action::Evict(Evict {
            peer: peer.subject().to_owned(),
            when: EvictWhen::WhenIdle,
        })
    }

    /// Backoff for a destination key, with the defaults documented on
    /// [`Backoff`].
    pub fn backoff(destination: &(impl Subject + ?Sized)) -> Backoff {
        Backoff {
            destination: destination.subject().to_owned(),
            initial_ms: 100,
            max_ms: 10_000,
            multiplier: 2.0,
            jitter: 0.2,
        }
    }

    /// Drain the OCI backends of a local workload.
    pub fn oci_drain(workload: &(impl Subject + ?Sized)) -> OciDrain {
        OciDrain {
            workload: workload.subject().to_owned(),
            drain: true,
            at_capacity: AtCapacity::Keep,
        }
    }

    /// Hold the network teardown of a local workload for at most `bound_ms`.
    pub fn hold_teardown(workload: &(impl Subject + ?Sized), bound_ms: u64) -> Action {
        Action::HoldTeardown(HoldTeardown {
            workload: workload.subject().to_owned(),
            bound_ms,
        })
    }

    /// A timer about `subject`, firing `after_ms` from now.
    pub fn set_timer(
        subject: &(impl Subject + ?Sized),
        tag: impl Into<String>,
        after_ms: u64,
    ) -> Action {
        Action::SetTimer(SetTimer {
            subject: subject.subject().to_owned(),
            tag: tag.into(),
            after_ms,
        })
    }

    /// A log line that is part of the decision. On a hot path, build the
    /// message with [`text!`](crate::text!) rather than `format!`.
    pub fn log(level: LogLevel, message: impl Into<String>) -> Action {
        Action::Log(LogLine {
            level,
            message: message.into(),
        })
    }

    /// The uid (or destination key) the action is about; `None` for a log.
    pub fn subject(&self) -> Option<&str> {
        match self {
            Action::Goaway(a) => Some(&a.workload),
            Action::Evict(a) => Some(&a.peer),
            Action::Backoff(a) => Some(&a.destination),
            Action::OciDrain(a) => Some(&a.workload),
            Action::HoldTeardown(a) => Some(&a.workload),
            Action::SetTimer(a) => Some(&a.subject),
            Action::Log(_) => None,
        }
    }

    /// The WIT (and YAML) name of the action's case, e.g. `"goaway"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::Goaway(_) => "goaway",
            Action::Evict(_) => "evict",
            Action::Backoff(_) => "backoff",
            Action::OciDrain(_) => "oci-drain",
            Action::HoldTeardown(_) => "hold-teardown",
            Action::SetTimer(_) => "set-timer",
            Action::Log(_) => "log",
        }
    }
}

impl From<Goaway> for Action {
    fn from(a: Goaway) -> Self {
        Action::Goaway(a)
    }
}

impl From<Backoff> for Action {
    fn from(a: Backoff) -> Self {
        Action::Backoff(a)
    }
}

impl From<OciDrain> for Action {
    fn from(a: OciDrain) -> Self {
        Action::OciDrain(a)
    }
}
