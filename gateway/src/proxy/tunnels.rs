//! The registry of live inbound HBONE tunnels and their streams, per
//! destination workload. The admin dump shows it; the drain engine acts on it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::hbone::GoawayCommand;
use crate::identity::SpiffeId;

#[derive(Debug, Default)]
pub struct InboundTunnels {
    tunnels: Mutex<BTreeMap<u64, Arc<InboundTunnel>>>,
    next_id: AtomicU64,
    /// Woken whenever a stream or a tunnel ends (see [`InboundTunnels::wait_idle`]).
    ended: Arc<tokio::sync::Notify>,
}

#[derive(Debug)]
pub struct InboundTunnel {
    pub id: u64,
    pub workload_uid: String,
    pub peer: SpiffeId,
    pub peer_addr: SocketAddr,
    pub opened_at: SystemTime,
    streams: AtomicUsize,
    streams_total: AtomicU64,
    goaway: watch::Sender<Option<GoawayCommand>>,
    ended: Arc<tokio::sync::Notify>,
    /// Set once a drain asked this tunnel to go away: shown in access logs.
    drained_by: OnceLock<String>,
}

impl InboundTunnel {
    pub fn streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    /// Counts a stream for as long as the returned guard lives.
    pub fn stream_started(self: &Arc<Self>) -> StreamCount {
        self.streams.fetch_add(1, Ordering::Relaxed);
        self.streams_total.fetch_add(1, Ordering::Relaxed);
        StreamCount(self.clone())
    }

    /// Asks the serving task to send GOAWAY. A later command can only make
    /// things stricter: immediate wins over graceful, the earlier deadline
    /// wins; once any command asked for a TLS close_notify, the close sends one.
    pub fn request_goaway(&self, cmd: GoawayCommand, drained_by: &str) {
        let _ = self.drained_by.set(drained_by.to_owned());
        self.goaway.send_modify(|cur| {
            *cur = Some(match *cur {
                None => cmd,
                Some(prev) => GoawayCommand {
                    graceful: prev.graceful && cmd.graceful,
                    deadline: match (prev.deadline, cmd.deadline) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    },
                    issued: prev.issued.min(cmd.issued),
                    close_notify: prev.close_notify || cmd.close_notify,
                },
            })
        });
    }

    /// Watches GOAWAY commands for this tunnel (the serving task).
    pub fn goaway_commands(&self) -> watch::Receiver<Option<GoawayCommand>> {
        self.goaway.subscribe()
    }

    /// Which drain asked this tunnel to go away, if any.
    pub fn drained_by(&self) -> Option<&str> {
        self.drained_by.get().map(String::as_str)
    }
}

#[derive(Debug)]
pub struct StreamCount(Arc<InboundTunnel>);

impl Drop for StreamCount {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
        self.0.ended.notify_waiters();
    }
}

/// Removes the tunnel from the registry when dropped.
#[derive(Debug)]
pub struct Registration {
    registry: Arc<InboundTunnels>,
    pub tunnel: Arc<InboundTunnel>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry
            .tunnels
            .lock()
            .unwrap()
            .remove(&self.tunnel.id);
    }
}

#[derive(Debug, Serialize)]
pub struct TunnelDump {
    pub id: u64,
    pub workload_uid: String,
    pub peer_identity: String,
    pub peer_addr: SocketAddr,
    pub age_ms: u128,
    pub streams: usize,
    pub streams_total: u64,
    pub draining: Option<String>,
}

impl InboundTunnels {
    pub fn register(
        self: &Arc<Self>,
        workload_uid: &str,
        peer: SpiffeId,
        peer_addr: SocketAddr,
    ) -> Registration {
        let tunnel = Arc::new(InboundTunnel {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            workload_uid: workload_uid.to_owned(),
            peer,
            peer_addr,
            opened_at: SystemTime::now(),
            streams: AtomicUsize::new(0),
            streams_total: AtomicU64::new(0),
            goaway: watch::channel(None).0,
            ended: self.ended.clone(),
            drained_by: OnceLock::new(),
        });
        self.tunnels
            .lock()
            .unwrap()
            .insert(tunnel.id, tunnel.clone());
        Registration {
            registry: self.clone(),
            tunnel,
        }
    }

    pub fn for_workload(&self, uid: &str) -> Vec<Arc<InboundTunnel>> {
        self.tunnels
            .lock()
            .unwrap()
            .values()
            .filter(|t| t.workload_uid == uid)
            .cloned()
            .collect()
    }

    /// Requests a graceful GOAWAY, without deadline, on every tunnel of
    /// `uid`; returns how many.
    pub fn goaway_workload(&self, uid: &str) -> usize {
        let tunnels = self.for_workload(uid);
        let cmd = GoawayCommand {
            graceful: true,
            deadline: None,
            issued: Instant::now(),
            close_notify: true,
        };
        for t in &tunnels {
            t.request_goaway(cmd, "admin");
        }
        tunnels.len()
    }

    /// Waits until `uid` has no open inbound stream or `until` passes;
    /// returns whether it became idle in time.
    pub async fn wait_idle(&self, uid: &str, until: Instant) -> bool {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            // Registered before the check, so no ending stream is missed.
            ended.as_mut().enable();
            if self.streams_of(uid) == 0 {
                return true;
            }
            tokio::select! {
                _ = ended => {}
                _ = tokio::time::sleep_until(until) => return self.streams_of(uid) == 0,
            }
        }
    }

    /// Open streams over all tunnels of `uid`.
    pub fn streams_of(&self, uid: &str) -> usize {
        self.for_workload(uid).iter().map(|t| t.streams()).sum()
    }

    pub fn len(&self) -> usize {
        self.tunnels.lock().unwrap().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dump(&self) -> Vec<TunnelDump> {
        let now = SystemTime::now();
        self.tunnels
            .lock()
            .unwrap()
            .values()
            .map(|t| TunnelDump {
                id: t.id,
                workload_uid: t.workload_uid.clone(),
                peer_identity: t.peer.to_string(),
                peer_addr: t.peer_addr,
                age_ms: now
                    .duration_since(t.opened_at)
                    .unwrap_or_default()
                    .as_millis(),
                streams: t.streams(),
                streams_total: t.streams_total.load(Ordering::Relaxed),
                draining: t.drained_by().map(str::to_owned),
            })
            .collect()
    }
}
