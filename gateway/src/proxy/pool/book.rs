//! What the pool knows about its destinations, under one lock: connect
//! failures and backoffs per destination address, when each destination
//! workload last sent GOAWAY, and the open streams per destination
//! workload. It knows nothing of tunnels (they hold it, to record a
//! GOAWAY).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

use super::PoolKey;

/// How long a GOAWAY is remembered for a workload no tunnel reached since.
const GOAWAY_MEMORY: Duration = Duration::from_secs(3600);

/// Consecutive connect failures to one destination, reported to the drain engine.
#[derive(Clone, Debug)]
pub struct ConnectFailure {
    pub key: PoolKey,
    pub consecutive: u32,
    pub failing_for: Duration,
    pub last_error: String,
}

/// Exponential backoff a policy set for a destination.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackoffParams {
    pub initial: Duration,
    pub max: Duration,
    pub multiplier: f64,
    pub jitter: f64,
}

#[derive(Debug)]
struct DestState {
    consecutive: u32,
    first_failure: Instant,
    backoff: Option<BackoffParams>,
    /// Retries attempted under the current backoff.
    attempt: u32,
    until: Option<Instant>,
}

impl DestState {
    fn new(now: Instant) -> Self {
        DestState {
            consecutive: 0,
            first_failure: now,
            backoff: None,
            attempt: 0,
            until: None,
        }
    }
}

/// The pool's knowledge of its destinations (the pool's `book`; taken
/// after a key's `tunnels` when both are held, never before).
#[derive(Default)]
pub(super) struct Book {
    dests: HashMap<SocketAddr, DestState>,
    /// Where consecutive connect failures are reported (the drain engine).
    pub(super) failures: Option<UnboundedSender<ConnectFailure>>,
    /// When a tunnel to each destination workload (uid) last received
    /// GOAWAY: usually the earliest sign that it drains (Service endpoint
    /// choice skips it). Cleared when a new tunnel to it opens.
    goaway_seen: HashMap<String, Instant>,
    /// Destination uid → open streams over all its tunnels.
    by_workload: HashMap<String, Arc<AtomicUsize>>,
}

impl Book {
    /// When a tunnel to workload `uid` received GOAWAY, if within `window`.
    pub(super) fn goaway_within(&self, uid: &str, window: Duration) -> Option<Instant> {
        let seen = *self.goaway_seen.get(uid)?;
        (seen.elapsed() < window).then_some(seen)
    }

    pub(super) fn goaway_received(&mut self, uid: &str) {
        self.goaway_seen.insert(uid.to_owned(), Instant::now());
    }

    /// Streams open now on tunnels (pooled or draining) to workload `uid`.
    pub(super) fn open_streams_to(&self, uid: &str) -> usize {
        self.by_workload
            .get(uid)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// A tunnel to `key` opened: the destination's backoff and its
    /// workload's GOAWAY are over. Returns the workload's shared stream
    /// counter, with the new tunnel's first stream counted.
    pub(super) fn opened(&mut self, key: &PoolKey) -> Arc<AtomicUsize> {
        self.dests.remove(&key.dst_addr);
        self.goaway_seen.remove(&key.dst_uid);
        let streams = self.by_workload.entry(key.dst_uid.clone()).or_default();
        streams.fetch_add(1, Ordering::AcqRel);
        streams.clone()
    }

    /// A dial to `key` failed: counts it, waits longer under a backoff,
    /// and reports it to the drain engine.
    pub(super) fn dial_failed(&mut self, key: &PoolKey, error: &str) {
        let now = Instant::now();
        let d = self
            .dests
            .entry(key.dst_addr)
            .or_insert_with(|| DestState::new(now));
        d.consecutive += 1;
        if let Some(b) = d.backoff {
            // Still failing under backoff: wait longer before the next try.
            d.attempt += 1;
            d.until = Some(now + backoff_wait(b, d.attempt));
        }
        let report = ConnectFailure {
            key: key.clone(),
            consecutive: d.consecutive,
            failing_for: now.duration_since(d.first_failure),
            last_error: error.to_owned(),
        };
        if let Some(tx) = &self.failures {
            let _ = tx.send(report);
        }
    }

    /// Starts (or replaces) a backoff for `addr`.
    pub(super) fn set_backoff(&mut self, addr: SocketAddr, params: BackoffParams) {
        let now = Instant::now();
        let d = self
            .dests
            .entry(addr)
            .or_insert_with(|| DestState::new(now));
        d.backoff = Some(params);
        d.attempt = 1;
        d.until = Some(now + backoff_wait(params, 1));
    }

    /// How long new tunnels to `addr` still fail fast.
    pub(super) fn backing_off(&self, addr: SocketAddr) -> Option<Duration> {
        let until = self.dests.get(&addr)?.until?;
        until.checked_duration_since(Instant::now())
    }

    /// Forgets the stream counters no tunnel holds and old GOAWAYs.
    pub(super) fn forget_idle(&mut self) {
        self.by_workload
            .retain(|_, c| Arc::strong_count(c) > 1 || c.load(Ordering::Acquire) > 0);
        self.goaway_seen
            .retain(|_, at| at.elapsed() < GOAWAY_MEMORY);
    }
}

/// The n-th wait (n from 1): min(initial * multiplier^(n-1), max), randomised
/// by ± jitter × that value.
fn backoff_wait(b: BackoffParams, n: u32) -> Duration {
    let base = b.initial.as_secs_f64() * b.multiplier.powi(n.saturating_sub(1) as i32);
    let base = base.min(b.max.as_secs_f64());
    // A cheap, good-enough random number: the clock's nanoseconds, mixed.
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(1)
        | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    let unit = (x % 10_000) as f64 / 10_000.0 * 2.0 - 1.0; // [-1, 1)
    Duration::from_secs_f64((base * (1.0 + b.jitter * unit)).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_its_max_within_jitter() {
        let b = BackoffParams {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
            multiplier: 2.0,
            jitter: 0.2,
        };
        for (n, base) in [(1, 100.0), (2, 200.0), (3, 400.0), (5, 1000.0), (9, 1000.0)] {
            let w = backoff_wait(b, n).as_secs_f64() * 1000.0;
            assert!(
                w >= base * 0.8 - 1e-6 && w <= base * 1.2 + 1e-6,
                "n={n}: {w} vs {base}"
            );
        }
    }
}
