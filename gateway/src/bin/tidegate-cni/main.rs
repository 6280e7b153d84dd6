//! `tidegate-cni`: a chained CNI plugin (CNI spec 1.x).
//!
//! - ADD and CHECK pass the previous result through untouched.
//! - DEL asks the node's tidegate over its Unix socket to tear down the pod
//!   (`K8S_POD_UID` from `CNI_ARGS`) and waits for the acknowledgement — the
//!   gateway holds it while the pod's tunnels drain — bounded by `timeout_ms`
//!   (default 10 s, well under the kubelet's runtime request timeout). A
//!   gateway that is down or slow never blocks pod deletion beyond the bound:
//!   DEL then succeeds and says why on stderr.
//! - VERSION answers the versions this plugin supports.
//! - Outside the runtime (no `CNI_COMMAND`), `tidegate-cni install` and
//!   `tidegate-cni uninstall` put the plugin on the node and chain it into
//!   the primary network configuration (see [`install`]).
//!
//! Network configuration keys of our own: `socket` (default
//! `/var/run/tidegate/cni.sock`) and `timeout_ms`.
//!
//! Deliberately standalone (std + serde_json): it runs on the host for every
//! pod deletion and must stay small and quick.

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod install;

const SUPPORTED: [&str; 6] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "1.1.1"];
const DEFAULT_SOCKET: &str = "/var/run/tidegate/cni.sock";
const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// A CNI error: printed as the spec's error object, exit code 1.
struct CniError {
    code: u32,
    msg: String,
    details: String,
}

fn err(code: u32, msg: &str, details: impl Into<String>) -> CniError {
    CniError {
        code,
        msg: msg.to_owned(),
        details: details.into(),
    }
}

fn main() -> ExitCode {
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if command.is_empty() {
        if let Some(sub @ ("install" | "uninstall")) = args.first().map(String::as_str) {
            return install::main(sub, &args[1..]);
        }
    }
    let mut stdin = String::new();
    if command != "VERSION" {
        let _ = std::io::stdin().read_to_string(&mut stdin);
    }
    let version = serde_json::from_str::<Value>(&stdin)
        .ok()
        .and_then(|c| {
            c.get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "1.0.0".into());
    match run(&command, &stdin) {
        Ok(Some(out)) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            println!(
                "{}",
                json!({"cniVersion": version, "code": e.code, "msg": e.msg, "details": e.details})
            );
            ExitCode::FAILURE
        }
    }
}

fn run(command: &str, stdin: &str) -> Result<Option<String>, CniError> {
    if command == "VERSION" {
        return Ok(Some(
            json!({"cniVersion": "1.1.0", "supportedVersions": SUPPORTED}).to_string(),
        ));
    }
    let conf: Value = serde_json::from_str(stdin)
        .map_err(|e| err(6, "failed to decode network configuration", e.to_string()))?;
    let version = conf
        .get("cniVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| err(1, "incompatible CNI version", "cniVersion is missing"))?;
    if !SUPPORTED.contains(&version) {
        return Err(err(
            1,
            "incompatible CNI version",
            format!("{version} is not one of {}", SUPPORTED.join(", ")),
        ));
    }
    match command {
        "ADD" | "CHECK" => {
            let prev = conf.get("prevResult").ok_or_else(|| {
                err(
                    7,
                    "tidegate-cni is a chained plugin",
                    "no prevResult: list it after the plugin that sets up the network",
                )
            })?;
            if command == "ADD" {
                // Untouched, with the configured version.
                let mut out = prev.clone();
                if let Some(o) = out.as_object_mut() {
                    o.insert("cniVersion".into(), Value::String(version.to_owned()));
                }
                Ok(Some(out.to_string()))
            } else {
                Ok(None)
            }
        }
        "DEL" => {
            delete(&conf);
            Ok(None)
        }
        "GC" | "STATUS" => Ok(None),
        "" => Err(err(
            4,
            "invalid environment variables",
            "CNI_COMMAND is not set",
        )),
        other => Err(err(
            4,
            "invalid environment variables",
            format!("unknown CNI_COMMAND {other:?}"),
        )),
    }
}

/// `K8S_POD_UID=…;K8S_POD_NAMESPACE=…` → the value of `key`.
fn cni_arg(key: &str) -> Option<String> {
    let args = std::env::var("CNI_ARGS").ok()?;
    args.split(';')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_owned())
}

/// Asks the gateway to drain the pod; never fails the DEL.
fn delete(conf: &Value) {
    let Some(uid) = cni_arg("K8S_POD_UID") else {
        eprintln!("tidegate-cni: DEL without K8S_POD_UID in CNI_ARGS; nothing to drain");
        return;
    };
    let socket = conf
        .get("socket")
        .and_then(Value::as_str)
        .unwrap_or(DEFAULT_SOCKET);
    let timeout = Duration::from_millis(
        conf.get("timeout_ms")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_TIMEOUT_MS),
    );
    let request = json!({
        "command": "teardown",
        "uid": uid,
        "namespace": cni_arg("K8S_POD_NAMESPACE").unwrap_or_default(),
        "name": cni_arg("K8S_POD_NAME").unwrap_or_default(),
        "container_id": std::env::var("CNI_CONTAINERID").unwrap_or_default(),
    });
    let started = Instant::now();
    match ask(socket, &request, timeout) {
        Ok(ack) => eprintln!(
            "tidegate-cni: pod {uid} drained: {ack} ({} ms)",
            started.elapsed().as_millis()
        ),
        Err(e) => eprintln!(
            "tidegate-cni: pod {uid} not drained, deletion goes on: {e} (after {} ms; socket {socket})",
            started.elapsed().as_millis()
        ),
    }
}

fn ask(socket: &str, request: &Value, timeout: Duration) -> std::io::Result<String> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_write_timeout(Some(timeout))?;
    stream.set_read_timeout(Some(timeout))?;
    writeln!(stream, "{request}")?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    if line.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the gateway closed the connection without an acknowledgement",
        ));
    }
    Ok(line.trim().to_owned())
}
