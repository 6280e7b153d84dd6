//! The pool as `/config_dump` shows it.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use serde::Serialize;
use tokio::time::Instant;

use super::Pool;

#[derive(Debug, Serialize)]
pub struct TunnelDump {
    pub id: u64,
    pub src: String,
    pub dst: String,
    pub dst_addr: SocketAddr,
    pub streams: usize,
    pub streams_total: u64,
    pub age_ms: u128,
    pub goaway_received: bool,
    /// `active`, `goaway-received` (the peer asked it to go away) or
    /// `draining` (evicted here; its open streams finish, then it closes).
    pub state: &'static str,
}

impl Pool {
    /// Pooled and draining tunnels (`/config_dump`).
    pub fn dump(&self) -> Vec<TunnelDump> {
        let now = Instant::now();
        let pooled = self.tunnels().into_iter().map(|t| {
            let state = if t.received_goaway() {
                "goaway-received"
            } else {
                "active"
            };
            (t, state)
        });
        let draining = self.draining().into_iter().map(|t| (t, "draining"));
        pooled
            .chain(draining)
            .map(|(t, state)| TunnelDump {
                id: t.id,
                src: t.key.src.to_string(),
                dst: t.key.dst.to_string(),
                dst_addr: t.key.dst_addr,
                streams: t.streams(),
                streams_total: t.streams_total.load(Ordering::Relaxed),
                age_ms: now.duration_since(t.opened).as_millis(),
                goaway_received: t.received_goaway(),
                state,
            })
            .collect()
    }
}
