//! OCI load-balancer backend draining: the host side of the `oci-drain` action.
//!
//! When a policy decides that a terminating pod's OCI load-balancer backends
//! should stop receiving new connections, [`OciDrainer`] sets `drain=true` on
//! exactly the backends whose `ipAddress` is an IP of that pod (by uid),
//! across the configured load balancers' backend sets, and keeps it so while
//! the pod terminates.
//!
//! - [`drainer`]: read-modify-write with `If-Match`, retries, work requests,
//!   one change at a time per load balancer, re-assertion, capacity.
//! - [`metrics`]: retries, latencies, re-assertions, capacity events.
//!
//! The API itself — signatures, credentials, signed HTTPS calls, the JSON
//! types — is the `tidegate-oci` crate.
//!
//! Safety rules (from the OCI native ingress review of backend draining):
//! only opted-in workloads; only the exact pod's IPs; node backends (an IP
//! in `oci.node_networks`, e.g. a node IP with a NodePort, or a host-network
//! pod's) are never touched; every field other than `drain` is resent as read, under the load
//! balancer's ETag, so another writer's change is never overwritten.

pub mod drainer;
pub mod metrics;

pub use crate::config::{Cidr, OciAuth, OciConfig, OptIn, OCI_BACKEND_LIMIT};
pub use drainer::{OciDrainer, OciStatus};
pub use metrics::OciMetrics;

use std::sync::Arc;

use tidegate_oci::{auth, client, CallMetrics, OciClient};

use crate::workloads::{WorkloadSpec, WorkloadStore};

/// The part of the `oci:` section that needs workloads: kept here so that
/// `config` does not import `workloads` (which imports `config`).
impl OciConfig {
    /// Whether `w` opted in (its Service's annotation, or this config).
    pub fn opted_in(&self, w: &WorkloadSpec) -> bool {
        w.oci_backend_draining
            || self.opt_in.iter().any(|o| {
                o.namespace == w.namespace
                    && o.selector.iter().all(|(k, v)| w.labels.get(k) == Some(v))
            })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OciSetupError {
    #[error("oci.auth: required when oci.enabled is true")]
    NoAuth,
    #[error(transparent)]
    Auth(#[from] auth::AuthError),
    #[error(transparent)]
    Endpoint(#[from] client::EndpointError),
    #[error("oci.ca_file {path}: {source}")]
    ReadCa {
        path: String,
        source: std::io::Error,
    },
}

/// The drainer `cfg` asks for, or `None` when `oci.enabled` is false.
pub fn from_config(
    cfg: &OciConfig,
    workloads: Arc<WorkloadStore>,
    registry: &mut prometheus_client::registry::Registry,
    drain: tidegate_base::shutdown::ShutdownWatch,
) -> Result<Option<Arc<OciDrainer>>, OciSetupError> {
    if !cfg.enabled {
        return Ok(None);
    }
    let signer = match &cfg.auth {
        Some(OciAuth::ApiKey {
            tenancy,
            user,
            fingerprint,
            key_file,
        }) => auth::Credentials::Static(auth::api_key(tenancy, user, fingerprint, key_file)?),
        Some(OciAuth::WorkloadIdentity {
            proxymux_endpoint,
            token_file,
            ca_file,
        }) => auth::Credentials::WorkloadIdentity(Box::new(auth::WorkloadIdentity::new(
            proxymux_endpoint,
            token_file,
            ca_file,
            cfg.request_timeout,
        )?)),
        None => return Err(OciSetupError::NoAuth),
    };
    let ca_path = cfg.ca_file.display().to_string();
    let roots = std::fs::read(&cfg.ca_file).map_err(|source| OciSetupError::ReadCa {
        path: ca_path.clone(),
        source,
    })?;
    let client = OciClient::new(
        &cfg.endpoint(),
        &roots,
        &ca_path,
        signer,
        cfg.request_timeout,
        CallMetrics::register(registry),
    )?;
    let metrics = OciMetrics::register(registry);
    tracing::info!(endpoint = %client.endpoint(), load_balancers = cfg.load_balancers.len(), "OCI backend draining enabled");
    Ok(Some(OciDrainer::new(
        cfg.clone(),
        client,
        workloads,
        metrics,
        drain,
    )))
}
