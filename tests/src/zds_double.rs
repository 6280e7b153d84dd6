//! A wire-level double of istio-cni's ZDS server (the node agent side of
//! `zds.proto`), written independently of the gateway's client: messages
//! are encoded and decoded by hand here, so a wrong field number on either
//! side fails the tests.
//!
//! Like the node agent it listens on a `SOCK_SEQPACKET` socket (removing a
//! stale file first), reads the client's hello (checked to be V1), sends
//! requests one at a time — `AddWorkload` with the pod's namespace as one
//! `SCM_RIGHTS` descriptor — and waits up to 5 s for each ack. Between
//! requests it probes the connection every [`ZdsDouble::probe_interval`]
//! (5 s in istio-cni) with a 10 ms read: a timeout means alive, EOF means
//! closed, and a message means the client broke the protocol (it must never
//! send unsolicited data), which drops the connection.

use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use rustix::net::{
    AddressFamily, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix,
    SocketFlags, SocketType,
};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::{mpsc, oneshot, watch};

/// istio-cni's read and write deadline for one exchange.
const DEADLINE: Duration = Duration::from_secs(5);
/// istio-cni's keepalive read.
const PROBE_READ: Duration = Duration::from_millis(10);
/// Both sides read into 1,024 bytes.
const READ_BUF: usize = 1024;

/// A pod as the node agent describes it in `AddWorkload`.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
}

impl PodSpec {
    /// `uid` with name `<uid>-name`, namespace `demo`, service account `sa`.
    pub fn new(uid: &str) -> PodSpec {
        PodSpec {
            uid: uid.into(),
            name: format!("{uid}-name"),
            namespace: "demo".into(),
            service_account: "sa".into(),
        }
    }
}

/// One `WorkloadRequest`, or raw bytes sent as they are (to misbehave).
#[derive(Clone, Debug)]
pub enum Request {
    Add(PodSpec),
    Keep(String),
    Del(String),
    SnapshotSent,
    Raw(Vec<u8>),
}

/// The listening side.
pub struct ZdsDouble {
    pub path: PathBuf,
    /// How often an idle connection is probed (istio-cni: 5 s).
    pub probe_interval: Duration,
    listener: AsyncFd<OwnedFd>,
}

impl ZdsDouble {
    /// Listens at `path` (a stale file there is removed, as istio-cni does).
    pub fn bind(path: &Path) -> io::Result<ZdsDouble> {
        let _ = std::fs::remove_file(path);
        let fd = seqpacket()?;
        rustix::net::bind(&fd, &SocketAddrUnix::new(path)?)?;
        rustix::net::listen(&fd, 16)?;
        Ok(ZdsDouble {
            path: path.to_owned(),
            probe_interval: Duration::from_secs(5),
            listener: register(fd)?,
        })
    }

    /// Accepts the next client and reads its hello (within 5 s); fails
    /// unless the hello says V1.
    pub async fn accept(&self) -> anyhow::Result<ZdsConn> {
        let fd = self
            .listener
            .async_io(Interest::READABLE, |l| {
                rustix::net::accept_with(l, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC)
                    .map_err(io::Error::from)
            })
            .await?;
        let sock = register(fd)?;
        let hello = tokio::time::timeout(DEADLINE, recv(&sock))
            .await
            .context("no ZdsHello within 5 s")??
            .context("the client closed before its hello")?;
        let version = decode_hello(&hello)?;
        if version != 1 {
            bail!("ZdsHello version {version}, want 1 (V1); bytes {hello:02x?}");
        }
        Ok(ZdsConn::spawn(sock, hello, self.probe_interval))
    }
}

/// What became of an accepted connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnState {
    Open,
    /// The client closed it (EOF on a probe or an exchange).
    ClosedByClient,
    /// The client sent something unsolicited (seen by a probe); dropped.
    ProtocolError(Vec<u8>),
    /// Dropped by [`ZdsConn::drop_connection`].
    Dropped,
}

