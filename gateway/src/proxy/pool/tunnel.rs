//! One pooled tunnel, the stream slots it hands out, and the tunnels of
//! one pool key.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use h2::client::SendRequest;
use prometheus_client::metrics::counter::Counter;
use tokio::time::Instant;
use tracing::debug;

use super::book::Book;
use super::PoolKey;
use tidegate_base::sync::Locked;
use tidegate_protocol::hbone::client_io::GoawayFlag;

/// One pooled tunnel.
pub struct Tunnel {
    pub id: u64,
    pub key: PoolKey,
    /// `None` once evicted: dropping the last handle makes h2 send GOAWAY and
    /// close the connection as soon as its streams end.
    pub(super) send: Mutex<Option<SendRequest<Bytes>>>,
    pub(super) streams: AtomicUsize,
    /// Open streams to the destination workload over all its tunnels
    /// (shared by them; Service endpoint choice reads it).
    pub(super) to_workload: Arc<AtomicUsize>,
    pub(super) streams_total: AtomicU64,
    pub(super) goaway: AtomicBool,
    pub(super) closed: AtomicBool,
    /// Set when the pool evicted it (idle or shutdown) rather than the peer closing it.
    pub(super) evicted: AtomicBool,
    /// Close now, open streams or not (evict `now`).
    pub(super) kill: tokio::sync::Notify,
    pub(super) opened: Instant,
    pub(super) idle_since: Mutex<Option<Instant>>,
    pub(super) goaways_received: Counter,
    /// The pool's book, where a GOAWAY received is recorded.
    pub(super) book: Arc<Mutex<Book>>,
    /// Raised by the connection's reader when the peer's GOAWAY arrives.
    pub(super) goaway_read: GoawayFlag,
}

impl Tunnel {
    pub fn streams(&self) -> usize {
        self.streams.load(Ordering::Acquire)
    }

    pub fn received_goaway(&self) -> bool {
        self.goaway.load(Ordering::Acquire)
    }

    /// Still connected and accepting new streams from the peer's point of view.
    pub(super) fn usable(&self) -> bool {
        if self.closed.load(Ordering::Acquire) {
            return false;
        }
        self.refresh_goaway();
        !self.goaway.load(Ordering::Acquire)
    }

    /// Notices a GOAWAY the tunnel's reader has seen (`hbone::client_io`):
    /// the driver calls this after every poll of the connection, checkout
    /// before using the tunnel. One atomic load while none arrived.
    pub(super) fn refresh_goaway(&self) {
        if self.goaway_read.is_raised() {
            self.mark_goaway();
        }
    }

    pub(super) fn mark_goaway(&self) {
        if !self.goaway.swap(true, Ordering::AcqRel) {
            self.goaways_received.inc();
            self.book.locked().goaway_received(&self.key.dst_uid);
            debug!(tunnel = self.id, "tunnel received GOAWAY; no new streams");
        }
    }

    pub(super) fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.send.locked().take();
    }

    /// Why its connection ended (the `tunnels_closed` reason). A transport
    /// error after the peer's GOAWAY is the peer closing as it announced
    /// (its final close may cross our last write and come back as a reset
    /// or broken pipe): `goaway`, not `error`.
    pub(super) fn close_reason(&self, r: Result<(), h2::Error>) -> &'static str {
        match r {
            // Our own GOAWAY after eviction may cross the peer's.
            _ if self.evicted.load(Ordering::Acquire) => "evicted",
            Ok(()) => "closed",
            Err(e) if e.is_go_away() => "goaway",
            Err(e) if e.is_io() && self.received_goaway() => {
                debug!(error = %e, "tunnel closed by the peer after its GOAWAY");
                "goaway"
            }
            Err(e) => {
                debug!(error = %e, "tunnel failed");
                "error"
            }
        }
    }
}

/// A reserved stream slot on a tunnel; released on drop.
pub struct StreamSlot {
    pub(super) tunnel: Arc<Tunnel>,
}

impl StreamSlot {
    pub fn tunnel(&self) -> &Arc<Tunnel> {
        &self.tunnel
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.tunnel.to_workload.fetch_sub(1, Ordering::AcqRel);
        if self.tunnel.streams.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.tunnel.idle_since.locked() = Some(Instant::now());
        }
    }
}

/// The tunnels of one pool key.
#[derive(Default)]
pub(super) struct KeyEntry {
    pub(super) tunnels: Mutex<Vec<Arc<Tunnel>>>,
    pub(super) dialing: tokio::sync::Mutex<()>,
}

impl KeyEntry {
    /// Reserves a slot on the first usable tunnel with room (`max` streams).
    pub(super) fn checkout(&self, max: usize) -> Option<StreamSlot> {
        let tunnels = self.tunnels.locked();
        for t in tunnels.iter() {
            if !t.usable() {
                continue;
            }
            let reserved = t
                .streams
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < max).then_some(n + 1)
                });
            if reserved.is_ok() {
                t.to_workload.fetch_add(1, Ordering::AcqRel);
                t.streams_total.fetch_add(1, Ordering::Relaxed);
                *t.idle_since.locked() = None;
                return Some(StreamSlot { tunnel: t.clone() });
            }
        }
        None
    }
}
