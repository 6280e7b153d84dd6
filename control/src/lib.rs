//! The control plane's listeners, shared by the node gateway (admin,
//! metrics, readiness, the CNI socket) and `tidegate-ca`:
//!
//! - [`limits`]: a connection cap per listener, the pause after accept
//!   errors, their metrics, and the descriptor budget that keeps the data
//!   path's reserve;
//! - [`slots`]: an HTTP listener's connection slots (a full listener
//!   closes the connection idle the longest);
//! - [`http`]: a small HTTP/1.1 server over both, and `GET /metrics`;
//! - [`config`]: the `control_plane:` configuration section;
//! - [`kube_client`]: the Kubernetes client both build from their settings.
//!
//! It imports `tidegate-base` and nothing of the gateway.

#![forbid(unsafe_code)]

pub mod config;
pub mod http;
pub mod kube_client;
pub mod limits;
pub mod slots;