struct Exchange {
    bytes: Vec<u8>,
    fds: Vec<OwnedFd>,
    reply: oneshot::Sender<anyhow::Result<String>>,
}

/// One accepted connection. Requests go through a task that owns the
/// socket, so probes and exchanges never read concurrently.
pub struct ZdsConn {
    /// The hello's bytes, as received.
    pub hello: Vec<u8>,
    tx: Option<mpsc::Sender<Exchange>>,
    probes: Arc<AtomicU64>,
    state: watch::Receiver<ConnState>,
    task: tokio::task::JoinHandle<()>,
}

impl ZdsConn {
    fn spawn(sock: AsyncFd<OwnedFd>, hello: Vec<u8>, probe_interval: Duration) -> ZdsConn {
        let (tx, rx) = mpsc::channel(1);
        let (state_tx, state) = watch::channel(ConnState::Open);
        let probes = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(serve(sock, rx, state_tx, probes.clone(), probe_interval));
        ZdsConn {
            hello,
            tx: Some(tx),
            probes,
            state,
            task,
        }
    }

    /// Sends `request` (with `fds` attached by `SCM_RIGHTS`) and returns the
    /// ack's error text: empty for an ACK.
    pub async fn request(&self, request: Request, fds: Vec<OwnedFd>) -> anyhow::Result<String> {
        let (reply, rx) = oneshot::channel();
        let bytes = encode_request(&request);
        let ex = Exchange { bytes, fds, reply };
        let tx = self.tx.as_ref().context("connection dropped")?;
        tx.send(ex).await.ok().context("connection closed")?;
        rx.await.context("connection closed during the exchange")?
    }

    pub async fn add(&self, pod: PodSpec, netns: OwnedFd) -> anyhow::Result<String> {
        self.request(Request::Add(pod), vec![netns]).await
    }

    pub async fn keep(&self, uid: &str) -> anyhow::Result<String> {
        self.request(Request::Keep(uid.into()), vec![]).await
    }

    pub async fn del(&self, uid: &str) -> anyhow::Result<String> {
        self.request(Request::Del(uid.into()), vec![]).await
    }

    pub async fn snapshot_sent(&self) -> anyhow::Result<String> {
        self.request(Request::SnapshotSent, vec![]).await
    }

    /// The snapshot as istio-cni sends it: each add (with its namespace),
    /// each keep, then `SnapshotSent`; fails on the first NACK.
    pub async fn snapshot(
        &self,
        adds: Vec<(PodSpec, OwnedFd)>,
        keeps: &[&str],
    ) -> anyhow::Result<()> {
        for (pod, netns) in adds {
            let uid = pod.uid.clone();
            expect_ack(&format!("add {uid}"), self.add(pod, netns).await?)?;
        }
        for uid in keeps {
            expect_ack(&format!("keep {uid}"), self.keep(uid).await?)?;
        }
        expect_ack("snapshot_sent", self.snapshot_sent().await?)
    }

    /// Probes that found the connection alive (the 10 ms read timed out).
    pub fn probes(&self) -> u64 {
        self.probes.load(Ordering::Relaxed)
    }

    pub fn state(&self) -> ConnState {
        self.state.borrow().clone()
    }

    /// Waits until the connection is no longer open; its final state.
    pub async fn closed(&mut self) -> ConnState {
        let s = self.state.wait_for(|s| *s != ConnState::Open).await;
        s.map(|s| s.clone()).unwrap_or(ConnState::Dropped)
    }

    /// Closes the connection (as a restarting node agent would).
    pub async fn drop_connection(mut self) {
        self.tx = None;
        let _ = (&mut self.task).await;
    }
}

/// An error unless `ack` is an ACK.
pub fn expect_ack(what: &str, ack: String) -> anyhow::Result<()> {
    if ack.is_empty() {
        Ok(())
    } else {
        bail!("{what}: NACK {ack:?}")
    }
}

