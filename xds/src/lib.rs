//! istiod's gRPC as a node proxy (ztunnel) speaks it, over the channel of
//! `tidegate-channel` (shared with the CA client).
//!
//! - [`envelope`]: the delta xDS envelope (requests, responses, the node);
//! - [`client`]: the delta ADS client — per-resource apply, ACK / NACK,
//!   reconnect with the versions held;
//! - [`workload`]: `istio.workload.Address` and what it carries
//!   (Workload, Service), hand-written with prost's derives;
//! - [`mid_message`]: a stream stopped half-way through a message fails;
//! - [`lifted`]: each response decoded from the frames that brought it
//!   (the stream keeps no buffer at the size of its largest);
//! - [`transport`]: TLS to istiod, or plaintext on a Unix socket (Cilium's agent);
//! - [`metrics`]: `istio_xds_*` (ztunnel's names) and `tidegate_xds_*`.

#![forbid(unsafe_code)]

pub mod client;
pub mod envelope;
pub mod lifted;
pub mod metrics;
pub mod mid_message;
pub mod transport;
pub mod workload;

pub use client::{AdsClient, ClientConfig, Handler, Limits, Rejected, Update};
pub use metrics::XdsMetrics;
