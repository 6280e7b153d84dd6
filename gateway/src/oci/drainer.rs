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

use super::client::{OciClient, OciError};
use super::metrics::{CapacityLabels, OciMetrics, OutcomeLabels};
use super::model::{Backend, LoadBalancer, UpdateBackendDetails};
use super::OciConfig;
use crate::shutdown::ShutdownWatch;
use crate::workloads::{WorkloadSnapshot, WorkloadStore};

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

/// What one backend change ended in.
#[derive(Debug, PartialEq, Eq)]
enum Applied {
    /// Our work request SUCCEEDED.
    Changed,
    /// It already had the wanted value.
    Already,
    Removed,
    /// The backend no longer exists.
    Gone,
}

/// Why a change stopped without success.
#[derive(Debug, thiserror::Error)]
enum Stop {
    #[error("{0}")]
    Fatal(OciError),
    #[error("gave up after {attempts} attempts: {last}")]
    Exhausted { attempts: u32, last: String },
}

/// One backend of the workload, as found on a load balancer.
struct Target {
    lb: String,
    set: String,
    name: String,
    drain: bool,
    /// Backends in its set and on its load balancer.
    set_len: usize,
    lb_len: usize,
}

impl Target {
    fn key(&self) -> String {
        format!("{}/{}/{}", self.lb, self.set, self.name)
    }
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
        self.status.lock().unwrap().get(uid).cloned()
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
        let mut status = self.status.lock().unwrap();
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
        match self.status.lock().unwrap().get_mut(&job.uid) {
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
            .lock()
            .unwrap()
            .entry(lb.to_owned())
            .or_default()
            .clone()
    }

    /// Read-modify-write of one backend under `If-Match`, then its work
    /// request. The caller holds the load balancer's lock.
    async fn apply(&self, t: &Target, drain: bool, remove: bool) -> Result<Applied, Stop> {
        let mut last = String::new();
        for attempt in 0..self.cfg.max_attempts {
            let read = self.client.get_backend(&t.lb, &t.set, &t.name).await;
            let (backend, etag) = match read {
                Ok(r) => r,
                Err(e) if e.status() == Some(404) => return Ok(Applied::Gone),
                Err(e) => {
                    last = e.to_string();
                    self.backoff(&e, attempt).await?;
                    continue;
                }
            };
            let sent = match write_for(&backend, drain, remove) {
                None => return Ok(Applied::Already),
                Some(Write::Delete) => {
                    self.client
                        .delete_backend(&t.lb, &t.set, &t.name, &etag)
                        .await
                }
                Some(Write::Update(details)) => {
                    self.client
                        .update_backend(&t.lb, &t.set, &t.name, &details, &etag)
                        .await
                }
            };
            let wr = match sent {
                Ok(wr) => wr,
                Err(e) if e.status() == Some(404) => return Ok(Applied::Gone),
                Err(e) if e.status() == Some(412) => {
                    // Another writer changed the load balancer: re-read.
                    self.metrics.retry("etag");
                    last = e.to_string();
                    continue;
                }
                Err(e) => {
                    last = e.to_string();
                    self.backoff(&e, attempt).await?;
                    continue;
                }
            };
            match self.await_work_request(&wr).await? {
                true => {
                    return Ok(if remove {
                        Applied::Removed
                    } else {
                        Applied::Changed
                    })
                }
                false => {
                    last = format!("work request {wr} FAILED");
                    self.metrics.retry("work_request_failed");
                    tokio::time::sleep(self.delay(attempt)).await;
                }
            }
        }
        Err(Stop::Exhausted {
            attempts: self.cfg.max_attempts,
            last,
        })
    }

    /// Polls a work request; true when SUCCEEDED, false when FAILED.
    async fn await_work_request(&self, id: &str) -> Result<bool, Stop> {
        let started = Instant::now();
        let mut errors = 0;
        loop {
            match self.client.get_work_request(id).await {
                Ok(wr) if wr.lifecycle_state == "SUCCEEDED" || wr.lifecycle_state == "FAILED" => {
                    self.metrics
                        .work_request
                        .observe(started.elapsed().as_secs_f64());
                    if wr.lifecycle_state == "FAILED" {
                        warn!(work_request = id, message = %wr.message, "work request FAILED");
                    }
                    return Ok(wr.lifecycle_state == "SUCCEEDED");
                }
                Ok(_) => {}
                Err(e) => {
                    self.backoff(&e, errors).await?;
                    errors += 1;
                    if errors >= self.cfg.max_attempts {
                        return Err(Stop::Exhausted {
                            attempts: errors,
                            last: e.to_string(),
                        });
                    }
                    continue;
                }
            }
            if started.elapsed() > self.cfg.work_request_timeout {
                return Err(Stop::Exhausted {
                    attempts: 1,
                    last: format!(
                        "work request {id} not finished within {:?}",
                        self.cfg.work_request_timeout
                    ),
                });
            }
            tokio::time::sleep(self.cfg.work_request_poll).await;
        }
    }

