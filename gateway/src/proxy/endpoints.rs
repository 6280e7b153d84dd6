//! Choosing a Service endpoint for a new connection — never one the gateway
//! knows is draining, when another will do.
//!
//! An endpoint is skipped, with a reason counted in
//! `tidegate_service_endpoint_skips_total{reason}`, when:
//! - `not_ready`: its conditions say so (a terminating pod, as discovery
//!   reports it: the peer-terminating signal);
//! - `goaway_received`: a tunnel to it received GOAWAY within
//!   `outbound.goaway_skip` (usually the earliest signal; a new tunnel to
//!   it ends the skip);
//! - `connect_backoff`: a policy's connect-failing backoff is running for it;
//! - `failing`: a connect to it failed — its tunnel's dial, or a CONNECT
//!   its gateway refused (5xx: the application is gone, a reset, no
//!   answer) — within `outbound.failing_skip`, doubled for each failure in
//!   a row (at most 16 times). A connect that succeeds ends it; so does
//!   the window, after which the next connection probes it. The failure
//!   is also the policy's `connect-failing` event, whose backoff can keep
//!   it out longer.
//!
//! Among the rest, two at random and the one with fewer open streams from
//! this gateway — plus its recent failures in a row — for its capacity
//! (`p2c`), or one at random (`random`).
//! "At random" is in proportion to each endpoint's capacity (istiod's
//! `capacity`, 1 elsewhere), as ztunnel's weighted choice is. When none is
//! left:
//! Kubernetes' terminating-endpoint fallback — serving endpoints that are
//! terminating, neither backing off nor failing — so a Service whose every
//! pod is terminating still answers; then any endpoint at all (counted
//! `last_resort`): skipping never empties a Service. Streams already open
//! are never moved. A last-resort endpoint under a policy's backoff is
//! probed, one connection at a time (`pool/probe.rs`): the Service has no
//! alternative, as a pod address has none.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::config::EndpointChoice;
use crate::proxy::pool::Pool;
use crate::workloads::endpoint_list::EndpointList;
use crate::workloads::services::{Endpoint, Service};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Label {
    reason: &'static str,
}

#[derive(Clone, Debug)]
pub struct EndpointMetrics {
    choices: Family<Label, Counter>,
    skips: Family<Label, Counter>,
}

impl EndpointMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = EndpointMetrics {
            choices: Family::default(),
            skips: Family::default(),
        };
        registry.register(
            "service_endpoint_choices",
            "Service endpoints chosen for new connections, by tier (ready, terminating_fallback, last_resort) or none (no_healthy_endpoint)",
            m.choices.clone(),
        );
        registry.register(
            "service_endpoint_skips",
            "Endpoints passed over for a new connection, by reason",
            m.skips.clone(),
        );
        m
    }
}

/// Random endpoints checked before falling back to a full pass.
const SAMPLES: usize = 8;

/// The shortest time a failure weighs in `p2c`'s load (doubled per failure
/// in a row): with `outbound.failing_skip: 0` a failing endpoint is still
/// chosen, but not as the least loaded.
const RECENT_FAILURE: Duration = Duration::from_secs(1);

/// How long skips last.
#[derive(Clone, Copy, Debug)]
pub struct Skips {
    /// `outbound.goaway_skip`.
    pub goaway: Duration,
    /// `outbound.failing_skip`.
    pub failing: Duration,
}

/// Where an endpoint's connects at `ip` can fail: its gateway
/// (`ip:15008`, the dial) and its application (`ip:targetPort`, the CONNECT).
fn addrs(e: &Endpoint, ip: std::net::IpAddr, hbone_port: u16) -> [SocketAddr; 2] {
    [
        SocketAddr::new(ip, hbone_port),
        SocketAddr::new(ip, e.target_port),
    ]
}

/// Why an endpoint is not chosen now: at its address of either family (a
/// dual-stack endpoint is dialed at the one of the VIP's family).
fn skip_reason(e: &Endpoint, pool: &Pool, hbone_port: u16, skips: Skips) -> Option<&'static str> {
    if !e.conditions.ready {
        return Some("not_ready");
    }
    let at = |ip| {
        let addrs = addrs(e, ip, hbone_port);
        pool.passed_over(e.workload.uid(), addrs, skips.goaway, skips.failing)
    };
    at(e.ip).or_else(|| e.alt_ip.and_then(at))
}

