//! What one HBONE tunnel is built with: the HTTP/2 settings both sides
//! announce, the keepalive, and the bound on the handshakes. The gateway
//! takes them from its `hbone:` configuration section.

use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Initial stream window (the peer may send this much per stream before
    /// a WINDOW_UPDATE).
    pub stream_window: u32,
    /// Initial connection window.
    pub connection_window: u32,
    pub max_frame_size: u32,
    /// Streams a peer may open concurrently (announced by the server side).
    pub max_concurrent_streams: u32,
    pub max_header_list_size: u32,
    /// PING interval of the server side's liveness check.
    pub keepalive_interval: Duration,
    /// A tunnel whose PING is not answered within this is closed.
    pub keepalive_timeout: Duration,
    /// Bound on TCP connect + TLS + HTTP/2 handshakes.
    pub connect_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            stream_window: 4 << 20,
            connection_window: 16 << 20,
            max_frame_size: 1 << 20,
            max_concurrent_streams: 200,
            max_header_list_size: 16 << 10,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(5),
        }
    }
}
