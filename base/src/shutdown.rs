//! The gateway's shutdown signal.
//!
//! One [`ShutdownTrigger`] and any number of [`ShutdownWatch`]es. When the trigger
//! fires, every watcher's [`ShutdownWatch::signaled`] resolves with the deadline
//! by which the work it guards must be finished. Tasks that serve
//! connections document what they guarantee when it fires.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tracing::info;

pub fn channel() -> (ShutdownTrigger, ShutdownWatch) {
    let (tx, rx) = watch::channel(None);
    (ShutdownTrigger { tx }, ShutdownWatch { rx })
}

#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<Option<Instant>>,
}

impl ShutdownTrigger {
    /// Starts draining; work must end within `grace`. Firing twice keeps the first deadline.
    pub fn start(&self, grace: Duration) -> Instant {
        let deadline = Instant::now() + grace;
        self.tx.send_if_modified(|d| {
            if d.is_none() {
                *d = Some(deadline);
                true
            } else {
                false
            }
        });
        self.tx.borrow().expect("set above")
    }

    pub fn watch(&self) -> ShutdownWatch {
        ShutdownWatch {
            rx: self.tx.subscribe(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ShutdownWatch {
    rx: watch::Receiver<Option<Instant>>,
}

impl ShutdownWatch {
    /// Resolves with the deadline once draining started (immediately if it already has).
    /// If the trigger is dropped without firing, this never resolves.
    pub async fn signaled(&mut self) -> Instant {
        let deadline = self
            .rx
            .wait_for(Option::is_some)
            .await
            .map(|d| d.expect("waited for Some"));
        match deadline {
            Ok(d) => d,
            Err(_) => std::future::pending().await,
        }
    }

    pub fn is_draining(&self) -> bool {
        self.rx.borrow().is_some()
    }
}

/// Counts live streams so shutdown can wait until none remain, and how the
/// ones that ended did (so shutdown can say what its deadline did).
#[derive(Clone, Debug, Default)]
pub struct ActiveStreams {
    inner: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    live: AtomicUsize,
    /// Streams whose bytes were moved to the end: both sides saw a clean close.
    clean: AtomicU64,
    /// Streams cut (a reset on either side).
    reset: AtomicU64,
    idle: Notify,
}

/// How many tracked streams ended cleanly and how many were reset (streams
/// refused or failed before any byte moved are in neither).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamEnds {
    pub clean: u64,
    pub reset: u64,
}

impl StreamEnds {
    /// The ends since `earlier`.
    pub fn since(self, earlier: StreamEnds) -> StreamEnds {
        StreamEnds {
            clean: self.clean.saturating_sub(earlier.clean),
            reset: self.reset.saturating_sub(earlier.reset),
        }
    }
}

impl ActiveStreams {
    pub fn track(&self) -> StreamGuard {
        self.inner.live.fetch_add(1, Ordering::Relaxed);
        StreamGuard {
            inner: self.inner.clone(),
            ended: None,
        }
    }

    pub fn count(&self) -> usize {
        self.inner.live.load(Ordering::Relaxed)
    }

    /// The ends counted so far.
    pub fn ends(&self) -> StreamEnds {
        StreamEnds {
            clean: self.inner.clean.load(Ordering::Relaxed),
            reset: self.inner.reset.load(Ordering::Relaxed),
        }
    }

    /// Resolves when no tracked stream is alive.
    pub async fn idle(&self) {
        loop {
            let notified = self.inner.idle.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }

    /// Waits until no stream is left or the drain `deadline` passes, and
    /// says how the streams open at the start ended: at the deadline, after
    /// waiting up to `settle` more for the streams it cut to end.
    pub async fn drain(&self, deadline: Instant, settle: Duration) -> DrainEnd {
        let start = self.drain_start();
        let idle = tokio::time::timeout_at(deadline, self.idle()).await;
        // Streams cut at the deadline end just as it passes: idle then is
        // no clean drain.
        if idle.is_ok() && Instant::now() < deadline {
            return start.end(self, false);
        }
        let _ = tokio::time::timeout(settle, self.idle()).await;
        start.end(self, true)
    }

    fn drain_start(&self) -> DrainStart {
        DrainStart {
            open: self.count(),
            ends: self.ends(),
        }
    }
}

/// [`ActiveStreams`] as a drain starts.
struct DrainStart {
    open: usize,
    ends: StreamEnds,
}

impl DrainStart {
    /// How the drain ended (at its deadline or not).
    fn end(self, streams: &ActiveStreams, deadline_reached: bool) -> DrainEnd {
        DrainEnd {
            deadline_reached,
            open: self.open,
            ended: streams.ends().since(self.ends),
            still_open: streams.count(),
        }
    }
}

/// How the gateway's drain ended: what happened to the streams open as it
/// started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainEnd {
    /// The deadline passed with streams open; its tunnels' close cut them
    /// (a stream whose copy saw an end of stream first closed cleanly).
    pub deadline_reached: bool,
    /// Streams open as the drain started.
    pub open: usize,
    /// How the streams that carried bytes ended since.
    pub ended: StreamEnds,
    /// Streams not ended at all (dropped as the gateway stops).
    pub still_open: usize,
}

impl DrainEnd {
    /// The drain's last log line.
    pub fn log(&self) {
        let head = if self.deadline_reached {
            "drain deadline reached"
        } else {
            "drained: no streams left"
        };
        info!(
            open_at_start = self.open,
            reset = self.ended.reset,
            closed_cleanly = self.ended.clean,
            still_open = self.still_open,
            "{head}: {}",
            self.what_happened()
        );
    }

    /// What happened to the streams, in words.
    pub fn what_happened(&self) -> String {
        let (open, still_open) = (self.open as u64, self.still_open as u64);
        let ended = self.ended;
        let unanswered = open.saturating_sub(ended.reset + ended.clean + still_open);
        let parts: Vec<String> = [
            (ended.reset, "reset"),
            (ended.clean, "closed cleanly"),
            (unanswered, "ended before any byte moved"),
            (still_open, "not ended when the gateway stopped"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        if parts.is_empty() {
            "no stream was open".to_owned()
        } else {
            format!("of {open} streams open, {}", parts.join(", "))
        }
    }
}

#[derive(Debug)]
pub struct StreamGuard {
    inner: Arc<Shared>,
    /// Whether the stream ended cleanly, once it carried bytes.
    ended: Option<bool>,
}

impl StreamGuard {
    /// The stream's bytes were moved: to the end (`clean`), or until a
    /// reset cut it. Counted when the guard drops.
    pub fn finished(&mut self, clean: bool) {
        self.ended = Some(clean);
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        match self.ended {
            Some(true) => self.inner.clean.fetch_add(1, Ordering::Relaxed),
            Some(false) => self.inner.reset.fetch_add(1, Ordering::Relaxed),
            None => 0,
        };
        if self.inner.live.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.inner.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn watchers_see_the_first_deadline() {
        let (trigger, mut w) = channel();
        let mut w2 = trigger.watch();
        assert!(!w.is_draining());
        let d1 = trigger.start(Duration::from_secs(5));
        let d2 = trigger.start(Duration::from_secs(50));
        assert_eq!(d1, d2);
        assert_eq!(w.signaled().await, d1);
        assert_eq!(w2.signaled().await, d1);
    }

    #[tokio::test]
    async fn idle_waits_for_last_guard() {
        let streams = ActiveStreams::default();
        let g1 = streams.track();
        let g2 = streams.track();
        let waiter = tokio::spawn({
            let s = streams.clone();
            async move { s.idle().await }
        });
        drop(g1);
        assert!(!waiter.is_finished());
        drop(g2);
        waiter.await.unwrap();
        assert_eq!(streams.count(), 0);
    }

    #[test]
    fn ends_are_counted_by_how_the_stream_ended() {
        let streams = ActiveStreams::default();
        let before = streams.ends();
        let mut clean = streams.track();
        let mut cut = streams.track();
        let refused = streams.track();
        clean.finished(true);
        cut.finished(false);
        drop((clean, cut, refused));
        assert_eq!(
            streams.ends().since(before),
            StreamEnds { clean: 1, reset: 1 }
        );
        assert_eq!(streams.count(), 0);
    }

    /// The drain's last line says how the streams open as it started
    /// ended: reset, closed cleanly, unanswered or not at all.
    #[test]
    fn a_drain_says_how_its_streams_ended() {
        let streams = ActiveStreams::default();
        let (mut reset, mut clean) = (streams.track(), streams.track());
        let (unanswered, hung) = (streams.track(), streams.track());
        let start = streams.drain_start();
        reset.finished(false);
        clean.finished(true);
        drop((reset, clean, unanswered));
        let end = start.end(&streams, true);
        assert_eq!(
            end,
            DrainEnd {
                deadline_reached: true,
                open: 4,
                ended: StreamEnds { clean: 1, reset: 1 },
                still_open: 1,
            }
        );
        assert_eq!(
            end.what_happened(),
            "of 4 streams open, 1 reset, 1 closed cleanly, \
             1 ended before any byte moved, 1 not ended when the gateway stopped"
        );
        drop(hung);
    }

    /// Streams the deadline cut whose apps saw a clean close are not said to
    /// be reset.
    #[test]
    fn streams_closed_cleanly_at_the_deadline_are_not_said_reset() {
        let streams = ActiveStreams::default();
        let mut open = streams.track();
        let start = streams.drain_start();
        open.finished(true);
        drop(open);
        let end = start.end(&streams, true);
        assert_eq!(end.what_happened(), "of 1 streams open, 1 closed cleanly");
        let nothing = streams.drain_start().end(&streams, true);
        assert_eq!(nothing.what_happened(), "no stream was open");
    }

    #[tokio::test]
    async fn a_drain_without_streams_ends_before_its_deadline() {
        let streams = ActiveStreams::default();
        let deadline = Instant::now() + Duration::from_secs(60);
        let end = streams.drain(deadline, Duration::from_secs(60)).await;
        assert!(!end.deadline_reached);
        assert_eq!(end.what_happened(), "no stream was open");
    }
}
