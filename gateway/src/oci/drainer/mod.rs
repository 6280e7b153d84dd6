//! Drains (or un-drains) one workload's OCI backends, safely.
//!
//! Per backend change: read the backend (its load balancer's ETag comes
//! with it), resend every field as read with `drain` set, under `If-Match`;
//! poll the work request to SUCCEEDED or FAILED. Changes to one load
//! balancer run one at a time (a FIFO lock per load balancer; different
//! load balancers are worked on at once), and each re-reads after the
//! previous work request finished, so the ETag is always fresh. 412 → re-read and retry at once; 409 IncorrectState, 429, 5xx, a
//! transport error or a FAILED work request → bounded exponential backoff
//! with jitter, at most `max_attempts` in all; any other 4xx (401
//! NotAuthenticated, 404 of the load balancer, 400) stops this workload's
//! drain with the error shown in `GET /drains`.
//!
//! Level-triggered: while the workload is still in the store, its backends
//! are re-read every `reassert_interval` (or at once when the store changes)
//! and `drain=true` is asserted again if another controller reset it. The
//! loop ends when the workload is gone or none of its backends is left.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tracing::{info, warn, Instrument as _};

use super::metrics::{CapacityLabels, OciMetrics, OutcomeLabels};
use super::OciConfig;
use crate::workloads::{WorkloadSnapshot, WorkloadStore};
use tidegate_base::shutdown::ShutdownWatch;
use tidegate_oci::OciClient;

mod targets;
mod write;

use targets::{plan, targets_of, Plan, Target};
use tidegate_base::sync::Locked;
#[cfg(test)]
use write::{retry_reason, write_for, Write};
use write::{Applied, Stop};

/// What the policy wants done when a backend set is at capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AtCapacity {
    /// Delete the backend instead of draining it, to make room for the
    /// replacement pod.
    RemoveEarly,
    /// Drain it and keep it (the replacement may not fit).
    Keep,
}

impl AtCapacity {
    fn label(self) -> &'static str {
        match self {
            AtCapacity::RemoveEarly => "remove-early",
            AtCapacity::Keep => "keep",
        }
    }
}

/// A workload's OCI drain as `GET /drains` shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OciStatus {
    /// `running`, `done` (backends gone or workload gone), `failed`,
    /// `not-opted-in`, `stopped` (the gateway shut down while re-asserting).
    pub state: &'static str,
    pub drain: bool,
    /// `<lb>/<set>/<ip:port>` → `drained`, `undrained`, `removed`, `pending`, `gone`.
    pub backends: BTreeMap<String, &'static str>,
    /// Lifecycle event → first drain SUCCEEDED, per backend.
    pub latency_ms: BTreeMap<String, u64>,
    pub reasserted: u64,
    /// Capacity events: which set was full and what was done.
    pub capacity: Vec<String>,
    pub error: Option<String>,
    /// Which request this is: a newer request for the workload supersedes it.
    #[serde(skip)]
    generation: u64,
    /// When it ended (kept for `GET /drains` for [`RETAIN`]).
    #[serde(skip)]
    ended_at: Option<Instant>,
}

/// How long an ended drain's status is kept once its workload is gone.
const RETAIN: Duration = Duration::from_secs(600);

/// One request being carried out.
struct Job {
    uid: String,
    generation: u64,
    drain: bool,
    at_capacity: AtCapacity,
    event_at: Instant,
}

pub struct OciDrainer {
    cfg: OciConfig,
    /// Re-assert loops end when the gateway drains (between passes).
    drain: ShutdownWatch,
    client: OciClient,
    workloads: Arc<WorkloadStore>,
    metrics: OciMetrics,
    lb_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    status: Mutex<HashMap<String, OciStatus>>,
}

impl std::fmt::Debug for OciDrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciDrainer")
            .field("endpoint", &self.client.endpoint())
            .finish()
    }
}

/// The result of handing a request to the drainer (for the action log).
#[derive(Debug)]
pub struct Accepted {
    /// A metric label: `started`, `not_opted_in`, `unknown_workload`, `running`.
    pub result: &'static str,
    pub description: String,
}

impl OciDrainer {
    /// `drain`: when it fires, re-assert loops stop at their next wait (a
    /// change in flight finishes first; nothing is left half-done on OCI's
    /// side since every change is one work request).
    pub fn new(
        cfg: OciConfig,
        client: OciClient,
        workloads: Arc<WorkloadStore>,
        metrics: OciMetrics,
        drain: ShutdownWatch,
    ) -> Arc<Self> {
        Arc::new(OciDrainer {
            cfg,
            drain,
            client,
            workloads,
            metrics,
            lb_locks: Mutex::new(HashMap::new()),
            status: Mutex::new(HashMap::new()),
        })
    }

    /// The drain of workload `uid`, if one was requested.
    pub fn status(&self, uid: &str) -> Option<OciStatus> {
        self.status.locked().get(uid).cloned()
    }

