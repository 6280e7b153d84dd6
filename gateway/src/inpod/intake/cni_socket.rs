//! The node-local Unix socket `tidegate-cni` talks to, a way pods come in:
//! one JSON line in, one JSON line out.
//!
//! - CNI DEL: `{"command": "teardown", "uid": …, "namespace": …, "name":
//!   …}`, answered once the teardown is acknowledged (after the policy's
//!   hold, if any); in in-pod mode the pod's own listeners then close. The
//!   workload is the one of that uid, else the one local workload of that
//!   namespace and name (istiod's workloads are not keyed by the pod's uid).
//!   The drain is the engine's ([`crate::drains`]); the pod's removal the
//!   intake's.
//! - CNI ADD (in-pod mode): `{"command": "add", "uid": …, "name": …,
//!   "namespace": …, "netns": <path>}` with the pod's network namespace
//!   attached as one `SCM_RIGHTS` descriptor, handed to the [`PodIntake`].
//!   The pod's mesh membership decides
//!   ([`crate::workloads::membership`]): a member is answered
//!   `{"result": "added"}` (or `"unchanged"` for a repeated ADD) once its
//!   listeners are up; a pod that is not one `{"result": "not-member",
//!   "reason": …}` (not served; the plugin captures nothing); a pod whose
//!   membership is unknown, or that could not be served, `{"result":
//!   "error", "error": …}`.
//!
//! Limits: a request line is at most [`MAX_LINE`] bytes and must arrive
//! within `control_plane.cni_read_timeout`; at most
//! `control_plane.cni_max_connections` connections are open at once (beyond
//! it a connection is closed at once). A line too long, not UTF-8 or not a
//! request is answered `{"result": "bad-request", "error": …}` and the
//! connection closed. Each refusal is counted in
//! `tidegate_control_refusals_total{listener="cni"}`.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tidegate_control::limits::ConnLimit;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, info, warn};

use super::{PodIntake, Removal, Source, Taken};
use crate::drains::{DrainEngine, Lifecycle, Trigger};
use crate::inpod::pods::PodMeta;
use tidegate_base::shutdown::ShutdownWatch;

/// The longest request line accepted (a real one is a few hundred bytes).
pub const MAX_LINE: usize = 64 << 10;

/// A request as `tidegate-cni` sends it.
#[derive(Debug, Deserialize)]
pub struct Request {
    pub command: String,
    pub uid: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    /// `add`: the namespace's path (`CNI_NETNS`), logged (the plugin keeps
    /// the record for re-adoption).
    #[serde(default)]
    pub netns: String,
}

/// The CNI socket's connection cap and read timeout (`control_plane.cni_*`).
#[derive(Clone, Debug)]
pub struct CniLimits {
    pub connections: ConnLimit,
    pub read_timeout: Duration,
}

/// Binds the socket (replacing a stale one).
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path)
}

/// Serves requests until drained.
/// Without `pods`, `add` is refused: the gateway is in node mode.
pub async fn serve<I: PodIntake>(
    listener: UnixListener,
    engine: Arc<DrainEngine>,
    pods: Option<Arc<I>>,
    limits: CniLimits,
    mut drain: ShutdownWatch,
) {
    loop {
        let accepted = limits.connections.accept(|| listener.accept(), &mut drain);
        let Some((stream, _)) = accepted.await else {
            return;
        };
        let Some(slot) = limits.connections.admit() else {
            debug!("cni socket over capacity: connection closed");
            continue;
        };
        let engine = engine.clone();
        let limits = limits.clone();
        let pods = pods.clone();
        tokio::spawn(async move {
            let _slot = slot;
            handle(stream, engine, pods, &limits).await
        });
    }
}

