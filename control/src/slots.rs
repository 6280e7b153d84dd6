//! The connection slots of one HTTP listener (admin, metrics, readiness).
//!
//! A listener holds at most `control_plane.max_connections` connections.
//! When a new one arrives and every slot is taken, the connection idle the
//! longest — one whose request head is not complete yet (a half-sent
//! request: slowloris) or a keep-alive connection between two requests —
//! is closed to make room for it (`tidegate_control_refusals_total{reason=
//! "evicted"}`). Only when every connection is inside a request is the new
//! one closed instead (`reason="over_capacity"`).
//!
//! So connections that hold a slot without asking anything can never keep a
//! probe out, however fast they are reopened: a kubelet's probe is a fresh
//! connection whose request follows at once, and it is the newest. A probe
//! whose slot was taken before its request was read (the accept loop ran
//! ahead of its task) is still answered: its request is read before the
//! eviction is acted on, and a request read is served, with `Connection:
//! close` ([`Slot::evicted_flag`]). The cap still bounds the descriptors the
//! listener holds (beyond it by at most the evicted connections finishing
//! their one request); the header-read timeout still closes what is left
//! idle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

use crate::limits::{ConnLimit, Open};
use tidegate_base::sync::Locked;

/// One listener's slots.
#[derive(Debug)]
pub struct Slots {
    limit: ConnLimit,
    max: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    conns: HashMap<u64, Entry>,
}

#[derive(Debug)]
struct Entry {
    /// `None` while a request is being served.
    idle_since: Option<Instant>,
    evict: Arc<Eviction>,
}

/// Told to the connection whose slot was taken.
#[derive(Debug, Default)]
struct Eviction {
    told: AtomicBool,
    notify: Notify,
}

/// An admitted connection's slot; given back when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
    evict: Arc<Eviction>,
    /// Inside a request: from the head read to the response.
    serving: AtomicBool,
    _open: Open,
}

impl Slots {
    pub fn new(limit: ConnLimit) -> Arc<Self> {
        Arc::new(Slots {
            max: limit.max(),
            limit,
            state: Mutex::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    /// A slot for a connection just accepted: a free one, or the one of the
    /// connection idle the longest, which is told to close
    /// ([`Slot::evicted`]). `None` when every connection is in a request:
    /// the caller closes the new one at once.
    pub fn admit(self: &Arc<Self>) -> Option<Slot> {
        let mut st = self.state();
        if st.conns.len() >= self.max {
            let oldest = st
                .conns
                .iter()
                .filter_map(|(id, e)| Some((e.idle_since?, *id)))
                .min();
            let Some((_, id)) = oldest else {
                drop(st);
                self.limit.refused("over_capacity");
                return None;
            };
            if let Some(e) = st.conns.remove(&id) {
                e.evict.told.store(true, Ordering::Relaxed);
                e.evict.notify.notify_one();
            }
            self.limit.refused("evicted");
        }
        let id = st.next;
        st.next += 1;
        let evict = Arc::new(Eviction::default());
        st.conns.insert(
            id,
            Entry {
                idle_since: Some(Instant::now()),
                evict: evict.clone(),
            },
        );
        Some(Slot {
            slots: self.clone(),
            id,
            evict,
            serving: AtomicBool::new(false),
            _open: self.limit.open(),
        })
    }
}

impl Slot {
    /// A request is being served: the connection is not idle.
    pub fn busy(&self) {
        self.serving.store(true, Ordering::Relaxed);
        self.mark(None);
    }

    /// The request was answered: idle (and evictable) from now on.
    pub fn idle(&self) {
        self.serving.store(false, Ordering::Relaxed);
        self.mark(Some(Instant::now()));
    }

    /// Inside a request (its head read, its response not yet given).
    pub fn serving(&self) -> bool {
        self.serving.load(Ordering::Relaxed)
    }

    /// Whether a newer connection took this slot: a response given now
    /// must close the connection.
    pub fn evicted_flag(&self) -> bool {
        self.evict.told.load(Ordering::Relaxed)
    }

    fn mark(&self, idle_since: Option<Instant>) {
        if let Some(e) = self.slots.state().conns.get_mut(&self.id) {
            e.idle_since = idle_since;
        }
    }

    /// Resolves once a newer connection took this slot: the connection
    /// must close.
    pub async fn evicted(&self) {
        self.evict.notify.notified().await
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.state().conns.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;
    use crate::limits::ControlMetrics;

    fn slots(max: u32) -> (Arc<Slots>, Registry) {
        let mut registry = Registry::default();
        let m = ControlMetrics::register(&mut registry);
        (Slots::new(ConnLimit::new("readiness", max, &m)), registry)
    }

    fn encoded(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[tokio::test]
    async fn a_new_connection_takes_the_slot_idle_the_longest() {
        let (slots, registry) = slots(2);
        let oldest = slots.admit().unwrap();
        let newer = slots.admit().unwrap();
        let fresh = slots.admit().expect("the oldest idle one makes room");
        tokio::time::timeout(std::time::Duration::from_secs(5), oldest.evicted())
            .await
            .expect("the oldest is told to close");
        // Dropping the evicted slot does not free the slot taken from it twice.
        drop(oldest);
        let _busy = slots.admit().unwrap();
        assert!(slots.state().conns.contains_key(&fresh.id));
        assert!(!slots.state().conns.contains_key(&newer.id));
        let text = encoded(&registry);
        assert!(
            text.contains(r#"control_refusals_total{listener="readiness",reason="evicted"} 2"#),
            "{text}"
        );
    }

    #[test]
    fn connections_inside_a_request_are_never_evicted() {
        let (slots, registry) = slots(2);
        let a = slots.admit().unwrap();
        let b = slots.admit().unwrap();
        a.busy();
        b.busy();
        assert!(slots.admit().is_none(), "every slot is in a request");
        b.idle();
        let _c = slots.admit().expect("b is idle again");
        assert!(slots.state().conns.contains_key(&a.id));
        let text = encoded(&registry);
        assert!(
            text.contains(
                r#"control_refusals_total{listener="readiness",reason="over_capacity"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"control_connections_open{listener="readiness"} 3"#),
            "an evicted connection is open until its task drops it: {text}"
        );
    }
}
