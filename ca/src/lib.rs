//! The Istio CA protocol (`istio.v1.auth.IstioCertificateService`): what a
//! node agent sends to get a certificate for each pod on its node, and what
//! the CA checks before it signs one, as istiod serves it
//! (`security/pkg/server/ca/` in Istio's source) and ztunnel calls it.
//!
//! - [`messages`]: the request and response, and `google.protobuf.Struct`
//!   for the `ImpersonatedIdentity` metadata, written with prost's derives.
//! - [`csr`]: an ECDSA P-256 key and a CSR with one URI SAN and an empty
//!   subject (the client); a CSR read and its signature checked (the CA).
//! - [`client`]: the gRPC call over TLS, with the token and cluster id.
//! - [`certs`]: `certificates.source: istio-ca`, a certificate per local
//!   identity, renewed at half-life, retried with backoff ([`schedule`]).
//! - [`issued`]: what the CA answered, checked before it is installed
//!   (the CSR's key, the identity, a chain to the configured roots, valid now).
//! - [`impersonation`]: istiod's node authorizer — who may ask for whose
//!   identity — as a pure decision over the caller and the pods it sees.
//! - [`server`] and [`config`]: `tidegate-ca`, the CA for clusters without
//!   istiod (its own binary, `src/main.rs`), and its flags.
//!
//! It imports `tidegate-base`, `tidegate-protocol` and `tidegate-control`,
//! and nothing of the node gateway: the client keeps a certificate for each
//! identity it is told to want ([`certs::IstioCaCerts::run`]).

#![forbid(unsafe_code)]

pub mod certs;
pub mod client;
pub mod config;
pub mod csr;
pub mod impersonation;
pub mod issued;
pub mod messages;
pub mod metrics;
pub mod schedule;
pub mod server;

/// The gRPC method path.
pub const CREATE_CERTIFICATE: &str = "/istio.v1.auth.IstioCertificateService/CreateCertificate";
/// The metadata key naming the identity a node agent asks for on a pod's behalf.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";
pub use config::DEFAULT_AUDIENCE;
