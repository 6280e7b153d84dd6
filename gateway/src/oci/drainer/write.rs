//! One backend change, safely: read it with its load balancer's ETag,
//! write it back under `If-Match` (412: re-read at once), poll its work
//! request, and retry what is transient with a bounded, jittered backoff.

use std::time::Duration;

use tokio::time::Instant;
use tracing::warn;

use super::targets::Target;
use super::OciDrainer;
use tidegate_oci::model::{Backend, UpdateBackendDetails};
use tidegate_oci::OciError;

/// What one backend change ended in.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Applied {
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
pub(super) enum Stop {
    #[error("{0}")]
    Fatal(OciError),
    #[error("gave up after {attempts} attempts: {last}")]
    Exhausted { attempts: u32, last: String },
}

impl OciDrainer {
    /// Read-modify-write of one backend under `If-Match`, then its work
    /// request. The caller holds the load balancer's lock.
    pub(super) async fn apply(
        &self,
        t: &Target,
        drain: bool,
        remove: bool,
    ) -> Result<Applied, Stop> {
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
    pub(super) async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<T, Stop>
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
pub(super) fn retry_reason(e: &OciError) -> Option<&'static str> {
    match e.status() {
        Some(409) if e.code() == "IncorrectState" || e.code() == "Conflict" => Some("conflict"),
        Some(429) => Some("throttled"),
        Some(s) if s >= 500 => Some("server"),
        None if matches!(e, OciError::Transport { .. }) => Some("transport"),
        _ => None,
    }
}

/// The write a backend just read (under its ETag) needs.
#[derive(Debug, PartialEq)]
pub(super) enum Write {
    /// Every field as read, `drain` set.
    Update(UpdateBackendDetails),
    Delete,
}

/// `None` when the backend already has the wanted `drain` (and is not to be removed).
pub(super) fn write_for(backend: &Backend, drain: bool, remove: bool) -> Option<Write> {
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
