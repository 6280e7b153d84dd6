//! One connection to the node agent: the hello, then one ack per request,
//! in order, each sent after the sink answered. The client never sends
//! anything else, so istio-cni's keepalive probe (a short read every 5 s
//! that treats any received message as a protocol error) never fires.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;

use prost::Message;
use tokio::sync::watch;
use tracing::Instrument;

use super::error::{RequestError, ZdsError};
use super::messages::{Request, Version, WorkloadRequest, WorkloadResponse, ZdsHello};
use super::metrics::{MessageLabels, ZdsMetrics};
use super::sink::{Pod, PodSink, Snapshot};
use super::socket::{Packet, SeqPacket};
use tidegate_base::shutdown::ShutdownWatch;

/// How a connection that was established ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum End {
    /// The node agent closed it.
    Closed,
    /// The gateway is shutting down.
    Shutdown,
}

/// What outlives one connection.
pub(super) struct Shared<S> {
    pub sink: std::sync::Arc<S>,
    /// Uids the sink accepted and has not removed since.
    pub known: BTreeSet<String>,
    pub metrics: ZdsMetrics,
    pub ready: watch::Sender<bool>,
}

pub(super) struct Session<'a, S> {
    sock: SeqPacket,
    shared: &'a mut Shared<S>,
    /// Uids named by add or keep on this connection.
    named: BTreeSet<String>,
    snapshot_sent: bool,
}

impl<'a, S: PodSink> Session<'a, S> {
    pub fn new(sock: SeqPacket, shared: &'a mut Shared<S>) -> Self {
        Session {
            sock,
            shared,
            named: BTreeSet::new(),
            snapshot_sent: false,
        }
    }

    /// Says hello, then serves requests until the agent closes the
    /// connection or `shutdown` fires (checked between requests only: a
    /// sink call in progress is never cancelled).
    pub async fn run(&mut self, shutdown: &mut ShutdownWatch) -> Result<End, ZdsError> {
        let hello = ZdsHello {
            version: Version::V1 as i32,
        };
        self.sock.send(&hello.encode_to_vec()).await?;
        loop {
            let packet = tokio::select! {
                p = self.sock.recv() => p?,
                _ = shutdown.signaled() => return Ok(End::Shutdown),
            };
            let Some(packet) = packet else {
                return Ok(End::Closed);
            };
            let (kind, result) = self.handle(packet).await;
            let labels = MessageLabels {
                kind,
                result: result.as_ref().err().map_or("ok", RequestError::reason),
            };
            self.shared.metrics.messages.get_or_create(&labels).inc();
            if let Err(e) = &result {
                tracing::warn!(kind, error = %e, "ZDS request refused");
            }
            let ack = WorkloadResponse::ack(result.map_err(|e| e.to_string()));
            self.sock.send(&ack.encode_to_vec()).await?;
        }
    }

    /// Whether the agent's snapshot came (`SnapshotSent`) on this connection.
    pub fn got_snapshot(&self) -> bool {
        self.snapshot_sent
    }

    /// Checks and decodes one datagram and hands it to the sink: the
    /// request's type (a metric label) and the ack's result.
    async fn handle(&mut self, packet: Packet) -> (&'static str, Result<(), RequestError>) {
        if packet.truncated {
            return ("invalid", Err(RequestError::TooLong));
        }
        if packet.fds_lost {
            let why = tidegate_base::descriptors::why_lost();
            return ("invalid", Err(RequestError::FdsLost { why }));
        }
        if packet.too_many_fds {
            return ("invalid", Err(RequestError::TooManyFds));
        }
        let request = match WorkloadRequest::decode(&packet.bytes[..]) {
            Ok(WorkloadRequest { payload: Some(r) }) => r,
            Ok(_) => return ("invalid", Err(RequestError::NoPayload)),
            Err(e) => return ("invalid", Err(e.into())),
        };
        let kind = kind_of(&request);
        let span = tracing::debug_span!("zds_request", kind, uid = tracing::field::Empty);
        let result = self.dispatch(request, packet.fds).instrument(span).await;
        (kind, result)
    }

