//! The protocol layer of tidegate: what goes over the wire between two
//! node gateways, and nothing of routing, authorization, dialing policy or
//! workloads.
//!
//! - [`identity`]: SPIFFE identities (`spiffe://<trust domain>/ns/<ns>/sa/<sa>`).
//! - [`tls`]: mutual TLS as HBONE uses it — the certificate directory,
//!   server and client contexts, identity verification, the development CA.
//! - [`hbone`]: HTTP/2 CONNECT tunnels over that TLS: serving one tunnel,
//!   dialing one and opening streams, keepalive, GOAWAY.

#![forbid(unsafe_code)]

pub mod hbone;
pub mod identity;
pub mod tls;
