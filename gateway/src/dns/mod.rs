//! The DNS proxy on 15053 inside each captured pod (in-pod mode, `dns:`).
//!
//! Since Istio 1.25 istio-cni redirects every enrolled pod's DNS (port 53,
//! UDP and TCP, except packets carrying the mesh mark) to 15053 in the
//! pod's own network namespace; a node proxy with nothing there leaves the
//! pod without DNS. Each pod served ([`crate::inpod::pods`]) gets a UDP and
//! a TCP listener on 15053 beside its others, made and marked the same way
//! ([`crate::inpod::netns`]), closed with them.
//!
//! - [`answer`]: A and AAAA of Service names from the workload store, seen
//!   from the pod's namespace (its search domains), as ztunnel answers them.
//! - [`handler`]: one query as bytes → an answer, a forward, FORMERR, or a
//!   counted drop. No I/O (the `dns` fuzz target).
//! - [`forward`]: everything else to the upstream servers, from the pod's
//!   namespace, with a timeout (SERVFAIL past it); a query of its own that
//!   comes back (a forwarding loop) is SERVFAIL at once.
//! - [`cache`]: each pod's forwarded answers, kept for their TTL.
//! - [`tcp`]: DNS over TCP's framing, with the time each step may take.
//! - [`listener`]: the per-pod UDP and TCP loops, and the caps on
//!   forwarded queries in flight and on TCP connections (per pod, and for
//!   the gateway, both inside the pods' descriptor share; REFUSED or
//!   closed at accept past either, counted).
//! - [`metrics`], the `tidegate_dns_*` families.
//! - [`wire`]: the header's length, the EDNS payload announced, the two
//!   transports: what the others share, below all of them.

pub mod answer;
pub mod cache;
pub mod forward;
pub mod handler;
pub mod listener;
pub mod metrics;
mod tcp;
#[cfg(test)]
#[path = "tests/proxy_tests.rs"]
mod tests;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use prometheus_client::registry::Registry;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub use answer::{service_hostname, Names};
pub use cache::Cache;
pub use forward::{Forwarder, Place};
pub use handler::{Action, Forward};
pub use listener::PodDns;
pub use metrics::DnsMetrics;
pub use wire::Transport;

use crate::config::{DnsCacheConfig, DnsConfig};
use crate::workloads::WorkloadStore;

/// What every pod's DNS proxy shares: the names, the upstream servers, the
/// gateway-wide cap, the metrics.
pub struct DnsProxy {
    names: Names,
    forwarder: Forwarder,
    metrics: DnsMetrics,
    /// `dns.max_in_flight`.
    in_flight: Arc<Semaphore>,
    /// `dns.max_in_flight_per_pod`.
    per_pod: usize,
    /// `dns.max_tcp_connections`: every pod's TCP connections to 15053.
    tcp: Arc<Semaphore>,
    /// `dns.max_tcp_connections_per_pod`.
    tcp_per_pod: usize,
    /// Connections closed at accept are logged at most ten times a second.
    tcp_refusals_log: crate::proxy::log_limit::LogLimit,
    /// How long a TCP connection may stay quiet (`dns.timeout`).
    idle: Duration,
    /// Each pod's cache (`dns.cache`).
    cache: DnsCacheConfig,
}

impl DnsProxy {
    /// From the `dns:` section; the upstream servers are `dns.upstream`,
    /// else the `nameserver` lines of `dns.resolv_conf` read now.
    pub fn new(
        config: &DnsConfig,
        workloads: Arc<WorkloadStore>,
        registry: &mut Registry,
    ) -> Arc<DnsProxy> {
        let upstreams: Vec<SocketAddr> = if config.upstream.is_empty() {
            match std::fs::read_to_string(&config.resolv_conf) {
                Ok(text) => forward::nameservers(&text),
                Err(e) => {
                    warn!(file = %config.resolv_conf.display(), error = %e,
                        "cannot read the upstream DNS servers; names the store does not have get SERVFAIL (set dns.upstream)");
                    Vec::new()
                }
            }
        } else {
            config.upstream.iter().map(|u| u.0).collect()
        };
        if upstreams.is_empty() {
            warn!(file = %config.resolv_conf.display(),
                "no upstream DNS server (dns.upstream is empty and the file names none): names the store does not have get SERVFAIL");
        }
        info!(upstreams = ?upstreams, cluster_domain = %config.cluster_domain,
            timeout = ?config.timeout, max_in_flight = config.max_in_flight,
            max_tcp_connections = config.max_tcp_connections, "DNS proxy on 15053 in every captured pod");
        Self::with(config, upstreams, workloads, DnsMetrics::register(registry))
    }

    /// With these upstream servers and metrics (tests, the fuzz target).
    pub fn with(
        config: &DnsConfig,
        upstreams: Vec<SocketAddr>,
        workloads: Arc<WorkloadStore>,
        metrics: DnsMetrics,
    ) -> Arc<DnsProxy> {
        Arc::new(DnsProxy {
            names: Names::new(workloads, &config.cluster_domain),
            forwarder: Forwarder::new(upstreams, config.timeout),
            metrics,
            in_flight: Arc::new(Semaphore::new(config.max_in_flight as usize)),
            per_pod: config.max_in_flight_per_pod as usize,
            tcp: Arc::new(Semaphore::new(config.max_tcp_connections as usize)),
            tcp_per_pod: config.max_tcp_connections_per_pod as usize,
            tcp_refusals_log: crate::proxy::log_limit::LogLimit::per_second(),
            idle: config.timeout,
            cache: config.cache.clone(),
        })
    }

    /// A new pod's cache.
    pub fn cache(&self) -> Cache {
        Cache::new(&self.cache, &self.metrics)
    }

    /// The answer to `f`, a query to forward from pod `pod`, when it needs
    /// no upstream server: SERVFAIL when it is this proxy's own query come
    /// back a second time (a loop, [`forward`]), else the pod's kept answer
    /// (cut for a UDP client's buffer). Counted. A first return is marked
    /// in `f` and forwarded.
    pub fn answer_here(
        &self,
        pod: &str,
        cache: &Cache,
        f: &mut Forward,
        t: Transport,
    ) -> Option<Vec<u8>> {
        let m = &self.metrics;
        if let Some((upstream, returns)) = self.forwarder.came_back(&f.bytes, f.question_end) {
            if returns > 0 {
                m.forward_failed("loop");
                self.forwarder.warn_loop(upstream, pod);
                return Some(handler::error_to(&f.query, ResponseCode::ServFail));
            }
            f.returns = returns + 1;
        }
        let kept = cache.answer(f.key.as_ref(), &f.bytes, f.question_end, Instant::now())?;
        let (bytes, truncated) = handler::relay(kept, &f.query, t);
        if truncated {
            m.truncated.inc();
        }
        let rcode = handler::rcode_label(handler::rcode_of(&bytes));
        m.answered("forwarded", rcode, t);
        debug!(
            pod,
            rcode, truncated, "DNS query answered from the pod's cache"
        );
        Some(bytes)
    }

    /// What to do with `bytes`, a query from a pod of `namespace` (no I/O).
    pub fn handle(&self, namespace: &str, bytes: &[u8], transport: Transport) -> Action {
        handler::handle(&self.names, namespace, bytes, transport)
    }

    /// The proxy of one pod; its sockets to the upstream servers are made
    /// in `place`.
    pub fn pod(self: &Arc<Self>, uid: &str, namespace: &str, place: Place) -> Arc<PodDns> {
        PodDns::new(self.clone(), uid, namespace, place)
    }
}
