//! The connections open now, one entry each, as `/config_dump`'s
//! `workloadState` lists them (ztunnel's connections view, which `istioctl
//! ztunnel-config connections` reads): a ledger ([`super::ledger`])
//! registers its connection once it is routed and removes it when it
//! ends, however it ends (refused, finished or dropped).
//!
//! Sharded, so that the hot path takes no global lock: a connection
//! registers in the shard of the thread that routes it (each thread is
//! given one in turn), so inserts on different runtime workers never meet
//! on one lock; its removal, from whichever thread ends it, locks that
//! shard only; the dump locks each shard in turn, briefly. A shard is a
//! slab (slots and the list of free ones): once it has grown to the
//! connections it holds, an insert allocates nothing but the uid it keeps.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use tidegate_base::sync::Locked;

/// Shards: more than the runtime's workers on any node the gateway runs
/// on, so two workers rarely share one.
const SHARDS: usize = 16;

/// Which way a connection goes, seen from the local workload it is
/// listed under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// To the local workload (HBONE stream or plaintext connection).
    Inbound,
    /// From the local workload.
    Outbound,
}

/// One open connection, as the dump lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveConnection {
    /// The local workload it is listed under: an outbound connection's
    /// source, an inbound one's destination.
    pub workload_uid: Box<str>,
    pub direction: Direction,
    /// Outbound: the application's address; inbound: the peer's (an HBONE
    /// tunnel's peer, or a plaintext client).
    pub src: SocketAddr,
    /// The address the application dialed: a Service VIP or a workload
    /// (outbound; inbound: none, where ztunnel writes the Service a
    /// waypoint asked for).
    pub original_dst: Option<SocketAddr>,
    /// Where it went: the workload's address and port (a Service's
    /// endpoint, or the original destination itself).
    pub actual_dst: SocketAddr,
    /// Carried over HBONE (else plain TCP).
    pub hbone: bool,
}

impl LiveConnection {
    /// ztunnel's protocol name.
    pub fn protocol(&self) -> &'static str {
        if self.hbone {
            "HBONE"
        } else {
            "TCP"
        }
    }
}

#[derive(Debug, Default)]
struct Shard {
    slots: Vec<Option<LiveConnection>>,
    free: Vec<usize>,
}

/// The registry; see the module doc.
#[derive(Debug)]
pub struct LiveConnections {
    shards: Box<[Mutex<Shard>]>,
}

/// Where a registered connection is, for [`LiveConnections::update`] and
/// [`LiveConnections::remove`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registered {
    shard: usize,
    slot: usize,
}

impl Default for LiveConnections {
    fn default() -> Self {
        LiveConnections {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

/// The calling thread's shard, given once per thread in turn.
fn home_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static HOME: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    HOME.with(|h| *h)
}

impl LiveConnections {
    /// Lists `c` until it is removed.
    pub fn insert(&self, c: LiveConnection) -> Registered {
        let shard = home_shard();
        let mut s = self.shards[shard].locked();
        let slot = match s.free.pop() {
            Some(slot) => {
                s.slots[slot] = Some(c);
                slot
            }
            None => {
                s.slots.push(Some(c));
                s.slots.len() - 1
            }
        };
        Registered { shard, slot }
    }

    /// Changes what is listed of a registered connection (a later attempt
    /// went elsewhere).
    pub fn update(&self, at: Registered, change: impl FnOnce(&mut LiveConnection)) {
        if let Some(Some(c)) = self.shards[at.shard].locked().slots.get_mut(at.slot) {
            change(c);
        }
    }

    /// No longer lists the connection registered at `at`.
    pub fn remove(&self, at: Registered) {
        let mut s = self.shards[at.shard].locked();
        let Some(slot) = s.slots.get_mut(at.slot) else {
            return;
        };
        if slot.take().is_none() {
            return;
        }
        if s.free.len() + 1 == s.slots.len() {
            // Empty again: start over (the capacity stays).
            s.slots.clear();
            s.free.clear();
        } else {
            s.free.push(at.slot);
        }
    }

    /// Every connection listed now (each shard read in turn: a connection
    /// registered or removed meanwhile may or may not be in it).
    pub fn list(&self) -> Vec<LiveConnection> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            out.extend(shard.locked().slots.iter().flatten().cloned());
        }
        out
    }

    /// How many are listed now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.locked();
                s.slots.len() - s.free.len()
            })
            .sum()
    }

    /// Whether none is listed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(port: u16) -> LiveConnection {
        LiveConnection {
            workload_uid: "uid".into(),
            direction: Direction::Outbound,
            src: SocketAddr::from(([10, 0, 0, 1], port)),
            original_dst: Some(SocketAddr::from(([10, 96, 0, 1], 80))),
            actual_dst: SocketAddr::from(([10, 0, 0, 2], 8080)),
            hbone: true,
        }
    }

    #[test]
    fn a_connection_is_listed_until_removed_and_its_slot_reused() {
        let live = LiveConnections::default();
        let a = live.insert(conn(1));
        let b = live.insert(conn(2));
        assert_eq!(live.len(), 2);
        live.update(b, |c| c.actual_dst.set_port(9090));
        live.remove(a);
        assert_eq!(
            live.list(),
            [LiveConnection {
                actual_dst: SocketAddr::from(([10, 0, 0, 2], 9090)),
                ..conn(2)
            }]
        );
        let c = live.insert(conn(3));
        assert_eq!(c, a, "the freed slot is reused");
        live.remove(b);
        live.remove(c);
        live.remove(c);
        assert!(live.is_empty());
        assert!(live.list().is_empty());
    }

    #[test]
    fn connections_of_many_threads_are_all_listed_and_all_removed() {
        let live = std::sync::Arc::new(LiveConnections::default());
        let handles: Vec<_> = (0..8u16)
            .map(|t| {
                let live = live.clone();
                std::thread::spawn(move || {
                    (0..100u16)
                        .map(|i| live.insert(conn(t * 100 + i)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let registered: Vec<Registered> = handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        assert_eq!(live.len(), 800);
        let mut ports: Vec<u16> = live.list().iter().map(|c| c.src.port()).collect();
        ports.sort_unstable();
        assert_eq!(ports, (0..800).collect::<Vec<_>>());
        for r in registered {
            live.remove(r);
        }
        assert!(live.is_empty());
    }
}
