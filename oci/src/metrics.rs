//! The API client's metrics: every call by operation and HTTP status
//! (`oci_calls`). What the drainer does with the calls (retries, work
//! requests, drains) is counted by the drainer.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub operation: &'static str,
    /// The HTTP status, or `error` when no answer came.
    pub status: String,
}

/// `oci_calls{operation, status}`.
#[derive(Clone, Debug)]
pub struct CallMetrics {
    calls: Family<CallLabels, Counter>,
}

impl CallMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = CallMetrics {
            calls: Family::default(),
        };
        registry.sub_registry_with_prefix("oci").register(
            "calls",
            "OCI API calls by operation and HTTP status",
            m.calls.clone(),
        );
        m
    }

    pub(crate) fn call(&self, operation: &'static str, status: String) {
        self.calls
            .get_or_create(&CallLabels { operation, status })
            .inc();
    }
}