/// Why a request line was refused: the metric reason and the answer's error.
#[derive(Debug)]
pub struct Refused(pub &'static str, pub String);

/// Reads and parses one request; `Ok(None)`: the peer closed without
/// sending one. Public for the fuzz target.
pub async fn read_command<R: tokio::io::AsyncRead + Unpin>(
    r: R,
    timeout: Duration,
) -> Result<Option<Request>, Refused> {
    let line = read_request(r, timeout).await?;
    if line.is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<Request>(&line) {
        Err(e) => Err(Refused("bad_request", e.to_string())),
        Ok(req) if req.command != "teardown" && req.command != "add" => Err(Refused(
            "bad_request",
            format!("unknown command {:?}", req.command),
        )),
        Ok(req) => Ok(Some(req)),
    }
}

/// Reads one request line: at most [`MAX_LINE`] bytes, within `timeout`, UTF-8.
async fn read_request<R: tokio::io::AsyncRead + Unpin>(
    r: R,
    timeout: Duration,
) -> Result<String, Refused> {
    let mut line = Vec::new();
    let mut bounded = BufReader::new(r).take(MAX_LINE as u64 + 1);
    match tokio::time::timeout(timeout, bounded.read_until(b'\n', &mut line)).await {
        Err(_) => {
            return Err(Refused(
                "read_timeout",
                format!("no complete request line within {} ms", timeout.as_millis()),
            ))
        }
        Ok(Err(e)) => return Err(Refused("bad_request", format!("reading the request: {e}"))),
        Ok(Ok(_)) => {}
    }
    if line.len() > MAX_LINE {
        return Err(Refused(
            "line_too_long",
            format!("request line longer than {MAX_LINE} bytes"),
        ));
    }
    String::from_utf8(line).map_err(|_| Refused("bad_request", "request line is not UTF-8".into()))
}

async fn handle<I: PodIntake>(
    stream: UnixStream,
    engine: Arc<DrainEngine>,
    pods: Option<Arc<I>>,
    limits: &CniLimits,
) {
    // An `add` carries the pod's namespace with its first bytes.
    let first = tokio::time::timeout(limits.read_timeout, recv_with_fds(&stream)).await;
    let (head, fds) = match first {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => return debug!(error = %e, "cni socket: reading the request failed"),
        // Silent: the line reader below times out and answers why.
        Err(_) => (Vec::new(), Attached::default()),
    };
    let (r, mut w) = stream.into_split();
    let req = match read_command(std::io::Cursor::new(head).chain(r), limits.read_timeout).await {
        Ok(None) => return, // closed without a request
        Ok(Some(req)) => req,
        Err(Refused(reason, error)) => {
            limits.connections.refused(reason);
            debug!(reason, %error, "cni request refused");
            let answer = json!({"result": "bad-request", "error": error});
            let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
            return;
        }
    };
    let answer = match req.command.as_str() {
        "add" => add(req, fds, pods.as_deref()).await,
        _ => teardown(req, &engine, pods.as_deref()).await,
    };
    let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
}

async fn add<I: PodIntake>(req: Request, fds: Attached, pods: Option<&I>) -> serde_json::Value {
    let error = |e: String| {
        warn!(uid = %req.uid, error = %e, "CNI ADD refused");
        json!({"result": "error", "error": e})
    };
    let Some(pods) = pods else {
        return error(
            "this gateway is in node capture mode (`capture.mode: node`); it takes no pods".into(),
        );
    };
    let netns = match fds.netns() {
        Ok(fd) => fd,
        Err(e) => return error(e),
    };
    info!(uid = %req.uid, namespace = %req.namespace, name = %req.name, netns = %req.netns, "CNI ADD");
    let pod = PodMeta {
        uid: req.uid.clone(),
        name: req.name.clone(),
        namespace: req.namespace.clone(),
        service_account: None,
        source: Source::Cni,
    };
    match pods.add(pod, netns).await {
        Taken::Served(result) => json!({"result": result}),
        Taken::NotMember(reason) => {
            info!(uid = %req.uid, reason, "CNI ADD: not a mesh member; not captured");
            json!({"result": "not-member", "reason": reason})
        }
        Taken::Failed(e) => error(e.to_string()),
    }
}

async fn teardown<I: PodIntake>(
    req: Request,
    engine: &Arc<DrainEngine>,
    pods: Option<&I>,
) -> serde_json::Value {
    // The pod's uid, or the workload discovery holds under another
    // (istiod's `<cluster>//Pod/<ns>/<name>`).
    let workload = engine.workload_of_pod(&req.uid, &req.namespace, &req.name);
    debug!(uid = %req.uid, namespace = %req.namespace, name = %req.name, %workload, "CNI DEL");
    let answer = match engine
        .on_lifecycle(&workload, Lifecycle::Teardown, Trigger::Cni)
        .await
    {
        Ok(outcome) => json!({
            "result": outcome.teardown.as_ref().map(|t| t.result).unwrap_or("no-hold"),
            "held_ms": outcome.teardown.as_ref().map(|t| t.held_ms).unwrap_or(0),
            "policy": outcome.policy,
            "actions": outcome.actions,
        }),
        // Not ours (another node, or never known): nothing to hold.
        Err(e) => json!({"result": "unknown-workload", "error": e.to_string()}),
    };
    // The hold is over: the pod's own listeners go (in-pod mode).
    if let Some(pods) = pods {
        let how = Removal::Drained {
            namespace: &req.namespace,
            name: &req.name,
        };
        pods.remove(&req.uid, how).await;
    }
    answer
}

/// The descriptors that came with a request.
#[derive(Debug, Default)]
struct Attached {
    fds: Vec<OwnedFd>,
    /// Some could not be received: the descriptor table was full.
    lost: bool,
}

impl Attached {
    /// An add's namespace: exactly one descriptor, received.
    fn netns(mut self) -> Result<OwnedFd, String> {
        if self.lost {
            return Err(format!(
                "the pod's network namespace descriptor could not be received: {}",
                tidegate_base::descriptors::why_lost()
            ));
        }
        match (self.fds.pop(), self.fds.is_empty()) {
            (Some(fd), true) => Ok(fd),
            _ => Err(
                "an add must carry exactly one network namespace descriptor (SCM_RIGHTS)".into(),
            ),
        }
    }
}

/// The first bytes on the connection and the descriptors sent with them.
async fn recv_with_fds(stream: &UnixStream) -> std::io::Result<(Vec<u8>, Attached)> {
    stream
        .async_io(tokio::io::Interest::READABLE, || {
            let mut buf = vec![0u8; 4096];
            let got = tidegate_base::fd_passing::recv_with_fds(stream, &mut buf)?;
            buf.truncate(got.bytes);
            let lost = got.fds_lost;
            Ok((buf, Attached { fds: got.fds, lost }))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_add_needs_one_received_descriptor_and_a_lost_one_is_named() {
        let null = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let one = Attached {
            fds: vec![null()],
            lost: false,
        };
        assert!(one.netns().is_ok());
        for fds in [vec![], vec![null(), null()]] {
            let e = Attached { fds, lost: false }.netns().unwrap_err();
            assert!(
                e.contains("exactly one network namespace descriptor"),
                "{e}"
            );
        }
        let e = Attached {
            fds: vec![],
            lost: true,
        }
        .netns()
        .unwrap_err();
        assert!(
            e.starts_with("the pod's network namespace descriptor could not be received: "),
            "{e}"
        );
        assert!(!e.contains("exactly one"), "{e}");
    }

    #[tokio::test]
    async fn request_lines_are_bounded_timed_and_utf8() {
        let ok = read_request(&b"{\"a\": 1}\nrest"[..], Duration::from_secs(5)).await;
        assert_eq!(ok.ok().as_deref(), Some("{\"a\": 1}\n"));
        let long = vec![b'x'; MAX_LINE + 10];
        let Err(Refused(reason, error)) = read_request(&long[..], Duration::from_secs(5)).await
        else {
            panic!("a long line must be refused")
        };
        assert_eq!(reason, "line_too_long");
        assert!(error.contains("65536"), "{error}");
        // Exactly MAX_LINE bytes with the newline is accepted.
        let mut edge = vec![b' '; MAX_LINE - 1];
        edge.push(b'\n');
        assert!(read_request(&edge[..], Duration::from_secs(5))
            .await
            .is_ok());
        let Err(Refused(reason, _)) =
            read_request(&b"\xff\xfe\n"[..], Duration::from_secs(5)).await
        else {
            panic!("non-UTF-8 must be refused")
        };
        assert_eq!(reason, "bad_request");
        let (_client, server) = tokio::io::duplex(64);
        let Err(Refused(reason, _)) = read_request(server, Duration::from_millis(20)).await else {
            panic!("a silent peer must time out")
        };
        assert_eq!(reason, "read_timeout");
    }
}
