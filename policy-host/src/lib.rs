//! tidegate's policy host: drain policies as WebAssembly components, run
//! by wasmtime (component model, no WASI). This crate is the only one that
//! links wasmtime; the gateway reaches it through here (as
//! `tidegate::policy`).
//!
//! It imports `tidegate-base` (locks, the shutdown signal, durations and
//! sizes) and `tidegate-sdk` (the contract's types, the trace runner), and
//! nothing of the gateway: a workload is a borrowed [`Subject`] the gateway
//! lends for each selection, and the `policies:` section of the
//! configuration is [`config`], which the gateway's configuration embeds.
//!
//! - [`bindings`]: the host side of the WIT contract (generated, only here).
//! - [`runtime`]: engine, epoch deadlines, memory caps, host imports;
//!   `ticker`: the epoch ticker, awake only while plugins run.
//! - [`plugin`]: one compiled version, warm instance, failure handling.
//! - [`engine`]: the loaded set, selection per workload, decisions, hot swap.
//! - [`resolve`]: which policy a workload gets and why (one function for
//!   selection and reports); `which`: run-time bindings and the report.
//! - [`subject`]: what a workload is to the host; [`config`]: the
//!   `policies:` section.
//! - [`validate`], [`fallback`], [`version`], [`metrics`].

#![forbid(unsafe_code)]

pub mod bindings;
pub mod config;
#[cfg(test)]
mod contract_tests;
mod convert;
pub mod engine;
mod error;
mod fallback;
mod files;
pub mod metrics;
pub mod plugin;
pub mod resolve;
pub mod runtime;
pub mod subject;
mod ticker;
pub mod trace;
mod validate;
pub mod version;
mod which;

pub use engine::{Decision, LoadedFrom, PolicyEngine, Selection, UploadResult, Uploaded};
pub use error::{CallFailure, FailureKind, LoadError};
pub use fallback::Fallback;
pub use metrics::PolicyMetrics;
pub use plugin::{PluginVersion, QuarantineRule, MAX_READ_KEYS};
pub use resolve::{Resolution, SelectedBy, Skipped, PEER_POLICY_ANNOTATION, POLICY_ANNOTATION};
pub use runtime::{Clock, PolicyRuntime, RuntimeLimits};
pub use subject::{AsSubject, Subject};
pub use validate::{validate, Bounds, Ignored, Validated};
pub use which::{BindError, PolicyReport};
