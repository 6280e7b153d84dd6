//! Inbound-only metrics: GOAWAYs a drain asked for, the refusals h2 made on
//! its own (seen in the frames it wrote, see [`tidegate_protocol::hbone::io`]), and the
//! upstream dials a peer wasted (see `pace.rs`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use tidegate_protocol::hbone::io::{reason_label, Refusal};
use tidegate_protocol::hbone::GoawayCommand;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    /// `rst_stream` (one stream) or `goaway` (the connection).
    frame: &'static str,
    /// The HTTP/2 error code, e.g. `protocol_error`, `refused_stream`,
    /// `enhance_your_calm`.
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WastedLabels {
    /// `reset_during_dial` or `no_bytes`.
    reason: &'static str,
}

/// What the inbound side counts beyond [`crate::proxy::metrics::ProxyMetrics`].
#[derive(Clone, Debug)]
pub struct InboundMetrics {
    goaways_sent: Counter,
    goaway_latency: Histogram,
    h2_refusals: Family<RefusalLabels, Counter>,
    wasted_dials: Family<WastedLabels, Counter>,
}

impl InboundMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = InboundMetrics {
            goaways_sent: Default::default(),
            // 5 µs .. ~5 s
            goaway_latency: Histogram::new(exponential_buckets(5e-6, 2.0, 20)),
            h2_refusals: Default::default(),
            wasted_dials: Default::default(),
        };
        registry.register(
            "drain_goaways_sent",
            "GOAWAYs sent on inbound tunnels because a drain asked",
            m.goaways_sent.clone(),
        );
        registry.register(
            "drain_event_to_goaway_seconds",
            "Time from the decision to the GOAWAY handed to the tunnel",
            m.goaway_latency.clone(),
        );
        registry.register(
            "h2_refusals",
            "Error-coded RST_STREAM and GOAWAY frames the HTTP/2 layer sent on inbound tunnels by itself \
             (malformed requests, streams beyond the concurrency limit, floods), by frame and error code",
            m.h2_refusals.clone(),
        );
        registry.register(
            "inbound_wasted_dials",
            "Upstream dials an inbound peer wasted: its stream reset while the dial was under way \
             (reset_during_dial), or ended without a byte from the peer (no_bytes); a tunnel that \
             wastes more than hbone.max_wasted_dials_per_second_per_tunnel is refused dials",
            m.wasted_dials.clone(),
        );
        m
    }

    pub fn dial_wasted(&self, reason: &'static str) {
        self.wasted_dials
            .get_or_create(&WastedLabels { reason })
            .inc();
    }

    /// Records the first GOAWAY a command made a tunnel send.
    pub fn goaway_sent(&self, cmd: GoawayCommand) {
        self.goaways_sent.inc();
        self.goaway_latency
            .observe(cmd.issued.elapsed().as_secs_f64());
    }

    pub fn h2_refused(&self, r: Refusal) {
        self.h2_refusals
            .get_or_create(&RefusalLabels {
                frame: r.frame.label(),
                reason: reason_label(r.reason),
            })
            .inc();
    }
}
