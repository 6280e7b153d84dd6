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
    /// says how the streams ended: at the deadline, waits up to `settle`
    /// more for the streams it cut to end, to count them.
    pub async fn drain(&self, deadline: Instant, settle: Duration) -> DrainEnd {
        let start = self.ends();
        let idle = tokio::time::timeout_at(deadline, self.idle()).await;
        // Streams cut at the deadline end just as it passes: idle then is
        // no clean drain.
        if idle.is_ok() && Instant::now() < deadline {
            return DrainEnd::Drained(self.ends().since(start));
        }
        let at_deadline = self.at_deadline(start);
        let _ = tokio::time::timeout(settle, self.idle()).await;
        at_deadline.settled(self)
    }

    /// The streams' state as the deadline passes (ends counted since `start`).
    fn at_deadline(&self, start: StreamEnds) -> AtDeadline {
        let ends = self.ends();
        AtDeadline {
            before: ends.since(start),
            open: self.count(),
            ends,
        }
    }
}

/// [`ActiveStreams`] as a drain's deadline passes.
struct AtDeadline {
    /// Ends counted before it.
    before: StreamEnds,
    open: usize,
    ends: StreamEnds,
}

impl AtDeadline {
    /// How the streams open at the deadline ended since.
    fn settled(self, streams: &ActiveStreams) -> DrainEnd {
        DrainEnd::Deadline {
            before: self.before,
            open: self.open,
            cut: streams.ends().since(self.ends),
            still_open: streams.count(),
        }
    }
}

/// How the gateway's drain ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainEnd {
    /// No stream was left before the deadline; how those that were ended.
    Drained(StreamEnds),
    /// The deadline passed with `open` streams: how they ended once it cut
    /// them (`cut`; an end of stream seen before the cut's reset is a clean
    /// close), how many had not ended at all (`still_open`: they are
    /// dropped as the gateway stops), and how those before it ended.
    Deadline {
        before: StreamEnds,
        open: usize,
        cut: StreamEnds,
        still_open: usize,
    },
}

impl DrainEnd {
    /// The drain's last log line.
    pub fn log(&self) {
        match *self {
            DrainEnd::Drained(ended) => info!(
                closed_cleanly = ended.clean,
                reset = ended.reset,
                "drained: no streams left"
            ),
            DrainEnd::Deadline {
                before,
                open,
                cut,
                still_open,
            } => info!(
                open_at_deadline = open,
                reset = cut.reset,
                closed_cleanly = cut.clean,
                still_open,
                closed_cleanly_before = before.clean,
                reset_before = before.reset,
                "drain deadline reached: {}",
                self.what_happened()
            ),
        }
    }

    /// What the deadline did to the streams still open, in words.
    pub fn what_happened(&self) -> String {
        let DrainEnd::Deadline {
            open,
            cut,
            still_open,
            ..
        } = *self
        else {
            return "no streams left".to_owned();
        };
        let (open, still_open) = (open as u64, still_open as u64);
        let unanswered = open.saturating_sub(cut.reset + cut.clean + still_open);
        let parts: Vec<String> = [
            (cut.reset, "reset"),
            (cut.clean, "closed cleanly"),
            (unanswered, "ended before any byte moved"),
            (still_open, "not ended when the gateway stopped"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        if parts.is_empty() {
            "no stream was still open".to_owned()
        } else {
            format!("of {open} streams still open, {}", parts.join(", "))
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

    /// At the deadline, the drain's last line says how the streams still
    /// open ended: reset, closed cleanly, unanswered or not at all.
    #[test]
    fn a_deadline_says_how_the_streams_it_cut_ended() {
        let streams = ActiveStreams::default();
        let start = streams.ends();
        let mut early = streams.track();
        early.finished(true);
        drop(early);
        let (mut reset, mut clean) = (streams.track(), streams.track());
        let (unanswered, hung) = (streams.track(), streams.track());
        let at = streams.at_deadline(start);
        reset.finished(false);
        clean.finished(true);
        drop((reset, clean, unanswered));
        let end = at.settled(&streams);
        assert_eq!(
            end,
            DrainEnd::Deadline {
                before: StreamEnds { clean: 1, reset: 0 },
                open: 4,
                cut: StreamEnds { clean: 1, reset: 1 },
                still_open: 1,
            }
        );
        assert_eq!(
            end.what_happened(),
            "of 4 streams still open, 1 reset, 1 closed cleanly, \
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
        let at = streams.at_deadline(streams.ends());
        open.finished(true);
        drop(open);
        let end = at.settled(&streams);
        assert_eq!(
            end.what_happened(),
            "of 1 streams still open, 1 closed cleanly"
        );
        assert_eq!(
            at_nothing_open(&streams).what_happened(),
            "no stream was still open"
        );
    }

    fn at_nothing_open(streams: &ActiveStreams) -> DrainEnd {
        streams.at_deadline(streams.ends()).settled(streams)
    }

    #[tokio::test]
    async fn a_drain_without_streams_ends_before_its_deadline() {
        let streams = ActiveStreams::default();
        let deadline = Instant::now() + Duration::from_secs(60);
        let end = streams.drain(deadline, Duration::from_secs(60)).await;
        assert_eq!(end, DrainEnd::Drained(StreamEnds::default()));
    }
}
