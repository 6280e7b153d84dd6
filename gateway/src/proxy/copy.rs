//! Bidirectional copy between a TCP socket and an HTTP/2 stream, with half-close.
//!
//! No buffer is held while a direction is idle: a read buffer is allocated
//! only after the socket reports readable, and handed to HTTP/2 as `Bytes`;
//! received frames are written straight from h2's buffers. An idle
//! connection therefore costs its task, its h2 stream state and its socket —
//! the figure the memory benchmark checks.

use std::future::poll_fn;
use std::io;

use bytes::{Bytes, BytesMut};
use h2::{RecvStream, SendStream};
use prometheus_client::metrics::counter::Counter;
use tokio::net::TcpStream;

/// Byte counts and counters live with the metrics: the copy loop depends on
/// them, never the other way round.
pub use crate::metrics::{ByteCounters, Transferred};

const READ_CHUNK: usize = 64 * 1024;

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
pub async fn copy_bidirectional(
    tcp: &TcpStream,
    mut send: SendStream<Bytes>,
    mut recv: RecvStream,
    counters: &ByteCounters,
) -> (Transferred, Result<(), CopyError>) {
    let mut moved = Transferred::default();
    let result = {
        let up = tcp_to_h2(tcp, &mut send, &counters.tcp_to_h2, &mut moved.tcp_to_h2);
        let down = h2_to_tcp(&mut recv, tcp, &counters.h2_to_tcp, &mut moved.h2_to_tcp);
        tokio::pin!(up, down);
        let (mut up_done, mut down_done) = (false, false);
        loop {
            tokio::select! {
                r = &mut up, if !up_done => match r {
                    Ok(()) => up_done = true,
                    Err(e) => break Err(e),
                },
                r = &mut down, if !down_done => match r {
                    Ok(()) => down_done = true,
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
    counter: &Counter,
    total: &mut u64,
) -> Result<(), CopyError> {
    loop {
        // Wait for data (or a reset of the h2 stream) without holding a buffer.
        tokio::select! {
            r = tcp.readable() => r?,
            r = poll_fn(|cx| send.poll_reset(cx)) => {
                return Err(CopyError::Io(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    format!("peer reset the stream: {:?}", r?),
                )));
            }
        }
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        match tcp.try_read_buf(&mut buf) {
            Ok(0) => {
                send.send_data(Bytes::new(), true)?;
                return Ok(());
            }
            Ok(n) => {
                *total += n as u64;
                counter.inc_by(n as u64);
                send_all(send, buf.freeze()).await?;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        }
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
    counter: &Counter,
    total: &mut u64,
) -> Result<(), CopyError> {
    while let Some(chunk) = recv.data().await {
        let chunk = chunk?;
        let n = chunk.len();
        write_all(tcp, &chunk).await?;
        *total += n as u64;
        counter.inc_by(n as u64);
        recv.flow_control().release_capacity(n)?;
    }
    // END_STREAM: half-close our write side; the other direction goes on.
    socket2::SockRef::from(tcp).shutdown(std::net::Shutdown::Write)?;
    Ok(())
}

pub(crate) async fn write_all(tcp: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        tcp.writable().await?;
        match tcp.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One direction of a plain TCP copy, half-closing `to` at EOF.
pub async fn copy_tcp(from: &TcpStream, to: &TcpStream) -> std::io::Result<u64> {
    let mut total = 0;
    loop {
        from.readable().await?;
        let mut buf = bytes::BytesMut::with_capacity(16 * 1024);
        match from.try_read_buf(&mut buf) {
            Ok(0) => {
                socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write)?;
                return Ok(total);
            }
            Ok(n) => {
                total += n as u64;
                write_all(to, &buf).await?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}
