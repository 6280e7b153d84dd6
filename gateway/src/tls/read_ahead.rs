//! The socket under a TLS connection, read ahead of rustls.
//!
//! rustls reads the socket into its own buffer and asks for no more than
//! the room left there: at most one record (16 KiB and a header), and 4 KiB
//! at a time after its buffer drained. A tunnel carrying a bulk flow made
//! one `recvfrom` per record, 64 per MB (most of the receiving gateway's
//! syscalls; `--bench dataplane -- --pair` with `DATAPLANE_PERF_STAT=1`
//! counts them).
//!
//! [`ReadAhead`] reads straight into rustls' buffer while reads are short,
//! as before. Once a read fills the room rustls offered (more is queued),
//! the next reads go into a buffer of its own, sized as the app-side copy
//! sizes its reads: 64 KiB, doubling to 256 KiB while reads fill it, and
//! rustls is served from there. Each byte is copied once more in user
//! space, for a fraction of the syscalls. A read that drains the socket
//! ends the read-ahead, and the buffer is let go once served, so an idle
//! tunnel holds none (the memory figure per idle connection is
//! unchanged). Writes go straight to the socket.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::socket_io::read_drained;

/// The first read ahead, and the largest.
const AHEAD_MIN: usize = 64 * 1024;
const AHEAD_MAX: usize = 256 * 1024;

/// A TCP stream whose reads run ahead of the caller while a flow lasts.
#[derive(Debug)]
pub struct ReadAhead {
    tcp: TcpStream,
    /// Read but not yet handed out.
    buf: BytesMut,
    /// The size of the next read ahead; 0 while reads go straight to the
    /// caller's buffer.
    ahead: usize,
    /// Socket reads made, for tests.
    #[cfg(test)]
    reads: usize,
}

impl ReadAhead {
    pub fn new(tcp: TcpStream) -> Self {
        ReadAhead {
            tcp,
            buf: BytesMut::new(),
            ahead: 0,
            #[cfg(test)]
            reads: 0,
        }
    }

    pub fn get_ref(&self) -> &TcpStream {
        &self.tcp
    }

    /// The socket; bytes read ahead and not handed out are dropped.
    pub fn into_inner(self) -> TcpStream {
        self.tcp
    }

    /// Hands out what was read ahead; lets the buffer go once it is all
    /// served and the flow has caught up.
    fn serve(&mut self, out: &mut ReadBuf<'_>) {
        let n = out.remaining().min(self.buf.len());
        out.put_slice(&self.buf[..n]);
        self.buf.advance(n);
        if self.buf.is_empty() && self.ahead == 0 {
            self.buf = BytesMut::new();
        }
    }

    /// One read straight into the caller's buffer; a read that fills it
    /// starts the read-ahead.
    fn poll_direct(&mut self, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let room = out.remaining();
        let before = out.filled().len();
        ready!(Pin::new(&mut self.tcp).poll_read(cx, out))?;
        self.count_read();
        if room > 0 && out.filled().len() - before == room {
            self.ahead = AHEAD_MIN;
        }
        Poll::Ready(Ok(()))
    }

