//! What the gateway and its CNI plugin (`tidegate-cni`) both need of a
//! pod's network, and nothing else:
//!
//! - [`namespace`]: the pod's network namespace — opened and checked to
//!   be one, its identity, entering it; the mesh's packet mark.
//! - [`capture`]: istio-cni's in-pod capture rules installed inside that
//!   namespace, and the node's probe exemption.
//! - [`pod_records`]: the node state directory's pod records, written by
//!   the plugin on ADD and read by a restarted gateway.
//! - [`never_meshed`]: the Kubernetes namespaces whose pods are never
//!   captured.
//!
//! The plugin runs on the host for every pod creation and deletion, so
//! this crate stays small: std, `nix` (setns, fstatfs), `libc` (open
//! flags), serde and serde_json (the records), thiserror. The gateway's
//! sockets inside a pod (tokio) are its own (`gateway/src/netns.rs`).

#![forbid(unsafe_code)]

pub mod capture;
pub mod namespace;
pub mod never_meshed;
pub mod pod_records;
