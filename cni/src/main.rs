//! `tidegate-cni`: a chained CNI plugin (CNI spec 1.x).
//!
//! - ADD passes the previous result through; with `capture: inpod` it first
//!   enrolls the pod if the gateway says it is a mesh member (see
//!   [`enroll`]): its namespace handed to the gateway, istio-cni's capture
//!   rules installed inside it, a record in the state directory; a pod
//!   that is not a member is left as it is. ADD fails when the gateway
//!   cannot answer: a pod never starts outside a mesh it belongs to.
//! - CHECK passes.
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
//! `/var/run/tidegate/cni.sock`) and `timeout_ms` (default 10000, 1 to
//! 120000). An invalid value of either is an error for every command (CNI
//! error code 7 naming the key), never a silent default.
//!
//! `timeout_ms` bounds the whole exchange with the gateway — connect (a full
//! backlog blocks it), request, acknowledgement — and, in in-pod mode, the
//! whole ADD. Only a well-formed
//! acknowledgement counts: one line of at most 64 KiB holding a JSON object
//! with a string `result`; anything else (garbage, a peer dribbling bytes,
//! `bad-request`) is reported as not drained.
//!
//! It runs on the host for every pod creation and deletion and must stay
//! quick, so it links little: std, serde_json, rustix (to pass the pod's
//! namespace over the socket, `SCM_RIGHTS`) and `tidegate-netns`, the pod
//! namespace check, capture rules, pod records and never-meshed namespaces
//! it shares with the gateway — not the gateway itself (no async runtime,
//! no TLS, no WebAssembly). DEL and the exchange with the gateway are std +
//! serde_json; ADD in in-pod mode adds `tidegate-netns` ([`enroll`]).

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod conf;
mod enroll;
mod install;

use conf::{acknowledgement, CniError, OurKeys, Parsed, MAX_ACK};

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

/// What the runtime asked, answered: `Some(text)` goes to stdout.
fn run(command: &str, stdin: &str) -> Result<Option<String>, CniError> {
    Ok(match conf::parse(command, stdin)? {
        Parsed::Version(out) => Some(out),
        Parsed::Add(out, e) => {
            if e.ours.inpod {
                enroll::add_within(e)?;
            }
            Some(out)
        }
        Parsed::Del(ours) => {
            delete(&ours);
            if ours.inpod {
                enroll::forget(&ours);
            }
            None
        }
        Parsed::Nothing => None,
    })
}

/// `K8S_POD_UID=…;K8S_POD_NAMESPACE=…` → the value of `key`.
pub(crate) fn cni_arg(key: &str) -> Option<String> {
    let args = std::env::var("CNI_ARGS").ok()?;
    args.split(';')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_owned())
}

