//! Per-workload lifecycle and the drains it starts.
//!
//! Transitions only move forward — running → shutting down → torn down →
//! deleted — so the same transition seen twice (from the workload file and
//! the admin API, or a retried CNI DEL) drains once. A drain pins the policy
//! version that started it; later events of the same workload are decided by
//! that version even if a new one was swapped in meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tidegate_sdk as sdk;
use tokio::time::Instant;
use tracing::info;

use super::executor::{self, Executed, Handles, TimerSink};
use super::metrics::{DrainLabels, DrainMetrics, EndLabels, EventLabels};
use super::phase::{transition, Transition};
pub use super::phase::{Lifecycle, Phase};
use super::tasks::DrainTasks;
use crate::config::DrainsConfig;
use crate::oci::{OciDrainer, OciStatus};
use crate::policy::{PolicyEngine, Selection};
use crate::proxy::pool::Pool;
use crate::proxy::tunnels::InboundTunnels;
use crate::shutdown::ShutdownWatch;
use crate::sync::Locked;
use crate::workloads::{Workload, WorkloadStore};

/// Where a lifecycle event came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    Admin,
    WorkloadFile,
    Kubernetes,
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
        decision: crate::policy::Decision,
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

pub(super) struct DrainState {
    /// Tells this record from a later one of the same uid (a workload
    /// deleted and added again): see [`DrainEngine::forget_earlier_incarnation`].
    pub(super) record: u64,
    pub(super) workload: Arc<Workload>,
    pub(super) phase: Phase,
    pub(super) selection: Selection,
    pub(super) trigger: Trigger,
    pub(super) started: SystemTime,
    pub(super) shutdown_at: Option<Instant>,
    /// When the pod's termination grace ends (from `shutdown-started`): no
    /// deadline about it outlives this (the executor cuts any that would).
    pub(super) grace_end: Option<Instant>,
    pub(super) deadline: Option<SystemTime>,
    pub(super) actions: Vec<String>,
    pub(super) ended: Option<&'static str>,
    pub(super) ended_at: Option<Instant>,
}

impl DrainState {
    /// A workload's drain record before its first lifecycle event.
    pub(super) fn new(workload: Arc<Workload>, selection: Selection, trigger: Trigger) -> Self {
        static RECORDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        DrainState {
            record: RECORDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            workload,
            phase: Phase::Running,
            selection,
            trigger,
            started: SystemTime::now(),
            shutdown_at: None,
            grace_end: None,
            deadline: None,
            actions: Vec::new(),
            ended: None,
            ended_at: None,
        }
    }
}

/// Where one lifecycle event left its drain.
struct Step {
    /// The policy selection the drain pinned.
    selection: Selection,
    since_shutdown: Option<Duration>,
    /// The pod's remaining grace, once its shutdown was seen.
    grace_left: Option<Duration>,
    duplicate: bool,
}

/// Which drain record an event is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Record {
    /// The workload's record, created by the event if it has none.
    Current,
    /// This record only (a deletion the store showed, raised for the record
    /// it was seen with): gone means the workload came back meanwhile.
    Only(u64),
}

/// How long ended drains and removed workloads are remembered (for
/// `GET /drains` and late actions naming them) before they are forgotten.
pub(super) const RETAIN: Duration = Duration::from_secs(600);

/// What the engine remembers about workloads and their drains.
#[derive(Default)]
pub(super) struct DrainBook {
    pub(super) drains: BTreeMap<String, DrainState>,
    pub(super) first_seen: HashMap<String, Instant>,
    /// Workloads removed from the store recently, so actions can still name them.
    pub(super) removed: HashMap<String, (Arc<Workload>, Instant)>,
    /// Peers' drains as this gateway (their client) handled them, by peer
    /// uid (or destination address for a connect-failing one).
    pub(super) peers: super::peer_book::PeerBook,
    /// The workload uid each IP was last seen with (kept for a vanished IP
    /// while the pool still holds tunnels to it): a new uid at the IP means
    /// a new workload, and tunnels pooled for the old one must not carry it.
    pub(super) ip_owners: HashMap<std::net::IpAddr, String>,
    /// In-pod mode: the pods the node agent handed over (`workload-added`
    /// waits for both the handover and discovery).
    pub(super) handed_over: std::collections::HashSet<String>,
}

