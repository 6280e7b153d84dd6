//! ZDS: how istio-cni's node agent hands each meshed pod's network
//! namespace to the node proxy, spoken wire-exactly so istio-cni drives
//! tidegate as it drives ztunnel.
//!
//! The agent listens on a Unix `SOCK_SEQPACKET` socket
//! ([`client::DEFAULT_SOCKET`]); the gateway connects ([`ZdsClient`]), says
//! [`messages::ZdsHello`] V1, and then answers each request with one ack:
//!
//! 1. the snapshot: an `AddWorkload` (with the pod's namespace as exactly
//!    one `SCM_RIGHTS` descriptor) or a `KeepWorkload` per pod the agent
//!    knows, then `SnapshotSent`; pods not named are removed;
//! 2. then `AddWorkload` / `DelWorkload` as pods come and go.
//!
//! Each message is one datagram of at most 1,024 bytes. A request that
//! cannot be honoured is NACKed with the reason and the connection goes on.
//! The pods go to a [`PodSink`]; the client is ready after the first snapshot.
//!
//! - `messages`: the protobuf messages (`zds.proto`);
//! - `socket`: the seqpacket socket over tokio's `AsyncFd`;
//! - `session`: one connection (hello, requests, acks);
//! - `client`: connect, reconnect with backoff, readiness;
//! - `sink`: the trait the gateway implements.

#![forbid(unsafe_code)]

pub mod client;
pub mod error;
pub mod messages;
mod metrics;
mod session;
pub mod sink;
mod socket;

pub use client::{ZdsClient, ZdsConfig};
pub use error::{RequestError, ZdsError};
pub use sink::{Pod, PodSink, Snapshot};
