//! In-pod capture: the gateway serves each meshed pod from listeners opened
//! inside the pod's own network namespace (as Istio ambient's ztunnel does).
//!
//! - [`pods`]: the per-pod proxies (15001, 15006, 15008 inside each pod).
//! - [`admission`]: which pods are taken (one namespace, one pod; never the
//!   gateway's own; `capture.max_pods`; descriptors to spare).
//! - [`capture`]: istio-cni's in-pod capture rules, installed inside a
//!   pod's namespace (what `tidegate-cni` ADD does in standalone mode).
//! - [`state`]: the node state directory `tidegate-cni` records pods in,
//!   re-adopted by a restarted gateway.
//! - [`zds`]: the client of istio-cni's node agent socket (the ZDS
//!   protocol), which hands over each pod's namespace as a file descriptor.
//!
//! Sockets inside a namespace are made by [`crate::netns`].

pub mod admission;
pub mod capture;
pub mod pods;
pub mod state;
pub mod zds;
