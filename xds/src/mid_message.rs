//! A response body that fails when istiod stops half-way through a
//! message. The channel's pulse notices a connection gone silent (an
//! unanswered PING) and the client's bound on a stream's first answer
//! notices a stream that never starts; neither notices a server whose
//! connection still answers PINGs while one stream stops in the middle of
//! a gRPC message — a stream that would then wait forever, applying
//! nothing. Between messages a stream may rest as long as the mesh does
//! not change; inside one, every `timeout` must bring a byte.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};

/// How the status that ends such a stream begins (a body error is a
/// `Status` by the time the client sees it: its text identifies it).
pub const STALLED: &str = "istiod stopped in the middle of a message:";

/// `inner`, failed once it stays `timeout` inside a message without a
/// byte.
pub struct MidMessage<B> {
    inner: B,
    timeout: Duration,
    /// Bytes of the current message's 5-byte prefix read so far.
    prefix: Vec<u8>,
    /// Bytes of the current message still to come after its prefix.
    remaining: usize,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether `deadline` runs for the current wait (a timer is made once
    /// and reset for each wait, not made again per frame).
    armed: bool,
}

impl<B> MidMessage<B> {
    pub fn new(inner: B, timeout: Duration) -> MidMessage<B> {
        MidMessage {
            inner,
            timeout,
            prefix: Vec::with_capacity(5),
            remaining: 0,
            deadline: None,
            armed: false,
        }
    }

    fn inside(&self) -> bool {
        !self.prefix.is_empty() || self.remaining > 0
    }

    /// Follows the gRPC framing (a flag byte, a 4-byte length, the
    /// message) through `data`.
    fn track(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data.advance(n);
                continue;
            }
            let n = (5 - self.prefix.len()).min(data.len());
            self.prefix.extend_from_slice(&data[..n]);
            data.advance(n);
            if self.prefix.len() == 5 {
                let len = u32::from_be_bytes(self.prefix[1..5].try_into().expect("4 bytes"));
                self.remaining = len as usize;
                self.prefix.clear();
            }
        }
    }
}

impl<B> Body for MidMessage<B>
where
    B: Body<Data = Bytes, Error = tonic::Status> + Unpin,
{
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(Ok(frame)) = &frame {
                    if let Some(data) = frame.data_ref() {
                        this.track(data);
                    }
                }
                this.armed = false;
                Poll::Ready(frame)
            }
            Poll::Pending if this.inside() => {
                let timeout = this.timeout;
                let deadline = this
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if !this.armed {
                    deadline
                        .as_mut()
                        .reset(tokio::time::Instant::now() + timeout);
                    this.armed = true;
                }
                if deadline.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                Poll::Ready(Some(Err(tonic::Status::unavailable(format!(
                    "{STALLED} no byte for {timeout:?}"
                )))))
            }
            Poll::Pending => {
                this.armed = false;
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_is_followed_across_chunks() {
        let mut m = MidMessage::new((), Duration::from_secs(1));
        m.track(&[0, 0, 0]);
        assert!(m.inside(), "half a prefix");
        m.track(&[0, 3, b'a']);
        assert!(m.inside(), "one of three bytes");
        m.track(&[b'b', b'c', 0, 0, 0, 0, 0]);
        assert!(!m.inside(), "a message and an empty one, whole");
        m.track(&[0, 0, 0, 0, 1]);
        assert!(m.inside());
    }
}
