//! In-pod capture: the gateway serves each meshed pod from listeners inside
//! the pod's own network namespace (as ztunnel does in Istio ambient).
//!
//! - [`netns`]: pod namespaces and the thread that makes sockets inside them
//!   (`setns`, `SO_MARK`, `SO_REUSEPORT`, transparent sources).
pub mod netns;