pub struct DrainEngine {
    pub(super) workloads: Arc<WorkloadStore>,
    pub(super) registry: Arc<InboundTunnels>,
    pub(super) pool: Arc<Pool>,
    pub(super) policies: Arc<PolicyEngine>,
    pub(super) cfg: DrainsConfig,
    pub(super) metrics: DrainMetrics,
    /// All the engine's drain state, under one lock (never held across a
    /// policy call, an await or another engine method that locks it).
    pub(super) book: Mutex<DrainBook>,
    /// Timers, delayed GOAWAYs and lifecycle events raised off the caller's
    /// task: owned here so [`DrainEngine::shutdown`] reaches them.
    pub(super) tasks: DrainTasks,
    /// Executes `oci-drain` actions when `oci.enabled` (see [`DrainEngine::set_oci`]).
    oci: std::sync::OnceLock<Arc<OciDrainer>>,
    /// In-pod mode: a local workload is "added" once its node agent
    /// handed it over, not when discovery first lists it.
    pub(super) added_by_node_agent: std::sync::atomic::AtomicBool,
}

/// `now + d` in unix milliseconds, saturating instead of overflowing.
fn unix_ms_after(d: Duration) -> u64 {
    SystemTime::now()
        .checked_add(d)
        .map_or(u64::MAX, |t| u64::try_from(unix_ms(t)).unwrap_or(u64::MAX))
}

