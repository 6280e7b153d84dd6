//! tidegate: a per-node HBONE gateway whose drain policies are WebAssembly plugins.
//!
//! - The data path, [`proxy`], in the order a byte travels:
//!   [`proxy::outbound`] (capture on 15001) → [`proxy::pool`] → [`hbone::client`]
//!   → mTLS ([`tls`]) → peer's [`proxy::inbound`] (15008) over [`hbone::server`]
//!   → the workload; [`proxy::copy`] moves the bytes.
//! - [`hbone`]: the protocol layer (HTTP/2 CONNECT, settings, keepalive, GOAWAY);
//!   it knows nothing of routing, authorization or dialing.
//! - The control plane: [`workloads`] (what runs on the node), [`policy`]
//!   (the WebAssembly plugins), [`drains`] (the drain engine acting on
//!   tunnels), [`oci`] (draining before an OCI runtime stops a container).
//! - [`dns`]: the DNS proxy on 15053 inside each captured pod (in-pod mode).
//! - [`cli`]: the command line (`tidegate connect`, `tidegate drain`, …).
//! - [`shutdown`]: the gateway's own shutdown signal (not the drain engine).
//!
//! [`app`] wires everything; [`config`] is the one typed configuration;
//! [`control_plane`] holds the limits the admin, metrics, readiness and CNI
//! listeners share; [`descriptor_budget`] splits the open-file limit
//! between them, the pods, the inbound caps and the outbound side.

#![forbid(unsafe_code)]

pub mod admin;
pub mod allocator;
pub mod app;
pub mod authorization;
pub mod cli;
pub mod config;
pub mod demo;
pub mod descriptor_budget;
pub mod dns;
pub mod drains;
pub mod fd_passing;
pub mod inpod;
pub mod oci;
pub mod proxy;
pub mod workloads;

pub use allocator::{Allocator, ALLOCATOR};
pub use tidegate_base::{descriptors, shutdown, sync};
/// The Istio CA client (and `tidegate-ca`, the CA, in the same crate).
pub use tidegate_ca as ca;
/// The policy host is its own crate (the only one that links wasmtime).
pub use tidegate_policy_host as policy;
pub use tidegate_protocol::{hbone, identity, tls};

/// The unit tests run on the gateway's allocator too (its metrics are
/// tested on it).
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: Allocator = ALLOCATOR;
