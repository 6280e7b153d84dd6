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
    /// What failed: the HBONE address (`key.dst_addr`) for a dial, the
    /// application's address (the CONNECT authority) for a refused CONNECT
    /// — the destination a policy's backoff names.
    pub addr: SocketAddr,
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

/// The longest wait between two probes of a backoff (whatever the
/// policy's wait): a destination that serves again is found within this.
pub(super) const PROBE_GAP_MAX: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct DestState {
    consecutive: u32,
    first_failure: Instant,
    backoff: Option<BackoffParams>,
    /// Retries attempted under the current backoff.
    attempt: u32,
    until: Option<Instant>,
    probe: Probe,
}

/// The half-open side of a backoff: one connection at a time may try a
/// destination that has no alternative while its backoff runs.
#[derive(Debug)]
struct Probe {
    in_flight: bool,
    /// No probe starts before this: the policy's wait, at most
    /// [`PROBE_GAP_MAX`], from the backoff's start or the last failed probe.
    next_at: Instant,
    /// Probes that ended and left the backoff running.
    failed: u64,
}

impl DestState {
    fn new(now: Instant) -> Self {
        DestState {
            consecutive: 0,
            first_failure: now,
            backoff: None,
            attempt: 0,
            until: None,
            probe: Probe {
                in_flight: false,
                next_at: now,
                failed: 0,
            },
        }
    }

    /// When the next probe may start: at the backoff's end, or
    /// [`PROBE_GAP_MAX`] from `now`, whichever is sooner.
    fn next_probe(&self, now: Instant) -> Instant {
        let until = self.until.unwrap_or(now);
        until.min(now + PROBE_GAP_MAX)
    }
}

/// What a new connection to a destination does about its backoff.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Turn {
    /// No backoff runs: connect.
    Clear,
    /// Connect, as the backoff's probe.
    Probe(SocketAddr),
    /// Fail at once (the caller has another endpoint to try).
    FailFast {
        addr: SocketAddr,
        remaining: Duration,
    },
    /// Wait for the probe in flight, or for the next one to start at
    /// `next_at`; `failed` tells whether one failed meanwhile.
    Wait {
        addr: SocketAddr,
        remaining: Duration,
        failed: u64,
        next_at: Option<Instant>,
    },
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
    /// Destination workloads whose last connect failed, by (uid, what
    /// failed: the HBONE address for a dial, the application's address for
    /// a CONNECT its gateway refused), until one succeeds. By address, so
    /// one dead port of a pod does not take its others out.
    failing: HashMap<String, Vec<(SocketAddr, Failing)>>,
}

