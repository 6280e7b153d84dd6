//! What the lab watches while a scenario runs: the client gateway's pool
//! (`GET /config_dump?only=pool` every millisecond), a counter's first rise
//! (`/metrics` every millisecond), the server gateway's drain record
//! (`GET /drains` every 5 ms).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

pub use super::http::HttpProbe;

/// A poll running on a namespace's runtime; it stops when dropped.
pub struct Poller(watch::Sender<bool>);

impl Drop for Poller {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

/// Calls `poll` on `probe`'s runtime every `period` (a late tick delays the
/// next) until the [`Poller`] is dropped or `poll` answers `Break`.
fn poll_every<F, Fut>(probe: &HttpProbe, period: Duration, mut poll: F) -> Poller
where
    F: FnMut(HttpProbe) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = std::ops::ControlFlow<()>> + Send,
{
    let (stop, mut stopped) = watch::channel(false);
    let probe = probe.clone();
    probe.ns.clone().spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stopped.changed() => return,
                _ = tick.tick() => {}
            }
            if poll(probe.clone()).await.is_break() {
                return;
            }
        }
    });
    Poller(stop)
}

pub use crate::metric_sum;

pub const OPENED: &str = "tidegate_pool_tunnels_opened_total";
pub const GOAWAYS: &str = "tidegate_pool_goaways_received_total";

/// What the pool watcher saw of the client gateway's pooled tunnels.
#[derive(Debug, Default)]
pub struct PoolTrace {
    pub polls: u64,
    /// Longest time between two successful polls.
    pub max_gap: Duration,
    last_poll: Option<Instant>,
    /// Tunnel ids to the old pod's IP, first seen before `reuse_at`.
    old_ids: HashSet<u64>,
    /// Last poll in which a tunnel to the old pod was pooled.
    pub old_last_seen: Option<Instant>,
    /// First poll after `old_last_seen` without one.
    pub old_gone_at: Option<Instant>,
    /// First poll in which any pooled tunnel had received a GOAWAY.
    pub first_goaway: Option<Instant>,
    /// When the old pod's IP went to a new pod (tunnels to it opened later are the new pod's).
    pub reuse_at: Option<Instant>,
    pub errors: u64,
}

impl PoolTrace {
    fn observe(&mut self, at: Instant, dump: &serde_json::Value, old_ip: IpAddr) {
        self.polls += 1;
        if let Some(prev) = self.last_poll {
            self.max_gap = self.max_gap.max(at - prev);
        }
        self.last_poll = Some(at);
        let mut old_present = false;
        for t in dump["pool"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            if t["goaway_received"] == true && self.first_goaway.is_none() {
                self.first_goaway = Some(at);
            }
            let id = t["id"].as_u64().unwrap_or(u64::MAX);
            let to_old_ip = t["dst_addr"]
                .as_str()
                .and_then(|a| a.parse::<SocketAddr>().ok())
                .is_some_and(|a| a.ip() == old_ip);
            if to_old_ip && self.reuse_at.is_none() {
                self.old_ids.insert(id);
            }
            old_present |= self.old_ids.contains(&id);
        }
        if old_present {
            self.old_last_seen = Some(at);
            self.old_gone_at = None;
        } else if self.old_last_seen.is_some() && self.old_gone_at.is_none() {
            self.old_gone_at = Some(at);
        }
    }

    /// Whether the last poll had a tunnel to the old pod.
    pub fn old_present(&self) -> bool {
        self.old_last_seen.is_some() && self.old_gone_at.is_none()
    }

    pub fn clone_summary(&self) -> TraceSummary {
        TraceSummary {
            polls: self.polls,
            max_gap: self.max_gap,
            old_seen: self.old_ids.len(),
            old_present: self.old_present(),
            old_gone_at: self.old_gone_at,
            first_goaway: self.first_goaway,
        }
    }
}

/// A copy of what the report needs from a [`PoolTrace`].
#[derive(Debug)]
pub struct TraceSummary {
    pub polls: u64,
    pub max_gap: Duration,
    /// Tunnels to the old pod seen in all.
    pub old_seen: usize,
    pub old_present: bool,
    pub old_gone_at: Option<Instant>,
    pub first_goaway: Option<Instant>,
}

/// Polls the client gateway's pool (`/config_dump?only=pool`) every
/// millisecond until dropped.
pub struct PoolWatcher {
    pub trace: Arc<Mutex<PoolTrace>>,
    _poll: Poller,
}

impl PoolWatcher {
    pub fn start(admin: HttpProbe, old_ip: IpAddr) -> PoolWatcher {
        let trace = Arc::new(Mutex::new(PoolTrace::default()));
        let t = trace.clone();
        let poll = poll_every(&admin, Duration::from_millis(1), move |admin| {
            let t = t.clone();
            async move {
                let got = admin.try_request("GET", "/config_dump?only=pool").await;
                let at = Instant::now();
                let mut trace = t.lock().unwrap_or_else(|e| e.into_inner());
                match got.ok().and_then(|(_, b)| serde_json::from_str(&b).ok()) {
                    Some(dump) => trace.observe(at, &dump, old_ip),
                    None => trace.errors += 1,
                }
                std::ops::ControlFlow::Continue(())
            }
        });
        PoolWatcher { trace, _poll: poll }
    }

