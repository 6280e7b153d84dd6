//! Istio's L4 authorization (`AuthorizationPolicy`, and PeerAuthentication
//! STRICT as istiod converts it) with ztunnel's semantics, as a pure
//! decision over a connection: no sockets, no runtime.
//!
//! - [`policy`]: a policy (scope, action, rules of clauses of matches) and
//!   whether it matches a [`Connection`];
//! - [`cidr`]: an address range as a match names it;
//! - [`store`]: the policies by key and by scope, and the decision for a
//!   destination workload ([`Decision`], with ztunnel's reasons);
//! - [`kubernetes`]: `AuthorizationPolicy` and `PeerAuthentication`
//!   straight from the API server, converted as istiod converts them;
//! - [`xds`]: the `istio.security.Authorization` resource istiod sends,
//!   and its conversion, which refuses what ztunnel would silently
//!   reshape (`docs/authorization.md` lists each case).

#![forbid(unsafe_code)]

pub mod cidr;
pub mod kubernetes;
pub mod policy;
pub mod store;
pub mod xds;

pub use cidr::Cidr;
pub use policy::{
    Action, Clause, Connection, Identity, Match, Policy, Rule, Scope, ServiceAccount, StringMatch,
};
pub use store::{Decision, Denial, Destination, Held, PolicyStore, Refusal};

#[cfg(test)]
mod tests;
