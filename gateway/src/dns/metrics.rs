//! The DNS proxy's metrics (prefix `tidegate_dns_`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::wire::Transport;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct QueryLabels {
    /// Who answered: `store` (the workload store), `forwarded` (the
    /// upstream server, now or earlier through the pod's cache, or the
    /// proxy when forwarding failed or was refused)
    /// or `invalid` (a query the proxy could not take: FORMERR, NOTIMP).
    pub source: &'static str,
    /// The response code the pod got, lowercase (`noerror`, `nxdomain`, …).
    pub rcode: &'static str,
    /// `udp` or `tcp`.
    pub protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct LimitLabel {
    /// `pod` (`dns.max_in_flight_per_pod`), `gateway` (`dns.max_in_flight`),
    /// `pod_tcp` (a TCP connection past `dns.max_tcp_connections_per_pod`)
    /// or `gateway_tcp` (past `dns.max_tcp_connections`, all pods).
    pub limit: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct DnsMetrics {
    pub(super) queries: Family<QueryLabels, Counter>,
    pub(super) forward_failures: Family<ReasonLabel, Counter>,
    pub(super) refused: Family<LimitLabel, Counter>,
    pub(super) dropped: Family<ReasonLabel, Counter>,
    pub(super) truncated: Counter,
    pub(super) in_flight: Gauge,
    pub(super) tcp_open: Gauge,
    pub(super) cache_hits: Counter,
    pub(super) cache_misses: Counter,
    pub(super) cache_evictions: Family<ReasonLabel, Counter>,
    pub(super) cache_not_stored: Family<ReasonLabel, Counter>,
    pub(super) cache_entries: Gauge,
    pub(super) tcp_closed: Family<ReasonLabel, Counter>,
}

impl DnsMetrics {
    /// Registers under `dns` in `registry` (the gateway's `tidegate` one).
    pub fn register(registry: &mut Registry) -> Self {
        let m = DnsMetrics::default();
        let r = registry.sub_registry_with_prefix("dns");
        r.register(
            "queries",
            "DNS queries answered to pods, by who answered (store, forwarded, invalid), response code and protocol",
            m.queries.clone(),
        );
        r.register(
            "forward_failures",
            "Forwarded queries no upstream server answered, by reason (timeout, network, no_upstream; loop: a query this proxy forwarded came back to it); each answered SERVFAIL",
            m.forward_failures.clone(),
        );
        r.register(
            "refused",
            "Queries answered REFUSED, and TCP connections closed at accept, for capacity, by limit (pod, gateway, pod_tcp, gateway_tcp)",
            m.refused.clone(),
        );
        r.register(
            "dropped",
            "Datagrams and TCP messages dropped unanswered, by reason (short: no DNS header; not_a_query: a response)",
            m.dropped.clone(),
        );
        r.register(
            "truncated",
            "UDP answers too large for the pod's buffer, sent truncated (the pod retries over TCP)",
            m.truncated.clone(),
        );
        r.register(
            "forwards_in_flight",
            "Forwarded queries waiting for an upstream server",
            m.in_flight.clone(),
        );
        r.register(
            "tcp_connections",
            "TCP connections open to 15053, all pods (at most dns.max_tcp_connections, inside the pods' descriptor share)",
            m.tcp_open.clone(),
        );
        r.register(
            "cache_hits",
            "Forwarded queries answered from the pod's cache of upstream answers",
            m.cache_hits.clone(),
        );
        r.register(
            "cache_misses",
            "Forwarded queries the pod's cache had no answer for (asked upstream)",
            m.cache_misses.clone(),
        );
        r.register(
            "cache_evictions",
            "Answers dropped from a pod's cache, by reason (capacity: past dns.cache.max_entries, the least recently used; expired: past its TTL)",
            m.cache_evictions.clone(),
        );
        r.register(
            "cache_not_stored",
            "Upstream answers not kept, by reason (rcode: not NOERROR or NXDOMAIN; truncated; too_large; no_soa: a negative answer without an SOA; zero_ttl; malformed; query: a query the cache does not key)",
            m.cache_not_stored.clone(),
        );
        r.register(
            "cache_entries",
            "Answers held in the pods' caches, all pods together",
            m.cache_entries.clone(),
        );
        r.register(
            "tcp_closed",
            "TCP connections to 15053 closed by the proxy, by reason (idle: no query within dns.timeout; stalled: a message begun and not finished within dns.timeout; incomplete: the client closed mid-message; oversized: a length prefix past 4096 bytes; slow_reader: an answer not taken within dns.timeout)",
            m.tcp_closed.clone(),
        );
        m
    }

    pub(super) fn cache_evicted(&self, reason: &'static str) {
        self.cache_evictions
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub(super) fn cache_not_stored(&self, reason: &'static str) {
        self.cache_not_stored
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub(super) fn tcp_closed(&self, reason: &'static str) {
        self.tcp_closed.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub(super) fn answered(&self, source: &'static str, rcode: &'static str, t: Transport) {
        self.queries
            .get_or_create(&QueryLabels {
                source,
                rcode,
                protocol: t.label(),
            })
            .inc();
    }

    pub(super) fn refused(&self, limit: &'static str) {
        self.refused.get_or_create(&LimitLabel { limit }).inc();
    }

    pub(super) fn dropped(&self, reason: &'static str) {
        self.dropped.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub(super) fn forward_failed(&self, reason: &'static str) {
        self.forward_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}
