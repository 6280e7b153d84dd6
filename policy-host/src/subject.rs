//! What the policy host knows of a workload: the few fields a policy is
//! resolved from. The gateway's workload model stays the gateway's: its
//! `Workload` lends these fields for each selection ([`AsSubject`], in
//! `gateway/src/workloads/`).

use std::collections::BTreeMap;
use std::sync::Arc;

/// A workload as [`crate::resolve`] sees it, borrowed from whoever owns it.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    /// Names the run-time binding (`PUT /workloads/<uid>/policy`).
    pub uid: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    /// Matched by `policies.bindings[].selector`.
    pub labels: &'a BTreeMap<String, String>,
    /// `tidegate.io/drain-policy` and `tidegate.io/peer-drain-policy`.
    pub annotations: &'a BTreeMap<String, String>,
    /// The drain policy the workload's namespace names.
    pub namespace_policy: Option<&'a str>,
}

/// Whatever the engine selects a policy for: it lends a [`Subject`].
pub trait AsSubject {
    fn subject(&self) -> Subject<'_>;
}

impl AsSubject for Subject<'_> {
    fn subject(&self) -> Subject<'_> {
        *self
    }
}

/// Workloads are shared (`Arc`) by the snapshots that hold them.
impl<T: AsSubject + ?Sized> AsSubject for Arc<T> {
    fn subject(&self) -> Subject<'_> {
        (**self).subject()
    }
}
