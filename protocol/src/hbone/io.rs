//! The byte stream under an inbound tunnel's HTTP/2: the mTLS stream, how it
//! is finally closed (with or without a TLS close_notify alert), and the
//! refusals h2 writes on its own.
//!
//! h2 answers some misbehaviour without ever handing the stream to us: a
//! malformed request (`:protocol` without extended CONNECT, an empty
//! `:authority`, …) gets RST_STREAM(PROTOCOL_ERROR), a stream beyond
//! `SETTINGS_MAX_CONCURRENT_STREAMS` gets RST_STREAM(REFUSED_STREAM), a
//! flood gets GOAWAY(ENHANCE_YOUR_CALM). The only place those are visible is
//! the frames h2 writes, so [`ServerIo`] follows the frame headers of what it
//! writes (9 bytes each, plus the error code of RST_STREAM and GOAWAY) and
//! reports each error-coded one to a [`RefusalSink`].

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::frames::{ErrorFrame, FrameScan};
use crate::tls::ServerTls;

/// The HTTP/2 frame that carried a refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalFrame {
    /// RST_STREAM: one stream refused.
    RstStream,
    /// GOAWAY with an error code: the whole connection.
    Goaway,
}

impl RefusalFrame {
    pub fn label(self) -> &'static str {
        match self {
            RefusalFrame::RstStream => "rst_stream",
            RefusalFrame::Goaway => "goaway",
        }
    }
}

/// An error-coded RST_STREAM or GOAWAY the server wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub frame: RefusalFrame,
    pub reason: h2::Reason,
}

/// Where [`ServerIo`] reports the refusals it sees written.
pub type RefusalSink = Arc<dyn Fn(Refusal) + Send + Sync>;

/// The metric label of an HTTP/2 error code (RFC 9113 §7), bounded.
pub fn reason_label(r: h2::Reason) -> &'static str {
    use h2::Reason as R;
    match r {
        R::NO_ERROR => "no_error",
        R::PROTOCOL_ERROR => "protocol_error",
        R::INTERNAL_ERROR => "internal_error",
        R::FLOW_CONTROL_ERROR => "flow_control_error",
        R::SETTINGS_TIMEOUT => "settings_timeout",
        R::STREAM_CLOSED => "stream_closed",
        R::FRAME_SIZE_ERROR => "frame_size_error",
        R::REFUSED_STREAM => "refused_stream",
        R::CANCEL => "cancel",
        R::COMPRESSION_ERROR => "compression_error",
        R::CONNECT_ERROR => "connect_error",
        R::ENHANCE_YOUR_CALM => "enhance_your_calm",
        R::INADEQUATE_SECURITY => "inadequate_security",
        R::HTTP_1_1_REQUIRED => "http_1_1_required",
        _ => "unknown",
    }
}

/// The refusal an error frame h2 wrote means: none for NO_ERROR (a drain)
/// and CANCEL (our own reset of a stream whose copy failed).
fn refusal(frame: ErrorFrame) -> Option<Refusal> {
    if frame.reason == h2::Reason::NO_ERROR || frame.reason == h2::Reason::CANCEL {
        return None;
    }
    let kind = if frame.goaway {
        RefusalFrame::Goaway
    } else {
        RefusalFrame::RstStream
    };
    Some(Refusal {
        frame: kind,
        reason: frame.reason,
    })
}

/// The mTLS stream of one inbound tunnel as h2 sees it.
///
/// Close contract: when h2 shuts the connection down (after a GOAWAY, once
/// its streams ended, or at the drain deadline), pending TLS records are
/// flushed; then a TLS close_notify alert is sent if the [`CloseNotify`]
/// flag is set (the default) and the TCP write side shut; without it only
/// the TCP write side is shut, so the peer sees the connection end without
/// a clean TLS close.
///
/// After such an orderly close the socket lingers (see [`LINGER`]): what the
/// peer still sends (a PING ack, a WINDOW_UPDATE, its own GOAWAY) is read
/// and dropped until the peer closes too. Closing a socket with unread bytes
/// makes the kernel answer with a TCP reset, and the peer, still writing,
/// would see its clean close end in a broken pipe.
pub struct ServerIo {
    /// Taken only when dropped (to linger).
    tls: Option<ServerTls>,
    /// Set once the write side was shut in order (h2's final close).
    shut: bool,
    close_notify: CloseNotify,
    scan: FrameScan,
    refusals: RefusalSink,
}

/// Whether a tunnel's final close sends TLS close_notify; shared between the
/// serving task (which sets it from GOAWAY commands) and the stream.
#[derive(Clone, Debug)]
pub struct CloseNotify(Arc<AtomicBool>);

