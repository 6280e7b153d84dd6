//! tidegate's metrics shared by every direction of the data path (the
//! access line is written by [`crate::proxy::ledger`]).
//! Each module registers its own metrics into the registry passed in; there
//! is no global registry.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::proxy::connections::LiveConnections;
use crate::proxy::copy::ByteCounters;
use crate::proxy::istio_tcp::IstioTcpMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    pub direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub direction: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BytesLabels {
    pub direction: &'static str,
    /// `tcp_to_tunnel` or `tunnel_to_tcp`.
    pub flow: &'static str,
}

/// Connections, streams and bytes for one direction (`inbound` or `outbound`).
#[derive(Clone, Debug)]
pub struct ProxyMetrics {
    pub direction: &'static str,
    pub connections_opened: Counter,
    pub connections_closed: Counter,
    pub streams_open: Gauge,
    pub bytes: ByteCounters,
    /// Istio's TCP metrics, shared by every direction.
    pub istio: IstioTcpMetrics,
    /// The connections open now (`/config_dump`'s `workloadState`),
    /// shared by every direction: a ledger registers its own.
    pub live: Arc<LiveConnections>,
    connections_failed: Family<ReasonLabels, Counter>,
    streams_ended: Family<ReasonLabels, Counter>,
}

/// Families shared by both directions, registered once.
#[derive(Clone, Debug, Default)]
pub struct ProxyFamilies {
    opened: Family<DirectionLabels, Counter>,
    closed: Family<DirectionLabels, Counter>,
    failed: Family<ReasonLabels, Counter>,
    streams_open: Family<DirectionLabels, Gauge>,
    streams_ended: Family<ReasonLabels, Counter>,
    bytes: Family<BytesLabels, Counter>,
    istio: IstioTcpMetrics,
    live: Arc<LiveConnections>,
}

impl ProxyFamilies {
    /// Registers tidegate's families in `registry`; `istio` is registered
    /// where it belongs (without the `tidegate` prefix).
    pub fn register(registry: &mut Registry, istio: IstioTcpMetrics) -> Self {
        let f = ProxyFamilies {
            istio,
            ..ProxyFamilies::default()
        };
        registry.register(
            "connections_opened",
            "Connections opened: inbound HBONE tunnels accepted, outbound application connections captured",
            f.opened.clone(),
        );
        registry.register("connections_closed", "Connections closed", f.closed.clone());
        registry.register(
            "connections_failed",
            "Connections that failed before carrying a stream, by reason",
            f.failed.clone(),
        );
        registry.register("streams_open", "Streams open now", f.streams_open.clone());
        registry.register(
            "streams_ended",
            "Streams ended, by result (ok, or the reason they failed or were refused)",
            f.streams_ended.clone(),
        );
        registry.register("bytes", "Bytes proxied", f.bytes.clone());
        f
    }

    /// The connections open now, every direction's.
    pub fn live(&self) -> Arc<LiveConnections> {
        self.live.clone()
    }

    pub fn direction(&self, direction: &'static str) -> ProxyMetrics {
        // Each get_or_create returns a read guard; bind them one at a time so
        // no guard is alive while the next call takes the write lock.
        let d = DirectionLabels { direction };
        let connections_opened = self.opened.get_or_create(&d).clone();
        let connections_closed = self.closed.get_or_create(&d).clone();
        let streams_open = self.streams_open.get_or_create(&d).clone();
        let tcp_to_h2 = self
            .bytes
            .get_or_create(&BytesLabels {
                direction,
                flow: "tcp_to_tunnel",
            })
            .clone();
        let h2_to_tcp = self
            .bytes
            .get_or_create(&BytesLabels {
                direction,
                flow: "tunnel_to_tcp",
            })
            .clone();
        ProxyMetrics {
            direction,
            connections_opened,
            connections_closed,
            streams_open,
            bytes: ByteCounters {
                tcp_to_h2,
                h2_to_tcp,
            },
            istio: self.istio.clone(),
            live: self.live.clone(),
            connections_failed: self.failed.clone(),
            streams_ended: self.streams_ended.clone(),
        }
    }
}

impl ProxyMetrics {
    pub fn connection_failed(&self, reason: &'static str) {
        self.connections_failed
            .get_or_create(&ReasonLabels {
                direction: self.direction,
                reason,
            })
            .inc();
    }

    pub fn stream_ended(&self, result: &'static str) {
        self.streams_ended
            .get_or_create(&ReasonLabels {
                direction: self.direction,
                reason: result,
            })
            .inc();
    }
}
