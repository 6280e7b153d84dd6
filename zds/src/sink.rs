//! What the ZDS client hands pods to: the gateway's ZDS adapter of its pod
//! intake (or a test's recorder). The client sends each request's ack only after the
//! sink answered, so istio-cni's "added" means the sink accepted the pod.

use std::collections::BTreeSet;
use std::future::Future;
use std::os::fd::OwnedFd;

/// A pod istio-cni enrolled, as `AddWorkload` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    /// Kubernetes `metadata.uid`.
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
}

/// The end of a snapshot: which pods this connection named (added or kept)
/// and which of the pods the sink accepted earlier it did not name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Every uid named by `AddWorkload` or `KeepWorkload` since the connection began.
    pub named: BTreeSet<String>,
    /// Uids the sink accepted (on this or an earlier connection of this
    /// client) and that the snapshot did not name: the node agent no longer
    /// has them, so they are to be removed. A sink that adopted pods some
    /// other way reconciles against `named` instead.
    pub gone: BTreeSet<String>,
}

/// Receives the pods istio-cni hands over. Calls come one at a time, in the
/// order of the requests; each result becomes that request's ack (the
/// error's `Display` is the NACK text istio-cni logs).
pub trait PodSink: Send + Sync + 'static {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Serve `pod` inside the network namespace `netns`. An `add` for a uid
    /// already served with the same namespace (same inode) must be a no-op;
    /// a different namespace means the sandbox was re-created.
    fn add(&self, pod: Pod, netns: OwnedFd)
        -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// During the snapshot: keep serving `uid` (its namespace could not be
    /// re-opened by the node agent).
    fn keep(&self, uid: &str) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Stop serving `uid` (the pod left the mesh or was deleted).
    fn del(&self, uid: &str) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The snapshot is complete: remove [`Snapshot::gone`].
    fn snapshot_done(
        &self,
        snapshot: &Snapshot,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}
