//! The half-open probe of a backoff, on the pool's book alone (no
//! network): who probes, who waits, who fails, and when the next probe
//! may go. Waits are short real ones; only lower bounds are checked (a
//! sleep never ends early).

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use super::*;
use crate::config::HboneConfig;
use crate::proxy::pool::book::PROBE_GAP_MAX;
use crate::proxy::pool::BackoffParams;
use tidegate_protocol::tls::{DevCa, TlsContext, TlsMetrics};

fn pool(connect_timeout: Duration) -> (Arc<Pool>, Registry) {
    let mut reg = Registry::default();
    let ca = DevCa::new(Duration::from_secs(3600)).unwrap();
    let tls = Arc::new(TlsContext::new(
        Arc::new(ca),
        "td",
        TlsMetrics::register(&mut reg),
    ));
    let hbone = HboneConfig {
        connect_timeout,
        ..Default::default()
    };
    let pool = Pool::new(
        tls,
        hbone,
        Default::default(),
        Default::default(),
        None,
        &mut reg,
    );
    (pool, reg)
}

fn key() -> PoolKey {
    PoolKey {
        src: "spiffe://td/ns/a/sa/client".parse().unwrap(),
        dst_uid: "b-uid".into(),
        dst: "spiffe://td/ns/a/sa/b".parse().unwrap(),
        dst_also: Vec::new(),
        dst_addr: "10.0.0.2:15008".parse().unwrap(),
        src_netns: None,
    }
}

fn app() -> SocketAddr {
    "10.0.0.2:80".parse().unwrap()
}

/// The policy's backoff: `wait` each time, no jitter.
fn backoff(wait: Duration) -> BackoffParams {
    BackoffParams {
        initial: wait,
        max: wait,
        multiplier: 1.0,
        jitter: 0.0,
    }
}

fn text(reg: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, reg).unwrap();
    out
}

fn count(reg: &Registry, series: &str) -> u64 {
    text(reg)
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

const PROBES_OK: &str = "pool_backoff_probes_total{outcome=\"succeeded\"}";
const PROBES_FAILED: &str = "pool_backoff_probes_total{outcome=\"failed\"}";
const FAST_FAILED: &str = "pool_backoff_fast_failures_total";

#[tokio::test]
async fn with_an_alternative_a_backoff_fails_the_connection_at_once() {
    let (pool, reg) = pool(Duration::from_secs(5));
    pool.set_backoff(key().dst_addr, backoff(Duration::from_secs(60)));
    let r = pool
        .through_backoff(&key(), app(), OnBackoff::FailFast)
        .now_or_never()
        .expect("no wait");
    assert!(matches!(r, Err(PoolError::BackingOff { .. })));
    assert_eq!(count(&reg, FAST_FAILED), 1);
}

/// The destination serves again: the first probe connects, the backoff
/// ends, and the connections that waited on it connect too.
#[tokio::test]
async fn a_probe_that_connects_ends_the_backoff_for_those_that_waited() {
    let (pool, reg) = pool(Duration::from_secs(5));
    let started = Instant::now();
    pool.set_backoff(key().dst_addr, backoff(Duration::from_millis(100)));
    assert!(
        pool.through_backoff(&key(), app(), OnBackoff::Probe)
            .now_or_never()
            .is_none(),
        "waits for the first probe"
    );
    // The first probe goes when the policy's wait is over, not before.
    let probe = pool
        .through_backoff(&key(), app(), OnBackoff::Probe)
        .await
        .unwrap()
        .expect("the probe");
    assert!(started.elapsed() >= Duration::from_millis(100));
    // Others wait for its outcome: none is a second probe, none fails.
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let turn = pool.through_backoff(&key(), app(), OnBackoff::Probe).await;
                turn.map(|t| t.is_none())
            })
        })
        .collect();
    tokio::task::yield_now().await;
    assert!(waiters.iter().all(|w| !w.is_finished()));
    probe.finish(true);
    for w in waiters {
        assert!(w.await.unwrap().unwrap(), "connects as usual");
    }
    assert_eq!(pool.book.locked().backing_off(key().dst_addr), None);
    assert_eq!((count(&reg, PROBES_OK), count(&reg, PROBES_FAILED)), (1, 0));
    assert_eq!(count(&reg, FAST_FAILED), 0);
}

/// Still down: the probe's waiters fail with it, as the backoff would
/// have failed them, and the next probe waits its gap — at most one in
/// flight, no two closer than the policy's wait (at most one second).
#[tokio::test]
async fn a_failed_probe_fails_its_waiters_and_the_next_waits_its_gap() {
    let (pool, reg) = pool(Duration::from_secs(5));
    let wait = Duration::from_millis(30);
    pool.set_backoff(key().dst_addr, backoff(wait));
    let mut last: Option<Instant> = None;
    for round in 1..=4u64 {
        let probe = pool
            .through_backoff(&key(), app(), OnBackoff::Probe)
            .await
            .unwrap()
            .expect("the probe");
        if let Some(last) = last {
            assert!(last.elapsed() >= wait, "round {round}: probes too close");
        }
        last = Some(Instant::now());
        let waiter = tokio::spawn({
            let pool = pool.clone();
            async move { pool.through_backoff(&key(), app(), OnBackoff::Probe).await }
        });
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "no second probe while one is in flight"
        );
        // The probe's connect fails: recorded (the backoff runs on), then ended.
        pool.failed(&key(), key().dst_addr, "connection refused");
        probe.finish(false);
        let failed = waiter.await.unwrap();
        assert!(matches!(failed, Err(PoolError::BackingOff { .. })));
        assert_eq!(count(&reg, PROBES_FAILED), round);
        assert_eq!(count(&reg, FAST_FAILED), round);
    }
    drop(
        pool.through_backoff(&key(), app(), OnBackoff::Probe)
            .await
            .unwrap(),
    );
    assert_eq!(count(&reg, PROBES_FAILED), 5, "dropped unfinished: failed");
    // A long policy wait: the next probe still comes within a second.
    pool.set_backoff(key().dst_addr, backoff(Duration::from_secs(600)));
    let turn = pool.book.locked().turn([key().dst_addr, app()], true);
    let Turn::Wait {
        next_at: Some(at), ..
    } = turn
    else {
        panic!("{turn:?}")
    };
    assert!(at <= Instant::now() + PROBE_GAP_MAX, "{turn:?}");
}

/// A connection waits no longer than the connect timeout: when the next
/// probe comes later, it fails at once as before.
#[tokio::test]
async fn a_probe_beyond_the_connect_timeout_is_not_waited_for() {
    let (pool, reg) = pool(Duration::from_millis(200));
    pool.set_backoff(key().dst_addr, backoff(Duration::from_secs(60)));
    let r = pool
        .through_backoff(&key(), app(), OnBackoff::Probe)
        .now_or_never()
        .expect("no wait");
    assert!(matches!(r, Err(PoolError::BackingOff { .. })));
    assert_eq!(count(&reg, FAST_FAILED), 1);
}