impl Book {
    /// An empty book whose consecutive connect failures go to `failures`.
    pub(super) fn reporting_to(failures: Option<UnboundedSender<ConnectFailure>>) -> Book {
        Book {
            failures,
            ..Book::default()
        }
    }
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
        self.forget_failing(&key.dst_uid, &[key.dst_addr]);
        self.goaway_seen.remove(&key.dst_uid);
        let streams = self.by_workload.entry(key.dst_uid.clone()).or_default();
        streams.fetch_add(1, Ordering::AcqRel);
        streams.clone()
    }

    /// The failing records of workload `uid` at any of `addrs` (its HBONE
    /// address, the application's).
    fn failing_at<'a>(
        &'a self,
        uid: &str,
        addrs: &'a [SocketAddr],
    ) -> impl Iterator<Item = &'a Failing> + 'a {
        self.failing
            .get(uid)
            .into_iter()
            .flatten()
            .filter(|(a, _)| addrs.contains(a))
            .map(|(_, f)| f)
    }

    /// Workload `uid` is no longer failing at `addrs`; returns those it was
    /// failing at.
    fn forget_failing(&mut self, uid: &str, addrs: &[SocketAddr]) -> Vec<SocketAddr> {
        let Some(at) = self.failing.get_mut(uid) else {
            return Vec::new();
        };
        let mut forgotten = Vec::new();
        at.retain(|(a, _)| {
            let keep = !addrs.contains(a);
            if !keep {
                forgotten.push(*a);
            }
            keep
        });
        if at.is_empty() {
            self.failing.remove(uid);
        }
        forgotten
    }

    /// How much longer workload `uid` is skipped for failing at one of
    /// `addrs`: the last failure plus `base` doubled for each failure in a
    /// row after the first (at most 16 × `base`).
    pub(super) fn failing_for(
        &self,
        uid: &str,
        addrs: &[SocketAddr],
        base: Duration,
    ) -> Option<Duration> {
        let now = Instant::now();
        self.failing_at(uid, addrs)
            .filter_map(|f| {
                let window = base * (1 << (f.consecutive - 1).min(MAX_FAILING_DOUBLINGS));
                (f.last + window).checked_duration_since(now)
            })
            .max()
    }

    /// Failures in a row of workload `uid` at one of `addrs` (0: none).
    pub(super) fn failures_of(&self, uid: &str, addrs: &[SocketAddr]) -> u32 {
        self.failing_at(uid, addrs)
            .map(|f| f.consecutive)
            .max()
            .unwrap_or(0)
    }

    /// Whether some workload is failing now (a connect's success need not
    /// take the lock otherwise).
    pub(super) fn any_failing(&self) -> bool {
        !self.failing.is_empty()
    }

    /// A CONNECT to `authority` through `key` succeeded: the workload is
    /// no longer failing there nor at its HBONE address, and their failures
    /// in a row start over.
    pub(super) fn connect_succeeded(&mut self, key: &PoolKey, authority: SocketAddr) {
        for addr in self.forget_failing(&key.dst_uid, &[key.dst_addr, authority]) {
            self.dests.remove(&addr);
        }
    }

    /// A connect through `key` failed at `at` (the HBONE address: its dial;
    /// the application's address: the CONNECT its gateway refused): counts
    /// it, marks the workload failing there, waits longer under a backoff,
    /// and reports it to the drain engine.
    pub(super) fn connect_failed(&mut self, key: &PoolKey, at: SocketAddr, error: &str) {
        let now = Instant::now();
        let by_addr = self.failing.entry(key.dst_uid.clone()).or_default();
        let f = match by_addr.iter_mut().position(|(a, _)| *a == at) {
            Some(i) => &mut by_addr[i].1,
            None => {
                let fresh = Failing {
                    last: now,
                    consecutive: 0,
                };
                by_addr.push((at, fresh));
                &mut by_addr.last_mut().expect("just pushed").1
            }
        };
        f.last = now;
        f.consecutive = f.consecutive.saturating_add(1);
        let d = self.dests.entry(at).or_insert_with(|| DestState::new(now));
        d.consecutive += 1;
        if let Some(b) = d.backoff {
            // Still failing under backoff: wait longer before the next try.
            d.attempt += 1;
            d.until = Some(now + backoff_wait(b, d.attempt));
        }
        let report = ConnectFailure {
            key: key.clone(),
            addr: at,
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
        d.probe.next_at = d.next_probe(now);
    }

    /// What a new connection to `addrs` (the HBONE address, the
    /// application's) does about a backoff on either. With an alternative
    /// it fails while the policy's wait runs; without (`may_probe`) the
    /// backoff runs until a connect succeeds, and its retries are probes,
    /// one at a time. A probe turn marks the probe in flight: the caller
    /// reports its end with [`Book::probe_ended`].
    pub(super) fn turn(&mut self, addrs: [SocketAddr; 2], may_probe: bool) -> Turn {
        if !may_probe {
            return match addrs
                .into_iter()
                .find_map(|a| Some((a, self.backing_off(a)?)))
            {
                Some((addr, remaining)) => Turn::FailFast { addr, remaining },
                None => Turn::Clear,
            };
        }
        let now = Instant::now();
        let Some((addr, d)) = addrs.into_iter().find_map(|a| {
            let d = self.dests.get(&a).filter(|d| d.backoff.is_some())?;
            Some((a, d))
        }) else {
            return Turn::Clear;
        };
        let remaining = d
            .until
            .and_then(|u| u.checked_duration_since(now))
            .unwrap_or_default();
        let p = &mut self.dests.get_mut(&addr).expect("found above").probe;
        if !p.in_flight && now >= p.next_at {
            p.in_flight = true;
            return Turn::Probe(addr);
        }
        Turn::Wait {
            addr,
            remaining,
            failed: p.failed,
            next_at: (!p.in_flight).then_some(p.next_at),
        }
    }

    /// The probe of `addr`'s backoff ended: a success ends the backoff
    /// (the WIT's "ends at the first successful connect"); a failure
    /// leaves it running, waiting longer (once per probe: a failure the
    /// pool recorded has already), and the next probe waits its gap.
    pub(super) fn probe_ended(&mut self, addr: SocketAddr, succeeded: bool) {
        if succeeded {
            self.dests.remove(&addr);
            return;
        }
        let Some(d) = self.dests.get_mut(&addr) else {
            return;
        };
        let now = Instant::now();
        if let (Some(b), true) = (d.backoff, d.until.is_none_or(|u| u <= now)) {
            d.attempt += 1;
            d.until = Some(now + backoff_wait(b, d.attempt));
        }
        d.probe.in_flight = false;
        d.probe.failed += 1;
        d.probe.next_at = d.next_probe(now);
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
        self.failing.retain(|_, at| {
            at.retain(|(_, f)| f.last.elapsed() < GOAWAY_MEMORY);
            !at.is_empty()
        });
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
        let k = key("e");
        let (hbone, app, other_port): (SocketAddr, SocketAddr, SocketAddr) = (
            k.dst_addr,
            "10.0.0.1:80".parse().unwrap(),
            "10.0.0.1:9090".parse().unwrap(),
        );
        assert_eq!(book.failing_for("e", &[hbone, app], base), None);
        book.connect_failed(&k, app, "CONNECT 10.0.0.1:80: peer answered 503");
        assert!(about(book.failing_for("e", &[hbone, app], base), base));
        assert_eq!(book.failures_of("e", &[hbone, app]), 1);
        // Its other ports are not failing: one dead port leaves the rest.
        assert_eq!(book.failing_for("e", &[hbone, other_port], base), None);
        // Reported to the drain engine as the policy's connect-failing
        // event, naming the application's address.
        let r = reports.try_recv().unwrap();
        assert_eq!(
            (r.consecutive, r.key.dst_uid.as_str(), r.addr),
            (1, "e", app)
        );
        assert!(r.last_error.contains("503"));
        // The window ends; the probe fails: twice as long, and so on up to 16 ×.
        for (n, window) in [(2, 10), (3, 20), (4, 40), (5, 80), (6, 80)] {
            // The last failure 100 s ago: past any window.
            let f = &mut book.failing.get_mut("e").unwrap()[0].1;
            f.last = f.last.checked_sub(Duration::from_secs(100)).unwrap();
            assert_eq!(
                book.failing_for("e", &[app], base),
                None,
                "after the window"
            );
            book.connect_failed(&k, app, "reset");
            assert_eq!(book.failures_of("e", &[app]), n);
            let window = Duration::from_secs(window);
            assert!(about(book.failing_for("e", &[app], base), window), "{n}");
        }
        // A failed dial marks the HBONE address: every port of the pod.
        book.connect_failed(&k, hbone, "connection refused");
        assert!(book.failing_for("e", &[hbone, other_port], base).is_some());
        // Others are not failing; a CONNECT that works ends both at once.
        assert_eq!(book.failing_for("other", &[hbone, app], base), None);
        assert!(book.any_failing());
        book.connect_succeeded(&k, app);
        assert_eq!(
            (
                book.failing_for("e", &[hbone, app], base),
                book.failures_of("e", &[hbone, app])
            ),
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