/// Asks the gateway to drain the pod; never fails the DEL (a gateway that
/// is down or slow must not block pod deletion): the outcome is on stderr.
fn delete(ours: &OurKeys) {
    let Some(uid) = cni_arg("K8S_POD_UID") else {
        eprintln!("tidegate-cni: DEL without K8S_POD_UID in CNI_ARGS; nothing to drain");
        return;
    };
    let request = json!({
        "command": "teardown",
        "uid": uid,
        "namespace": cni_arg("K8S_POD_NAMESPACE").unwrap_or_default(),
        "name": cni_arg("K8S_POD_NAME").unwrap_or_default(),
        "container_id": std::env::var("CNI_CONTAINERID").unwrap_or_default(),
    });
    let started = Instant::now();
    let socket = &ours.socket;
    match ask_within(socket, &request, ours.timeout, None) {
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

/// Where the exchange is, for the message when the deadline passes.
#[derive(Default)]
struct Progress {
    phase: AtomicU8,
    received: AtomicUsize,
}

const CONNECTING: u8 = 0;
const SENDING: u8 = 1;
const WAITING: u8 = 2;

/// The whole exchange — connect included — within `timeout`. It runs on a
/// thread of its own: a connect to a socket whose backlog is full blocks and
/// no socket option bounds it; past the deadline the thread is abandoned
/// (the process exits right after).
pub(crate) fn ask_within(
    socket: &str,
    request: &Value,
    timeout: Duration,
    fd: Option<OwnedFd>,
) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let progress = Arc::new(Progress::default());
    let (tx, rx) = mpsc::channel();
    let (socket, request) = (socket.to_owned(), format!("{request}\n"));
    let p = progress.clone();
    std::thread::spawn(move || {
        let _ = tx.send(ask(&socket, request.as_bytes(), fd, deadline, &p));
    });
    let ms = timeout.as_millis();
    match rx.recv_timeout(timeout) {
        Ok(Ok(ack)) => Ok(ack),
        Ok(Err(Failed::Other(e))) => Err(e),
        // The thread saw the deadline pass first, or is still blocked.
        Ok(Err(Failed::Deadline)) | Err(_) => Err(match progress.phase.load(Ordering::Relaxed) {
            CONNECTING => format!(
                "could not connect within timeout_ms ({ms} ms): the gateway's socket is not accepting (backlog full?)"
            ),
            SENDING => format!("could not send the request within timeout_ms ({ms} ms)"),
            _ => match progress.received.load(Ordering::Relaxed) {
                0 => format!("no acknowledgement within timeout_ms ({ms} ms)"),
                n => format!(
                    "no complete acknowledgement within timeout_ms ({ms} ms): {n} bytes without a newline"
                ),
            },
        }),
    }
}

enum Failed {
    /// The deadline passed (a socket timeout, or no time left).
    Deadline,
    Other(String),
}

impl Failed {
    fn io(what: &str) -> impl Fn(std::io::Error) -> Failed + '_ {
        move |e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Failed::Deadline,
            _ => Failed::Other(format!("{what}: {e}")),
        }
    }
}

fn ask(
    socket: &str,
    request: &[u8],
    fd: Option<OwnedFd>,
    deadline: Instant,
    progress: &Progress,
) -> Result<String, Failed> {
    let left = || {
        let d = deadline.saturating_duration_since(Instant::now());
        // A zero timeout means "block forever" to the socket options.
        (!d.is_zero()).then_some(d).ok_or(Failed::Deadline)
    };
    let mut stream = UnixStream::connect(socket).map_err(Failed::io("cannot connect"))?;
    progress.phase.store(SENDING, Ordering::Relaxed);
    stream
        .set_write_timeout(Some(left()?))
        .map_err(Failed::io("socket option"))?;
    match fd {
        // The descriptor rides with the request's bytes (one sendmsg).
        Some(fd) => send_with_fd(&stream, request, fd)
            .map_err(Failed::io("cannot send the request with the namespace"))?,
        None => stream
            .write_all(request)
            .map_err(Failed::io("cannot send the request"))?,
    }
    progress.phase.store(WAITING, Ordering::Relaxed);
    let mut line = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        stream
            .set_read_timeout(Some(left()?))
            .map_err(Failed::io("socket option"))?;
        let n = stream
            .read(&mut chunk)
            .map_err(Failed::io("reading the acknowledgement"))?;
        if n == 0 {
            return Err(Failed::Other(format!(
                "the gateway closed the connection without an acknowledgement ({} bytes received)",
                line.len()
            )));
        }
        line.extend_from_slice(&chunk[..n]);
        progress.received.store(line.len(), Ordering::Relaxed);
        if let Some(end) = line.iter().position(|b| *b == b'\n') {
            line.truncate(end);
            return acknowledgement(&line).map_err(Failed::Other);
        }
        if line.len() > MAX_ACK {
            return Err(Failed::Other(format!(
                "no acknowledgement: more than {MAX_ACK} bytes without a newline"
            )));
        }
    }
}

/// Sends `request` with `fd` attached (`SCM_RIGHTS`) in one message.
fn send_with_fd(stream: &UnixStream, request: &[u8], fd: OwnedFd) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::mem::MaybeUninit;
    use std::os::fd::AsFd;
    let fds = [fd.as_fd()];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    control.push(SendAncillaryMessage::ScmRights(&fds));
    let sent = rustix::net::sendmsg(
        stream,
        &[std::io::IoSlice::new(request)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    // The rest (a request is far below a socket buffer) goes as plain bytes.
    let mut s = stream;
    s.write_all(&request[sent..])
}
