//! The node-local Unix socket `tidegate-cni` talks to on CNI DEL: one JSON
//! line in (`{"command": "teardown", "uid": …}`), one JSON line out once the
//! teardown is acknowledged (after the policy's hold, if any).
//!
//! Limits: a request line is at most [`MAX_LINE`] bytes and must arrive
//! within `control_plane.cni_read_timeout`; at most
//! `control_plane.cni_max_connections` connections are open at once (beyond
//! it a connection is closed at once). A line too long, not UTF-8 or not a
//! request is answered `{"result": "bad-request", "error": …}` and the
//! connection closed. Each refusal is counted in
//! `tidegate_control_refusals_total{listener="cni"}`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::debug;

use super::{DrainEngine, Lifecycle, Trigger};
use crate::control_plane::ConnLimit;
use crate::shutdown::ShutdownWatch;

/// The longest request line accepted (a real one is a few hundred bytes).
pub const MAX_LINE: usize = 64 << 10;

/// A teardown request as `tidegate-cni` sends it.
#[derive(Debug, Deserialize)]
pub struct Request {
    pub command: String,
    pub uid: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
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

/// Serves teardown requests until drained.
pub async fn serve(
    listener: UnixListener,
    engine: Arc<DrainEngine>,
    limits: CniLimits,
    mut drain: ShutdownWatch,
) {
    loop {
        let stream = tokio::select! {
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    limits.connections.accept_failed(&e).await;
                    continue;
                }
            },
            _ = drain.signaled() => return,
        };
        let Some(slot) = limits.connections.admit() else {
            debug!("cni socket over capacity: connection closed");
            continue;
        };
        let engine = engine.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            let _slot = slot;
            handle(stream, engine, &limits).await
        });
    }
}

/// Why a request line was refused: the metric reason and the answer's error.
#[derive(Debug)]
pub struct Refused(pub &'static str, pub String);

/// Reads and parses one teardown request; `Ok(None)`: the peer closed
/// without sending one. Public for the fuzz target.
pub async fn read_teardown<R: tokio::io::AsyncRead + Unpin>(
    r: R,
    timeout: Duration,
) -> Result<Option<Request>, Refused> {
    let line = read_request(r, timeout).await?;
    if line.is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<Request>(&line) {
        Err(e) => Err(Refused("bad_request", e.to_string())),
        Ok(req) if req.command != "teardown" => Err(Refused(
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

async fn handle(stream: UnixStream, engine: Arc<DrainEngine>, limits: &CniLimits) {
    let (r, mut w) = stream.into_split();
    let req = match read_teardown(r, limits.read_timeout).await {
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
    debug!(uid = %req.uid, namespace = %req.namespace, name = %req.name, "CNI DEL");
    let answer = match engine
        .on_lifecycle(&req.uid, Lifecycle::Teardown, Trigger::Cni)
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
    let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

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
