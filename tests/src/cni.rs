//! Running the real `tidegate-cni` binary as a container runtime does: the
//! CNI environment, and the network configuration on stdin.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A chained plugin's network configuration for DEL: the gateway's socket,
/// `timeout_ms`, and a previous result.
pub fn del_conf(socket: &Path, timeout_ms: u128) -> String {
    format!(
        r#"{{"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "tidegate-cni",
            "socket": "{}", "timeout_ms": {timeout_ms},
            "prevResult": {{"cniVersion": "1.0.0", "interfaces": [{{"name": "eth0"}}]}}}}"#,
        socket.display()
    )
}

/// Starts `bin` for DEL of pod `namespace/name` (`uid`) with `conf` on its
/// stdin (then closed); stdout and stderr are piped.
pub fn spawn_del(
    bin: &Path,
    namespace: &str,
    name: &str,
    uid: &str,
    conf: &str,
) -> std::io::Result<Child> {
    let args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};K8S_POD_UID={uid}"
    );
    let mut child = Command::new(bin)
        .env("CNI_COMMAND", "DEL")
        .env("CNI_CONTAINERID", "c0ffee")
        .env("CNI_NETNS", "/var/run/netns/none")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/opt/cni/bin")
        .env("CNI_ARGS", args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(conf.as_bytes())?;
    }
    Ok(child)
}