    /// One read ahead into the own buffer (empty when called).
    fn poll_ahead(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        self.buf.reserve(self.ahead);
        loop {
            if self.tcp.poll_read_ready(cx)?.is_pending() {
                // Caught up: no buffer is held while the socket is quiet.
                self.ahead = 0;
                self.buf = BytesMut::new();
                return Poll::Pending;
            }
            let room = self.buf.capacity() - self.buf.len();
            match read_drained(&self.tcp, &mut self.buf) {
                Ok(n) => {
                    self.count_read();
                    self.ahead = match n {
                        _ if n == room => (self.ahead * 2).min(AHEAD_MAX),
                        _ => 0,
                    };
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    #[cfg(test)]
    fn count_read(&mut self) {
        self.reads += 1;
    }

    #[cfg(not(test))]
    fn count_read(&mut self) {}
}

impl AsyncRead for ReadAhead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.buf.is_empty() {
            if this.ahead == 0 {
                return this.poll_direct(cx, out);
            }
            if ready!(this.poll_ahead(cx))? == 0 {
                // EOF: nothing more to hand out.
                return Poll::Ready(Ok(()));
            }
        }
        this.serve(out);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ReadAhead {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpSocket;

    /// A connected pair whose socket buffers hold a few MiB, so a test can
    /// queue a megabyte before reading any of it.
    async fn pair() -> (TcpStream, ReadAhead) {
        let big = 4 << 20;
        let l = TcpSocket::new_v4().unwrap();
        l.set_recv_buffer_size(big).unwrap();
        l.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let l = l.listen(1).unwrap();
        let c = TcpSocket::new_v4().unwrap();
        c.set_send_buffer_size(big).unwrap();
        let (a, b) = tokio::join!(c.connect(l.local_addr().unwrap()), l.accept());
        (a.unwrap(), ReadAhead::new(b.unwrap().0))
    }

    /// One poll of a read: `None` while it waits.
    async fn poll_once(rx: &mut ReadAhead, b: &mut [u8]) -> Option<usize> {
        std::future::poll_fn(|cx| {
            let mut rb = ReadBuf::new(b);
            Poll::Ready(match Pin::new(&mut *rx).poll_read(cx, &mut rb) {
                Poll::Ready(r) => Some(r.map(|()| rb.filled().len()).unwrap()),
                Poll::Pending => None,
            })
        })
        .await
    }

    /// The bytes a stream of `len` carries: not periodic in any read size.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// Everything arrives, in order, through reads of a record's size
    /// (what rustls asks for) and of odd sizes, across the switches between
    /// direct reads and reads ahead; EOF comes through after the last byte.
    #[tokio::test]
    async fn hands_out_every_byte_in_order_then_eof() {
        for piece in [16 * 1024 + 5, 4096, 1000] {
            let (mut tx, mut rx) = pair().await;
            let sent = pattern(3 << 20);
            let body = sent.clone();
            let writer = tokio::spawn(async move {
                for chunk in body.chunks(100_000) {
                    tx.write_all(chunk).await.unwrap();
                }
            });
            let mut got = Vec::with_capacity(sent.len());
            let mut b = vec![0u8; piece];
            loop {
                let n = rx.read(&mut b).await.unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&b[..n]);
            }
            writer.await.unwrap();
            assert_eq!(got.len(), sent.len(), "piece {piece}");
            assert!(got == sent, "bytes differ, piece {piece}");
        }
    }

    /// With a megabyte queued, record-sized reads cost a fraction of one
    /// socket read per record (rustls alone made one per record).
    #[tokio::test]
    async fn queued_bytes_are_read_in_few_large_reads() {
        let (mut tx, mut rx) = pair().await;
        let sent = pattern(1 << 20);
        tx.write_all(&sent).await.unwrap();
        tx.shutdown().await.unwrap();
        let record = 16 * 1024 + 22;
        let mut b = vec![0u8; record];
        let mut got = Vec::new();
        let mut calls = 0;
        loop {
            let n = rx.read(&mut b).await.unwrap();
            calls += 1;
            if n == 0 {
                break;
            }
            got.extend_from_slice(&b[..n]);
        }
        assert!(got == sent);
        assert!(calls >= (1 << 20) / record, "{calls} calls");
        assert!(
            rx.reads * 4 <= calls,
            "{} socket reads for {calls} record-sized reads",
            rx.reads
        );
    }

    /// Once the socket is drained the buffer is let go and reads go
    /// straight to the caller again: an idle tunnel holds nothing.
    #[tokio::test]
    async fn a_quiet_socket_holds_no_buffer() {
        let (mut tx, mut rx) = pair().await;
        tx.write_all(&pattern(512 * 1024)).await.unwrap();
        let mut b = vec![0u8; 16 * 1024];
        let mut got = 0;
        while got < 512 * 1024 {
            got += rx.read(&mut b).await.unwrap();
        }
        assert!(rx.reads < 16, "read ahead: {} socket reads", rx.reads);
        // Nothing queued now: the next read waits, and lets the buffer go.
        assert_eq!(poll_once(&mut rx, &mut b).await, None, "nothing was sent");
        assert_eq!(rx.buf.capacity(), 0);
        assert_eq!(rx.ahead, 0);
        // A small message afterwards is read straight into the caller's buffer.
        let before = rx.reads;
        tx.write_all(b"ping").await.unwrap();
        let n = rx.read(&mut b).await.unwrap();
        assert_eq!(&b[..n], b"ping");
        assert_eq!(rx.reads, before + 1);
        assert_eq!(rx.buf.capacity(), 0);
    }
}
