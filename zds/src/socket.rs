//! A nonblocking `AF_UNIX` `SOCK_SEQPACKET` socket served by tokio's
//! [`AsyncFd`] (tokio has no seqpacket type): one datagram per message, file
//! descriptors received by `SCM_RIGHTS`.

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::net::{AddressFamily, SendFlags, SocketAddrUnix, SocketFlags, SocketType};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The largest message either side reads (istio-cni and ztunnel both read
/// into 1,024 bytes); a longer datagram arrives truncated.
pub const MAX_MESSAGE: usize = 1024;

/// One received datagram.
#[derive(Debug)]
pub struct Packet {
    pub bytes: Vec<u8>,
    /// Descriptors that came with it (`SCM_RIGHTS`), already owned: dropping
    /// the packet closes them.
    pub fds: Vec<OwnedFd>,
    /// The datagram was longer than [`MAX_MESSAGE`] (its tail is lost).
    pub truncated: bool,
    /// More descriptors came than there was room for (the rest were closed).
    pub too_many_fds: bool,
    /// Descriptors came that could not be received (the gateway's
    /// descriptor table is full): they were closed.
    pub fds_lost: bool,
}

/// A connected seqpacket socket.
#[derive(Debug)]
pub struct SeqPacket {
    fd: AsyncFd<OwnedFd>,
}

impl SeqPacket {
    /// Connects to the listener at `path`.
    pub fn connect(path: &Path) -> io::Result<SeqPacket> {
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?;
        // A Unix connect completes at once or fails (EAGAIN: backlog full),
        // never "in progress": the caller's backoff covers the failure.
        rustix::net::connect(&fd, &SocketAddrUnix::new(path)?)?;
        SeqPacket::from_connected(fd)
    }

    /// Wraps a connected, nonblocking seqpacket descriptor (e.g. one
    /// returned by `accept`).
    pub fn from_connected(fd: OwnedFd) -> io::Result<SeqPacket> {
        // `with_interest` is deprecated because an arbitrary `AsRawFd` could
        // close or swap its descriptor while registered (tokio#8587); an
        // `OwnedFd` moved into the `AsyncFd` can do neither, and its unsafe
        // replacement is not an option here (the crate forbids unsafe code).
        #[allow(deprecated)]
        let fd = AsyncFd::with_interest(fd, Interest::READABLE | Interest::WRITABLE)?;
        Ok(SeqPacket { fd })
    }

    /// Sends `bytes` as one datagram.
    pub async fn send(&self, bytes: &[u8]) -> io::Result<()> {
        self.fd
            .async_io(Interest::WRITABLE, |fd| {
                rustix::net::send(fd, bytes, SendFlags::NOSIGNAL).map_err(io::Error::from)
            })
            .await
            .map(|_| ())
    }

    /// Receives one datagram; `None` once the peer closed the connection.
    /// (A zero-length datagram reads like the end of the connection, so a
    /// peer must never send one; no ZDS message encodes to zero bytes
    /// except a request without payload, which is invalid anyway.)
    pub async fn recv(&self) -> io::Result<Option<Packet>> {
        self.fd.async_io(Interest::READABLE, recv_now).await
    }
}

fn recv_now(fd: &OwnedFd) -> io::Result<Option<Packet>> {
    let mut buf = [0u8; MAX_MESSAGE];
    let got = tidegate_base::fd_passing::recv_with_fds(fd, &mut buf)?;
    if got.bytes == 0 && got.fds.is_empty() {
        return Ok(None);
    }
    Ok(Some(Packet {
        bytes: buf[..got.bytes.min(MAX_MESSAGE)].to_vec(),
        fds: got.fds,
        truncated: got.truncated,
        too_many_fds: got.too_many_fds,
        fds_lost: got.fds_lost,
    }))
}
