//! The OCI API as the gateway's backend drainer calls it: signed HTTPS
//! calls to the load-balancer API, nothing of workloads or drains.
//!
//! - [`sign`]: OCI HTTP signatures (version 1, rsa-sha256).
//! - [`auth`]: the signing key (API key, or OKE workload identity's session key).
//! - [`transport`]: one HTTPS request over rustls to the regional endpoint.
//! - [`client`]: signed calls (GetLoadBalancer, GetBackend, UpdateBackend,
//!   DeleteBackend, GetWorkRequest), typed answers and errors.
//! - [`model`]: the API's JSON types.
//! - [`metrics`]: every call by operation and status.
//!
//! The drainer (read-modify-write under `If-Match`, retries, work
//! requests, re-assertion) is the gateway's (`gateway/src/oci/`).

#![forbid(unsafe_code)]

pub mod auth;
pub mod client;
pub mod metrics;
pub mod model;
pub mod sign;
pub mod transport;

pub use client::{OciClient, OciError};
pub use metrics::CallMetrics;
