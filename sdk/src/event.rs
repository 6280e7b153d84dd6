//! Events: what happened, with the facts a decision needs.
//!
//! These mirror the WIT records of `tidegate:policy/types` field for field
//! (Rust `snake_case` here, WIT and YAML `kebab-case`). Labels and
//! annotations are maps here and `(key, value)` lists in WIT.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Anything that has a uid (or destination key) actions can name.
pub trait Subject {
    /// The uid (or destination key) an action about this thing carries.
    fn subject(&self) -> &str;
}

impl Subject for str {
    fn subject(&self) -> &str {
        self
    }
}

impl Subject for String {
    fn subject(&self) -> &str {
        self
    }
}

/// Identity and metadata of a workload (a pod) on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct WorkloadInfo {
    /// Kubernetes pod uid; actions name the workload by it.
    pub uid: String,
    /// Pod name.
    #[serde(default)]
    pub name: String,
    /// Pod namespace.
    #[serde(default)]
    pub namespace: String,
    /// SPIFFE id of the workload.
    #[serde(default)]
    pub identity: String,
    /// Pod labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Pod annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl WorkloadInfo {
    /// A workload with only a uid (handy in tests).
    pub fn new(uid: impl Into<String>) -> Self {
        Self {
            uid: uid.into(),
            ..Self::default()
        }
    }

    /// Sets the pod name and namespace.
    pub fn named(mut self, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self.name = name.into();
        self
    }

    /// Adds a label.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Adds an annotation.
    pub fn with_annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }

    /// The value of a label.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// The value of an annotation.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }
}

impl Subject for WorkloadInfo {
    fn subject(&self) -> &str {
        &self.uid
    }
}

/// A local workload as the gateway sees it when the event happens.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct WorkloadState {
    /// Identity and metadata.
    pub info: WorkloadInfo,
    /// Open HBONE tunnels terminating at this workload.
    #[serde(default)]
    pub inbound_tunnels: u32,
    /// Open CONNECT streams over those tunnels.
    #[serde(default)]
    pub inbound_streams: u32,
    /// Pooled outbound tunnels whose source is this workload.
    #[serde(default)]
    pub outbound_pooled_tunnels: u32,
    /// Milliseconds since the gateway first saw the workload.
    #[serde(default)]
    pub age_ms: u64,
}

impl WorkloadState {
    /// A workload state with no tunnels and age 0.
    pub fn new(info: WorkloadInfo) -> Self {
        Self {
            info,
            ..Self::default()
        }
    }

    /// Sets the inbound tunnel and stream counts.
    pub fn with_inbound(mut self, tunnels: u32, streams: u32) -> Self {
        self.inbound_tunnels = tunnels;
        self.inbound_streams = streams;
        self
    }

    /// The workload's uid.
    pub fn uid(&self) -> &str {
        &self.info.uid
    }
}

impl Subject for WorkloadState {
    fn subject(&self) -> &str {
        &self.info.uid
    }
}

/// Payload of [`Event::ShutdownStarted`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ShutdownStarted {
    /// The workload that is shutting down.
    pub workload: WorkloadState,
    /// End of the grace period, ms since the Unix epoch.
    pub grace_deadline_ms: u64,
    /// Milliseconds left until the grace deadline.
    pub grace_remaining_ms: u64,
}

/// Payload of [`Event::NetworkTeardown`] (CNI DEL).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct NetworkTeardown {
    /// The workload whose network is being torn down.
    pub workload: WorkloadState,
    /// Milliseconds since its shutdown started, if the gateway saw that.
    #[serde(default)]
    pub since_shutdown_ms: Option<u64>,
    /// Longest hold the host honours for [`crate::HoldTeardown::bound_ms`].
    pub max_hold_ms: u64,
}

/// A destination workload the gateway pools outbound tunnels to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct PeerInfo {
    /// Kubernetes pod uid of the peer; actions name the peer by it.
    pub uid: String,
    /// Pod name, empty when unknown.
    #[serde(default)]
    pub name: String,
    /// Pod namespace, empty when unknown.
    #[serde(default)]
    pub namespace: String,
    /// SPIFFE id.
    #[serde(default)]
    pub identity: String,
    /// HBONE address, `ip:port`.
    #[serde(default)]
    pub address: String,
}

impl PeerInfo {
    /// A peer with only a uid (handy in tests).
    pub fn new(uid: impl Into<String>) -> Self {
        Self {
            uid: uid.into(),
            ..Self::default()
        }
    }
}

impl Subject for PeerInfo {
    fn subject(&self) -> &str {
        &self.uid
    }
}

/// A peer as the gateway sees it when the event happens.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct PeerState {
    /// Identity of the peer.
    pub peer: PeerInfo,
    /// Pooled outbound tunnels to it.
    #[serde(default)]
    pub pooled_tunnels: u32,
    /// Open CONNECT streams over those tunnels.
    #[serde(default)]
    pub active_streams: u32,
}

impl Subject for PeerState {
    fn subject(&self) -> &str {
        &self.peer.uid
    }
}

