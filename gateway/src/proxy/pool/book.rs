//! What the pool knows about its destinations, under one lock: connect
//! failures and backoffs per destination address, when each destination
//! workload last sent GOAWAY or last failed a connect, and the open
//! streams per destination workload. It knows nothing of tunnels (they
//! hold it, to record a GOAWAY).

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

/// A failing workload's skip doubles with each failure in a row, up to
/// this many times its base (`outbound.failing_skip`): 1, 2, 4, 8, 16.
const MAX_FAILING_DOUBLINGS: u32 = 4;

/// A destination workload whose last connect failed.
#[derive(Debug)]
struct Failing {
    last: Instant,
    /// Failures in a row (no connect succeeded since the first).
    consecutive: u32,
}

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
    /// Destination workloads (uid) whose last connect failed — a dial, or
    /// a CONNECT its gateway refused — until one succeeds.
    failing: HashMap<String, Failing>,
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

    /// How much longer workload `uid` is skipped for failing: its last
    /// failure plus `base` doubled for each failure in a row after the
    /// first (at most 16 × `base`).
    pub(super) fn failing_for(&self, uid: &str, base: Duration) -> Option<Duration> {
        let f = self.failing.get(uid)?;
        let window = base * (1 << (f.consecutive - 1).min(MAX_FAILING_DOUBLINGS));
        (f.last + window).checked_duration_since(Instant::now())
    }

    /// Failures in a row of workload `uid` (0: its last connect worked).
    pub(super) fn failures_of(&self, uid: &str) -> u32 {
        self.failing.get(uid).map_or(0, |f| f.consecutive)
    }

    /// Whether some workload is failing now (a connect's success need not
    /// take the lock otherwise).
    pub(super) fn any_failing(&self) -> bool {
        !self.failing.is_empty()
    }

    /// A CONNECT to `key` succeeded: its workload is no longer failing,
    /// and its address's failures in a row start over.
    pub(super) fn connect_succeeded(&mut self, key: &PoolKey) {
        if self.failing.remove(&key.dst_uid).is_some() {
            self.dests.remove(&key.dst_addr);
        }
    }

    /// A connect to `key` failed (its dial, or the CONNECT its gateway
    /// refused): counts it, marks its workload failing, waits longer under
    /// a backoff, and reports it to the drain engine.
    pub(super) fn connect_failed(&mut self, key: &PoolKey, error: &str) {
        let now = Instant::now();
        let f = self.failing.entry(key.dst_uid.clone()).or_insert(Failing {
            last: now,
            consecutive: 0,
        });
        f.last = now;
        f.consecutive = f.consecutive.saturating_add(1);
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
        self.failing.retain(|_, f| f.last.elapsed() < GOAWAY_MEMORY);
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

    fn key(uid: &str) -> PoolKey {
        PoolKey {
            src: "spiffe://td/ns/a/sa/client".parse().unwrap(),
            dst_uid: uid.into(),
            dst: "spiffe://td/ns/a/sa/echo".parse().unwrap(),
            dst_also: Vec::new(),
            dst_addr: "10.0.0.1:15008".parse().unwrap(),
            src_netns: None,
        }
    }

    /// `remaining` is `window`, less the moments the test took.
    fn about(remaining: Option<Duration>, window: Duration) -> bool {
        remaining.is_some_and(|r| r <= window && r + Duration::from_secs(1) > window)
    }

    #[test]
    fn a_failing_workload_is_skipped_longer_for_each_failure_in_a_row_until_a_success() {
        let (tx, mut reports) = tokio::sync::mpsc::unbounded_channel();
        let mut book = Book {
            failures: Some(tx),
            ..Book::default()
        };
        let base = Duration::from_secs(5);
        assert_eq!(book.failing_for("e", base), None);
        book.connect_failed(&key("e"), "CONNECT 10.0.0.1:80: peer answered 503");
        assert!(about(book.failing_for("e", base), base));
        assert_eq!(book.failures_of("e"), 1);
        // Reported to the drain engine as the policy's connect-failing event.
        let r = reports.try_recv().unwrap();
        assert_eq!((r.consecutive, r.key.dst_uid.as_str()), (1, "e"));
        assert!(r.last_error.contains("503"));
        // The window ends; the probe fails: twice as long, and so on up to 16 ×.
        for (n, window) in [(2, 10), (3, 20), (4, 40), (5, 80), (6, 80)] {
            // The last failure 100 s ago: past any window.
            let f = book.failing.get_mut("e").unwrap();
            f.last = f.last.checked_sub(Duration::from_secs(100)).unwrap();
            assert_eq!(book.failing_for("e", base), None, "after the window");
            book.connect_failed(&key("e"), "reset");
            assert_eq!(book.failures_of("e"), n);
            let window = Duration::from_secs(window);
            assert!(about(book.failing_for("e", base), window), "{n}");
        }
        // Others are not failing; a success ends it at once.
        assert_eq!(book.failing_for("other", base), None);
        assert!(book.any_failing());
        book.connect_succeeded(&key("e"));
        assert_eq!(
            (book.failing_for("e", base), book.failures_of("e")),
            (None, 0)
        );
        assert!(!book.any_failing());
    }

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
