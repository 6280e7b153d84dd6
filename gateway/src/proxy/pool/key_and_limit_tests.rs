//! Pool keys, the per-tunnel stream limit, idle close and eviction, on
//! tunnels put in the pool by hand (no network: a tunnel without an h2
//! handle is still checked out, counted and evicted like a dialed one).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use super::{Pool, PoolKey, Tunnel};
use crate::config::PoolConfig;
use tidegate_base::sync::Locked;
use tidegate_protocol::tls::{DevCa, TlsContext, TlsMetrics};

fn pool(max_streams_per_tunnel: usize, idle_timeout: Duration) -> Arc<Pool> {
    let mut reg = Registry::default();
    let ca = DevCa::new(Duration::from_secs(3600)).unwrap();
    let tls = Arc::new(TlsContext::new(
        Arc::new(ca),
        "td",
        TlsMetrics::register(&mut reg),
    ));
    let cfg = PoolConfig {
        max_streams_per_tunnel,
        idle_timeout,
    };
    Pool::new(
        tls,
        Default::default(),
        cfg,
        Default::default(),
        None,
        &mut reg,
    )
}

fn key(src: &str, dst: &str, dst_addr: &str) -> PoolKey {
    PoolKey {
        src: format!("spiffe://td/ns/default/sa/{src}").parse().unwrap(),
        dst: format!("spiffe://td/ns/default/sa/{dst}").parse().unwrap(),
        dst_uid: format!("{dst}-uid"),
        dst_also: Vec::new(),
        dst_addr: dst_addr.parse().unwrap(),
        src_netns: None,
    }
}

/// Puts an open tunnel for `key` in the pool, idle since `idle_since`.
fn add(pool: &Pool, key: &PoolKey, idle_since: Option<Instant>) -> Arc<Tunnel> {
    let tunnel = Arc::new(Tunnel {
        id: pool
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        key: key.clone(),
        send: Mutex::new(None),
        streams: AtomicUsize::new(0),
        to_workload: Default::default(),
        streams_total: AtomicU64::new(0),
        goaway: AtomicBool::new(false),
        closed: AtomicBool::new(false),
        evicted: AtomicBool::new(false),
        kill: tokio::sync::Notify::new(),
        opened: Instant::now(),
        idle_since: Mutex::new(idle_since),
        goaways_received: Counter::default(),
        book: pool.book.clone(),
        goaway_read: Default::default(),
    });
    pool.entry(key).tunnels.locked().push(tunnel.clone());
    tunnel
}

fn ids(pool: &Pool) -> Vec<u64> {
    let mut ids: Vec<u64> = pool.tunnels().iter().map(|t| t.id).collect();
    ids.sort();
    ids
}

fn killed(t: &Tunnel) -> bool {
    t.kill.notified().now_or_never().is_some()
}

#[test]
fn a_tunnel_serves_only_its_own_source_destination_and_address() {
    let pool = pool(100, Duration::from_secs(300));
    let k = key("client", "echo", "10.0.0.2:15008");
    let t = add(&pool, &k, None);
    let slot = pool
        .entry(&k)
        .checkout(100)
        .expect("same key: the pooled tunnel");
    assert!(Arc::ptr_eq(slot.tunnel(), &t));
    for other in [
        key("other", "echo", "10.0.0.2:15008"), // another source identity
        key("client", "other", "10.0.0.2:15008"), // another destination identity
        key("client", "echo", "10.0.0.9:15008"), // another destination workload
    ] {
        assert!(
            pool.entry(&other).checkout(100).is_none(),
            "{other:?} must not ride a tunnel of {k:?}"
        );
    }
}

