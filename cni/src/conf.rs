//! What `tidegate-cni` reads: the network configuration on stdin (with the
//! CNI command) and the gateway's acknowledgement line. Pure and
//! standalone (std + serde_json), so the fuzz target `cni_stdin` includes
//! this file as it is.

use std::time::Duration;

use serde_json::{json, Value};

pub const SUPPORTED: [&str; 6] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "1.1.1"];
pub const DEFAULT_SOCKET: &str = "/var/run/tidegate/cni.sock";
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_STATE_DIR: &str = "/var/run/tidegate/pods";
/// The longest `timeout_ms`: past the kubelet's runtime request timeout (2 min)
/// the wait is cut anyway.
pub const MAX_TIMEOUT_MS: u64 = 120_000;
/// The longest acknowledgement line (a real one is a few hundred bytes).
pub const MAX_ACK: usize = 64 << 10;

/// A CNI error: printed as the spec's error object, exit code 1.
#[derive(Debug)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

pub fn err(code: u32, msg: &str, details: impl Into<String>) -> CniError {
    CniError {
        code,
        msg: msg.to_owned(),
        details: details.into(),
    }
}

/// What a command asks of the plugin.
#[derive(Debug)]
pub enum Parsed {
    /// VERSION: the answer.
    Version(String),
    /// ADD: the previous result with the configured version, to print, and
    /// what enrolling the pod needs (in-pod capture).
    Add(String, Enroll),
    /// DEL: drain through the gateway's socket.
    Del(OurKeys),
    /// CHECK, GC, STATUS: nothing to print.
    Nothing,
}

/// Reads `stdin` for `command` (CNI spec 1.x): errors carry the spec's codes.
pub fn parse(command: &str, stdin: &str) -> Result<Parsed, CniError> {
    if command == "VERSION" {
        return Ok(Parsed::Version(
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
    let ours = our_keys(&conf)?;
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
                let enroll = Enroll {
                    pod_ips: prev_ips(prev),
                    ours,
                };
                Ok(Parsed::Add(out.to_string(), enroll))
            } else {
                Ok(Parsed::Nothing)
            }
        }
        "DEL" => Ok(Parsed::Del(ours)),
        "GC" | "STATUS" => Ok(Parsed::Nothing),
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

/// Our keys of the network configuration.
#[derive(Debug)]
pub struct OurKeys {
    pub socket: String,
    pub timeout: Duration,
    /// `capture: inpod`: ADD enrolls the pod (capture rules inside it, its
    /// namespace handed to the gateway); `node` (the default): ADD passes
    /// the result through.
    pub inpod: bool,
    /// `state_dir`: where each enrolled pod is recorded for the gateway.
    pub state_dir: String,
}

/// What ADD needs to enroll a pod.
#[derive(Debug)]
pub struct Enroll {
    pub ours: OurKeys,
    /// The pod's addresses from `prevResult.ips` (probe SNAT on the node).
    pub pod_ips: Vec<std::net::IpAddr>,
}

/// `prevResult.ips[].address` (`10.0.1.2/24`) → the addresses.
fn prev_ips(prev: &Value) -> Vec<std::net::IpAddr> {
    prev.get("ips")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.get("address")?.as_str()?.split('/').next()?.parse().ok())
        .collect()
}

fn invalid_key(key: &str, value: &Value, accepted: &str) -> CniError {
    err(
        7,
        "invalid network configuration",
        format!("`{key}`: {value} is not {accepted}"),
    )
}

/// `socket` and `timeout_ms`: defaults when absent, an error naming the key
/// when present and invalid.
fn our_keys(conf: &Value) -> Result<OurKeys, CniError> {
    let socket = match conf.get("socket") {
        None => DEFAULT_SOCKET.to_owned(),
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(v) => return Err(invalid_key("socket", v, "a socket path")),
    };
    let timeout_ms = match conf.get("timeout_ms") {
        None => DEFAULT_TIMEOUT_MS,
        Some(v) => v
            .as_u64()
            .filter(|t| (1..=MAX_TIMEOUT_MS).contains(t))
            .ok_or_else(|| {
                invalid_key(
                    "timeout_ms",
                    v,
                    &format!("a number of milliseconds from 1 to {MAX_TIMEOUT_MS}"),
                )
            })?,
    };
    let inpod = match conf.get("capture") {
        None => false,
        Some(Value::String(s)) if s == "node" => false,
        Some(Value::String(s)) if s == "inpod" => true,
        Some(v) => return Err(invalid_key("capture", v, "\"node\" or \"inpod\"")),
    };
    let state_dir = match conf.get("state_dir") {
        None => DEFAULT_STATE_DIR.to_owned(),
        Some(Value::String(s)) if s.starts_with('/') => s.clone(),
        Some(v) => return Err(invalid_key("state_dir", v, "an absolute directory path")),
    };
    Ok(OurKeys {
        socket,
        timeout: Duration::from_millis(timeout_ms),
        inpod,
        state_dir,
    })
}

/// A well-formed acknowledgement: a JSON object with a string `result`
/// other than `bad-request`. Returned re-serialized, never as the raw bytes.
pub fn acknowledgement(line: &[u8]) -> Result<String, String> {
    let not_ack = || {
        let shown = &line[..line.len().min(64)];
        format!(
            "not a well-formed acknowledgement ({} bytes, starting {:?}): expected a JSON object with a \"result\"",
            line.len(),
            String::from_utf8_lossy(shown)
        )
    };
    let v: Value = serde_json::from_slice(line).map_err(|_| not_ack())?;
    match v.get("result").and_then(Value::as_str) {
        Some("bad-request") => Err(format!(
            "the gateway refused the request: {}",
            v.get("error")
                .and_then(Value::as_str)
                .unwrap_or("no reason given")
        )),
        Some(r) if !r.is_empty() && v.is_object() => Ok(v.to_string()),
        _ => Err(not_ack()),
    }
}
