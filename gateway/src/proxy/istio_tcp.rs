//! Istio's TCP metrics, as ztunnel reports them (`src/proxy/metrics.rs` in
//! its source), beside tidegate's own: the dashboards built for ztunnel
//! read these.
//!
//! - `istio_tcp_connections_opened_total`, `istio_tcp_connections_closed_total`,
//!   `istio_tcp_connections_failed_total` (closed with a failure flag),
//!   `istio_tcp_sent_bytes_total` (upstream → downstream: what the
//!   connection's initiator received) and `istio_tcp_received_bytes_total`
//!   (downstream → upstream), counted while copying.
//! - Labels: `reporter` (`source` outbound, `destination` inbound), the
//!   source and destination workload (its name, canonical service and
//!   revision, namespace, principal, app, version, cluster), the
//!   destination Service, `request_protocol="tcp"`, `response_flags` (`-`,
//!   `DENY` for an authorization refusal, `CONNECT` for a failed dial,
//!   `TLS_FAILURE` and `H2_HANDSHAKE_FAILURE` for a tunnel whose TLS or
//!   HTTP/2 handshake failed) and
//!   `connection_security_policy` (`mutual_tls` over HBONE, else
//!   `unknown`), and the four locality labels. A value not known is
//!   `unknown`; principals are whole SPIFFE ids.
//!
//! A destination side that does not know the source by its address reads
//! the `baggage` the source's CONNECT carries (as ztunnel writes it; see
//! [`tidegate_protocol::hbone::baggage`]), and every outbound CONNECT carries its own.
//!
//! The canonical service is the workload's `service.istio.io/canonical-name`
//! label, else `app.kubernetes.io/name`, else `app`, else its workload
//! name; the revision `service.istio.io/canonical-revision`, else
//! `app.kubernetes.io/version`, else `version`, else `latest` (istiod's
//! rule). The workload name is its Deployment's or Job's, else the pod's.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use http::HeaderValue;

use crate::proxy::copy::ByteCounters;
use crate::workloads::Workload;
use tidegate_base::sync::Locked;
use tidegate_protocol::hbone::baggage::Baggage;
use tidegate_protocol::identity::SpiffeId;

const UNKNOWN: &str = "unknown";

/// Who reports: the connection's source side or its destination side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reporter {
    Source,
    Destination,
}

/// How a connection ended, as Envoy's response flags name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flags {
    None,
    /// Refused by an authorization policy (at its start or later).
    Deny,
    /// The upstream could not be reached.
    Connect,
    /// The tunnel's TLS handshake failed.
    TlsFailure,
    /// The tunnel's HTTP/2 handshake failed (no `h2`, or its preface).
    H2HandshakeFailure,
}

impl Flags {
    fn label(self) -> &'static str {
        match self {
            Flags::None => "-",
            Flags::Deny => "DENY",
            Flags::Connect => "CONNECT",
            Flags::TlsFailure => "TLS_FAILURE",
            Flags::H2HandshakeFailure => "H2_HANDSHAKE_FAILURE",
        }
    }

    /// How ztunnel flags a connection whose tunnel could not be had.
    pub fn of_pool_error(e: &crate::proxy::pool::PoolError) -> Flags {
        use tidegate_protocol::hbone::client::DialError;
        match e {
            crate::proxy::pool::PoolError::Dial { source, .. } => match source {
                DialError::Tls(_) => Flags::TlsFailure,
                DialError::NoH2 | DialError::H2(_) => Flags::H2HandshakeFailure,
                _ => Flags::Connect,
            },
            _ => Flags::Connect,
        }
    }
}

/// One connection's labels, in ztunnel's order.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficLabels {
    reporter: &'static str,
    source_workload: String,
    source_canonical_service: String,
    source_canonical_revision: String,
    source_workload_namespace: String,
    source_principal: String,
    source_app: String,
    source_version: String,
    source_cluster: String,
    destination_service: String,
    destination_service_namespace: String,
    destination_service_name: String,
    destination_workload: String,
    destination_canonical_service: String,
    destination_canonical_revision: String,
    destination_workload_namespace: String,
    destination_principal: String,
    destination_app: String,
    destination_version: String,
    destination_cluster: String,
    request_protocol: &'static str,
    response_flags: &'static str,
    connection_security_policy: &'static str,
    source_region: &'static str,
    source_zone: &'static str,
    destination_region: &'static str,
    destination_zone: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct IstioTcpMetrics {
    opened: Family<TrafficLabels, Counter>,
    closed: Family<TrafficLabels, Counter>,
    failed: Family<TrafficLabels, Counter>,
    sent: Family<TrafficLabels, Counter>,
    received: Family<TrafficLabels, Counter>,
    cluster: Arc<str>,
    /// The label sets of open connections, one copy each: every
    /// connection between the same two workloads shares it, so an idle
    /// connection holds a pointer, not nineteen strings.
    interned: Arc<Mutex<Interned>>,
}

