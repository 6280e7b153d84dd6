//! CNI DEL through the real `tidegate-cni` binary, as the container runtime
//! runs it when the pod's last container has exited: the CNI environment,
//! the network configuration on stdin (the gateway's socket, `timeout_ms`).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::gateway::sibling_binary;
use super::LabError;

/// What DEL did.
#[derive(Debug)]
pub struct CniDel {
    pub took: Duration,
    pub success: bool,
    /// Whether the gateway acknowledged the teardown (stderr says "drained",
    /// not "not drained").
    pub acknowledged: bool,
    pub stderr: String,
}

/// Runs DEL for pod `uid` against `socket`; returns when the plugin exits
/// (it bounds itself at `timeout`; the lab adds 5 s before giving up).
pub async fn del(socket: &Path, uid: &str, timeout: Duration) -> Result<CniDel, LabError> {
    let bin = sibling_binary("tidegate-cni")?;
    let conf = format!(
        r#"{{"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "tidegate-cni",
            "socket": "{}", "timeout_ms": {},
            "prevResult": {{"cniVersion": "1.0.0", "interfaces": [{{"name": "eth0"}}]}}}}"#,
        socket.display(),
        timeout.as_millis()
    );
    let args =
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=lab;K8S_POD_NAME=server-old;K8S_POD_UID={uid}");
    let started = Instant::now();
    let run = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(&bin)
            .env("CNI_COMMAND", "DEL")
            .env("CNI_CONTAINERID", "lab")
            .env("CNI_NETNS", "/var/run/netns/none")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/opt/cni/bin")
            .env("CNI_ARGS", args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(conf.as_bytes())
                .map_err(|e| e.to_string())?;
        }
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
    Ok(CniDel {
        took,
        success: out.status.success(),
        acknowledged: stderr.contains("drained") && !stderr.contains("not drained"),
        stderr,
    })
}