    /// Hands over a request from the `oci-drain` action; returns at once
    /// (the API calls run in a task of their own). `event_at` is when the
    /// lifecycle event was decided (the drain latency is measured from it).
    pub fn request(
        self: &Arc<Self>,
        uid: &str,
        drain: bool,
        at_capacity: AtCapacity,
        event_at: Instant,
    ) -> Accepted {
        let snapshot = self.workloads.snapshot();
        let Some(w) = snapshot.by_uid(uid) else {
            return Accepted {
                result: "unknown_workload",
                description: format!("oci-drain {uid}: not a known workload"),
            };
        };
        let mut status = self.status.locked();
        status.retain(|uid, s| {
            snapshot.by_uid(uid).is_some() || s.ended_at.is_none_or(|t| t.elapsed() < RETAIN)
        });
        let generation = status.get(uid).map_or(0, |s| s.generation + 1);
        if !self.cfg.opted_in(&w.spec) {
            status.insert(
                uid.to_owned(),
                OciStatus {
                    state: "not-opted-in",
                    drain,
                    generation,
                    ended_at: Some(Instant::now()),
                    ..Default::default()
                },
            );
            return Accepted {
                result: "not_opted_in",
                description: format!(
                    "oci-drain {uid}: not opted in (Service annotation tidegate.io/oci-backend-draining or oci.opt_in)"
                ),
            };
        }
        if let Some(s) = status.get(uid) {
            if s.state == "running" && s.drain == drain {
                return Accepted {
                    result: "running",
                    description: format!("oci-drain {uid} drain={drain}: already running"),
                };
            }
        }
        status.insert(
            uid.to_owned(),
            OciStatus {
                state: "running",
                drain,
                generation,
                ..Default::default()
            },
        );
        drop(status);
        let this = self.clone();
        let job = Job {
            uid: uid.to_owned(),
            generation,
            drain,
            at_capacity,
            event_at,
        };
        let span = tracing::info_span!("oci_drain", workload = %uid, drain);
        tokio::spawn(async move { this.run(job).await }.instrument(span));
        Accepted {
            result: "started",
            description: format!(
                "oci-drain drain={drain} on {} load balancer(s) (at capacity: {})",
                self.cfg.load_balancers.len(),
                at_capacity.label()
            ),
        }
    }

    /// Updates the job's status; false once a newer request superseded it.
    fn update(&self, job: &Job, f: impl FnOnce(&mut OciStatus)) -> bool {
        match self.status.locked().get_mut(&job.uid) {
            Some(s) if s.generation == job.generation => {
                f(s);
                if s.state != "running" {
                    s.ended_at = Some(Instant::now());
                }
                true
            }
            _ => false,
        }
    }

