//! tidegate: a per-node HBONE gateway whose drain policies are WebAssembly plugins.
//!
//! A sibling crate is named by its crate name wherever it is used
//! (`tidegate_policy_host::…`, `tidegate_protocol::hbone::…`); this crate
//! re-exports none of them.
//!
//! - The data path, [`proxy`], in the order a byte travels:
//!   [`proxy::outbound`] (capture on 15001) → [`proxy::pool`] →
//!   [`tidegate_protocol::hbone::client`] → mTLS ([`tidegate_protocol::tls`])
//!   → peer's [`proxy::inbound`] (15008) over
//!   [`tidegate_protocol::hbone::server`] → the workload; [`proxy::copy`]
//!   moves the bytes.
//! - [`tidegate_protocol::hbone`]: the protocol layer (HTTP/2 CONNECT,
//!   settings, keepalive, GOAWAY); it knows nothing of routing,
//!   authorization or dialing.
//! - The control plane: [`workloads`] (what runs on the node),
//!   [`tidegate_policy_host`] (the WebAssembly plugins; its own crate, the
//!   only one that links wasmtime), [`drains`] (the drain engine acting on
//!   tunnels), [`oci`] (draining before an OCI runtime stops a container);
//!   [`tidegate_ca`] is the Istio CA client (and the CA).
//! - [`dns`]: the DNS proxy on 15053 inside each captured pod (in-pod mode).
//! - [`cli`]: the command line (`tidegate connect`, `tidegate drain`, …);
//!   [`build_info`]: the version, commit and protocol versions
//!   (`tidegate version`, `GET /version`).
//! - [`tidegate_base::shutdown`]: the gateway's own shutdown signal (not the
//!   drain engine).
//!
//! [`app`] wires everything; [`config`] is the one typed configuration;
//! [`tidegate_control::limits`] holds the limits the admin, metrics, readiness and
//! CNI listeners share; [`descriptor_budget`] splits the open-file limit
//! between them, the pods, the inbound caps and the outbound side.

#![forbid(unsafe_code)]

pub mod admin;
pub mod allocator;
pub mod app;
pub mod authorization;
pub mod build_info;
pub mod cli;
pub mod config;
pub mod demo;
pub mod descriptor_budget;
pub mod dns;
pub mod drains;
pub mod inpod;
pub mod oci;
pub mod proxy;
pub mod workloads;

pub use allocator::{Allocator, ALLOCATOR};

/// The unit tests run on the gateway's allocator too (its metrics are
/// tested on it).
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: Allocator = ALLOCATOR;
