//! What the drain engine is told and answers with: where an event came
//! from and which pod, what handling one did or why it failed, and the
//! views `GET /drains` and the admin API return.

use std::time::{Duration, SystemTime};

use super::phase::Phase;
use crate::oci::OciStatus;
use serde::Serialize;

/// Where a lifecycle event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    Admin,
    WorkloadFile,
    Kubernetes,
    /// istiod's delta xDS.
    Istio,
    Cni,
    /// istio-cni's node agent over ZDS (`DelWorkload`).
    Zds,
    Timer,
}

impl Trigger {
    pub fn label(self) -> &'static str {
        match self {
            Trigger::Admin => "admin",
            Trigger::WorkloadFile => "workload-file",
            Trigger::Kubernetes => "kubernetes",
            Trigger::Istio => "istio",
            Trigger::Cni => "cni",
            Trigger::Zds => "zds",
            Trigger::Timer => "timer",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("no workload with uid {0:?} on this node")]
    UnknownWorkload(String),
    /// A deletion seen in a workload-store snapshot, handled after the
    /// workload came back with the same uid: it is about the earlier one.
    #[error("workload {0:?} came back with the same uid before its deletion was handled; the deletion is dropped")]
    CameBack(String),
}

/// The network-teardown acknowledgement.
#[derive(Clone, Debug, Serialize)]
pub struct TeardownAck {
    /// `idle` (no stream left), `bound` (the hold expired), `no-hold` (the
    /// policy asked for none) or `already` (this teardown was acknowledged before).
    pub result: &'static str,
    pub held_ms: u64,
    pub streams_left: usize,
}

/// What handling one lifecycle event did.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub uid: String,
    pub event: &'static str,
    pub duplicate: bool,
    pub policy: Option<String>,
    pub version: Option<String>,
    pub fallback: Option<String>,
    pub actions: Vec<String>,
    pub teardown: Option<TeardownAck>,
}

impl Outcome {
    /// What a decision about `uid` did (no teardown acknowledgement).
    pub(super) fn decided(
        uid: &str,
        event: &'static str,
        decision: tidegate_policy_host::Decision,
        actions: Vec<String>,
    ) -> Outcome {
        Outcome {
            uid: uid.to_owned(),
            event,
            duplicate: false,
            policy: Some(decision.policy),
            version: decision.version,
            fallback: decision
                .fallback
                .map(|f| format!("{}: {}", f.kind, f.detail)),
            actions,
            teardown: None,
        }
    }
}

/// A drain in progress (or finished), as `GET /drains` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct DrainView {
    pub uid: String,
    pub workload: String,
    pub policy: String,
    pub version: Option<String>,
    pub trigger: Trigger,
    pub phase: Phase,
    pub started_unix_ms: u128,
    pub deadline_unix_ms: Option<u128>,
    pub actions_taken: Vec<String>,
    pub tunnels_remaining: usize,
    pub streams_remaining: usize,
    pub ended: Option<&'static str>,
    /// The workload's OCI backend drain, if an `oci-drain` action asked for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciStatus>,
}

/// A pod as its node agent names it.
#[derive(Clone, Copy, Debug)]
pub struct PodKey<'a> {
    pub uid: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
}

/// `now + d` in unix milliseconds, saturating instead of overflowing.
pub(super) fn unix_ms_after(d: Duration) -> u64 {
    SystemTime::now()
        .checked_add(d)
        .map_or(u64::MAX, |t| u64::try_from(unix_ms(t)).unwrap_or(u64::MAX))
}

pub(super) fn unix_ms(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}
