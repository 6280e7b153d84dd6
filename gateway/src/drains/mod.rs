//! The drain engine: lifecycle events in, policy decisions, actions executed
//! on real tunnels.
//!
//! - [`engine`]: per-workload lifecycle (idempotent transitions), the event
//!   a policy sees, the pinned policy version of a drain, `GET /drains`.
//! - [`executor`]: GOAWAY on inbound tunnels, eviction of pooled tunnels,
//!   teardown holds, timers; `oci-drain` is handed to [`crate::oci::OciDrainer`].
//!   A function of (actions, handles): the engine passes in what actions act
//!   on and receives fired timers through a sink; the executor does not
//!   import the engine.
//! - `book`: what the engine remembers (drain records, hand-overs, peers'
//!   drains) and the transitions that change it, under the engine's lock.
//! - `tasks`: the engine's timers, delayed GOAWAYs and lifecycle events,
//!   cancelled and awaited at shutdown.
//! - [`metrics`]: drains started / completed / forced, teardown holds.
//! - `store_events`: lifecycle and peer events derived from workload-store
//!   snapshots (workload file, Kubernetes); retiring tunnels to reused IPs.
//! - `peers`: a peer's drain seen from its clients' gateway — whose policy
//!   decides, executed on the clients' pooled tunnels; `peer_book` records
//!   those decisions (and connect-failing ones) for `GET /drains`.

mod book;
pub mod engine;
mod executor;
mod gateway_events;
mod metrics;
mod peer_book;
mod peers;
mod phase;
mod state;
mod store_events;
mod tasks;

pub use engine::{
    DrainDeps, DrainEngine, DrainError, DrainView, Lifecycle, Outcome, Phase, TeardownAck, Trigger,
};
pub use metrics::DrainMetrics;
pub use peer_book::{PeerDecision, PeerDrainView};
pub use state::PodKey;

/// The longest grace period a `shutdown-started` may carry (the admin API
/// refuses longer ones with a 400).
pub const MAX_GRACE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

#[cfg(test)]
mod tests;