#[derive(Debug, Default)]
struct Interned {
    sets: HashSet<Arc<TrafficLabels>>,
    /// Sets no open connection holds are dropped when the table reaches
    /// this size (then twice what is left): amortised, and bounded by the
    /// open connections' distinct sets.
    prune_at: usize,
}

impl IstioTcpMetrics {
    /// The shared copy of `labels`.
    fn intern(&self, labels: TrafficLabels) -> Arc<TrafficLabels> {
        let mut i = self.interned.locked();
        if let Some(shared) = i.sets.get(&labels) {
            return shared.clone();
        }
        if i.sets.len() >= i.prune_at {
            i.sets.retain(|set| Arc::strong_count(set) > 1);
            i.prune_at = (2 * i.sets.len()).max(64);
        }
        let shared = Arc::new(labels);
        i.sets.insert(shared.clone());
        shared
    }
}

impl IstioTcpMetrics {
    /// Registers under `istio` (the registry passed must carry no prefix
    /// of its own); `cluster` is this cluster's id, the value of every
    /// `*_cluster` label of a known workload.
    pub fn register(registry: &mut Registry, cluster: &str) -> Self {
        let m = IstioTcpMetrics {
            cluster: cluster.into(),
            ..IstioTcpMetrics::default()
        };
        let r = registry.sub_registry_with_prefix("istio");
        r.register(
            "tcp_connections_opened",
            "The total number of TCP connections opened",
            m.opened.clone(),
        );
        r.register(
            "tcp_connections_closed",
            "The total number of TCP connections closed",
            m.closed.clone(),
        );
        r.register(
            "tcp_received_bytes",
            "The size of total bytes received during request in case of a TCP connection",
            m.received.clone(),
        );
        r.register(
            "tcp_sent_bytes",
            "The size of total bytes sent during response in case of a TCP connection",
            m.sent.clone(),
        );
        r.register(
            "tcp_connections_failed",
            "The total number of TCP connections that failed to establish (unstable)",
            m.failed.clone(),
        );
        m
    }

    /// Counts a connection opened and returns its report.
    pub fn open(&self, c: Connection<'_>) -> Report {
        let labels = self.labels(c);
        self.opened.get_or_create(&labels).inc();
        Report {
            sent: self.sent.get_or_create(&labels).clone(),
            received: self.received.get_or_create(&labels).clone(),
            labels: self.intern(labels),
            metrics: self.clone(),
            closed: false,
        }
    }

    /// The `baggage` an outbound CONNECT from `source` carries, so the
    /// serving side can name it.
    pub fn baggage(&self, source: &Workload) -> Option<HeaderValue> {
        let side = Side::of(source, &self.cluster);
        let kind = if source.spec.workload_name.is_some() {
            "deployment"
        } else {
            "pod"
        };
        let b = Baggage {
            cluster_id: Some(side.cluster),
            namespace: Some(side.namespace),
            workload_name: Some(side.workload),
            service_name: Some(side.canonical),
            revision: Some(side.revision),
            ..Baggage::default()
        };
        HeaderValue::from_str(&b.header_value(kind)).ok()
    }