async fn serve(
    sock: AsyncFd<OwnedFd>,
    mut rx: mpsc::Receiver<Exchange>,
    state: watch::Sender<ConnState>,
    probes: Arc<AtomicU64>,
    probe_interval: Duration,
) {
    let start = tokio::time::Instant::now() + probe_interval;
    let mut ticker = tokio::time::interval_at(start, probe_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            ex = rx.recv() => {
                let Some(ex) = ex else {
                    state.send_replace(ConnState::Dropped);
                    return;
                };
                let r = exchange(&sock, &ex.bytes, &ex.fds).await;
                let end = match &r {
                    Err(_) => Some(ConnState::ClosedByClient),
                    Ok(_) => None,
                };
                let _ = ex.reply.send(r);
                if let Some(end) = end {
                    state.send_replace(end);
                    return;
                }
            }
            _ = ticker.tick() => match tokio::time::timeout(PROBE_READ, recv(&sock)).await {
                Err(_) => { probes.fetch_add(1, Ordering::Relaxed); }
                Ok(Ok(Some(unsolicited))) => { state.send_replace(ConnState::ProtocolError(unsolicited)); return; }
                Ok(_) => { state.send_replace(ConnState::ClosedByClient); return; }
            }
        }
    }
}

/// Sends one request and waits (5 s) for its `WorkloadResponse`: the ack's error text.
async fn exchange(
    sock: &AsyncFd<OwnedFd>,
    bytes: &[u8],
    fds: &[OwnedFd],
) -> anyhow::Result<String> {
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
    tokio::time::timeout(DEADLINE, send(sock, bytes, &borrowed))
        .await
        .context("write deadline")??;
    let resp = tokio::time::timeout(DEADLINE, recv(sock))
        .await
        .context("no ack within 5 s")??
        .context("the client closed the connection instead of acking")?;
    decode_ack(&resp)
}

/// Registers `fd` with tokio's reactor. `AsyncFd::new` is deprecated because
/// an arbitrary `AsRawFd` could close or swap its descriptor while
/// registered (tokio#8587); a moved-in `OwnedFd` can do neither.
#[allow(deprecated)]
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::new(fd)
}

fn seqpacket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?)
}

async fn send(sock: &AsyncFd<OwnedFd>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    sock.async_io(Interest::WRITABLE, |fd| {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(io::Error::other(
                "too many fds for the double's control buffer",
            ));
        }
        let iov = [IoSlice::new(bytes)];
        Ok(rustix::net::sendmsg(
            fd,
            &iov,
            &mut control,
            SendFlags::NOSIGNAL,
        )?)
    })
    .await
    .map(|_| ())
}

/// One datagram (fds attached to the client's messages, none expected, are
/// dropped); `None` on EOF. A datagram longer than istio-cni's 1,024-byte
/// read is an error naming its length (the agent would get it truncated).
async fn recv(sock: &AsyncFd<OwnedFd>) -> io::Result<Option<Vec<u8>>> {
    sock.async_io(Interest::READABLE, |fd| {
        let mut buf = [0u8; READ_BUF];
        let (n, full) = rustix::net::recv(fd, &mut buf, RecvFlags::TRUNC)?;
        if full > READ_BUF {
            let e = format!("a {full}-byte message: istio-cni reads {READ_BUF} bytes");
            return Err(io::Error::other(e));
        }
        Ok((n > 0).then(|| buf[..n].to_vec()))
    })
    .await
}

