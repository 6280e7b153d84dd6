//! The data path: the listeners, the tunnels and the bytes.
//!
//! - [`outbound`]: the capture listener (15001), one pooled CONNECT stream per connection.
//! - [`routing`]: what routes a connection to no workload IP (Services, the
//!   cluster's ranges) and its counters; [`endpoints`]: a Service's endpoint
//!   for a new connection, drain-aware.
//! - [`pool`]: outbound HBONE tunnels per (peer, identity), reused and evicted.
//! - [`inbound`]: the HBONE listener (15008); routes, authorizes and dials each CONNECT.
//! - [`tunnels`]: the live inbound tunnels per workload (admin dump, drain engine).
//! - [`plaintext`]: a pod's 15006 (in-pod mode): plaintext inbound, allowed or refused.
//! - [`origin`]: where a listener's sockets live — the node's namespace or a pod's.
//! - [`listener`]: binding and original-destination lookup; [`port_holder`]:
//!   who holds a port a listener cannot bind.
//! - [`log_limit`]: bounded logging of refusals a peer can provoke.
//! - [`ledger`]: what is recorded of each connection or stream, once: the
//!   counters, Istio's report, the access line.
//! - [`copy`]: moving bytes between an HTTP/2 stream and a TCP socket.
//! - [`metrics`]: tidegate's counters both directions share (`tidegate_connections_*`,
//!   `tidegate_streams_*`, `tidegate_bytes`); [`istio_tcp`]: Istio's TCP metrics
//!   (`istio_tcp_*`), as ztunnel reports them.
//! - [`congestion`]: the congestion control of app-side and tunnel sockets.

pub mod congestion;
pub mod connections;
pub mod copy;
pub mod endpoints;
pub mod inbound;
pub mod istio_tcp;
pub mod ledger;
pub mod listener;
pub mod log_limit;
pub mod metrics;
pub mod origin;
pub mod outbound;
pub mod plaintext;
pub mod pool;
pub mod port_holder;
pub mod routing;
pub mod tunnels;
pub mod waypoint;
