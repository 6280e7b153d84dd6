//! The epoch ticker that bounds plugin calls, awake only while plugins run.
//!
//! wasmtime interrupts a call whose store's epoch deadline has passed; the
//! deadline counts ticks of [`EPOCH_TICK`], advanced by this thread. A
//! ticker that never stops wakes the gateway a thousand times a second for
//! nothing: decisions are rare (lifecycle events), and each wake-up is a
//! context switch the data path pays for (1,000 a second per gateway, so
//! about 2.5 per MB moved at 800 MB/s across two gateways). So the thread
//! parks when no call has started for [`LINGER_TICKS`] ticks and no call
//! is in progress, and the first call after that unparks it (one futex
//! wake); calls in a burst find it awake and pay four atomic operations.
//!
//! Contract: while a [`Busy`] guard is alive, the epoch advances at least
//! once per [`EPOCH_TICK`] (plus scheduling delay), so a deadline of N
//! ticks interrupts the call after about N ms, as with an always-on ticker.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::Thread;
use std::time::Duration;

use wasmtime::Engine;

/// One epoch tick.
pub(super) const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Ticks the ticker stays awake after the last call started (100 ms): a
/// burst of decisions (a node drain, a gateway shutdown) keeps it awake.
const LINGER_TICKS: u64 = 100;

#[derive(Debug, Default)]
struct Shared {
    /// Calls in progress.
    in_flight: AtomicUsize,
    /// Calls started since the ticker began (it compares snapshots).
    started: AtomicU64,
    /// The ticker is parked, or about to park: a starting call unparks it.
    parked: AtomicBool,
    stop: AtomicBool,
    /// Epoch ticks so far (tests read it).
    ticks: AtomicU64,
}

/// Advances an engine's epoch while plugin calls run; stops its thread when
/// dropped.
#[derive(Debug)]
pub(super) struct Ticker {
    shared: Arc<Shared>,
    thread: Thread,
}

/// A plugin call in progress: keeps the ticker awake until dropped.
#[must_use = "the ticker bounds the call only while the guard lives"]
pub(super) struct Busy<'a>(&'a Shared);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Ticker {
    pub(super) fn spawn(engine: Engine) -> std::io::Result<Ticker> {
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("policy-epoch".into())
                .spawn(move || run(&engine, &shared))?
                .thread()
                .clone()
        };
        Ok(Ticker { shared, thread })
    }

    /// Marks a call in progress, waking the ticker if it sleeps.
    pub(super) fn busy(&self) -> Busy<'_> {
        let s = &*self.shared;
        s.in_flight.fetch_add(1, Ordering::SeqCst);
        s.started.fetch_add(1, Ordering::Relaxed);
        // SeqCst pairs with the ticker's store of `parked` and load of
        // `in_flight`: either it sees this call, or this call sees it parked.
        if s.parked.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
        Busy(s)
    }

    /// Epoch ticks since the ticker started.
    #[cfg(test)]
    fn ticks(&self) -> u64 {
        self.shared.ticks.load(Ordering::Relaxed)
    }

    /// Whether the thread is parked (no call for a while).
    #[cfg(test)]
    fn is_parked(&self) -> bool {
        self.shared.parked.load(Ordering::SeqCst)
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

fn run(engine: &Engine, s: &Shared) {
    let mut seen = s.started.load(Ordering::Relaxed);
    let mut quiet = 0u64;
    while !s.stop.load(Ordering::SeqCst) {
        let started = s.started.load(Ordering::Relaxed);
        if started != seen {
            seen = started;
            quiet = 0;
        }
        if quiet >= LINGER_TICKS && s.in_flight.load(Ordering::SeqCst) == 0 {
            s.parked.store(true, Ordering::SeqCst);
            // Re-check after announcing: a call that started before it saw
            // `parked` is counted in `in_flight` now.
            if s.in_flight.load(Ordering::SeqCst) == 0 && !s.stop.load(Ordering::SeqCst) {
                std::thread::park();
            }
            s.parked.store(false, Ordering::SeqCst);
            quiet = 0;
            continue;
        }
        std::thread::sleep(EPOCH_TICK);
        engine.increment_epoch();
        s.ticks.fetch_add(1, Ordering::Relaxed);
        quiet += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn engine() -> Engine {
        let mut cfg = wasmtime::Config::new();
        cfg.epoch_interruption(true);
        Engine::new(&cfg).unwrap()
    }

    /// Polls `f` until it holds, for at most `within`.
    fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < within {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        f()
    }

    #[test]
    fn ticks_while_a_call_runs_and_parks_when_idle() {
        let t = Ticker::spawn(engine()).unwrap();
        // Nothing runs: the ticker goes to sleep and stops ticking.
        assert!(eventually(Duration::from_secs(10), || t.is_parked()));
        let asleep = t.ticks();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(t.ticks(), asleep, "a parked ticker does not tick");

        // A call in progress wakes it and keeps it ticking however long it runs.
        let busy = t.busy();
        assert!(eventually(Duration::from_secs(10), || t.ticks()
            >= asleep + 3 * LINGER_TICKS));
        assert!(!t.is_parked(), "a call is in progress");
        drop(busy);

        // Once the call is over and nothing else started, it parks again.
        assert!(eventually(Duration::from_secs(10), || t.is_parked()));
    }

    #[test]
    fn stops_its_thread_when_dropped() {
        let t = Ticker::spawn(engine()).unwrap();
        let shared = t.shared.clone();
        let _busy_then_gone = t.busy();
        drop(_busy_then_gone);
        drop(t);
        // The thread holds the other reference; it lets go when it ends.
        assert!(eventually(Duration::from_secs(10), || Arc::strong_count(
            &shared
        ) == 1));
    }
}