// ---------------------------------------------------------------------------
// Protobuf by hand: only what zds.proto needs (varints, length-delimited).

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Field `field` as length-delimited (wire type 2).
fn bytes_field(out: &mut Vec<u8>, field: u64, value: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

/// A proto3 string: omitted when empty.
fn string_field(out: &mut Vec<u8>, field: u64, value: &str) {
    if !value.is_empty() {
        bytes_field(out, field, value.as_bytes());
    }
}

/// `WorkloadRequest{payload}`: add=1, del=2, snapshot_sent=3, keep=5;
/// `AddWorkload{uid=1, workload_info=2}`, `WorkloadInfo{name=1,
/// namespace=2, service_account=3}`, `KeepWorkload{uid=1}`, `DelWorkload{uid=2}`.
pub fn encode_request(request: &Request) -> Vec<u8> {
    let mut inner = Vec::new();
    let field = match request {
        Request::Add(pod) => {
            let mut info = Vec::new();
            string_field(&mut info, 1, &pod.name);
            string_field(&mut info, 2, &pod.namespace);
            string_field(&mut info, 3, &pod.service_account);
            string_field(&mut inner, 1, &pod.uid);
            bytes_field(&mut inner, 2, &info);
            1
        }
        Request::Keep(uid) => {
            string_field(&mut inner, 1, uid);
            5
        }
        Request::Del(uid) => {
            string_field(&mut inner, 2, uid);
            2
        }
        Request::SnapshotSent => 3,
        Request::Raw(bytes) => return bytes.clone(),
    };
    let mut out = Vec::new();
    bytes_field(&mut out, field, &inner);
    out
}

fn read_varint(b: &[u8], i: &mut usize) -> anyhow::Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i).context("truncated varint")?;
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(v);
        }
    }
    bail!("varint too long")
}

/// The fields of one message as (field number, wire type, value): a
/// varint's value, or a length-delimited field's bytes.
fn fields(b: &[u8]) -> anyhow::Result<Vec<(u64, u64, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let key = read_varint(b, &mut i)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => out.push((field, 0, read_varint(b, &mut i)?.to_le_bytes().to_vec())),
            2 => {
                let n = read_varint(b, &mut i)? as usize;
                let v = b.get(i..i + n).context("truncated field")?;
                i += n;
                out.push((field, 2, v.to_vec()));
            }
            w => bail!("unexpected wire type {w} in {b:02x?}"),
        }
    }
    Ok(out)
}

/// `ZdsHello{version=1 (enum)}`: the version number.
fn decode_hello(b: &[u8]) -> anyhow::Result<u64> {
    let mut version = 0;
    for (field, wire, v) in fields(b)? {
        if field == 1 && wire == 0 {
            version = u64::from_le_bytes(v.try_into().expect("8 bytes"));
        }
    }
    Ok(version)
}

/// `WorkloadResponse{ack=1}` with `Ack{error=1}`: the error text; an error
/// when the response has no ack.
fn decode_ack(b: &[u8]) -> anyhow::Result<String> {
    let ack = fields(b)?
        .into_iter()
        .find(|(f, w, _)| *f == 1 && *w == 2)
        .with_context(|| format!("WorkloadResponse without ack: {b:02x?}"))?
        .2;
    let mut error = String::new();
    for (field, wire, v) in fields(&ack)? {
        if field == 1 && wire == 2 {
            error = String::from_utf8(v).context("ack error text not UTF-8")?;
        }
    }
    Ok(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_encode_with_the_upstream_field_numbers() {
        let pod = PodSpec {
            uid: "u".into(),
            name: "n".into(),
            namespace: String::new(),
            service_account: String::new(),
        };
        let add = encode_request(&Request::Add(pod));
        assert_eq!(add, [0x0a, 8, 0x0a, 1, b'u', 0x12, 3, 0x0a, 1, b'n']);
        assert_eq!(
            encode_request(&Request::Keep("u".into())),
            [0x2a, 3, 0x0a, 1, b'u']
        );
        assert_eq!(
            encode_request(&Request::Del("u".into())),
            [0x12, 3, 0x12, 1, b'u']
        );
        assert_eq!(encode_request(&Request::SnapshotSent), [0x1a, 0]);
    }

    #[test]
    fn acks_and_hellos_decode() {
        assert_eq!(decode_ack(&[0x0a, 0]).unwrap(), "");
        assert_eq!(decode_ack(&[0x0a, 3, 0x0a, 1, b'x']).unwrap(), "x");
        assert!(decode_ack(&[]).is_err());
        assert_eq!(decode_hello(&[0x08, 1]).unwrap(), 1);
        assert_eq!(decode_hello(&[]).unwrap(), 0);
    }
}
