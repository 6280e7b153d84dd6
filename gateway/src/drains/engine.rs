//! Per-workload lifecycle and the drains it starts.
//!
//! Transitions only move forward — running → shutting down → torn down →
//! deleted — so the same transition seen twice (from the workload file and
//! the admin API, or a retried CNI DEL) drains once. A drain pins the policy
//! version that started it; later events of the same workload are decided by
//! that version even if a new one was swapped in meanwhile.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidegate_sdk as sdk;
use tokio::time::Instant;
use tracing::info;

use super::book::{DrainBook, Record, Step};
use super::executor::{self, Executed, Handles, TimerSink};
use super::metrics::{DrainLabels, DrainMetrics, EndLabels, EventLabels};
pub use super::phase::{Lifecycle, Phase};
use super::state::unix_ms_after;
pub use super::state::{DrainError, DrainView, Outcome, TeardownAck, Trigger};
use super::tasks::DrainTasks;
use crate::config::DrainsConfig;
use crate::oci::OciDrainer;
use crate::proxy::pool::Pool;
use crate::proxy::tunnels::InboundTunnels;
use crate::workloads::{Workload, WorkloadStore};
use tidegate_base::sync::Locked;
use tidegate_policy_host::{PolicyEngine, Selection};

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
    /// Executes `oci-drain` actions when `oci.enabled`.
    oci: Option<Arc<OciDrainer>>,
    /// In-pod mode: a local workload is "added" once its node agent
    /// handed it over, not when discovery first lists it.
    pub(super) added_by_node_agent: bool,
}

/// What the drain engine is built from.
pub struct DrainDeps {
    pub workloads: Arc<WorkloadStore>,
    /// The inbound tunnels a GOAWAY reaches.
    pub tunnels: Arc<InboundTunnels>,
    /// The outbound pool: client-side eviction, backoff, GOAWAY.
    pub pool: Arc<Pool>,
    pub policies: Arc<PolicyEngine>,
    pub cfg: DrainsConfig,
    pub metrics: DrainMetrics,
    /// The OCI drainer (`oci.enabled`), or `None`: `oci-drain` actions are
    /// then refused as not configured.
    pub oci: Option<Arc<OciDrainer>>,
    /// In-pod mode: a local workload is "added" when its node agent hands
    /// its pod over ([`DrainEngine::pod_handed_over`]), not when discovery
    /// first lists it.
    pub added_by_node_agent: bool,
}

impl DrainEngine {
    pub fn new(deps: DrainDeps) -> Arc<Self> {
        let DrainDeps {
            workloads,
            tunnels,
            pool,
            policies,
            cfg,
            metrics,
            oci,
            added_by_node_agent,
        } = deps;
        Arc::new(DrainEngine {
            workloads,
            registry: tunnels,
            pool,
            policies,
            cfg,
            metrics,
            book: Mutex::new(DrainBook::default()),
            oci,
            tasks: DrainTasks::default(),
            added_by_node_agent,
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
        sources: Option<&[tidegate_protocol::identity::SpiffeId]>,
    ) -> Executed {
        let lookup = |uid: &str| self.any_workload(uid);
        let grace_end = |uid: &str| self.book.locked().grace_end(uid);
        let handles = Handles {
            pool: &self.pool,
            inbound: &self.registry,
            oci: self.oci.as_ref(),
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

    /// What a policy is told about a local workload right now.
    pub(super) fn state_of(&self, w: &Workload) -> sdk::WorkloadState {
        let uid = w.uid();
        let age = self.book.locked().first_seen(uid, Instant::now()).elapsed();
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
                labels: (*w.spec.labels).clone(),
                annotations: (*w.spec.annotations).clone(),
            },
            inbound_tunnels: tunnels.len() as u32,
            inbound_streams: tunnels.iter().map(|t| t.streams()).sum::<usize>() as u32,
            outbound_pooled_tunnels: outbound as u32,
            age_ms: age.as_millis() as u64,
        }
    }

    pub(super) fn lookup(&self, uid: &str) -> Option<Arc<Workload>> {
        if let Some(w) = self.workloads.snapshot().by_uid(uid).filter(|w| w.local) {
            return Some(w.clone());
        }
        // Deleted from the store already: the drain remembers it.
        self.book.locked().pinned(uid).map(|(_, w)| w)
    }

    /// The workload a pod's runtime names (CNI DEL: the pod's Kubernetes
    /// uid, namespace and name): the workload of that uid when there is
    /// one, else the one local workload of that namespace and name —
    /// istiod keys workloads `<cluster>//Pod/<namespace>/<name>`, never by
    /// the pod's uid. Neither (or two of that name): the uid as given.
    pub fn workload_of_pod(&self, uid: &str, namespace: &str, name: &str) -> String {
        if self.lookup(uid).is_some() || namespace.is_empty() || name.is_empty() {
            return uid.to_owned();
        }
        let snapshot = self.workloads.snapshot();
        let mut named = snapshot
            .locals()
            .filter(|w| w.spec.namespace == namespace && w.spec.name == name);
        match (named.next(), named.next()) {
            (Some(w), None) => w.uid().to_owned(),
            _ => uid.to_owned(),
        }
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
            if trigger == Trigger::Admin {
                // Deleted is deleted: out of every Service in this publish,
                // whatever the source still lists.
                self.workloads.remove(uid);
            }
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
        let step =
            self.book
                .locked()
                .advance(workload, what, trigger, decided_at, record, || {
                    self.policies.select(workload)
                })?;
        if step.started {
            self.count_start(workload.uid(), &step.selection, trigger);
        }
        Some(step)
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
        let earlier = self.book.locked().forget_incarnation(uid);
        if let Some(phase) = earlier {
            self.registry.forget(uid);
            info!(
                workload = uid,
                phase = phase.label(),
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

    fn record(&self, uid: &str, executed: &Executed) {
        self.book
            .locked()
            .record_actions(uid, &executed.descriptions);
    }

    fn end(&self, uid: &str, selection: &Selection, result: &'static str) {
        let ended = self.book.locked().end(uid, result, Instant::now());
        if ended {
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
            .or_else(|| self.book.locked().removed_workload(uid))
    }

    /// The phase of local workload `uid` and, once a drain started, the
    /// policy selection it pinned (`/config_dump`).
    pub fn phase_of(&self, uid: &str) -> (Phase, Option<Selection>) {
        self.book.locked().phase_of(uid)
    }

    /// `GET /drains`.
    pub fn list(&self) -> Vec<DrainView> {
        self.book.locked().views(|uid, view| {
            view.tunnels_remaining = self.registry.for_workload(uid).len();
            view.streams_remaining = self.registry.streams_of(uid);
            view.oci = self.oci.as_ref().and_then(|o| o.status(uid));
        })
    }
}

impl TimerSink for DrainEngine {
    fn timer_fired(self: Arc<Self>, subject: String, tag: String, source: Arc<Workload>) {
        DrainEngine::timer_fired(&self, subject, tag, source);
    }
}
