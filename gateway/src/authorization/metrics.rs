//! What authorization counts: refusals at accept and live connections
//! closed after a change, by transport and reason; the live connections
//! and the policies held.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tidegate_authz::Denial;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DenialLabels {
    /// `hbone` or `plaintext`.
    transport: &'static str,
    /// `explicitly_denied` (a DENY matched) or `not_allowed` (ALLOW
    /// policies exist and none matched).
    reason: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct AuthorizationMetrics {
    denied: Family<DenialLabels, Counter>,
    closed: Family<DenialLabels, Counter>,
    live: Gauge,
    policies: Gauge,
}

fn reason(d: &Denial) -> &'static str {
    match d {
        Denial::ExplicitlyDenied { .. } => "explicitly_denied",
        Denial::NotAllowed => "not_allowed",
    }
}

impl AuthorizationMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = AuthorizationMetrics::default();
        let r = registry.sub_registry_with_prefix("authorization");
        r.register(
            "denied",
            "Inbound connections refused by authorization policy",
            m.denied.clone(),
        );
        r.register(
            "closed",
            "Live inbound connections closed when a policy change refused them",
            m.closed.clone(),
        );
        r.register(
            "live_connections",
            "Inbound connections checked again on every policy change",
            m.live.clone(),
        );
        r.register(
            "policies",
            "Authorization policies held",
            m.policies.clone(),
        );
        m
    }

    pub(super) fn denied(&self, transport: &'static str, d: &Denial) {
        let labels = DenialLabels {
            transport,
            reason: reason(d),
        };
        self.denied.get_or_create(&labels).inc();
    }

    pub(super) fn closed(&self, transport: &'static str, d: &Denial) {
        let labels = DenialLabels {
            transport,
            reason: reason(d),
        };
        self.closed.get_or_create(&labels).inc();
    }

    pub(super) fn live_changed(&self, by: i64) {
        self.live.inc_by(by);
    }

    pub(super) fn policies(&self, n: usize) {
        self.policies.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}
