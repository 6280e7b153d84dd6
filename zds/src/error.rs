//! The ZDS client's errors: those that end a connection ([`ZdsError`]) and
//! those that only refuse one request ([`RequestError`], sent back as the
//! ack's error text while the connection goes on).

use std::io;
use std::path::PathBuf;

use super::socket::MAX_MESSAGE;

/// Ends the connection; the client reconnects with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ZdsError {
    #[error(
        "cannot connect to the ZDS socket {}: {source} (is the node agent — istio-cni's, or Cilium's — running on this node, and is its socket directory mounted into the gateway?)",
        path.display()
    )]
    Connect { path: PathBuf, source: io::Error },
    #[error("ZDS connection failed: {0}")]
    Io(#[from] io::Error),
}

/// Refuses one request: its ack carries this text, and the connection goes on.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("message longer than {MAX_MESSAGE} bytes: refused unread")]
    TooLong,
    #[error("too many file descriptors attached to one message: all closed, message refused")]
    TooManyFds,
    #[error("the file descriptor sent with the request could not be received: {why}")]
    FdsLost { why: String },
    #[error("cannot decode the WorkloadRequest: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("WorkloadRequest without payload (unknown request type?)")]
    NoPayload,
    #[error("{kind} carries {got} file descriptors; AddWorkload needs exactly one (the pod's network namespace) and other requests none")]
    FdCount { kind: &'static str, got: usize },
    #[error("{kind} without uid")]
    NoUid { kind: &'static str },
    #[error("AddWorkload for {uid} without workload_info")]
    NoWorkloadInfo { uid: String },
    #[error("KeepWorkload for {uid} after SnapshotSent: keep is only valid during the snapshot")]
    KeepAfterSnapshot { uid: String },
    #[error("a second SnapshotSent on one connection")]
    SnapshotTwice,
    /// The sink refused; its message is the ack's text, unchanged.
    #[error("{0}")]
    Sink(Box<dyn std::error::Error + Send + Sync>),
}

impl RequestError {
    /// A bounded metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            RequestError::TooLong => "too_long",
            RequestError::TooManyFds | RequestError::FdCount { .. } => "fd_count",
            RequestError::FdsLost { .. } => "descriptors",
            RequestError::Decode(_) | RequestError::NoPayload => "decode",
            RequestError::NoUid { .. } | RequestError::NoWorkloadInfo { .. } => "incomplete",
            RequestError::KeepAfterSnapshot { .. } | RequestError::SnapshotTwice => "out_of_order",
            RequestError::Sink(_) => "sink",
        }
    }
}