    fn labels(&self, c: Connection<'_>) -> TrafficLabels {
        let side = |w: Option<&Workload>| match w {
            Some(w) => Side::of(w, &self.cluster),
            None => Side::default(),
        };
        let src = match (c.source, c.source_baggage) {
            (None, Some(b)) => Side::derived(b),
            (w, _) => side(w),
        };
        let dst = side(c.destination);
        let principal =
            |id: Option<&SpiffeId>| id.map_or_else(|| UNKNOWN.to_owned(), |i| i.to_string());
        let (svc_host, svc_ns, svc_name) = match c.service {
            Some(s) => (
                format!("{}.{}.svc.cluster.local", s.name, s.namespace),
                s.namespace.to_owned(),
                s.name.to_owned(),
            ),
            None => (UNKNOWN.into(), UNKNOWN.into(), UNKNOWN.into()),
        };
        TrafficLabels {
            reporter: match c.reporter {
                Reporter::Source => "source",
                Reporter::Destination => "destination",
            },
            source_app: src.app.clone(),
            source_version: src.revision.clone(),
            source_workload: src.workload,
            source_canonical_service: src.canonical,
            source_canonical_revision: src.revision,
            source_workload_namespace: src.namespace,
            source_principal: principal(c.source_identity),
            source_cluster: src.cluster,
            destination_service: svc_host,
            destination_service_namespace: svc_ns,
            destination_service_name: svc_name,
            destination_app: dst.app.clone(),
            destination_version: dst.revision.clone(),
            destination_workload: dst.workload,
            destination_canonical_service: dst.canonical,
            destination_canonical_revision: dst.revision,
            destination_workload_namespace: dst.namespace,
            destination_principal: principal(c.destination.map(|w| &w.identity)),
            destination_cluster: dst.cluster,
            request_protocol: "tcp",
            response_flags: Flags::None.label(),
            connection_security_policy: if c.mutual_tls { "mutual_tls" } else { UNKNOWN },
            source_region: UNKNOWN,
            source_zone: UNKNOWN,
            destination_region: UNKNOWN,
            destination_zone: UNKNOWN,
        }
    }
}

/// The Service a connection was addressed to.
#[derive(Clone, Copy, Debug)]
pub struct ServiceRef<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
}

/// What one connection's labels are made of.
#[derive(Clone, Copy, Debug)]
pub struct Connection<'a> {
    pub reporter: Reporter,
    /// The source workload, when its address is known.
    pub source: Option<&'a Workload>,
    /// The peer's identity (inbound HBONE) or this side's (outbound HBONE).
    pub source_identity: Option<&'a SpiffeId>,
    /// What the peer's CONNECT said of its workload (inbound HBONE): the
    /// source's labels when its address names no workload.
    pub source_baggage: Option<&'a Baggage>,
    pub destination: Option<&'a Workload>,
    pub service: Option<ServiceRef<'a>>,
    pub mutual_tls: bool,
}

/// One side's labels.
struct Side {
    workload: String,
    canonical: String,
    /// `*_app`: the canonical service, or for a source known by its
    /// baggage only, its workload name (as ztunnel reports it).
    app: String,
    revision: String,
    namespace: String,
    cluster: String,
}

impl Default for Side {
    fn default() -> Self {
        Side {
            workload: UNKNOWN.into(),
            canonical: UNKNOWN.into(),
            app: UNKNOWN.into(),
            revision: UNKNOWN.into(),
            namespace: UNKNOWN.into(),
            cluster: UNKNOWN.into(),
        }
    }
}

impl Side {
    fn of(w: &Workload, cluster: &str) -> Side {
        let s = &w.spec;
        let label = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| s.labels.get(*k).filter(|v| !v.is_empty()))
        };
        let workload = s.workload_name.clone().unwrap_or_else(|| s.name.clone());
        let canonical = label(&[
            "service.istio.io/canonical-name",
            "app.kubernetes.io/name",
            "app",
        ])
        .cloned()
        .unwrap_or_else(|| workload.clone());
        Side {
            app: canonical.clone(),
            canonical,
            revision: label(&[
                "service.istio.io/canonical-revision",
                "app.kubernetes.io/version",
                "version",
            ])
            .cloned()
            .unwrap_or_else(|| "latest".into()),
            workload,
            namespace: s.namespace.clone(),
            cluster: cluster.to_owned(),
        }
    }

    /// A source known only by what its CONNECT's baggage says.
    fn derived(b: &Baggage) -> Side {
        let or = |v: &Option<String>| v.clone().unwrap_or_else(|| UNKNOWN.into());
        Side {
            workload: or(&b.workload_name),
            canonical: or(&b.service_name),
            app: or(&b.workload_name),
            revision: or(&b.revision),
            namespace: or(&b.namespace),
            cluster: or(&b.cluster_id),
        }
    }
}

/// An open connection's report: its byte counters (for the copy loop) and
/// its close, counted once.
pub struct Report {
    sent: Counter,
    received: Counter,
    /// Shared ([`IstioTcpMetrics::intern`]); `response_flags` is `-`.
    labels: Arc<TrafficLabels>,
    metrics: IstioTcpMetrics,
    closed: bool,
}

impl Report {
    /// The counters a copy loop adds to, as (downstream → upstream,
    /// upstream → downstream): received, then sent.
    pub fn counters(&self) -> (&Counter, &Counter) {
        (&self.received, &self.sent)
    }

