//! Discovery from istiod (`workloads.source: istio`).

pub mod convert;
