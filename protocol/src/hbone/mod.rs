//! HBONE: HTTP/2 CONNECT tunnels over mutual TLS, as ztunnel speaks it.
//!
//! - [`authority`]: the CONNECT target, `ip:port` or `[v6]:port`.
//! - [`server`]: the inbound side of one tunnel; a [`server::StreamHandler`]
//!   decides what each CONNECT stream means.
//! - [`client`]: dialing a tunnel to a peer gateway and opening CONNECT streams.
//! - [`baggage`]: the source workload a CONNECT carries, as ztunnel writes it.
//! - [`keepalive`]: HTTP/2 PING liveness for both sides.
//! - [`io`]: the server's byte stream: close_notify on close, refusals h2 writes.
//! - [`client_io`]: the client's byte stream: the peer's GOAWAY as it is read.
//! - `frames`: following frame boundaries from outside h2 (both of the above).
//! - [`Settings`]: the HTTP/2 settings, keepalive and handshake bound of a tunnel.

pub mod authority;
pub mod baggage;
pub mod client;
pub mod client_io;
mod frames;
pub mod io;
pub mod keepalive;
pub mod server;
mod settings;

pub use settings::Settings;

use tokio::time::Instant;

/// Response header carrying the reason for a refused CONNECT (HTTP/2 has no reason phrase).
pub const REASON_HEADER: &str = "tidegate-reason";

/// What the serving task does when asked to go away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoawayCommand {
    /// Two-phase GOAWAY (streams finish) or one GOAWAY and close at once.
    pub graceful: bool,
    /// Remaining streams are reset and the tunnel closed at this instant.
    pub deadline: Option<Instant>,
    /// When the decision was made (for the event → GOAWAY histogram).
    pub issued: Instant,
    /// Whether the tunnel's final close sends a TLS close_notify alert;
    /// without it the peer sees the TCP connection end without one.
    pub close_notify: bool,
}

/// How much a stream may queue in h2 before its writer waits: the whole
/// stream window (as ztunnel's client does). The peer's window bounds it
/// anyway; a smaller buffer (it was one frame, 1 MiB) only made h2 wake
/// the copy task once per frame written, to top the buffer up, instead of
/// once per WINDOW_UPDATE.
fn send_buffer(cfg: &Settings) -> usize {
    cfg.stream_window as usize
}

pub(crate) fn server_builder(cfg: &Settings) -> h2::server::Builder {
    let mut b = h2::server::Builder::new();
    b.initial_window_size(cfg.stream_window)
        .initial_connection_window_size(cfg.connection_window)
        .max_frame_size(cfg.max_frame_size)
        .max_concurrent_streams(cfg.max_concurrent_streams)
        .max_header_list_size(cfg.max_header_list_size)
        .max_send_buffer_size(send_buffer(cfg));
    b
}

pub(crate) fn client_builder(cfg: &Settings) -> h2::client::Builder {
    let mut b = h2::client::Builder::new();
    b.initial_window_size(cfg.stream_window)
        .initial_connection_window_size(cfg.connection_window)
        .max_frame_size(cfg.max_frame_size)
        .max_header_list_size(cfg.max_header_list_size)
        .max_send_buffer_size(send_buffer(cfg))
        .enable_push(false);
    b
}