    async fn run(self: Arc<Self>, job: Job) {
        let job = Arc::new(job);
        let mut changes = self.workloads.subscribe();
        let mut gateway_drain = self.drain.clone();
        let mut pass = 0u64;
        loop {
            if !self.update(&job, |_| {}) {
                info!("superseded by a newer oci-drain request: stop");
                return;
            }
            let snapshot = self.workloads.snapshot();
            let Some(ips) = snapshot.by_uid(&job.uid).map(|w| w.spec.ips.clone()) else {
                info!("workload gone: stop");
                self.update(&job, |s| s.state = "done");
                return;
            };
            match self.pass(&job, &ips, &snapshot, pass).await {
                Err(e) => {
                    warn!(error = %e, "OCI backend drain stopped");
                    self.metrics
                        .backends
                        .get_or_create(&OutcomeLabels { result: "failed" })
                        .inc();
                    self.update(&job, |s| {
                        s.state = "failed";
                        s.error = Some(e.to_string());
                    });
                    return;
                }
                Ok(0) => {
                    info!("no backend of the workload left: stop");
                    self.update(&job, |s| s.state = "done");
                    return;
                }
                Ok(_) if !job.drain => {
                    self.update(&job, |s| s.state = "done");
                    return;
                }
                Ok(_) => {}
            }
            pass += 1;
            // At most one pass per interval, however often the store changes;
            // a change only ends the wait early when the workload is gone.
            let next = Instant::now() + self.cfg.reassert_interval;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => break,
                    _ = gateway_drain.signaled() => {
                        info!("gateway shutting down: stop re-asserting");
                        self.update(&job, |s| s.state = "stopped");
                        return;
                    }
                    r = changes.changed() => {
                        if r.is_err() {
                            return;
                        }
                        if self.workloads.snapshot().by_uid(&job.uid).is_none() {
                            break;
                        }
                    }
                }
            }
        }
    }

    /// One look at every configured load balancer, all at once (changes to
    /// any one of them stay one at a time); returns how many of the
    /// workload's backends are still there. A load balancer that fails does
    /// not cut the others short; the first error is returned when all ended.
    async fn pass(
        self: &Arc<Self>,
        job: &Arc<Job>,
        ips: &[IpAddr],
        snapshot: &Arc<WorkloadSnapshot>,
        pass: u64,
    ) -> Result<usize, Stop> {
        let mut lbs = tokio::task::JoinSet::new();
        for lb in &self.cfg.load_balancers {
            let (this, job, lb) = (self.clone(), job.clone(), lb.clone());
            let (ips, snapshot) = (ips.to_vec(), snapshot.clone());
            lbs.spawn(
                async move { this.pass_lb(&job, &lb, &ips, &snapshot, pass).await }
                    .in_current_span(),
            );
        }
        let (mut left, mut error) = (0, None);
        while let Some(r) = lbs.join_next().await {
            match r {
                Ok(Ok(n)) => left += n,
                Ok(Err(e)) => {
                    error.get_or_insert(e);
                }
                Err(e) => {
                    error.get_or_insert(Stop::Exhausted {
                        attempts: 0,
                        last: format!("load balancer task ended: {e}"),
                    });
                }
            }
        }
        error.map_or(Ok(left), Err)
    }

    /// [`Self::pass`] on one load balancer.
    async fn pass_lb(
        &self,
        job: &Job,
        lb: &str,
        ips: &[IpAddr],
        snapshot: &WorkloadSnapshot,
        pass: u64,
    ) -> Result<usize, Stop> {
        let (uid, drain, at_capacity) = (job.uid.as_str(), job.drain, job.at_capacity);
        if pass > 0 && !self.update(job, |_| {}) {
            return Ok(0);
        }
        let mut left = 0;
        let lock = self.lb_lock(lb);
        let targets = {
            let _one_at_a_time = lock.lock().await;
            let (view, _) = self.retrying(|| self.client.get_load_balancer(lb)).await?;
            targets_of(lb, &view, uid, ips, snapshot, &self.cfg.node_networks)
        };
        for t in targets {
            let key = t.key();
            let Plan::Change { full, remove } =
                plan(&t, drain, at_capacity, self.cfg.capacity_limit)
            else {
                left += 1;
                self.update(job, |s| {
                    s.backends.insert(key, state_word(drain));
                });
                continue;
            };
            if full {
                self.at_capacity(job, &t);
            }
            let mut was_drained = false;
            self.update(job, |s| {
                was_drained = s.backends.get(&key) == Some(&"drained");
                s.backends.insert(key.clone(), "pending");
            });
            let applied = {
                let _one_at_a_time = lock.lock().await;
                self.apply(&t, drain, remove).await?
            };
            if matches!(applied, Applied::Changed | Applied::Already) {
                left += 1;
            }
            self.record(job, key, applied, was_drained);
        }
        Ok(left)
    }

    /// A full backend set or load balancer: a warning, a metric, a status line.
    fn at_capacity(&self, job: &Job, t: &Target) {
        let choice = job.at_capacity.label();
        let key = t.key();
        warn!(backend = %key, set_backends = t.set_len, lb_backends = t.lb_len, choice, "OCI backend set at capacity");
        self.metrics
            .capacity
            .get_or_create(&CapacityLabels { choice })
            .inc();
        let what = format!(
            "{key}: backend set holds {} / load balancer {} backends (limit {}): {choice}",
            t.set_len, t.lb_len, self.cfg.capacity_limit,
        );
        self.update(job, |s| s.capacity.push(what));
    }

    /// Metrics and status for one backend change. A drain that had
    /// succeeded before and had to be made again was reset by another writer.
    fn record(&self, job: &Job, key: String, applied: Applied, was_drained: bool) {
        let word = match applied {
            Applied::Gone => "gone",
            Applied::Already => state_word(job.drain),
            Applied::Removed => {
                self.metrics
                    .backends
                    .get_or_create(&OutcomeLabels { result: "removed" })
                    .inc();
                "removed"
            }
            Applied::Changed => {
                let result = state_word(job.drain);
                self.metrics
                    .backends
                    .get_or_create(&OutcomeLabels { result })
                    .inc();
                if was_drained && job.drain {
                    info!(backend = %key, "drain reset by another writer: re-asserted");
                    self.metrics.reasserted.inc();
                    self.update(job, |s| s.reasserted += 1);
                } else {
                    let latency = job.event_at.elapsed();
                    if job.drain {
                        self.metrics.drain_latency.observe(latency.as_secs_f64());
                    }
                    info!(backend = %key, latency_ms = latency.as_millis() as u64, "backend {result}");
                    self.update(job, |s| {
                        s.latency_ms.insert(key.clone(), latency.as_millis() as u64);
                    });
                }
                result
            }
        };
        self.update(job, |s| {
            s.backends.insert(key, word);
        });
    }

    fn lb_lock(&self, lb: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.lb_locks
            .locked()
            .entry(lb.to_owned())
            .or_default()
            .clone()
    }
}

fn state_word(drain: bool) -> &'static str {
    if drain {
        "drained"
    } else {
        "undrained"
    }
}

#[cfg(test)]
mod tests;
