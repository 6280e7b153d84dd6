//! Running the real `tidegate-cni` binary as a container runtime does: the
//! CNI environment, and the network configuration on stdin.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;

/// `target/<profile>/tidegate-cni`, next to the directory of the running
/// test executable (`target/<profile>/deps`); built once if missing.
pub fn binary() -> PathBuf {
    static BUILT: Mutex<()> = Mutex::new(());
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps");
    let bin = profile_dir.join("tidegate-cni");
    let _once = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !bin.exists() {
        let out = Command::new(env!("CARGO"))
            .args(["build", "-p", "tidegate-cni"])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .output()
            .expect("run cargo build for tidegate-cni");
        assert!(
            out.status.success(),
            "cargo build -p tidegate-cni failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(bin.exists(), "{} missing after the build", bin.display());
    bin
}

/// A chained plugin's network configuration in in-pod mode: the gateway's
/// socket, the state directory, and a previous result naming the pod's address.
pub fn inpod_conf(socket: &Path, state_dir: &Path, pod_ip: std::net::IpAddr) -> String {
    format!(
        r#"{{"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "tidegate-cni",
            "socket": "{}", "timeout_ms": 10000, "capture": "inpod", "state_dir": "{}",
            "prevResult": {{"cniVersion": "1.0.0", "interfaces": [{{"name": "eth0"}}],
                            "ips": [{{"address": "{pod_ip}/24", "interface": 0}}]}}}}"#,
        socket.display(),
        state_dir.display()
    )
}

/// A pod as the runtime names it to the plugin.
#[derive(Clone, Debug)]
pub struct CniPod<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
    /// `CNI_NETNS`.
    pub netns: &'a str,
}

/// Starts `bin` for `command` (ADD, DEL, …) on `pod` with `conf` on its
/// stdin (then closed), in the namespace of the calling thread (a runtime
/// runs plugins in the node's); stdout and stderr are piped.
pub fn spawn(bin: &Path, command: &str, pod: &CniPod<'_>, conf: &str) -> std::io::Result<Child> {
    spawn_with_env(bin, command, pod, conf, &[])
}

/// [`spawn`] with more environment variables (`PATH`, to put stand-in
/// tools first).
pub fn spawn_with_env(
    bin: &Path,
    command: &str,
    pod: &CniPod<'_>,
    conf: &str,
    env: &[(&str, &str)],
) -> std::io::Result<Child> {
    let args = format!(
        "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_UID={}",
        pod.namespace, pod.name, pod.uid
    );
    let mut child = Command::new(bin)
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "c0ffee")
        .env("CNI_NETNS", pod.netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/opt/cni/bin")
        .env("CNI_ARGS", args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(conf.as_bytes())?;
    }
    Ok(child)
}

/// [`spawn`], to completion.
pub fn run(bin: &Path, command: &str, pod: &CniPod<'_>, conf: &str) -> std::io::Result<Output> {
    spawn(bin, command, pod, conf)?.wait_with_output()
}

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
    let pod = CniPod {
        namespace,
        name,
        uid,
        netns: "/var/run/netns/none",
    };
    spawn(bin, "DEL", &pod, conf)
}
