//! Bidirectional copy between a TCP socket and an HTTP/2 stream, with half-close.
//!
//! No buffer is held while a direction is idle: a read buffer is allocated
//! only after the socket reports readable, and handed to HTTP/2 as `Bytes`;
//! received frames are written straight from h2's buffers. An idle
//! connection therefore costs its task, its h2 stream state and its socket —
//! the figure the memory benchmark checks.
//!
//! The read size follows the flow ([`ReadSize`]): a read that fills its
//! buffer doubles the next one, from one TLS record up to sixteen (less
//! room for the frame header), so a bulk
//! transfer moves in few large reads, DATA frames and writes; while reads
//! keep filling, the buffer's allocation can be reclaimed once HTTP/2 has
//! let go of the previous chunk (no fresh pages per read). A read that
//! drains the socket drops the buffer and starts again small: the flow
//! has caught up and may now sit idle.

use std::future::poll_fn;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use prometheus_client::metrics::counter::Counter;
use tokio::net::TcpStream;

// Byte counts and their counters live with the copy loop that moves the
// bytes; the metrics modules take them from here.

/// Bytes moved by one stream.
#[derive(Debug, Default, Clone, Copy)]
pub struct Transferred {
    /// TCP → HTTP/2.
    pub tcp_to_h2: u64,
    /// HTTP/2 → TCP.
    pub h2_to_tcp: u64,
}

/// Counters incremented as bytes move (per direction).
#[derive(Clone, Debug, Default)]
pub struct ByteCounters {
    pub tcp_to_h2: Counter,
    pub h2_to_tcp: Counter,
}

/// The first read of a burst, and the largest a flow grows to: whole TLS
/// records (16 KiB of plaintext each) less room for the 9-byte DATA frame
/// header, so a frame fills its records exactly. A power of two left the
/// header's 9 bytes in a record of their own: one more seal on one side
/// and one more open on the other for every frame (as ztunnel sizes its
/// reads).
const TLS_RECORD: usize = 16 * 1024;
const FRAME_ROOM: usize = 64;
const READ_MIN: usize = TLS_RECORD - FRAME_ROOM;
const READ_MAX: usize = 16 * TLS_RECORD - FRAME_ROOM;

/// The read size of one direction of a copy.
#[derive(Debug)]
struct ReadSize {
    buf: BytesMut,
    want: usize,
}

impl Default for ReadSize {
    fn default() -> Self {
        ReadSize {
            buf: BytesMut::new(),
            want: READ_MIN,
        }
    }
}

impl ReadSize {
    /// The buffer to read into, with room for the next read.
    fn buffer(&mut self) -> &mut BytesMut {
        self.buf.reserve(self.want);
        &mut self.buf
    }

