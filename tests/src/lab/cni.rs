//! CNI DEL through the real `tidegate-cni` binary, as the container runtime
//! runs it when the pod's last container has exited: the CNI environment,
//! the network configuration on stdin (the gateway's socket, `timeout_ms`).

use std::path::Path;
use std::time::{Duration, Instant};

use super::gateway::sibling_binary;
use super::LabError;

/// What DEL did.
#[derive(Debug)]
pub struct CniDel {
    pub took: Duration,
    pub success: bool,
    /// Whether the gateway acknowledged the teardown (stderr says "drained",
    /// not "not drained", and the gateway knew the pod).
    pub acknowledged: bool,
    /// The gateway answered that it knows no workload of the pod's uid.
    pub unknown: bool,
    pub stderr: String,
}

/// Runs DEL for pod `name` (`uid`) of namespace `lab` against `socket`;
/// returns when the plugin exits (it bounds itself at `timeout`; the lab
/// adds 5 s before giving up).
pub async fn del(
    socket: &Path,
    name: &str,
    uid: &str,
    timeout: Duration,
) -> Result<CniDel, LabError> {
    let bin = sibling_binary("tidegate-cni")?;
    let conf = crate::cni::del_conf(socket, timeout.as_millis());
    let (name, uid) = (name.to_owned(), uid.to_owned());
    let started = Instant::now();
    let run = tokio::task::spawn_blocking(move || {
        let child = crate::cni::spawn_del(&bin, "lab", &name, &uid, &conf)
            .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
        child.wait_with_output().map_err(|e| e.to_string())
    });
    let out = match tokio::time::timeout(timeout + Duration::from_secs(5), run).await {
        Ok(Ok(Ok(out))) => out,
        Ok(Ok(Err(e))) => return Err(LabError::Setup(format!("tidegate-cni DEL: {e}"))),
        Ok(Err(e)) => return Err(LabError::Setup(format!("tidegate-cni DEL: {e}"))),
        Err(_) => {
            return Err(LabError::Timeout(format!(
                "tidegate-cni DEL to return within its timeout ({timeout:?}) + 5 s"
            )))
        }
    };
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    let unknown = stderr.contains("unknown-workload");
    Ok(CniDel {
        took,
        success: out.status.success(),
        acknowledged: stderr.contains("drained") && !stderr.contains("not drained") && !unknown,
        unknown,
        stderr,
    })
}
