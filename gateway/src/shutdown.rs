//! The gateway's shutdown signal.
//!
//! One [`ShutdownTrigger`] and any number of [`ShutdownWatch`]es. When the trigger
//! fires, every watcher's [`ShutdownWatch::signaled`] resolves with the deadline
//! by which the work it guards must be finished. Tasks that serve
//! connections document what they guarantee when it fires.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

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

/// Counts live streams so shutdown can wait until none remain.
#[derive(Clone, Debug, Default)]
pub struct ActiveStreams {
    inner: Arc<(AtomicUsize, Notify)>,
}

impl ActiveStreams {
    pub fn track(&self) -> StreamGuard {
        self.inner.0.fetch_add(1, Ordering::Relaxed);
        StreamGuard {
            inner: self.inner.clone(),
        }
    }

    pub fn count(&self) -> usize {
        self.inner.0.load(Ordering::Relaxed)
    }

    /// Resolves when no tracked stream is alive.
    pub async fn idle(&self) {
        loop {
            let notified = self.inner.1.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

#[derive(Debug)]
pub struct StreamGuard {
    inner: Arc<(AtomicUsize, Notify)>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.inner.0.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.inner.1.notify_waiters();
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
}
