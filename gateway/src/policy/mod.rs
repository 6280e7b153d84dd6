//! Drain policies as WebAssembly components.
//!
//! - [`bindings`]: the host side of the WIT contract (generated, only here).
//! - [`runtime`]: engine, epoch deadlines, memory caps, host imports;
//!   `ticker`: the epoch ticker, awake only while plugins run.
//! - [`plugin`]: one compiled version, warm instance, failure handling.
//! - [`engine`]: the loaded set, selection per workload, decisions, hot swap.
//! - [`resolve`]: which policy a workload gets and why (one function for
//!   selection and reports); `which`: run-time bindings and the report.
//! - [`validate`], [`fallback`], [`version`], [`metrics`].

pub mod bindings;
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
pub use validate::{validate, Bounds, Ignored, Validated};
pub use which::{BindError, PolicyReport};