/// The endpoint choice, shared by every outbound listener.
pub struct EndpointPicker {
    pool: Arc<Pool>,
    hbone_port: u16,
    choice: EndpointChoice,
    skips: Skips,
    metrics: EndpointMetrics,
}

impl EndpointPicker {
    pub fn new(
        pool: Arc<Pool>,
        hbone_port: u16,
        choice: EndpointChoice,
        skips: Skips,
        metrics: EndpointMetrics,
    ) -> Self {
        EndpointPicker {
            pool,
            hbone_port,
            choice,
            skips,
            metrics,
        }
    }

    /// An endpoint of `svc`'s `port` for a new connection, or `None`: no
    /// endpoint at all.
    ///
    /// Endpoints are sampled at random and checked one by one (a few tries
    /// find usable ones in a Service of thousands at constant cost); only
    /// when sampling finds too few does a full pass build the tiers.
    pub fn pick<'s>(&self, svc: &'s Service, port: u16) -> Option<&'s Endpoint> {
        self.pick_avoiding(svc, port, None).map(|p| p.endpoint)
    }

    /// [`EndpointPicker::pick`], passing over the workload `avoid` as
    /// `failing` whatever `outbound.failing_skip` says: the endpoint whose
    /// connect just failed for this connection (`outbound.connect_attempts`).
    /// It is chosen only when nothing else is left (the last resort).
    pub fn pick_avoiding<'s>(
        &self,
        svc: &'s Service,
        port: u16,
        avoid: Option<&str>,
    ) -> Option<Picked<'s>> {
        let all = svc.endpoints.get(&port).unwrap_or(EndpointList::EMPTY);
        let skip_reason = |e: &Endpoint| {
            if avoid == Some(e.workload.uid()) {
                return Some("failing");
            }
            skip_reason(e, &self.pool, self.hbone_port, self.skips)
        };
        let want = if self.choice == EndpointChoice::P2c && all.len() > 1 {
            2
        } else {
            1
        };
        let mut found: [Option<&Endpoint>; 2] = [None, None];
        let mut n = 0;
        for _ in 0..SAMPLES.min(all.len() * 2) {
            let e = &all[all.sample()];
            if found[..n]
                .iter()
                .any(|f| f.is_some_and(|f| std::ptr::eq(f, e)))
            {
                continue;
            }
            match skip_reason(e) {
                None => {
                    found[n] = Some(e);
                    n += 1;
                    if n == want {
                        break;
                    }
                }
                Some(reason) => {
                    self.metrics.skips.get_or_create(&Label { reason }).inc();
                }
            }
        }
        if n == want || (n == 1 && all.len() <= SAMPLES) {
            self.metrics
                .choices
                .get_or_create(&Label { reason: "ready" })
                .inc();
            let endpoint = match found {
                [Some(a), Some(b)] => self.lighter(a, b),
                [Some(a), None] => a,
                _ => return None,
            };
            return Some(Picked {
                endpoint,
                last_resort: false,
            });
        }
        self.pick_by_pass(all, avoid)
    }

    /// The full pass: every endpoint checked, the first non-empty tier used.
    fn pick_by_pass<'s>(&self, all: &'s EndpointList, avoid: Option<&str>) -> Option<Picked<'s>> {
        let avoided = |e: &&Endpoint| avoid == Some(e.workload.uid());
        let mut usable: Vec<&Endpoint> = Vec::with_capacity(all.len());
        for e in all {
            if avoided(&e) {
                self.metrics
                    .skips
                    .get_or_create(&Label { reason: "failing" })
                    .inc();
                continue;
            }
            match skip_reason(e, &self.pool, self.hbone_port, self.skips) {
                None => usable.push(e),
                Some(reason) => {
                    self.metrics.skips.get_or_create(&Label { reason }).inc();
                }
            }
        }
        let tier = if !usable.is_empty() {
            "ready"
        } else {
            usable = all
                .iter()
                .filter(|e| e.conditions.serving && e.conditions.terminating && !avoided(e))
                .filter(|e| {
                    // A GOAWAY is what terminating endpoints send: not a skip here.
                    let (uid, failing) = (e.workload.uid(), self.skips.failing);
                    let fine = |ip| {
                        let addrs = addrs(e, ip, self.hbone_port);
                        self.pool
                            .passed_over(uid, addrs, Duration::ZERO, failing)
                            .is_none()
                    };
                    fine(e.ip) && e.alt_ip.is_none_or(fine)
                })
                .collect();
            if !usable.is_empty() {
                "terminating_fallback"
            } else {
                usable = all.iter().filter(|e| !avoided(e)).collect();
                if usable.is_empty() {
                    usable = all.iter().collect();
                }
                "last_resort"
            }
        };
        if usable.is_empty() {
            self.metrics
                .choices
                .get_or_create(&Label {
                    reason: "no_healthy_endpoint",
                })
                .inc();
            return None;
        }
        self.metrics
            .choices
            .get_or_create(&Label { reason: tier })
            .inc();
        Some(Picked {
            endpoint: self.choose(&usable),
            last_resort: tier == "last_resort",
        })
    }

    fn choose<'s>(&self, from: &[&'s Endpoint]) -> &'s Endpoint {
        let i = weighted(from, None);
        if self.choice == EndpointChoice::Random || from.len() == 1 {
            return from[i];
        }
        // A second one, different from the first.
        let j = weighted(from, Some(i));
        self.lighter(from[i], from[j])
    }

    /// Of two endpoints, the one with fewer open streams from here (and
    /// recent failures in a row) for its capacity.
    fn lighter<'s>(&self, a: &'s Endpoint, b: &'s Endpoint) -> &'s Endpoint {
        let recent = self.skips.failing.max(RECENT_FAILURE);
        let load = |e: &Endpoint| {
            let addrs = addrs(e, e.ip, self.hbone_port);
            self.pool.load_of(e.workload.uid(), addrs, recent)
        };
        // load(b) / cap(b) < load(a) / cap(a), without dividing.
        if load(b) * u64::from(a.capacity) < load(a) * u64::from(b.capacity) {
            b
        } else {
            a
        }
    }

    /// Each endpoint of each port of `svc` and why it would be skipped now
    /// (`/config_dump`).
    pub fn explain(&self, svc: &Service) -> Vec<EndpointDump> {
        svc.endpoints
            .iter()
            .flat_map(|(port, list)| {
                list.iter().map(move |e| EndpointDump {
                    port: *port,
                    workload_uid: e.workload.uid().to_owned(),
                    addr: SocketAddr::new(e.ip, e.target_port),
                    other_family_addr: e.alt_ip.map(|ip| SocketAddr::new(ip, e.target_port)),
                    conditions: e.conditions,
                    skipped: skip_reason(e, &self.pool, self.hbone_port, self.skips),
                })
            })
            .collect()
    }
}