    pub fn mark_reuse(&self) {
        self.trace
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reuse_at = Some(Instant::now());
    }

    pub fn old_present(&self) -> bool {
        self.trace
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .old_present()
    }
}

/// The server gateway's drain record of one workload, polled every 5 ms
/// through `GET /drains` until it has ended.
pub struct DrainWatcher {
    pub seen: Arc<Mutex<DrainSeen>>,
    _poll: Poller,
}

#[derive(Debug, Default, Clone)]
pub struct DrainSeen {
    /// The last record seen.
    pub view: Option<serde_json::Value>,
    /// Wall clock (unix ms) of the first poll that showed it ended.
    pub ended_seen_unix_ms: Option<u128>,
}

impl DrainSeen {
    /// Start → end of the drain (end as first seen by the poll).
    pub fn duration(&self) -> Option<Duration> {
        let started = self.view.as_ref()?["started_unix_ms"].as_u64()? as u128;
        let ended = self.ended_seen_unix_ms?;
        Some(Duration::from_millis(ended.saturating_sub(started) as u64))
    }
}

impl DrainWatcher {
    pub fn start(admin: HttpProbe, uid: String) -> DrainWatcher {
        let seen = Arc::new(Mutex::new(DrainSeen::default()));
        let s = seen.clone();
        let uid = Arc::new(uid);
        let poll = poll_every(&admin, Duration::from_millis(5), move |admin| {
            let (s, uid) = (s.clone(), uid.clone());
            async move {
                if let Ok((200, body)) = admin.try_request("GET", "/drains").await {
                    observe_drain(&s, &body, &uid);
                }
                std::ops::ControlFlow::Continue(())
            }
        });
        DrainWatcher { seen, _poll: poll }
    }

    pub fn seen(&self) -> DrainSeen {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Records the drain record of `uid` in a `GET /drains` answer, if any.
fn observe_drain(seen: &Mutex<DrainSeen>, body: &str, uid: &str) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
        return;
    };
    let Some(d) = v["drains"]
        .as_array()
        .and_then(|l| l.iter().find(|d| d["uid"] == uid))
    else {
        return;
    };
    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    if !d["ended"].is_null() && seen.ended_seen_unix_ms.is_none() {
        seen.ended_seen_unix_ms = Some(unix_ms());
    }
    seen.view = Some(d.clone());
}

pub fn unix_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// Polls a gateway's `/metrics` every millisecond until the sum of
/// `series` rises above its value at the start; the first poll that saw it.
/// (A counter keeps what a dump can miss: a tunnel GOAWAYed and closed
/// between two polls.)
pub struct CounterWatcher {
    pub rose_at: Arc<Mutex<Option<Instant>>>,
    _poll: Poller,
}

impl CounterWatcher {
    pub fn start(metrics: HttpProbe, series: &'static str, from: f64) -> CounterWatcher {
        let rose_at = Arc::new(Mutex::new(None));
        let r = rose_at.clone();
        let poll = poll_every(&metrics, Duration::from_millis(1), move |metrics| {
            let r = r.clone();
            async move {
                let Ok((200, text)) = metrics.try_request("GET", "/metrics").await else {
                    return std::ops::ControlFlow::Continue(());
                };
                if metric_sum(&text, series) > from {
                    *r.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                    return std::ops::ControlFlow::Break(());
                }
                std::ops::ControlFlow::Continue(())
            }
        });
        CounterWatcher {
            rose_at,
            _poll: poll,
        }
    }

    pub fn rose_at(&self) -> Option<Instant> {
        *self.rose_at.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dump(tunnels: &[(u64, &str, bool)]) -> serde_json::Value {
        let pool: Vec<_> = tunnels
            .iter()
            .map(|(id, dst, goaway)| json!({"id": id, "dst_addr": dst, "goaway_received": goaway}))
            .collect();
        json!({ "pool": pool })
    }

    #[test]
    fn old_pod_tunnels_are_followed_until_gone_and_reuse_is_not_theirs() {
        let old: IpAddr = "10.1.2.2".parse().unwrap();
        let mut t = PoolTrace::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        t.observe(
            at(0),
            &dump(&[(1, "10.1.2.2:15008", false), (2, "10.1.3.2:15008", false)]),
            old,
        );
        assert!(t.old_present());
        t.observe(
            at(1),
            &dump(&[(1, "10.1.2.2:15008", true), (2, "10.1.3.2:15008", false)]),
            old,
        );
        assert_eq!(t.first_goaway, Some(at(1)));
        t.observe(at(2), &dump(&[(2, "10.1.3.2:15008", false)]), old);
        assert!(!t.old_present());
        assert_eq!(t.old_gone_at, Some(at(2)));
        // After the IP went to a new pod, a tunnel to it is not the old pod's.
        t.reuse_at = Some(at(3));
        t.observe(at(4), &dump(&[(3, "10.1.2.2:15008", false)]), old);
        assert!(!t.old_present());
        assert_eq!(t.clone_summary().old_seen, 1);
        assert_eq!(t.max_gap, Duration::from_millis(2));
    }
}
