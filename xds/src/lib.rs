//! istiod's delta xDS, as a node proxy (ztunnel) speaks it.
//!
//! - [`workload`]: `istio.workload.Address` and what it carries
//!   (Workload, Service), hand-written with prost's derives;

#![forbid(unsafe_code)]

pub mod workload;
