//! How pods come in: the one [`PodIntake`] the per-pod proxies implement,
//! and the adapters of the ways pods arrive — `tidegate-cni`'s CNI socket
//! ([`cni_socket`]), istio-cni's ZDS ([`zds`]) and the state directory a
//! restarted gateway re-adopts from ([`state_dir`]).
//!
//! An adapter speaks its source's protocol and turns each request into a
//! call here; what a pod becomes (served, refused, torn down) is decided
//! once, behind [`PodIntake`]. Another node agent speaking ZDS (Cilium's) is
//! the [`zds`] adapter again; one speaking something else is one adapter
//! more.

use std::collections::BTreeSet;
use std::future::Future;
use std::os::fd::OwnedFd;

use super::pods::{PodError, PodMeta};
use crate::drains::Trigger;

pub mod cni_socket;
pub(crate) mod source;
pub mod state_dir;
pub mod zds;

pub use source::Source;

/// What became of a pod handed over.
#[derive(Debug)]
pub enum Taken {
    /// Served: `added`, `unchanged` (same pod, same namespace) or `replaced`
    /// (same pod, re-created sandbox).
    Served(&'static str),
    /// Not a mesh member, with why: not served, and not to be captured.
    NotMember(&'static str),
    /// Not served: its membership is unknown, or it could not be served.
    Failed(PodError),
}

/// How a pod leaves.
#[derive(Clone, Copy, Debug)]
pub enum Removal<'a> {
    /// Its teardown drain ran already and was answered (CNI DEL); the node
    /// agent named it `namespace`/`name`.
    Drained { namespace: &'a str, name: &'a str },
    /// Its teardown drain runs first: the policy decides (its hold
    /// honoured), then the listeners close.
    Drain(Trigger),
}

/// Where every pod handed over goes: the per-pod proxies
/// ([`super::pods::PodProxies`]), or a test's double. Calls from one
/// adapter come one at a time, in its source's order.
pub trait PodIntake: Send + Sync + 'static {
    /// Serve `pod` inside the network namespace `netns`: the same uid in the
    /// same namespace (same inode) again is `Served("unchanged")`, in a new
    /// one `Served("replaced")`. Served, the drain engine learns the pod
    /// was handed over.
    fn add(&self, pod: PodMeta, netns: OwnedFd) -> impl Future<Output = Taken> + Send;

    /// Keep serving `uid` (a snapshot names it; its namespace could not be
    /// re-opened): whether it is served.
    fn keep(&self, uid: &str) -> impl Future<Output = bool> + Send;

    /// The node agent took `uid` back: its listeners close, and whatever
    /// tunnels it still has.
    fn remove(&self, uid: &str, how: Removal<'_>) -> impl Future<Output = ()> + Send;

    /// `source`'s snapshot is complete: its pods it did not name are torn
    /// down (pods other sources handed over are not its to remove).
    fn reconcile(
        &self,
        source: Source,
        named: &BTreeSet<String>,
    ) -> impl Future<Output = ()> + Send;
}

#[cfg(test)]
mod tests;
