//! The ZDS client's metrics (prefix `zds`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct MessageLabels {
    /// `add`, `keep`, `del`, `snapshot_sent` or `invalid`.
    pub kind: &'static str,
    /// `ok`, or the reason of the NACK ([`super::RequestError::reason`]).
    pub result: &'static str,
}

#[derive(Clone, Debug, Default)]
pub(super) struct ZdsMetrics {
    pub messages: Family<MessageLabels, Counter>,
    pub reconnects: Counter,
    pub reconnect_delay: Gauge<f64, AtomicU64>,
    pub connected: Gauge,
    pub ready: Gauge,
}

impl ZdsMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = ZdsMetrics::default();
        let r = registry.sub_registry_with_prefix("zds");
        r.register(
            "messages",
            "Requests from istio-cni's node agent, by type and ack result",
            m.messages.clone(),
        );
        r.register(
            "reconnects",
            "Connection attempts to the node agent after the first (after a failed connect or an ended connection)",
            m.reconnects.clone(),
        );
        r.register(
            "reconnect_delay_seconds",
            "The wait before the next connection attempt: 10 ms, doubled after each connection that failed or ended before a snapshot, at most 15 s",
            m.reconnect_delay.clone(),
        );
        r.register(
            "connected",
            "1 while connected to the node agent",
            m.connected.clone(),
        );
        r.register(
            "ready",
            "1 once the first snapshot was received and accepted",
            m.ready.clone(),
        );
        m
    }
}