    async fn dispatch(&mut self, request: Request, fds: Vec<OwnedFd>) -> Result<(), RequestError> {
        if !matches!(request, Request::Add(_)) && !fds.is_empty() {
            let kind = proto_name(&request);
            return Err(RequestError::FdCount {
                kind,
                got: fds.len(),
            });
        }
        match request {
            Request::Add(add) => {
                let uid = nonempty(add.uid, "AddWorkload")?;
                tracing::Span::current().record("uid", uid.as_str());
                let info = add
                    .workload_info
                    .ok_or_else(|| RequestError::NoWorkloadInfo { uid: uid.clone() })?;
                self.named.insert(uid.clone());
                let netns = exactly_one(fds)?;
                let pod = Pod {
                    uid: uid.clone(),
                    name: info.name,
                    namespace: info.namespace,
                    service_account: info.service_account,
                };
                sink_result(self.shared.sink.add(pod, netns).await)?;
                self.shared.known.insert(uid);
                Ok(())
            }
            Request::Keep(keep) => self.keep(nonempty(keep.uid, "KeepWorkload")?).await,
            Request::Del(del) => self.del(nonempty(del.uid, "DelWorkload")?).await,
            Request::SnapshotSent(_) => self.snapshot_sent().await,
        }
    }

    async fn keep(&mut self, uid: String) -> Result<(), RequestError> {
        tracing::Span::current().record("uid", uid.as_str());
        if self.snapshot_sent {
            return Err(RequestError::KeepAfterSnapshot { uid });
        }
        self.named.insert(uid.clone());
        sink_result(self.shared.sink.keep(&uid).await)?;
        self.shared.known.insert(uid);
        Ok(())
    }

    async fn del(&mut self, uid: String) -> Result<(), RequestError> {
        tracing::Span::current().record("uid", uid.as_str());
        self.named.remove(&uid);
        sink_result(self.shared.sink.del(&uid).await)?;
        self.shared.known.remove(&uid);
        Ok(())
    }

    async fn snapshot_sent(&mut self) -> Result<(), RequestError> {
        if self.snapshot_sent {
            return Err(RequestError::SnapshotTwice);
        }
        self.snapshot_sent = true;
        let snapshot = Snapshot {
            named: self.named.clone(),
            gone: self.shared.known.difference(&self.named).cloned().collect(),
        };
        tracing::info!(
            named = snapshot.named.len(),
            gone = snapshot.gone.len(),
            "ZDS snapshot received"
        );
        sink_result(self.shared.sink.snapshot_done(&snapshot).await)?;
        self.shared.known.retain(|uid| !snapshot.gone.contains(uid));
        self.shared.metrics.ready.set(1);
        self.shared.ready.send_replace(true);
        Ok(())
    }
}

fn kind_of(request: &Request) -> &'static str {
    match request {
        Request::Add(_) => "add",
        Request::Keep(_) => "keep",
        Request::Del(_) => "del",
        Request::SnapshotSent(_) => "snapshot_sent",
    }
}

fn proto_name(request: &Request) -> &'static str {
    match request {
        Request::Add(_) => "AddWorkload",
        Request::Keep(_) => "KeepWorkload",
        Request::Del(_) => "DelWorkload",
        Request::SnapshotSent(_) => "SnapshotSent",
    }
}

fn nonempty(uid: String, kind: &'static str) -> Result<String, RequestError> {
    if uid.is_empty() {
        Err(RequestError::NoUid { kind })
    } else {
        Ok(uid)
    }
}

/// The namespace of an `AddWorkload`: exactly one descriptor (extra ones are closed on return).
fn exactly_one(mut fds: Vec<OwnedFd>) -> Result<OwnedFd, RequestError> {
    match fds.len() {
        1 => Ok(fds.remove(0)),
        got => Err(RequestError::FdCount {
            kind: "AddWorkload",
            got,
        }),
    }
}

fn sink_result<E: std::error::Error + Send + Sync + 'static>(
    r: Result<(), E>,
) -> Result<(), RequestError> {
    r.map_err(|e| RequestError::Sink(Box::new(e)))
}
