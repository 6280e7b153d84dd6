//! In-pod capture: the gateway serves each meshed pod from listeners opened
//! inside the pod's own network namespace (as Istio ambient's ztunnel does).
//!
//! - [`netns`]: pod namespaces and the thread that makes sockets inside them
//!   (`setns`, `SO_MARK`, `SO_REUSEPORT`, transparent sources).
//! - [`capture`]: istio-cni's in-pod capture rules, installed inside a
//!   pod's namespace (what `tidegate-cni` ADD will do in standalone mode).
//! - [`zds`]: the client of istio-cni's node agent socket (the ZDS
//!   protocol), which hands over each pod's namespace as a file descriptor.

pub mod capture;
pub mod netns;
pub mod zds;
