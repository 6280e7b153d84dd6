//! The admin API from the command line: one HTTP/1.1 request per
//! connection (the API is on loopback, its answers small), for `tidegate
//! workloads`, `drains`, `drain`, `bind`, `unbind` and `policy upload|list`,
//! and for `tidegate run` asking a running gateway who it is.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Why the admin API gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(
        "cannot reach the admin API at {addr} (is the gateway running? --admin sets the address)"
    )]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("reading the admin API at {addr}")]
    Io {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("admin API at {addr} answered {status}: {reason}")]
    Status {
        addr: SocketAddr,
        status: String,
        reason: String,
    },
    #[error("admin API at {addr}: {path} did not answer the expected JSON: {detail}")]
    Json {
        addr: SocketAddr,
        path: String,
        detail: String,
    },
}

/// The address to dial for the configured `admin` listener: an unspecified
/// IP means loopback.
pub fn dial_addr(admin: SocketAddr) -> SocketAddr {
    if admin.ip().is_unspecified() {
        SocketAddr::from(([127, 0, 0, 1], admin.port()))
    } else {
        admin
    }
}

/// `method path` with `body`; the answer's JSON when its status is 2xx,
/// else [`AdminError::Status`] with the server's reason.
pub fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<serde_json::Value, AdminError> {
    call_with(addr, method, path, &[], body)
}

/// `GET /version` with a short read timeout: who answers on a port a new
/// gateway cannot bind (a process that accepts and never answers must not
/// hold its refusal up).
pub fn identify(addr: SocketAddr) -> Result<serde_json::Value, AdminError> {
    let (status, text) = request(addr, "GET", "/version", &[], b"", IDENTIFY_WITHIN)?;
    if !status
        .split_whitespace()
        .nth(1)
        .unwrap_or_default()
        .starts_with('2')
    {
        return Err(AdminError::Status {
            addr,
            status,
            reason: reason(&text),
        });
    }
    serde_json::from_str(&text).map_err(|e| AdminError::Json {
        addr,
        path: "/version".into(),
        detail: e.to_string(),
    })
}

/// How long an answer may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// How long [`identify`] waits.
const IDENTIFY_WITHIN: Duration = Duration::from_secs(2);

/// [`call`] with extra request headers (visible ASCII: the caller checks).
pub fn call_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<serde_json::Value, AdminError> {
    let (status, text) = request(addr, method, path, headers, body, ANSWER_WITHIN)?;
    let code = status.split_whitespace().nth(1).unwrap_or_default();
    if !code.starts_with('2') {
        return Err(AdminError::Status {
            addr,
            status: status
                .split_whitespace()
                .skip(1)
                .collect::<Vec<_>>()
                .join(" "),
            reason: reason(&text),
        });
    }
    serde_json::from_str(&text).map_err(|e| AdminError::Json {
        addr,
        path: path.to_owned(),
        detail: e.to_string(),
    })
}

/// The status line and the body.
fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    within: Duration,
) -> Result<(String, String), AdminError> {
    let io = |source| AdminError::Io { addr, source };
    let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|source| AdminError::Connect { addr, source })?;
    tcp.set_read_timeout(Some(within)).map_err(io)?;
    let extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    write!(
        tcp,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    )
    .map_err(io)?;
    tcp.write_all(body).map_err(io)?;
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).map_err(io)?;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    Ok((status, body.to_owned()))
}

/// The reason in an error answer: its text, or the `error` of a JSON body,
/// on one line.
fn reason(body: &str) -> String {
    let json = serde_json::from_str::<serde_json::Value>(body).ok();
    let text = match json.as_ref().and_then(|v| v["error"].as_str()) {
        Some(e) => e,
        None => body,
    };
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `workload` (a uid or `namespace/name`) as one path segment: everything
/// but unreserved characters percent-encoded, so `/` is `%2F`.
pub fn path_segment(workload: &str) -> String {
    workload
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_is_one_path_segment() {
        assert_eq!(path_segment("demo/echo"), "demo%2Fecho");
        assert_eq!(path_segment("6f1c-echo_0.1~"), "6f1c-echo_0.1~");
        assert_eq!(path_segment("a b%"), "a%20b%25");
    }

    #[test]
    fn the_reason_is_the_text_or_the_json_error_on_one_line() {
        assert_eq!(reason("no workload\n"), "no workload");
        assert_eq!(
            reason(
                "{\n  \"result\": \"refused\",\n  \"error\": \"no policy named \\\"x\\\"\"\n}\n"
            ),
            "no policy named \"x\""
        );
    }
}
