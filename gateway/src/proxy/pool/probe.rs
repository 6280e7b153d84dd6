//! Connections to a destination under a policy's connect-failing backoff.
//!
//! A destination with another endpoint to try fails at once (the
//! connection is tried on the other). One with no alternative — a pod
//! address, or a Service whose every endpoint is passed over — is probed,
//! half-open as a circuit breaker: one connection at a time goes through
//! (no sooner than the policy's wait, and at most
//! [`PROBE_GAP_MAX`](super::book::PROBE_GAP_MAX) after the backoff's start
//! or the last failed probe); the others wait for its outcome, bounded by
//! `hbone.connect_timeout`. A probe that connects ends the backoff and its
//! waiters connect; one that fails leaves the backoff running and fails
//! its waiters, as the backoff would have.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::book::{Book, Turn};
use super::metrics::OutcomeLabel;
use super::{Pool, PoolError, PoolKey};
use tidegate_base::sync::Locked;

/// What a connection does when its destination backs off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnBackoff {
    /// Fail at once: the caller has another endpoint to try.
    FailFast,
    /// Probe (one at a time) or wait for the probe: no alternative.
    Probe,
}

/// The one probe in flight through a backoff; its end is reported when it
/// is finished, or as a failure if dropped unfinished.
pub(super) struct ProbeTicket {
    book: Arc<Mutex<Book>>,
    ended: Arc<Notify>,
    probes: Family<OutcomeLabel, Counter>,
    addr: SocketAddr,
    finished: bool,
}

impl ProbeTicket {
    /// The probe's connect succeeded or not.
    pub(super) fn finish(mut self, succeeded: bool) {
        self.end(succeeded);
    }

    fn end(&mut self, succeeded: bool) {
        self.finished = true;
        self.book.locked().probe_ended(self.addr, succeeded);
        let outcome = if succeeded { "succeeded" } else { "failed" };
        self.probes.get_or_create(&OutcomeLabel { outcome }).inc();
        self.ended.notify_waiters();
    }
}

impl Drop for ProbeTicket {
    fn drop(&mut self) {
        if !self.finished {
            self.end(false);
        }
    }
}

impl Pool {
    /// Through `key`'s backoff, if one runs on its HBONE address or on
    /// `authority`: `None` to connect as usual, a ticket to connect as the
    /// probe, or the error of a connection the backoff fails.
    pub(super) async fn through_backoff(
        &self,
        key: &PoolKey,
        authority: SocketAddr,
        on_backoff: OnBackoff,
    ) -> Result<Option<ProbeTicket>, PoolError> {
        let addrs = [key.dst_addr, authority];
        let may_probe = on_backoff == OnBackoff::Probe;
        let deadline = Instant::now() + self.hbone.connect_timeout;
        // The failed probes counted when this connection began to wait:
        // one more, and the probe it waited for failed.
        let mut waited: Option<u64> = None;
        loop {
            let ended = self.probe_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let turn = self.book.locked().turn(addrs, may_probe);
            let wake = match turn {
                Turn::Clear => return Ok(None),
                Turn::Probe(addr) => {
                    return Ok(Some(ProbeTicket {
                        book: self.book.clone(),
                        ended: self.probe_ended.clone(),
                        probes: self.metrics.probes.clone(),
                        addr,
                        finished: false,
                    }))
                }
                Turn::FailFast { addr, remaining } => return Err(self.fast_fail(addr, remaining)),
                Turn::Wait {
                    addr,
                    remaining,
                    failed,
                    next_at,
                } => {
                    let probe_failed = waited.is_some_and(|w| w != failed);
                    let too_late = next_at.is_some_and(|at| at > deadline);
                    if probe_failed || too_late || Instant::now() >= deadline {
                        return Err(self.fast_fail(addr, remaining));
                    }
                    waited = Some(failed);
                    next_at.map_or(deadline, |at| at.min(deadline))
                }
            };
            tokio::select! {
                _ = ended => {}
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// A connection the backoff on `addr` fails without a dial of its own.
    fn fast_fail(&self, addr: SocketAddr, remaining: Duration) -> PoolError {
        self.metrics.fast_failed.inc();
        PoolError::BackingOff {
            addr,
            remaining_ms: remaining.as_millis() as u64,
        }
    }
}

#[cfg(test)]
#[path = "probe_tests.rs"]
mod tests;