    /// As the data path's [`ByteCounters`], where the TCP side is the
    /// connection's initiator (`tcp_is_downstream`: outbound) or its
    /// target (inbound).
    pub fn byte_counters(&self, tcp_is_downstream: bool) -> ByteCounters {
        let (received, sent) = (self.received.clone(), self.sent.clone());
        if tcp_is_downstream {
            ByteCounters {
                tcp_to_h2: received,
                h2_to_tcp: sent,
            }
        } else {
            ByteCounters {
                tcp_to_h2: sent,
                h2_to_tcp: received,
            }
        }
    }

    /// Counts the close with `flags` (a failure flag also counts it failed).
    pub fn close(mut self, flags: Flags) {
        self.finish(flags);
    }

    fn finish(&mut self, flags: Flags) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        if flags == Flags::None {
            self.metrics.closed.get_or_create(&self.labels).inc();
            return;
        }
        let mut labels = (*self.labels).clone();
        labels.response_flags = flags.label();
        self.metrics.closed.get_or_create(&labels).inc();
        self.metrics.failed.get_or_create(&labels).inc();
    }
}

/// A report dropped without [`Report::close`] (a task cancelled) still
/// counts its close.
impl Drop for Report {
    fn drop(&mut self) {
        self.finish(Flags::None);
    }
}

#[cfg(test)]
mod flag_tests {
    use super::Flags;
    use crate::proxy::pool::PoolError;
    use tidegate_protocol::hbone::client::DialError;
    use tidegate_protocol::tls::HandshakeError;

    #[test]
    fn a_failed_tunnel_is_flagged_as_ztunnel_flags_it() {
        let addr = "10.0.0.1:15008".parse().unwrap();
        let dial = |source| PoolError::Dial { addr, source };
        let tls = HandshakeError::Failed {
            reason: "untrusted_ca",
            source: std::io::Error::other("bad certificate"),
        };
        let cases = [
            (dial(DialError::Tls(tls)), "TLS_FAILURE"),
            (dial(DialError::NoH2), "H2_HANDSHAKE_FAILURE"),
            (
                dial(DialError::H2(h2::Reason::PROTOCOL_ERROR.into())),
                "H2_HANDSHAKE_FAILURE",
            ),
            (
                dial(DialError::Connect {
                    addr,
                    source: std::io::ErrorKind::ConnectionRefused.into(),
                }),
                "CONNECT",
            ),
            (
                PoolError::BackingOff {
                    addr,
                    remaining_ms: 5,
                },
                "CONNECT",
            ),
        ];
        for (e, flag) in cases {
            assert_eq!(Flags::of_pool_error(&e).label(), flag, "{e}");
        }
    }
}

#[cfg(test)]
mod intern_tests {
    use super::*;

    fn to(service: Option<ServiceRef<'_>>, mutual_tls: bool) -> Connection<'_> {
        Connection {
            reporter: Reporter::Source,
            source: None,
            source_identity: None,
            source_baggage: None,
            destination: None,
            service,
            mutual_tls,
        }
    }

    #[test]
    fn connections_with_the_same_labels_share_one_copy_while_one_is_open() {
        let m = IstioTcpMetrics::register(&mut Registry::default(), "Kubernetes");
        let (a, b, c) = (
            m.open(to(None, true)),
            m.open(to(None, true)),
            m.open(to(None, false)),
        );
        assert!(Arc::ptr_eq(&a.labels, &b.labels), "the same set, one copy");
        assert!(!Arc::ptr_eq(&a.labels, &c.labels));
        // Sets no connection holds go once the table fills; a held one stays.
        let names: Vec<String> = (0..200).map(|i| format!("svc-{i}")).collect();
        for name in &names {
            let svc = ServiceRef {
                namespace: "ns",
                name,
            };
            m.open(to(Some(svc), true)).close(Flags::None);
        }
        let left = m.interned.locked().sets.len();
        assert!(
            left < 64 + 2,
            "closed connections' sets were dropped: {left} left"
        );
        assert!(Arc::ptr_eq(&a.labels, &m.open(to(None, true)).labels));
        // A failed close is counted under its flag, the shared set untouched.
        b.close(Flags::Connect);
        assert_eq!(a.labels.response_flags, Flags::None.label());
        assert_eq!(
            m.failed
                .get_or_create(&{
                    let mut l = (*a.labels).clone();
                    l.response_flags = Flags::Connect.label();
                    l
                })
                .get(),
            1
        );
        drop((a, c));
    }
}