/// The endpoint chosen for a new connection.
#[derive(Clone, Copy, Debug)]
pub struct Picked<'s> {
    pub endpoint: &'s Endpoint,
    /// Chosen although passed over (every endpoint was): the connection has
    /// no alternative, so under a backoff it goes through the backoff's
    /// probe rather than failing at once.
    pub last_resort: bool,
}

/// The index of one of `from` (not `except`), in proportion to capacity.
fn weighted(from: &[&Endpoint], except: Option<usize>) -> usize {
    let weight = |i: usize, e: &Endpoint| {
        if Some(i) == except {
            0
        } else {
            u64::from(e.capacity.max(1))
        }
    };
    let total: u64 = from.iter().enumerate().map(|(i, e)| weight(i, e)).sum();
    if total == 0 {
        return 0;
    }
    let mut r = fastrand::u64(..total);
    for (i, e) in from.iter().enumerate() {
        let w = weight(i, e);
        if r < w {
            return i;
        }
        r -= w;
    }
    from.len() - 1
}

/// One endpoint as `/config_dump` shows it.
#[derive(Debug, Serialize)]
pub struct EndpointDump {
    pub port: u16,
    pub workload_uid: String,
    /// `podIP:targetPort` (`[v6]:targetPort`): at the address of the
    /// family of the Service's first VIP, else its other one.
    pub addr: SocketAddr,
    /// A dual-stack endpoint's address of the other family: where a
    /// connection to a VIP of that family goes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_family_addr: Option<SocketAddr>,
    pub conditions: crate::workloads::services::Conditions,
    /// Why a new connection would not be sent there now (`null`: it would).
    pub skipped: Option<&'static str>,
}

#[cfg(test)]
#[path = "endpoints_tests.rs"]
mod tests;
