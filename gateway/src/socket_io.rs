//! Non-blocking socket reads and writes that leave tokio's readiness as its
//! own `poll_read` / `poll_write` would: a read shorter than its room (the
//! socket is drained) or a write shorter than offered (the send buffer is
//! full) clears it, so the next wait goes straight to epoll instead of
//! spending a syscall on `EAGAIN` first. The copy loops and the TLS
//! read-ahead use them.

use std::io;

use bytes::BytesMut;
use tokio::net::TcpStream;

/// `try_read_buf`, except that a read shorter than the room it had also
/// clears the socket's readiness, as tokio's own `poll_read` does: the
/// socket is drained, so the next wait goes straight to epoll instead of
/// spending a `recvfrom` on `EAGAIN` first (one syscall of four per small
/// request on each side).
pub(crate) fn read_drained(tcp: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    let room = buf.capacity() - buf.len();
    io_once(
        tcp,
        tokio::io::Interest::READABLE,
        || tcp.try_read_buf(buf),
        |n| n > 0 && n < room,
    )
}

/// One non-blocking read or write `op` (returning the bytes it moved) that
/// also clears the socket's readiness for `interest` when `short(n)` says
/// the socket is drained or full. The inner call is the real one; the
/// outer `try_io` only turns "short" into the `WouldBlock` that clears
/// readiness, and the count is still returned.
fn io_once(
    tcp: &TcpStream,
    interest: tokio::io::Interest,
    mut op: impl FnMut() -> io::Result<usize>,
    short: impl Fn(usize) -> bool,
) -> io::Result<usize> {
    let mut moved = None;
    let r = tcp.try_io(interest, || {
        let n = op()?;
        moved = Some(n);
        if short(n) {
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(n)
        }
    });
    match (r, moved) {
        (Err(e), Some(n)) if e.kind() == io::ErrorKind::WouldBlock => Ok(n),
        (r, _) => r,
    }
}

pub(crate) async fn write_all(tcp: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        tcp.writable().await?;
        match write_drained(tcp, buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `try_write`, except that a write shorter than offered also clears the
/// socket's write readiness, as tokio's own `poll_write` does: the send
/// buffer is full, so the next wait goes to epoll instead of spending a
/// `sendto` on `EAGAIN` first.
pub(crate) fn write_drained(tcp: &TcpStream, buf: &[u8]) -> io::Result<usize> {
    io_once(
        tcp,
        tokio::io::Interest::WRITABLE,
        || tcp.try_write(buf),
        |n| n < buf.len(),
    )
}