fn unix_ms(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

impl DrainEngine {
    pub fn new(
        workloads: Arc<WorkloadStore>,
        registry: Arc<InboundTunnels>,
        pool: Arc<Pool>,
        policies: Arc<PolicyEngine>,
        cfg: DrainsConfig,
        metrics: DrainMetrics,
    ) -> Arc<Self> {
        Arc::new(DrainEngine {
            workloads,
            registry,
            pool,
            policies,
            cfg,
            metrics,
            book: Mutex::new(DrainBook::default()),
            oci: std::sync::OnceLock::new(),
            tasks: DrainTasks::default(),
            added_by_node_agent: Default::default(),
        })
    }

    /// Tasks the engine runs now (timers, delayed GOAWAYs, lifecycle events).
    pub fn pending_tasks(&self) -> usize {
        self.tasks.len()
    }

    /// The gateway is stopping: pending timers, delayed GOAWAYs and
    /// lifecycle events are cancelled and awaited.
    pub async fn shutdown(&self) {
        self.tasks.shutdown().await;
    }

    /// Executes a decision's `actions` about `workload` on the engine's
    /// handles; a timer they set comes back to [`DrainEngine::timer_fired`].
    pub(super) fn execute(
        self: &Arc<Self>,
        workload: &Arc<Workload>,
        actions: &[sdk::Action],
        decided_at: Instant,
    ) -> Executed {
        self.execute_for(workload, actions, decided_at, None)
    }

    /// [`DrainEngine::execute`], touching only the pooled tunnels of
    /// `sources` (when set): a peer decision made for some local clients.
    pub(super) fn execute_for(
        self: &Arc<Self>,
        workload: &Arc<Workload>,
        actions: &[sdk::Action],
        decided_at: Instant,
        sources: Option<&[crate::identity::SpiffeId]>,
    ) -> Executed {
        let lookup = |uid: &str| self.any_workload(uid);
        let grace_end = |uid: &str| self.book.locked().drains.get(uid).and_then(|d| d.grace_end);
        let handles = Handles {
            pool: &self.pool,
            inbound: &self.registry,
            oci: self.oci.get(),
            metrics: &self.metrics,
            tasks: &self.tasks,
            workload: &lookup,
            timers: self.clone(),
            default_goaway_deadline: self.cfg.default_goaway_deadline,
            grace_end: &grace_end,
            sources,
        };
        executor::execute(&handles, workload, actions, decided_at)
    }

    /// Hands `oci-drain` actions to `drainer` (set once, at build).
    pub fn set_oci(&self, drainer: Arc<OciDrainer>) {
        let _ = self.oci.set(drainer);
    }

    /// What a policy is told about a local workload right now.
    pub(super) fn state_of(&self, w: &Workload) -> sdk::WorkloadState {
        let uid = w.uid();
        let age = self
            .book
            .locked()
            .first_seen
            .entry(uid.to_owned())
            .or_insert_with(Instant::now)
            .elapsed();
        let tunnels = self.registry.for_workload(uid);
        let outbound = self
            .pool
            .tunnels()
            .iter()
            .filter(|t| t.key.src == w.identity)
            .count();
        sdk::WorkloadState {
            info: sdk::WorkloadInfo {
                uid: uid.to_owned(),
                name: w.spec.name.clone(),
                namespace: w.spec.namespace.clone(),
                identity: w.identity.to_string(),
                labels: w.spec.labels.clone(),
                annotations: w.spec.annotations.clone(),
            },
            inbound_tunnels: tunnels.len() as u32,
            inbound_streams: tunnels.iter().map(|t| t.streams()).sum::<usize>() as u32,
            outbound_pooled_tunnels: outbound as u32,
            age_ms: age.as_millis() as u64,
        }
    }

    fn lookup(&self, uid: &str) -> Option<Arc<Workload>> {
        if let Some(w) = self.workloads.snapshot().by_uid(uid).filter(|w| w.local) {
            return Some(w.clone());
        }
        // Deleted from the store already: the drain remembers it.
        self.book
            .locked()
            .drains
            .get(uid)
            .map(|d| d.workload.clone())
    }

    /// Handles one lifecycle transition: decides with the workload's policy,
    /// executes the actions, and for a teardown waits for the hold (if any)
    /// before returning the acknowledgement.
    pub async fn on_lifecycle(
        self: &Arc<Self>,
        uid: &str,
        what: Lifecycle,
        trigger: Trigger,
    ) -> Result<Outcome, DrainError> {
        self.on_lifecycle_of(uid, what, trigger, Record::Current)
            .await
    }

    /// [`DrainEngine::on_lifecycle`] for the drain record `record`.
    pub(super) async fn on_lifecycle_of(
        self: &Arc<Self>,
        uid: &str,
        what: Lifecycle,
        trigger: Trigger,
        record: Record,
    ) -> Result<Outcome, DrainError> {
        let workload = self
            .lookup(uid)
            .ok_or_else(|| DrainError::UnknownWorkload(uid.to_owned()))?;
        let decided_at = Instant::now();
        let step = self
            .advance(&workload, what, trigger, decided_at, record)
            .ok_or_else(|| DrainError::CameBack(uid.to_owned()))?;
        if step.duplicate {
            return Ok(self.duplicate(uid, what, step.selection));
        }
        let event = self.event_for(&workload, what, &step);
        let decision = self.policies.decide(&step.selection, &event);
        info!(
            workload = uid,
            event = what.kind(),
            policy = %decision.policy,
            version = decision.version.as_deref().unwrap_or("builtin"),
            actions = decision.actions.len(),
            fallback = decision.fallback.as_ref().map(|f| f.kind.as_str()),
            trigger = trigger.label(),
            "drain decision"
        );
        let mut executed = self.execute(&workload, &decision.actions, decided_at);
        if matches!(what, Lifecycle::Deleted) {
            // The drain applies to the workload: whatever tunnel it still has
            // (one accepted after the policy's GOAWAY, one it never drained)
            // is closed now, and any accepted later.
            let n = self.registry.close_workload(uid);
            if n > 0 {
                executed
                    .descriptions
                    .push(format!("closed {n} remaining inbound tunnels (deleted)"));
            }
        }
        self.record(uid, &executed);
        let teardown = match what {
            Lifecycle::Teardown => Some(
                self.hold_teardown(uid, &step.selection, executed.hold, decided_at)
                    .await,
            ),
            _ => None,
        };
        if matches!(what, Lifecycle::Deleted) {
            self.end(uid, &step.selection, "completed");
            self.deletion_completed(uid);
        }
        Ok(Outcome {
            teardown,
            ..Outcome::decided(uid, what.kind(), decision, executed.descriptions)
        })
    }

    /// Moves the workload's drain record forward by `what` (creating it, and
    /// pinning its policy selection, on the first event); `None` when the
    /// event was for a record that is gone.
    fn advance(
        &self,
        workload: &Arc<Workload>,
        what: Lifecycle,
        trigger: Trigger,
        decided_at: Instant,
        record: Record,
    ) -> Option<Step> {
        let uid = workload.uid();
        let mut book = self.book.locked();
        if let Record::Only(id) = record {
            if book.drains.get(uid).map(|d| d.record) != Some(id) {
                return None;
            }
        }
        let d = book.drains.entry(uid.to_owned()).or_insert_with(|| {
            DrainState::new(workload.clone(), self.policies.select(workload), trigger)
        });
        let step = transition(d.phase, what);
        if let Transition::Start(_) = step {
            d.trigger = trigger;
            d.started = SystemTime::now();
            self.count_start(uid, &d.selection, trigger);
        }
        if let Transition::Start(_) | Transition::Advance(_) = step {
            d.phase = what.phase();
            if let Lifecycle::ShutdownStarted { grace } = what {
                d.shutdown_at = Some(decided_at);
                d.grace_end = decided_at.checked_add(grace);
                d.deadline = SystemTime::now().checked_add(grace);
            }
        }
        Some(Step {
            selection: d.selection.clone(),
            since_shutdown: d.shutdown_at.map(|t| t.elapsed()),
            grace_left: d
                .grace_end
                .map(|end| end.saturating_duration_since(decided_at)),
            duplicate: step == Transition::Duplicate,
        })
    }

    /// A deletion was handled: once the workload is gone from the store its
    /// tunnels' standing GOAWAY is dropped (no tunnel is accepted for a
    /// workload the store does not list), so a workload added again with the
    /// same uid is not turned away. The record stays for `GET /drains`.
    fn deletion_completed(&self, uid: &str) {
        let listed = self
            .workloads
            .snapshot()
            .by_uid(uid)
            .is_some_and(|w| w.local);
        if !listed {
            self.registry.forget(uid);
        }
    }

    /// A local workload appeared in the store: if its uid had a drain (the
    /// workload was deleted and is back, or vanished from a snapshot and
    /// returned), that drain was about an earlier incarnation. Its record,
    /// standing GOAWAY and age are forgotten; the workload starts afresh.
    pub(super) fn forget_earlier_incarnation(&self, uid: &str) {
        let earlier = {
            let mut book = self.book.locked();
            let earlier = book.drains.remove(uid);
            if earlier.is_some() {
                book.removed.remove(uid);
                book.first_seen.remove(uid);
            }
            earlier
        };
        if let Some(d) = earlier {
            self.registry.forget(uid);
            info!(
                workload = uid,
                phase = d.phase.label(),
                "workload added again with the same uid: its earlier drain is forgotten"
            );
        }
    }

    fn count_start(&self, uid: &str, selection: &Selection, trigger: Trigger) {
        self.metrics
            .started
            .get_or_create(&DrainLabels {
                policy: selection.name.clone(),
                trigger: trigger.label(),
            })
            .inc();
        self.metrics
            .streams_at_start
            .observe(self.registry.streams_of(uid) as f64);
    }

    /// The outcome of an event the drain already saw (nothing is decided).
    fn duplicate(&self, uid: &str, what: Lifecycle, selection: Selection) -> Outcome {
        self.metrics
            .duplicates
            .get_or_create(&EventLabels { event: what.kind() })
            .inc();
        Outcome {
            uid: uid.to_owned(),
            event: what.kind(),
            duplicate: true,
            policy: Some(selection.name),
            version: selection.version.map(|v| v.hash.clone()),
            fallback: None,
            actions: vec![],
            teardown: matches!(what, Lifecycle::Teardown).then_some(TeardownAck {
                result: "already",
                held_ms: 0,
                streams_left: self.registry.streams_of(uid),
            }),
        }
    }

    /// The event a policy sees for `what`. A teardown's `max-hold-ms` is
    /// `drains.max_hold`, and never more than the pod's remaining grace:
    /// a policy computing its hold and GOAWAY deadline from it (as the
    /// reference ones do) stays within the grace; the executor cuts any
    /// deadline that does not.
    fn event_for(&self, w: &Workload, what: Lifecycle, step: &Step) -> sdk::Event {
        let state = self.state_of(w);
        match what {
            Lifecycle::ShutdownStarted { grace } => {
                sdk::Event::ShutdownStarted(sdk::ShutdownStarted {
                    workload: state,
                    grace_deadline_ms: unix_ms_after(grace),
                    grace_remaining_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
                })
            }
            Lifecycle::Teardown => sdk::Event::NetworkTeardown(sdk::NetworkTeardown {
                workload: state,
                since_shutdown_ms: step.since_shutdown.map(|d| d.as_millis() as u64),
                max_hold_ms: step
                    .grace_left
                    .map_or(self.cfg.max_hold, |left| left.min(self.cfg.max_hold))
                    .as_millis() as u64,
            }),
            Lifecycle::Deleted => sdk::Event::WorkloadDeleted(state),
        }
    }

    pub(super) fn record(&self, uid: &str, executed: &Executed) {
        if let Some(d) = self.book.locked().drains.get_mut(uid) {
            d.actions.extend(executed.descriptions.iter().cloned());
        }
    }

    fn end(&self, uid: &str, selection: &Selection, result: &'static str) {
        let mut book = self.book.locked();
        if let Some(d) = book.drains.get_mut(uid) {
            if d.ended.is_none() {
                d.ended = Some(result);
                d.ended_at = Some(Instant::now());
                self.metrics
                    .streams_at_end
                    .observe(self.registry.streams_of(uid) as f64);
                self.metrics
                    .ended
                    .get_or_create(&EndLabels {
                        policy: selection.name.clone(),
                        result,
                    })
                    .inc();
            }
        }
    }

    /// Holds the teardown until the workload's inbound streams are gone or
    /// the bound expires, whichever first.
    async fn hold_teardown(
        &self,
        uid: &str,
        selection: &Selection,
        hold: Option<Duration>,
        started: Instant,
    ) -> TeardownAck {
        let ack = match hold {
            None => TeardownAck {
                result: "no-hold",
                held_ms: 0,
                streams_left: self.registry.streams_of(uid),
            },
            Some(bound) => {
                let until = started
                    .checked_add(bound.min(self.cfg.max_hold))
                    .unwrap_or_else(|| started + super::MAX_GRACE);
                // A GOAWAY deadline equal to the bound cuts the streams at
                // that very instant: that is a forced end, not an idle one.
                let idle = self.registry.wait_idle(uid, until).await && Instant::now() < until;
                if idle {
                    TeardownAck {
                        result: "idle",
                        held_ms: started.elapsed().as_millis() as u64,
                        streams_left: 0,
                    }
                } else {
                    self.metrics.teardown_timeouts.inc();
                    TeardownAck {
                        result: "bound",
                        held_ms: started.elapsed().as_millis() as u64,
                        streams_left: self.registry.streams_of(uid),
                    }
                }
            }
        };
        self.metrics
            .teardown_ack
            .observe(started.elapsed().as_secs_f64());
        self.end(
            uid,
            selection,
            if ack.result == "bound" {
                "forced"
            } else {
                "completed"
            },
        );
        ack
    }

    /// Any workload by uid, including one removed from the store recently.
    pub(super) fn any_workload(&self, uid: &str) -> Option<Arc<Workload>> {
        self.workloads
            .snapshot()
            .by_uid(uid)
            .cloned()
            .or_else(|| self.book.locked().removed.get(uid).map(|(w, _)| w.clone()))
    }

    /// Turns the pool's connect-failure reports into `connect-failing`
    /// events, decided by the source workload's policy (e.g. a backoff).
    pub async fn watch_connect_failures(
        self: Arc<Self>,
        mut failures: tokio::sync::mpsc::UnboundedReceiver<crate::proxy::pool::ConnectFailure>,
        mut drain: ShutdownWatch,
    ) {
        loop {
            let f = tokio::select! {
                f = failures.recv() => match f { Some(f) => f, None => return },
                _ = drain.signaled() => return,
            };
            let snapshot = self.workloads.snapshot();
            let Some(source) = snapshot
                .iter()
                .find(|w| w.local && w.identity == f.key.src)
                .cloned()
            else {
                continue;
            };
            let known = snapshot
                .by_uid(&f.key.dst_uid)
                .or_else(|| snapshot.by_ip(f.key.dst_addr.ip()));
            let peer = known.map(|p| super::peer_book::peer_info(p, &f.key.dst_addr.to_string()));
            let event = sdk::Event::ConnectFailing(sdk::ConnectFailing {
                destination: f.key.dst_addr.to_string(),
                peer,
                consecutive_failures: f.consecutive,
                last_error: f.last_error.clone(),
                failing_for_ms: f.failing_for.as_millis() as u64,
            });
            let selection = self.policies.select(&source);
            let decision = self.policies.decide(&selection, &event);
            let executed = self.execute(&source, &decision.actions, Instant::now());
            if !executed.descriptions.is_empty() {
                info!(
                    destination = %f.key.dst_addr,
                    consecutive = f.consecutive,
                    policy = %decision.policy,
                    actions = ?executed.descriptions,
                    "connect-failing decision"
                );
                let key = known.map_or_else(|| f.key.dst_addr.to_string(), |p| p.uid().to_owned());
                self.book.locked().peers.record(
                    &key,
                    known.map(|p| &**p),
                    super::peer_book::PeerDecision {
                        event: "connect-failing",
                        policy: decision.policy,
                        version: decision.version,
                        selected_by: selection.by.label(),
                        clients: vec![f.key.src.to_string()],
                        actions: executed.descriptions,
                        tunnels_evicted: executed.tunnels_evicted,
                        at_unix_ms: super::peer_book::now_unix_ms(),
                    },
                    RETAIN,
                );
            }
        }
    }

    /// The gateway itself is stopping: each policy is asked for a plan for
    /// the local workloads it governs (a `gateway-shutdown` event with the
    /// deadline), and its actions are executed before the default drain.
    pub fn on_gateway_shutdown(self: &Arc<Self>, deadline: Duration) -> Vec<String> {
        let snapshot = self.workloads.snapshot();
        let mut by_policy: BTreeMap<String, (Selection, Vec<Arc<Workload>>)> = BTreeMap::new();
        for w in snapshot.iter().filter(|w| w.local) {
            let sel = self.policies.select(w);
            by_policy
                .entry(sel.name.clone())
                .or_insert_with(|| (sel, Vec::new()))
                .1
                .push(w.clone());
        }
        let mut done = Vec::new();
        let now = Instant::now();
        for (_, (selection, workloads)) in by_policy {
            let event = sdk::Event::GatewayShutdown(sdk::GatewayShutdown {
                deadline_ms: unix_ms_after(deadline),
                remaining_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
                workloads: workloads.iter().map(|w| self.state_of(w)).collect(),
            });
            let decision = self.policies.decide(&selection, &event);
            for w in &workloads {
                let mine: Vec<sdk::Action> = decision
                    .actions
                    .iter()
                    .filter(|a| a.subject().is_none_or(|s| s == w.uid()))
                    .cloned()
                    .collect();
                let executed = self.execute(w, &mine, now);
                done.extend(executed.descriptions);
            }
        }
        done
    }

    /// A timer the policy asked for fired. Decided by the subject's drain
    /// (its pinned version) when it has one, else by the policy of the local
    /// workload whose decision set the timer (`source`): a peer uid or a
    /// connect-failing destination are valid subjects too.
    pub(super) fn timer_fired(
        self: &Arc<Self>,
        subject: String,
        tag: String,
        source: Arc<Workload>,
    ) {
        // The drains lock is released before `lookup`, which takes it again.
        let pinned = self
            .book
            .locked()
            .drains
            .get(&subject)
            .map(|d| (d.selection.clone(), d.workload.clone()));
        let (selection, workload) = match pinned {
            Some((selection, w)) => (selection, Some(w)),
            None => match self.lookup(&subject) {
                Some(w) => (self.policies.select(&w), Some(w)),
                None => (self.policies.select(&source), None),
            },
        };
        let event = sdk::Event::TimerFired(sdk::TimerFired {
            subject: subject.clone(),
            tag: tag.clone(),
            workload: workload.as_deref().map(|w| self.state_of(w)),
        });
        let decision = self.policies.decide(&selection, &event);
        let on = workload.unwrap_or(source);
        let executed = self.execute(&on, &decision.actions, Instant::now());
        info!(subject, tag, policy = %decision.policy, actions = ?executed.descriptions, "timer decision");
        self.record(&subject, &executed);
    }

    /// The phase of local workload `uid` and, once a drain started, the
    /// policy selection it pinned (`/config_dump`).
    pub fn phase_of(&self, uid: &str) -> (Phase, Option<Selection>) {
        match self.book.locked().drains.get(uid) {
            Some(d) if d.phase > Phase::Running => (d.phase, Some(d.selection.clone())),
            _ => (Phase::Running, None),
        }
    }

    /// `GET /drains`.
    pub fn list(&self) -> Vec<DrainView> {
        let book = self.book.locked();
        book.drains
            .iter()
            .filter(|(_, d)| d.phase > Phase::Running)
            .map(|(uid, d)| DrainView {
                uid: uid.clone(),
                workload: format!("{}/{}", d.workload.spec.namespace, d.workload.spec.name),
                policy: d.selection.name.clone(),
                version: d.selection.version.as_ref().map(|v| v.hash.clone()),
                trigger: d.trigger,
                phase: d.phase,
                started_unix_ms: unix_ms(d.started),
                deadline_unix_ms: d.deadline.map(unix_ms),
                actions_taken: d.actions.clone(),
                tunnels_remaining: self.registry.for_workload(uid).len(),
                streams_remaining: self.registry.streams_of(uid),
                ended: d.ended,
                oci: self.oci.get().and_then(|o| o.status(uid)),
            })
            .collect()
    }
}

impl TimerSink for DrainEngine {
    fn timer_fired(self: Arc<Self>, subject: String, tag: String, source: Arc<Workload>) {
        DrainEngine::timer_fired(&self, subject, tag, source);
    }
}