#[test]
fn a_tunnel_carries_at_most_max_streams_and_takes_more_as_they_end() {
    let pool = pool(2, Duration::from_secs(300));
    let k = key("client", "echo", "10.0.0.2:15008");
    let t = add(&pool, &k, None);
    let entry = pool.entry(&k);
    let a = entry.checkout(2).expect("first stream");
    let b = entry.checkout(2).expect("second stream");
    assert_eq!(t.streams(), 2);
    assert!(
        entry.checkout(2).is_none(),
        "a third stream needs another tunnel"
    );
    // A second tunnel of the same key takes the overflow.
    let t2 = add(&pool, &k, None);
    let c = entry.checkout(2).expect("the second tunnel has room");
    assert!(Arc::ptr_eq(c.tunnel(), &t2));
    drop(a);
    let d = entry.checkout(2).expect("a stream ended: room again");
    assert!(
        Arc::ptr_eq(d.tunnel(), &t),
        "the first tunnel with room is reused"
    );
    assert_eq!(
        t.streams_total.load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    drop((b, c, d));
    assert_eq!((t.streams(), t2.streams()), (0, 0));
}

#[test]
fn a_tunnel_that_received_goaway_takes_no_new_stream() {
    let pool = pool(100, Duration::from_secs(300));
    let k = key("client", "echo", "10.0.0.2:15008");
    let t = add(&pool, &k, None);
    t.mark_goaway();
    assert!(pool.entry(&k).checkout(100).is_none());
    assert!(t.received_goaway());
}

#[test]
fn the_last_stream_ending_starts_the_idle_clock() {
    let pool = pool(100, Duration::from_secs(300));
    let k = key("client", "echo", "10.0.0.2:15008");
    let t = add(&pool, &k, None);
    let entry = pool.entry(&k);
    let (a, b) = (entry.checkout(100).unwrap(), entry.checkout(100).unwrap());
    drop(a);
    assert_eq!(*t.idle_since.locked(), None, "one stream still open");
    let before = Instant::now();
    drop(b);
    assert!(t.idle_since.locked().is_some_and(|at| at >= before));
    // A new stream stops it again.
    let _c = entry.checkout(100).unwrap();
    assert_eq!(*t.idle_since.locked(), None);
}

#[test]
fn idle_close_takes_only_tunnels_idle_for_the_timeout() {
    let idle_timeout = Duration::from_secs(60);
    let pool = pool(100, idle_timeout);
    let now = Instant::now();
    let long_ago = now.checked_sub(idle_timeout * 2).unwrap();
    let idle = add(
        &pool,
        &key("client", "echo", "10.0.0.2:15008"),
        Some(long_ago),
    );
    let recent = add(&pool, &key("client", "echo", "10.0.0.3:15008"), Some(now));
    // Idle since long ago but with a stream open again: not idle.
    let busy_key = key("client", "other", "10.0.0.4:15008");
    let busy = add(&pool, &busy_key, Some(long_ago));
    busy.streams.store(1, std::sync::atomic::Ordering::Release);
    pool.evict_idle_once();
    assert_eq!(ids(&pool), [recent.id, busy.id]);
    assert!(idle.evicted.load(std::sync::atomic::Ordering::Acquire));
    assert!(!recent.evicted.load(std::sync::atomic::Ordering::Acquire));
    // The emptied key is forgotten, the others kept.
    let keys = pool.keys.locked();
    assert_eq!(keys.len(), 2);
    assert!(!keys.contains_key(&idle.key));
}

#[test]
fn a_sweep_keeps_the_key_a_connect_is_dialing_for() {
    let pool = pool(100, Duration::from_secs(60));
    let k = key("client", "echo", "10.0.0.2:15008");
    // A connect looked the key up and is dialing: no tunnel yet.
    let entry = pool.entry(&k);
    pool.evict_idle_once();
    assert!(
        Arc::ptr_eq(&entry, &pool.entry(&k)),
        "the dial's entry was replaced"
    );
    // Once nothing holds it and it has no tunnel, the key is forgotten.
    drop(entry);
    pool.evict_idle_once();
    assert!(pool.keys.locked().is_empty());
}

#[test]
fn evict_when_idle_lets_streams_finish_and_evict_now_cuts_them() {
    let pool = pool(100, Duration::from_secs(300));
    let echo = key("client", "echo", "10.0.0.2:15008");
    let other = key("client", "other", "10.0.0.4:15008");
    let (t_echo, t_other) = (add(&pool, &echo, None), add(&pool, &other, None));
    let stream = pool.entry(&echo).checkout(100).unwrap();

    let dst = echo.dst.clone();
    assert_eq!(pool.evict_matching(false, |k| k.dst == dst), 1);
    // Out of the pool (no new stream), marked, its h2 handle dropped so h2
    // closes it once the open stream ends; the stream is not cut.
    assert_eq!(ids(&pool), [t_other.id]);
    assert!(t_echo.evicted.load(std::sync::atomic::Ordering::Acquire));
    assert!(t_echo.send.locked().is_none());
    assert!(
        !killed(&t_echo),
        "when idle: the driver is not told to close now"
    );
    assert_eq!(t_echo.streams(), 1);
    drop(stream);

    let dst = other.dst.clone();
    assert_eq!(pool.evict_matching(true, |k| k.dst == dst), 1);
    assert!(pool.tunnels().is_empty());
    assert!(
        killed(&t_other),
        "now: the driver closes the tunnel at once"
    );
    // Nothing left to match.
    assert_eq!(pool.evict_matching(true, |_| true), 0);
}