    /// After a read of `n` bytes: the bytes read, and the size of the next read.
    fn took(&mut self, n: usize) -> Bytes {
        let filled = n >= self.want;
        let data = self.buf.split().freeze();
        if filled {
            self.want = ((self.want + FRAME_ROOM) * 2 - FRAME_ROOM).min(READ_MAX);
        } else {
            // Drained: hold nothing while the socket may stay quiet.
            *self = ReadSize::default();
        }
        data
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("tcp: {0}")]
    Io(#[from] io::Error),
    #[error("http/2 stream: {0}")]
    H2(#[from] h2::Error),
}

impl CopyError {
    /// A bounded label for metrics and access logs.
    pub fn reason(&self) -> &'static str {
        match self {
            CopyError::Io(e) if e.kind() == io::ErrorKind::ConnectionReset => "tcp_reset",
            CopyError::Io(_) => "tcp_error",
            CopyError::H2(e) if e.is_reset() => "stream_reset",
            CopyError::H2(e) if e.is_go_away() => "tunnel_goaway",
            CopyError::H2(_) => "tunnel_error",
        }
    }
}

/// Copies until both directions ended (each end-of-stream / EOF is propagated
/// as a half-close) or either side failed; on failure the other side is
/// reset: the h2 stream gets RST_STREAM(CANCEL), the TCP socket is dropped.
/// Every chunk counts in `counters` (the direction's) and in `also` (the
/// connection's, for Istio's metrics).
pub async fn copy_bidirectional(
    tcp: &TcpStream,
    mut send: SendStream<Bytes>,
    mut recv: RecvStream,
    counters: &ByteCounters,
    also: &ByteCounters,
) -> (Transferred, Result<(), CopyError>) {
    let mut moved = Transferred::default();
    // Set once the peer's END_STREAM arrived: from then on only the sending
    // side can learn of a reset (before, `recv.data()` reports it).
    let recv_ended = AtomicBool::new(false);
    let result = {
        let up = tcp_to_h2(
            tcp,
            &mut send,
            &recv_ended,
            [&counters.tcp_to_h2, &also.tcp_to_h2],
            &mut moved.tcp_to_h2,
        );
        let down = h2_to_tcp(
            &mut recv,
            tcp,
            [&counters.h2_to_tcp, &also.h2_to_tcp],
            &mut moved.h2_to_tcp,
        );
        tokio::pin!(up, down);
        let (mut up_done, mut down_done) = (false, false);
        loop {
            tokio::select! {
                r = &mut up, if !up_done => match r {
                    Ok(()) => up_done = true,
                    Err(e) => break Err(e),
                },
                r = &mut down, if !down_done => match r {
                    Ok(()) => {
                        down_done = true;
                        // `up` is polled again by the next `select!` and
                        // starts watching for a reset.
                        recv_ended.store(true, Ordering::Relaxed);
                    }
                    Err(e) => break Err(e),
                },
            }
            if up_done && down_done {
                break Ok(());
            }
        }
    };
    if result.is_err() {
        send.send_reset(h2::Reason::CANCEL);
    }
    (moved, result)
}

async fn tcp_to_h2(
    tcp: &TcpStream,
    send: &mut SendStream<Bytes>,
    recv_ended: &AtomicBool,
    counters: [&Counter; 2],
    total: &mut u64,
) -> Result<(), CopyError> {
    let mut size = ReadSize::default();
    loop {
        // Wait for data; no buffer is held unless the last read filled its
        // buffer (more is already queued).
        readable_or_reset(tcp, send, recv_ended).await?;
        match read_drained(tcp, size.buffer()) {
            Ok(0) => {
                send.send_data(Bytes::new(), true)?;
                return Ok(());
            }
            Ok(n) => {
                *total += n as u64;
                for c in counters {
                    c.inc_by(n as u64);
                }
                send_all(send, size.took(n)).await?;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                size = ReadSize::default();
                continue;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits until `tcp` is readable or, once the receiving side ended, the
/// peer reset the stream. While the receiving side is open a reset reaches
/// `recv.data()` and ends the copy there; watching it here too took h2's
/// lock once more per chunk and shared the stream's send waker with
/// `poll_capacity`, so capacity updates woke this task while it waited on
/// the socket.
async fn readable_or_reset(
    tcp: &TcpStream,
    send: &mut SendStream<Bytes>,
    recv_ended: &AtomicBool,
) -> Result<(), CopyError> {
    poll_fn(|cx| {
        if recv_ended.load(Ordering::Relaxed) {
            if let Poll::Ready(r) = send.poll_reset(cx) {
                return Poll::Ready(Err(match r {
                    Ok(reason) => CopyError::Io(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        format!("peer reset the stream: {reason:?}"),
                    )),
                    Err(e) => CopyError::H2(e),
                }));
            }
        }
        tcp.poll_read_ready(cx).map_err(CopyError::Io)
    })
    .await
}

/// `try_read_buf`, except that a read shorter than the room it had also
/// clears the socket's readiness, as tokio's own `poll_read` does: the
/// socket is drained, so the next wait goes straight to epoll instead of
/// spending a `recvfrom` on `EAGAIN` first (one syscall of four per small
/// request on each side).
fn read_drained(tcp: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
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

async fn send_all(send: &mut SendStream<Bytes>, mut data: Bytes) -> Result<(), CopyError> {
    while !data.is_empty() {
        send.reserve_capacity(data.len());
        match poll_fn(|cx| send.poll_capacity(cx)).await {
            Some(Ok(0)) => continue,
            Some(Ok(n)) => {
                let chunk = data.split_to(n.min(data.len()));
                send.send_data(chunk, false)?;
            }
            Some(Err(e)) => return Err(e.into()),
            None => {
                return Err(CopyError::Io(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "h2 stream closed while sending",
                )))
            }
        }
    }
    Ok(())
}

async fn h2_to_tcp(
    recv: &mut RecvStream,
    tcp: &TcpStream,
    counters: [&Counter; 2],
    total: &mut u64,
) -> Result<(), CopyError> {
    while let Some(chunk) = recv.data().await {
        let chunk = chunk?;
        let n = chunk.len();
        write_all(tcp, &chunk).await?;
        *total += n as u64;
        for c in counters {
            c.inc_by(n as u64);
        }
        recv.flow_control().release_capacity(n)?;
    }
    // END_STREAM: half-close our write side; the other direction goes on.
    socket2::SockRef::from(tcp).shutdown(std::net::Shutdown::Write)?;
    Ok(())
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
fn write_drained(tcp: &TcpStream, buf: &[u8]) -> io::Result<usize> {
    io_once(
        tcp,
        tokio::io::Interest::WRITABLE,
        || tcp.try_write(buf),
        |n| n < buf.len(),
    )
}

/// One direction of a plain TCP copy, half-closing `to` at EOF; each chunk
/// counts in `counter` as it is copied.
pub async fn copy_tcp(from: &TcpStream, to: &TcpStream, counter: &Counter) -> std::io::Result<u64> {
    let mut total = 0;
    loop {
        from.readable().await?;
        let mut buf = bytes::BytesMut::with_capacity(16 * 1024);
        match read_drained(from, &mut buf) {
            Ok(0) => {
                socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write)?;
                return Ok(total);
            }
            Ok(n) => {
                total += n as u64;
                write_all(to, &buf).await?;
                counter.inc_by(n as u64);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads that fill the buffer double the next one up to READ_MAX, each
    /// a whole number of TLS records with room for the DATA frame header;
    /// a short read lets the buffer go.
    #[test]
    fn read_size_follows_the_flow() {
        let mut size = ReadSize::default();
        let mut wants = Vec::new();
        for _ in 0..6 {
            let want = size.want;
            wants.push(want);
            size.buffer().resize(want, 7);
            let chunk = size.took(want);
            assert_eq!(chunk.len(), want);
        }
        // Whole TLS records less room for the frame header.
        let records: Vec<usize> = wants.iter().map(|w| (w + 64) / (16 << 10)).collect();
        assert_eq!(records, [1, 2, 4, 8, 16, 16]);
        assert!(wants.iter().all(|w| (w + 64) % (16 << 10) == 0));
        // A read that does not fill the buffer: back to the small size, no
        // capacity held.
        size.buffer().resize(100, 1);
        let chunk = size.took(100);
        assert_eq!(chunk.len(), 100);
        assert_eq!(size.want, READ_MIN);
        assert_eq!(size.buf.capacity(), 0);
    }
}