    /// Runs a read with the retry rules (no ETag involved).
    async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<T, Stop>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, OciError>>,
    {
        let mut last = String::new();
        for attempt in 0..self.cfg.max_attempts {
            match call().await {
                Ok(v) => return Ok(v),
                Err(e) => {
                    last = e.to_string();
                    self.backoff(&e, attempt).await?;
                }
            }
        }
        Err(Stop::Exhausted {
            attempts: self.cfg.max_attempts,
            last,
        })
    }

    /// Sleeps before a retry of a transient error; a permanent one stops.
    async fn backoff(&self, e: &OciError, attempt: u32) -> Result<(), Stop> {
        let Some(reason) = retry_reason(e) else {
            return Err(Stop::Fatal(e.clone()));
        };
        self.metrics.retry(reason);
        tokio::time::sleep(self.delay(attempt)).await;
        Ok(())
    }

    /// Exponential with "equal jitter": half fixed, half random.
    fn delay(&self, attempt: u32) -> Duration {
        let exp = self
            .cfg
            .backoff_base
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.cfg.backoff_max);
        exp / 2 + exp.mul_f64(fastrand::f64() / 2.0)
    }
}

/// Why `e` is worth a retry (a metric label), or `None` when it is
/// permanent and stops the workload's drain (401, 404, 400, other 409s...).
fn retry_reason(e: &OciError) -> Option<&'static str> {
    match e.status() {
        Some(409) if e.code() == "IncorrectState" || e.code() == "Conflict" => Some("conflict"),
        Some(429) => Some("throttled"),
        Some(s) if s >= 500 => Some("server"),
        None if matches!(e, OciError::Transport { .. }) => Some("transport"),
        _ => None,
    }
}

/// What to do about one of the workload's backends, as the load balancer
/// view shows it.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// It already has the wanted `drain`.
    Keep,
    /// Change it. `full`: its backend set or load balancer is at capacity;
    /// `remove`: delete it rather than drain it.
    Change { full: bool, remove: bool },
}

/// Only a drain can find a set at capacity (an un-drain never removes).
fn plan(t: &Target, drain: bool, at_capacity: AtCapacity, capacity_limit: usize) -> Plan {
    if t.drain == drain {
        return Plan::Keep;
    }
    let full = drain && (t.set_len >= capacity_limit || t.lb_len >= capacity_limit);
    Plan::Change {
        full,
        remove: full && at_capacity == AtCapacity::RemoveEarly,
    }
}

/// The write a backend just read (under its ETag) needs.
#[derive(Debug, PartialEq)]
enum Write {
    /// Every field as read, `drain` set.
    Update(UpdateBackendDetails),
    Delete,
}

/// `None` when the backend already has the wanted `drain` (and is not to be removed).
fn write_for(backend: &Backend, drain: bool, remove: bool) -> Option<Write> {
    if remove {
        Some(Write::Delete)
    } else if backend.drain == drain {
        None
    } else {
        Some(Write::Update(UpdateBackendDetails::with_drain(
            backend, drain,
        )))
    }
}

fn state_word(drain: bool) -> &'static str {
    if drain {
        "drained"
    } else {
        "undrained"
    }
}

/// The workload's backends on `lb`: `ipAddress` is one of the workload's
/// IPs and the store says that IP belongs to this exact workload uid. A
/// backend in a node network (a NodePort behind a node IP, a host-network
/// pod) serves many pods and is never drained.
fn targets_of(
    lb: &str,
    view: &LoadBalancer,
    uid: &str,
    ips: &[IpAddr],
    snapshot: &WorkloadSnapshot,
    node_networks: &[super::Cidr],
) -> Vec<Target> {
    let node = |ip: IpAddr| node_networks.iter().any(|n| n.contains(ip));
    let lb_len = view.backend_sets.values().map(|s| s.backends.len()).sum();
    let mut out = Vec::new();
    for (set_name, set) in &view.backend_sets {
        for b in &set.backends {
            let Ok(ip) = b.ip_address.parse::<IpAddr>() else {
                continue;
            };
            let owner = snapshot.by_ip(ip).map(|w| w.uid());
            if !ips.contains(&ip) || owner != Some(uid) || node(ip) {
                continue;
            }
            out.push(Target {
                lb: lb.to_owned(),
                set: set_name.clone(),
                name: b.name.clone(),
                drain: b.drain,
                set_len: set.backends.len(),
                lb_len,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests;