impl CloseNotify {
    pub fn set(&self, yes: bool) {
        self.0.store(yes, Ordering::Relaxed);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl ServerIo {
    pub fn new(tls: ServerTls, refusals: RefusalSink) -> Self {
        ServerIo {
            tls: Some(tls),
            shut: false,
            close_notify: CloseNotify(Arc::new(AtomicBool::new(true))),
            scan: FrameScan::default(),
            refusals,
        }
    }

    /// The flag deciding how this stream is finally closed.
    pub fn close_notify(&self) -> CloseNotify {
        self.close_notify.clone()
    }

    fn tls(&mut self) -> Pin<&mut ServerTls> {
        Pin::new(self.tls.as_mut().expect("taken only on drop"))
    }

    fn observe(&mut self, written: &[u8]) {
        let sink = &self.refusals;
        self.scan.scan(written, &mut |frame| {
            if let Some(r) = refusal(frame) {
                sink(r)
            }
        });
    }
}

impl AsyncRead for ServerIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.get_mut().tls().poll_read(cx, buf)
    }
}

impl AsyncWrite for ServerIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = std::task::ready!(this.tls().poll_write(cx, buf))?;
        this.observe(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = std::task::ready!(this.tls().poll_write_vectored(cx, bufs))?;
        let mut left = n;
        for b in bufs {
            if left == 0 {
                break;
            }
            let k = left.min(b.len());
            this.observe(&b[..k]);
            left -= k;
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().tls().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = if this.close_notify.get() {
            // tokio-rustls: close_notify, flush, then shut the TCP write side.
            std::task::ready!(this.tls().poll_shutdown(cx))
        } else {
            std::task::ready!(this.tls().poll_flush(cx))?;
            let tcp = &mut this.tls.as_mut().expect("taken only on drop").get_mut().0;
            std::task::ready!(Pin::new(tcp).poll_shutdown(cx))
        };
        this.shut = r.is_ok();
        Poll::Ready(r)
    }
}

/// How long a closed tunnel's socket keeps reading what the peer still
/// sends before it is closed anyway.
pub const LINGER: Duration = Duration::from_secs(2);

impl Drop for ServerIo {
    fn drop(&mut self) {
        let (Some(tls), true) = (self.tls.take(), self.shut) else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (tcp, _) = tls.into_inner();
        rt.spawn(linger(tcp));
    }
}

/// Reads and drops what arrives until the peer closes, fails, or [`LINGER`]
/// passes; then the socket closes without unread bytes (no reset).
async fn linger(mut tcp: tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut sink = [0u8; 256];
    let drained = async {
        while let Ok(n) = tcp.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drained).await;
}

#[cfg(test)]
mod tests {
    use super::super::frames::wire::*;
    use super::*;

    fn refusals(bytes: &[u8], piece: usize) -> Vec<Refusal> {
        scan_in_pieces(bytes, piece)
            .into_iter()
            .filter_map(refusal)
            .collect()
    }

    #[test]
    fn finds_error_coded_resets_and_goaways_across_any_split() {
        let mut bytes = frame(0x4, 0, &[0; 12]); // SETTINGS
        bytes.extend(frame(0x0, 1, &[7; 40_000])); // DATA
        bytes.extend(rst(3, 1)); // PROTOCOL_ERROR
        bytes.extend(rst(5, 8)); // CANCEL: ours, not a refusal
        bytes.extend(rst(7, 7)); // REFUSED_STREAM
        bytes.extend(goaway(0)); // NO_ERROR: a drain, not a refusal
        bytes.extend(frame(0x6, 0, &[0; 8])); // PING
        bytes.extend(goaway(0xb)); // ENHANCE_YOUR_CALM
        let want = vec![
            Refusal {
                frame: RefusalFrame::RstStream,
                reason: h2::Reason::PROTOCOL_ERROR,
            },
            Refusal {
                frame: RefusalFrame::RstStream,
                reason: h2::Reason::REFUSED_STREAM,
            },
            Refusal {
                frame: RefusalFrame::Goaway,
                reason: h2::Reason::ENHANCE_YOUR_CALM,
            },
        ];
        for piece in [1, 2, 5, 9, 13, 1000, bytes.len()] {
            assert_eq!(refusals(&bytes, piece), want, "split every {piece}");
        }
    }

    #[test]
    fn labels_are_bounded() {
        assert_eq!(reason_label(h2::Reason::REFUSED_STREAM), "refused_stream");
        assert_eq!(reason_label(h2::Reason::from(0xdead)), "unknown");
    }
}
