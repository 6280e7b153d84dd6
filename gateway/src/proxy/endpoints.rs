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
//! - `connect_backoff`: a policy's connect-failing backoff is running for it.
//!
//! Among the rest, two at random and the one with fewer open streams from
//! this gateway (`p2c`), or one at random (`random`). When none is left:
//! Kubernetes' terminating-endpoint fallback — serving endpoints that are
//! terminating, not backing off — so a Service whose every pod is
//! terminating still answers; then any endpoint at all. Streams already
//! open are never moved.

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

/// Why an endpoint is not chosen now.
fn skip_reason(
    e: &Endpoint,
    pool: &Pool,
    hbone_port: u16,
    goaway_skip: Duration,
) -> Option<&'static str> {
    if !e.conditions.ready {
        return Some("not_ready");
    }
    if !goaway_skip.is_zero() && pool.goaway_within(e.workload.uid(), goaway_skip).is_some() {
        return Some("goaway_received");
    }
    if pool.is_backing_off(SocketAddr::new(e.ip, hbone_port)) {
        return Some("connect_backoff");
    }
    None
}

/// The endpoint choice, shared by every outbound listener.
pub struct EndpointPicker {
    pool: Arc<Pool>,
    hbone_port: u16,
    choice: EndpointChoice,
    goaway_skip: Duration,
    metrics: EndpointMetrics,
}

impl EndpointPicker {
    pub fn new(
        pool: Arc<Pool>,
        hbone_port: u16,
        choice: EndpointChoice,
        goaway_skip: Duration,
        metrics: EndpointMetrics,
    ) -> Self {
        EndpointPicker {
            pool,
            hbone_port,
            choice,
            goaway_skip,
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
        let all = svc.endpoints.get(&port).map(Vec::as_slice).unwrap_or(&[]);
        let want = if self.choice == EndpointChoice::P2c && all.len() > 1 {
            2
        } else {
            1
        };
        let mut found: [Option<&Endpoint>; 2] = [None, None];
        let mut n = 0;
        for _ in 0..SAMPLES.min(all.len() * 2) {
            let e = &all[fastrand::usize(..all.len())];
            if found[..n]
                .iter()
                .any(|f| f.is_some_and(|f| std::ptr::eq(f, e)))
            {
                continue;
            }
            match skip_reason(e, &self.pool, self.hbone_port, self.goaway_skip) {
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
            return match found {
                [Some(a), Some(b)] => Some(self.lighter(a, b)),
                [Some(a), None] => Some(a),
                _ => None,
            };
        }
        self.pick_by_pass(all)
    }

    /// The full pass: every endpoint checked, the first non-empty tier used.
    fn pick_by_pass<'s>(&self, all: &'s [Endpoint]) -> Option<&'s Endpoint> {
        let mut usable: Vec<&Endpoint> = Vec::with_capacity(all.len());
        for e in all {
            match skip_reason(e, &self.pool, self.hbone_port, self.goaway_skip) {
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
                .filter(|e| e.conditions.serving && e.conditions.terminating)
                .filter(|e| {
                    !self
                        .pool
                        .is_backing_off(SocketAddr::new(e.ip, self.hbone_port))
                })
                .collect();
            if !usable.is_empty() {
                "terminating_fallback"
            } else {
                usable = all.iter().collect();
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
        Some(self.choose(&usable))
    }

    fn choose<'s>(&self, from: &[&'s Endpoint]) -> &'s Endpoint {
        let i = fastrand::usize(..from.len());
        if self.choice == EndpointChoice::Random || from.len() == 1 {
            return from[i];
        }
        // A second one, different from the first.
        let j = (i + 1 + fastrand::usize(..from.len() - 1)) % from.len();
        self.lighter(from[i], from[j])
    }

    /// Of two endpoints, the one with fewer open streams from here.
    fn lighter<'s>(&self, a: &'s Endpoint, b: &'s Endpoint) -> &'s Endpoint {
        let load = |e: &Endpoint| self.pool.open_streams_to(e.workload.uid());
        if load(b) < load(a) {
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
                    conditions: e.conditions,
                    skipped: skip_reason(e, &self.pool, self.hbone_port, self.goaway_skip),
                })
            })
            .collect()
    }
}

/// One endpoint as `/config_dump` shows it.
#[derive(Debug, Serialize)]
pub struct EndpointDump {
    pub port: u16,
    pub workload_uid: String,
    /// `podIP:targetPort`.
    pub addr: SocketAddr,
    pub conditions: crate::workloads::services::Conditions,
    /// Why a new connection would not be sent there now (`null`: it would).
    pub skipped: Option<&'static str>,
}
