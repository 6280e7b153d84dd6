//! In-pod capture: the gateway serves each meshed pod from listeners opened
//! inside the pod's own network namespace (as Istio ambient's ztunnel does).
//!
//! Pod namespaces reach the gateway from the node's CNI. [`zds`] is the
//! client of istio-cni's node agent socket (the ZDS protocol), which hands
//! over each pod's namespace as a file descriptor.

pub mod zds;
