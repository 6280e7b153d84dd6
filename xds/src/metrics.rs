//! The xDS client's metrics: ztunnel's names, which Istio's dashboards
//! query (`istio_xds_*`, registered without a prefix), and the client's
//! own (`tidegate_xds_*`).

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why a stream ended, as ztunnel reports it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Termination {
    /// The connection could not be made (or the call was refused before
    /// the stream started).
    ConnectionError,
    /// The stream failed.
    Error,
    /// The server ended the stream the way istiod routinely does (its
    /// maximum connection age, a GOAWAY) after at least one response:
    /// reconnect at once.
    Reconnect,
    /// The server ended the stream cleanly after at least one response.
    Complete,
    /// istiod stopped answering: no HTTP/2 frame after TLS, or no
    /// response within the bound on a stream's first answer (the project's
    /// own reason). A connection dropped for an unanswered PING ends its
    /// stream as the transport reports it (`Unknown`: `Reconnect`).
    Timeout,
    /// The server ended the stream, cleanly or the routine way, before any
    /// response: a failure for the backoff (the project's own reason).
    Unanswered,
}

/// What was past its size limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Oversized {
    /// A response past `max_message_size`: refused unread, the stream
    /// opened again.
    Message,
    /// A resource past `max_resource_size`: NACKed, the others applied.
    Resource,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OversizedLabels {
    /// `message` or `resource`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: Termination,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UrlLabels {
    pub url: String,
}

#[derive(Clone, Debug, Default)]
pub struct XdsMetrics {
    pub(crate) terminations: Family<ReasonLabels, Counter>,
    pub(crate) messages: Family<UrlLabels, Counter>,
    pub(crate) message_bytes: Family<UrlLabels, Counter>,
    pub(crate) rejected: Family<UrlLabels, Counter>,
    pub(crate) oversized: Family<OversizedLabels, Counter>,
    pub(crate) connected: Gauge,
}

impl XdsMetrics {
    /// Registers into `root`, the registry without a prefix: Istio's
    /// names as they are, the project's with `tidegate_`.
    pub fn register(root: &mut Registry) -> XdsMetrics {
        let m = XdsMetrics::default();
        root.register(
            "istio_xds_connection_terminations",
            "xDS streams ended, by reason",
            m.terminations.clone(),
        );
        root.register(
            "istio_xds_message",
            "xDS responses received, by type URL",
            m.messages.clone(),
        );
        root.register(
            "istio_xds_message_bytes",
            "Bytes of xDS responses received, by type URL",
            m.message_bytes.clone(),
        );
        root.register(
            "tidegate_xds_rejected_resources",
            "xDS resources refused (NACKed) by type URL; the others of the same response are applied",
            m.rejected.clone(),
        );
        root.register(
            "tidegate_xds_oversized",
            "xDS responses (kind=message: refused unread, the stream opened again) and resources \
             (kind=resource: NACKed) past their size limit",
            m.oversized.clone(),
        );
        root.register(
            "tidegate_xds_connected",
            "1 while a delta ADS stream to istiod is open",
            m.connected.clone(),
        );
        m
    }

    pub(crate) fn terminated(&self, reason: Termination) {
        self.terminations
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub(crate) fn oversized(&self, kind: Oversized) {
        let kind = match kind {
            Oversized::Message => "message",
            Oversized::Resource => "resource",
        };
        self.oversized
            .get_or_create(&OversizedLabels { kind })
            .inc();
    }

    pub(crate) fn url(family: &Family<UrlLabels, Counter>, url: &str, by: u64) {
        family
            .get_or_create(&UrlLabels {
                url: url.to_owned(),
            })
            .inc_by(by);
    }
}
