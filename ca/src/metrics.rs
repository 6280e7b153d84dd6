//! The CA client's metrics: fetches by result with their latency, and
//! each identity's seconds to expiry (computed at scrape time).

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tidegate_base::sync::Locked;

/// Where the expiry gauge reads its figures at scrape time (the
/// certificates, which own this module's metrics, not the other way round).
pub trait ExpirySource: Send + Sync {
    /// (identity, seconds until its current certificate expires).
    fn expiries(&self) -> Vec<(String, f64)>;
}

type Source = Arc<Mutex<Option<Weak<dyn ExpirySource>>>>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IdentityLabels {
    identity: String,
}

#[derive(Clone)]
pub struct CaMetrics {
    fetches: Family<ResultLabels, Counter>,
    latency: Histogram,
    source: Source,
}

impl Default for CaMetrics {
    fn default() -> Self {
        CaMetrics {
            fetches: Family::default(),
            latency: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            source: Arc::new(Mutex::new(None)),
        }
    }
}

/// Seconds to expiry, per identity, read from the certificates at scrape time.
struct Expiry(Source);

impl std::fmt::Debug for Expiry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Expiry")
    }
}

impl prometheus_client::collector::Collector for Expiry {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(inner) = self.0.locked().as_ref().and_then(Weak::upgrade) else {
            return Ok(());
        };
        let mut family = encoder.encode_descriptor(
            "certificate_expiry_seconds",
            "Seconds until the current certificate of each local identity expires (negative: expired)",
            None,
            MetricType::Gauge,
        )?;
        for (identity, left) in inner.expiries() {
            let labels = IdentityLabels { identity };
            ConstGauge::new(left).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl CaMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = CaMetrics::default();
        let sub = registry.sub_registry_with_prefix("ca");
        sub.register(
            "fetches",
            "Certificate requests to the CA by result: ok; the CA not reached or failing (unavailable, timeout, error), refusing us (refused); its answer refused (bad_chain, san_mismatch, key_mismatch, untrusted_chain, expired, not_yet_valid); ours (roots, token, local, config)",
            m.fetches.clone(),
        );
        sub.register(
            "fetch_duration_seconds",
            "Seconds from a key's generation to its certificate installed",
            m.latency.clone(),
        );
        sub.register_collector(Box::new(Expiry(m.source.clone())));
        m
    }

    pub(super) fn observe(&self, source: Weak<dyn ExpirySource>) {
        *self.source.locked() = Some(source);
    }

    pub(super) fn fetched(&self, result: &'static str, took: Duration) {
        self.fetches.get_or_create(&ResultLabels { result }).inc();
        if result == "ok" {
            self.latency.observe(took.as_secs_f64());
        }
    }
}
