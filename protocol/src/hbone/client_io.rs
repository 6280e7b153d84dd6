//! The byte stream under an outbound tunnel's HTTP/2: the mTLS stream, with
//! the peer's GOAWAY noticed as it is read.
//!
//! h2 tells a client of a GOAWAY only through the next `poll_ready` of its
//! `SendRequest`, which takes the connection's lock; asking after every
//! poll of the connection contended with the streams' copy tasks on every
//! chunk. [`ClientIo`] follows the frames it reads instead
//! ([`super::frames`]) and raises a [`GoawayFlag`] the pool reads with one
//! atomic load.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::frames::FrameScan;
use crate::tls::ClientTls;

/// Raised when the peer's GOAWAY (any error code) has been read.
#[derive(Clone, Debug, Default)]
pub struct GoawayFlag(Arc<AtomicBool>);

impl GoawayFlag {
    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn raise(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The client's stream as h2 sees it: reads are followed frame by frame.
pub struct ClientIo<S = ClientTls> {
    inner: S,
    scan: FrameScan,
    goaway: GoawayFlag,
}

impl<S> ClientIo<S> {
    pub fn new(inner: S, goaway: GoawayFlag) -> Self {
        ClientIo {
            inner,
            scan: FrameScan::default(),
            goaway,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ClientIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let goaway = &this.goaway;
        this.scan.scan(&buf.filled()[before..], &mut |f| {
            if f.goaway {
                goaway.raise();
            }
        });
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ClientIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::super::frames::wire::{frame, goaway, rst};
    use super::*;

    /// Reads `bytes` through a `ClientIo` in small reads; whether the flag
    /// went up.
    async fn read_through(bytes: Vec<u8>) -> (bool, Vec<u8>) {
        let (mut peer, ours) = tokio::io::duplex(64);
        let flag = GoawayFlag::default();
        let mut io = ClientIo::new(ours, flag.clone());
        let writer = tokio::spawn(async move {
            peer.write_all(&bytes).await.unwrap();
        });
        let mut got = Vec::new();
        io.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        (flag.is_raised(), got)
    }

    #[tokio::test]
    async fn raises_the_flag_on_a_graceful_goaway_and_passes_bytes_through() {
        let mut bytes = frame(0x4, 0, &[0; 12]); // SETTINGS
        bytes.extend(frame(0x0, 1, &[7; 5_000])); // DATA
        bytes.extend(goaway(0)); // NO_ERROR: the peer drains
        let (raised, got) = read_through(bytes.clone()).await;
        assert!(raised);
        assert_eq!(got, bytes, "bytes reach h2 unchanged");
    }

    #[tokio::test]
    async fn a_reset_or_a_goaway_inside_data_is_no_goaway() {
        let mut bytes = frame(0x4, 0, &[0; 12]);
        bytes.extend(rst(1, 8));
        // A DATA payload that looks like a GOAWAY frame is skipped.
        bytes.extend(frame(0x0, 3, &goaway(0)));
        let (raised, _) = read_through(bytes).await;
        assert!(!raised);
    }
}