/// Payload of [`Event::ConnectFailing`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ConnectFailing {
    /// Pool key of the destination (`ip:port`); [`crate::Backoff`] repeats it.
    pub destination: String,
    /// The peer behind it, when known.
    #[serde(default)]
    pub peer: Option<PeerInfo>,
    /// Consecutive failed connects (>= 1).
    pub consecutive_failures: u32,
    /// The last error as text.
    #[serde(default)]
    pub last_error: String,
    /// Milliseconds since the first of these failures.
    #[serde(default)]
    pub failing_for_ms: u64,
}

impl Subject for ConnectFailing {
    fn subject(&self) -> &str {
        &self.destination
    }
}

/// Payload of [`Event::GatewayShutdown`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct GatewayShutdown {
    /// When the gateway exits, ms since the Unix epoch.
    pub deadline_ms: u64,
    /// Milliseconds left until then.
    pub remaining_ms: u64,
    /// Every local workload.
    #[serde(default)]
    pub workloads: Vec<WorkloadState>,
}

/// Payload of [`Event::TimerFired`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct TimerFired {
    /// The subject the timer was set with.
    pub subject: String,
    /// The tag the timer was set with.
    #[serde(default)]
    pub tag: String,
    /// The subject's current state when it is a known local workload.
    #[serde(default)]
    pub workload: Option<WorkloadState>,
}

impl Subject for TimerFired {
    fn subject(&self) -> &str {
        &self.subject
    }
}

/// Something that happened; see the WIT `event` variant for each subject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Event {
    /// A workload appeared on this node.
    WorkloadAdded(WorkloadState),
    /// A workload began terminating.
    ShutdownStarted(ShutdownStarted),
    /// CNI DEL: the app exited, the network still exists.
    NetworkTeardown(NetworkTeardown),
    /// A workload is gone from the API server.
    WorkloadDeleted(WorkloadState),
    /// A peer began terminating.
    PeerTerminating(PeerState),
    /// A peer is gone from the API server.
    PeerDeleted(PeerState),
    /// Connects to a destination keep failing.
    ConnectFailing(ConnectFailing),
    /// The gateway is stopping.
    GatewayShutdown(GatewayShutdown),
    /// A timer set by [`crate::Action::set_timer`] fired.
    TimerFired(TimerFired),
}

/// Every [`Event::kind`], in WIT order.
pub const EVENT_KINDS: [&str; 9] = [
    "workload-added",
    "shutdown-started",
    "network-teardown",
    "workload-deleted",
    "peer-terminating",
    "peer-deleted",
    "connect-failing",
    "gateway-shutdown",
    "timer-fired",
];

impl Event {
    /// The WIT (and YAML) name of the event's case, e.g. `"shutdown-started"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::WorkloadAdded(_) => "workload-added",
            Event::ShutdownStarted(_) => "shutdown-started",
            Event::NetworkTeardown(_) => "network-teardown",
            Event::WorkloadDeleted(_) => "workload-deleted",
            Event::PeerTerminating(_) => "peer-terminating",
            Event::PeerDeleted(_) => "peer-deleted",
            Event::ConnectFailing(_) => "connect-failing",
            Event::GatewayShutdown(_) => "gateway-shutdown",
            Event::TimerFired(_) => "timer-fired",
        }
    }

    /// The local workload the event is about, for the events that have one.
    pub fn workload(&self) -> Option<&WorkloadState> {
        match self {
            Event::WorkloadAdded(w) | Event::WorkloadDeleted(w) => Some(w),
            Event::ShutdownStarted(e) => Some(&e.workload),
            Event::NetworkTeardown(e) => Some(&e.workload),
            Event::TimerFired(e) => e.workload.as_ref(),
            Event::PeerTerminating(_)
            | Event::PeerDeleted(_)
            | Event::ConnectFailing(_)
            | Event::GatewayShutdown(_) => None,
        }
    }

    /// The uids (or destination key) actions in answer to this event may
    /// name, as the host enforces it.
    pub fn subjects(&self) -> Vec<&str> {
        match self {
            Event::WorkloadAdded(w) | Event::WorkloadDeleted(w) => vec![w.uid()],
            Event::ShutdownStarted(e) => vec![e.workload.uid()],
            Event::NetworkTeardown(e) => vec![e.workload.uid()],
            Event::PeerTerminating(p) | Event::PeerDeleted(p) => vec![p.subject()],
            Event::ConnectFailing(e) => {
                let mut s = vec![e.destination.as_str()];
                if let Some(p) = &e.peer {
                    s.push(&p.uid);
                }
                s
            }
            Event::GatewayShutdown(e) => e.workloads.iter().map(WorkloadState::uid).collect(),
            Event::TimerFired(e) => vec![e.subject.as_str()],
        }
    }

    /// Whether an action may name `subject` in answer to this event: one of
    /// [`Event::subjects`], without collecting them.
    pub fn has_subject(&self, subject: &str) -> bool {
        match self {
            Event::WorkloadAdded(w) | Event::WorkloadDeleted(w) => w.uid() == subject,
            Event::ShutdownStarted(e) => e.workload.uid() == subject,
            Event::NetworkTeardown(e) => e.workload.uid() == subject,
            Event::PeerTerminating(p) | Event::PeerDeleted(p) => p.subject() == subject,
            Event::ConnectFailing(e) => {
                e.destination == subject || e.peer.as_ref().is_some_and(|p| p.uid == subject)
            }
            Event::GatewayShutdown(e) => e.workloads.iter().any(|w| w.uid() == subject),
            Event::TimerFired(e) => e.subject == subject,
        }
    }
}
