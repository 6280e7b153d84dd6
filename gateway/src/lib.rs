//! tidegate: a per-node HBONE gateway whose drain policies are WebAssembly plugins.
//!
//! The data path, in the order a byte travels:
//! [`outbound`] (capture on 15001) → [`pool`] → [`hbone::client`] → mTLS ([`tls`])
//! → peer's [`inbound`] (15008) → [`hbone::server`] → the workload.
//! [`app`] wires everything; [`config`] is the one typed configuration.

#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod cli;
pub mod config;
pub mod connect;
pub mod demo;
pub mod drain;
pub mod drains;
pub mod hbone;
pub mod identity;
pub mod inbound;
pub mod listener;
pub mod metrics;
pub mod oci;
pub mod outbound;
pub mod plugin_tools;
pub mod policy;
pub mod pool;
pub mod registry;
pub mod tls;
pub mod workload_table;
pub mod workloads;
