//! The registry of live inbound HBONE tunnels and their streams, per
//! destination workload. The admin dump shows it; the drain engine acts on it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use tidegate_base::sync::Locked;
use tidegate_protocol::hbone::GoawayCommand;
use tidegate_protocol::identity::SpiffeId;

#[derive(Debug, Default)]
pub struct InboundTunnels {
    tunnels: Mutex<BTreeMap<u64, Arc<InboundTunnel>>>,
    next_id: AtomicU64,
    /// Woken whenever a stream or a tunnel ends (see [`InboundTunnels::wait_idle`]).
    ended: Arc<tokio::sync::Notify>,
    /// A drain applies to the workload, not only to the tunnels it had when
    /// it began: a tunnel accepted later for a workload named here is asked
    /// to go away as soon as it registers.
    standing: Mutex<HashMap<String, StandingGoaway>>,
}

/// A drain's GOAWAY, kept for the workload's later tunnels.
#[derive(Clone, Debug)]
struct StandingGoaway {
    graceful: bool,
    /// Streams of a later tunnel are cut this long after it registers.
    hard: Option<Duration>,
    close_notify: bool,
    label: String,
}

impl StandingGoaway {
    fn command_now(&self) -> GoawayCommand {
        let now = Instant::now();
        GoawayCommand {
            graceful: self.graceful,
            deadline: self.hard.and_then(|h| now.checked_add(h)),
            issued: now,
            close_notify: self.close_notify,
        }
    }
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
    /// The workload's drain when this tunnel was accepted: its GOAWAY is
    /// sent once the first stream is accepted (see [`InboundTunnels::register`]).
    after_first_stream: OnceLock<StandingGoaway>,
}

impl InboundTunnel {
    pub fn streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    /// Counts a stream for as long as the returned guard lives.
    pub fn stream_started(self: &Arc<Self>) -> StreamCount {
        self.streams.fetch_add(1, Ordering::Relaxed);
        if self.streams_total.fetch_add(1, Ordering::Relaxed) == 0 {
            if let Some(s) = self.after_first_stream.get() {
                self.request_goaway(s.command_now(), &s.label);
            }
        }
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

    /// Watches GOAWAY commands for this tunnel (the serving task); a command
    /// given before the task subscribed is seen as a change too.
    pub fn goaway_commands(&self) -> watch::Receiver<Option<GoawayCommand>> {
        let mut rx = self.goaway.subscribe();
        if rx.borrow().is_some() {
            rx.mark_changed();
        }
        rx
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
        self.registry.tunnels.locked().remove(&self.tunnel.id);
        self.registry.ended.notify_waiters();
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
    /// Registers a tunnel accepted for `workload_uid`. When the workload is
    /// draining (see [`InboundTunnels::goaway_from_now_on`]) the tunnel gets
    /// the drain's GOAWAY too: a graceful one once its first stream is
    /// accepted, an immediate one at once.
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
            after_first_stream: OnceLock::new(),
        });
        self.tunnels.locked().insert(tunnel.id, tunnel.clone());
        // A graceful drain lets the stream the peer dialed this tunnel for
        // through (a GOAWAY before it would make the peer's pool fail it or
        // dial again); an immediate one (a deleted workload) closes it now.
        let standing = self.standing.locked().get(workload_uid).cloned();
        match standing {
            Some(s) if s.graceful => {
                let _ = tunnel.after_first_stream.set(s);
            }
            Some(s) => tunnel.request_goaway(s.command_now(), &s.label),
            None => {}
        }
        Registration {
            registry: self.clone(),
            tunnel,
        }
    }

    pub fn for_workload(&self, uid: &str) -> Vec<Arc<InboundTunnel>> {
        self.tunnels
            .locked()
            .values()
            .filter(|t| t.workload_uid == uid)
            .cloned()
            .collect()
    }

    /// Asks every tunnel of `uid` to go away with `cmd`, and every tunnel
    /// accepted for it from now on (their streams cut `hard` after they
    /// register, when set); returns how many tunnels it has now. As for one
    /// tunnel, a later call can only make it stricter.
    pub fn goaway_from_now_on(
        &self,
        uid: &str,
        cmd: GoawayCommand,
        hard: Option<Duration>,
        label: &str,
    ) -> usize {
        let new = StandingGoaway {
            graceful: cmd.graceful,
            hard,
            close_notify: cmd.close_notify,
            label: label.to_owned(),
        };
        self.standing
            .locked()
            .entry(uid.to_owned())
            .and_modify(|prev| {
                *prev = StandingGoaway {
                    graceful: prev.graceful && new.graceful,
                    hard: match (prev.hard, new.hard) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    },
                    close_notify: prev.close_notify || new.close_notify,
                    label: prev.label.clone(),
                }
            })
            .or_insert_with(|| new.clone());
        let tunnels = self.for_workload(uid);
        for t in &tunnels {
            t.request_goaway(cmd, label);
        }
        tunnels.len()
    }

    /// The workload is gone: its tunnels (and any accepted later) are
    /// closed at once, streams reset, with a TLS close_notify; returns how many.
    pub fn close_workload(&self, uid: &str) -> usize {
        let cmd = GoawayCommand {
            graceful: false,
            deadline: Some(Instant::now()),
            issued: Instant::now(),
            close_notify: true,
        };
        self.goaway_from_now_on(uid, cmd, Some(Duration::ZERO), "workload deleted")
    }

    /// The tunnels `uid` has now are closed at once, streams reset, with a
    /// TLS close_notify (its pod's network is gone); tunnels accepted
    /// later are not affected (a re-added pod). Returns how many.
    pub fn close_current(&self, uid: &str, label: &str) -> usize {
        let cmd = GoawayCommand {
            graceful: false,
            deadline: Some(Instant::now()),
            issued: Instant::now(),
            close_notify: true,
        };
        let tunnels = self.for_workload(uid);
        for t in &tunnels {
            t.request_goaway(cmd, label);
        }
        tunnels.len()
    }

    /// Forgets the drains of `uid` (its record is gone).
    pub fn forget(&self, uid: &str) {
        self.standing.locked().remove(uid);
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

    /// Waits until no inbound tunnel is left or `until` passes; returns
    /// how many are still open. A gateway stopping waits here after its
    /// streams: a tunnel told to go away (graceful GOAWAY, RFC 9113 §6.8)
    /// closes once its peer has answered the GOAWAY's PING and the streams
    /// the peer opened before it have ended. A stream the peer sent before
    /// it read the GOAWAY is still served; leaving earlier would reset the
    /// tunnel under it, a failure the peer cannot retry.
    pub async fn wait_closed(&self, until: Instant) -> usize {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            // Registered before the check, so no closing tunnel is missed.
            ended.as_mut().enable();
            if self.is_empty() {
                return 0;
            }
            tokio::select! {
                _ = ended => {}
                _ = tokio::time::sleep_until(until) => return self.len(),
            }
        }
    }

    /// Open streams over all tunnels of `uid`.
    pub fn streams_of(&self, uid: &str) -> usize {
        self.for_workload(uid).iter().map(|t| t.streams()).sum()
    }

    pub fn len(&self) -> usize {
        self.tunnels.locked().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dump(&self) -> Vec<TunnelDump> {
        let now = SystemTime::now();
        self.tunnels
            .locked()
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
