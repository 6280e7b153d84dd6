//! The node-local Unix socket `tidegate-cni` talks to on CNI DEL: one JSON
//! line in (`{"command": "teardown", "uid": …}`), one JSON line out once the
//! teardown is acknowledged (after the policy's hold, if any).

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, warn};

use super::{DrainEngine, Lifecycle, Trigger};
use crate::shutdown::ShutdownWatch;

#[derive(Debug, Deserialize)]
struct Request {
    command: String,
    uid: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
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
pub async fn serve(listener: UnixListener, engine: Arc<DrainEngine>, mut drain: ShutdownWatch) {
    loop {
        let stream = tokio::select! {
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    warn!(error = %e, "cni socket accept failed");
                    continue;
                }
            },
            _ = drain.signaled() => return,
        };
        let engine = engine.clone();
        tokio::spawn(async move { handle(stream, engine).await });
    }
}

async fn handle(stream: UnixStream, engine: Arc<DrainEngine>) {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    if BufReader::new(r).read_line(&mut line).await.is_err() {
        return;
    }
    let answer = match serde_json::from_str::<Request>(&line) {
        Err(e) => json!({"result": "bad-request", "error": e.to_string()}),
        Ok(req) if req.command != "teardown" => {
            json!({"result": "bad-request", "error": format!("unknown command {:?}", req.command)})
        }
        Ok(req) => {
            debug!(uid = %req.uid, namespace = %req.namespace, name = %req.name, "CNI DEL");
            match engine
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
            }
        }
    };
    let _ = w.write_all(format!("{answer}\n").as_bytes()).await;
}
