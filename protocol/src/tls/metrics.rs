//! TLS handshake metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::context::HandshakeError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabels {
    pub direction: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    pub direction: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct TlsMetrics {
    handshakes: Family<DirectionLabels, Counter>,
    failures: Family<HandshakeLabels, Counter>,
}

impl TlsMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = TlsMetrics::default();
        let sub = registry.sub_registry_with_prefix("tls");
        sub.register(
            "handshakes",
            "Completed TLS handshakes by direction",
            m.handshakes.clone(),
        );
        sub.register(
            "handshake_failures",
            "Failed TLS handshakes by direction and reason",
            m.failures.clone(),
        );
        m
    }

    pub(super) fn record_handshake(&self, direction: &'static str, err: Option<&HandshakeError>) {
        match err {
            None => {
                self.handshakes
                    .get_or_create(&DirectionLabels { direction })
                    .inc();
            }
            Some(e) => {
                self.failures
                    .get_or_create(&HandshakeLabels {
                        direction,
                        reason: e.reason(),
                    })
                    .inc();
            }
        }
    }
}
