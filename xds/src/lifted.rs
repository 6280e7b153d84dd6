//! Responses decoded where they arrived, not from a copy that outlives
//! them.
//!
//! tonic assembles every gRPC message of a stream in one buffer, which
//! keeps the capacity of the largest message for as long as the stream
//! lives: istiod's first answer at 100,000 workloads is 24 MB, and the
//! buffer kept those 24 MB (32 MiB of capacity) for the life of the
//! stream after the answer was applied, a third of a KiB per workload
//! held for nothing. Here the response body ([`Lifted`]) takes each
//! message's bytes out of the stream as they arrive — the HTTP/2 DATA
//! frames' own buffers, not copied — and puts them on a [`Shelf`]; tonic
//! sees an empty message in its place, and the decoder ([`LiftedCodec`])
//! decodes the message from the shelf. What a message used is freed once
//! it is applied (its resources' bytes are slices of those buffers).
//!
//! A message tonic must refuse — a length prefix past the decoding limit,
//! a compression flag this client never negotiated — is passed through
//! unchanged, so tonic refuses it exactly as before; a body that ends
//! inside a message is an `Internal` status, as tonic's own end of stream
//! there is ([`ENDED_INSIDE`]).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tidegate_base::sync::Locked;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::ProstEncoder;

use crate::envelope::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};

/// A gRPC message's prefix: a compression flag and a 4-byte length.
const PREFIX: usize = 5;

/// What tonic reads in place of a message taken to the shelf: an
/// uncompressed message of no bytes.
const STAND_IN: [u8; PREFIX] = [0; PREFIX];

/// The status of a response body that ended inside a message.
pub const ENDED_INSIDE: &str = "istiod's stream ended in the middle of a message";

/// The messages taken out of one response body, in order, until the
/// decoder takes them.
#[derive(Clone, Debug, Default)]
pub struct Shelf(Arc<Mutex<VecDeque<Chunks>>>);

impl Shelf {
    fn put(&self, message: Chunks) {
        self.0.locked().push_back(message);
    }

    fn take(&self) -> Option<Chunks> {
        self.0.locked().pop_front()
    }
}

/// One message's bytes, as the frames brought them: a [`Buf`] whose
/// `copy_to_bytes` slices the frame it falls in (a resource's bytes are
/// not copied) and copies only what spans two frames.
#[derive(Debug, Default)]
pub struct Chunks {
    parts: VecDeque<Bytes>,
    remaining: usize,
}

impl Chunks {
    fn push(&mut self, part: Bytes) {
        if !part.is_empty() {
            self.remaining += part.len();
            self.parts.push_back(part);
        }
    }
}

impl Buf for Chunks {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.parts.front().map_or(&[], |p| p.as_ref())
    }

    fn advance(&mut self, mut n: usize) {
        assert!(n <= self.remaining, "advance past the message's end");
        self.remaining -= n;
        while n > 0 {
            let front = self.parts.front_mut().expect("bytes remain");
            if n < front.len() {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.parts.pop_front();
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        match self.parts.front_mut() {
            Some(front) if len <= front.len() => {
                let out = front.split_to(len);
                self.remaining -= len;
                if front.is_empty() {
                    self.parts.pop_front();
                }
                out
            }
            _ => {
                assert!(len <= self.remaining, "copy past the message's end");
                let mut out = BytesMut::with_capacity(len);
                out.put(self.take(len));
                out.freeze()
            }
        }
    }
}

/// Where the body is in the gRPC framing.
#[derive(Debug)]
enum State {
    /// Reading a prefix (the bytes of it so far).
    Prefix(Vec<u8>),
    /// Taking a message to the shelf: its bytes still to come.
    Message { chunks: Chunks, remaining: usize },
    /// Passing a message tonic refuses through: its bytes still to come.
    Through(usize),
}

/// A response body whose messages go to a [`Shelf`], tonic reading an
/// empty message in place of each.
pub struct Lifted<B> {
    inner: B,
    shelf: Shelf,
    /// tonic's decoding limit: a longer message is passed through.
    max_message: usize,
    state: State,
}

impl<B> Lifted<B> {
    pub fn new(inner: B, shelf: Shelf, max_message: usize) -> Lifted<B> {
        Lifted {
            inner,
            shelf,
            max_message,
            state: State::Prefix(Vec::with_capacity(PREFIX)),
        }
    }

    /// Whether part of a message has been read and the rest has not.
    fn inside(&self) -> bool {
        match &self.state {
            State::Prefix(prefix) => !prefix.is_empty(),
            State::Message { .. } | State::Through(_) => true,
        }
    }

    /// What tonic reads of `data`: stand-ins for the messages completed
    /// in it, and the bytes of messages passed through.
    fn lift(&mut self, mut data: Bytes) -> Bytes {
        let mut out = BytesMut::new();
        while !data.is_empty() {
            match &mut self.state {
                State::Prefix(prefix) => {
                    let n = (PREFIX - prefix.len()).min(data.len());
                    prefix.extend_from_slice(&data.split_to(n));
                    if prefix.len() < PREFIX {
                        continue;
                    }
                    let len = u32::from_be_bytes(prefix[1..].try_into().expect("4 bytes")) as usize;
                    if prefix[0] != 0 || len > self.max_message {
                        out.extend_from_slice(prefix);
                        self.state = State::Through(len);
                    } else {
                        self.state = State::Message {
                            chunks: Chunks::default(),
                            remaining: len,
                        };
                    }
                }
                State::Message { chunks, remaining } => {
                    let n = (*remaining).min(data.len());
                    chunks.push(data.split_to(n));
                    *remaining -= n;
                }
                State::Through(remaining) => {
                    let n = (*remaining).min(data.len());
                    out.extend_from_slice(&data.split_to(n));
                    *remaining -= n;
                }
            }
            self.finish(&mut out);
        }
        out.freeze()
    }

    /// Ends the message being read if nothing of it is left to come.
    fn finish(&mut self, out: &mut BytesMut) {
        match &mut self.state {
            State::Message {
                chunks,
                remaining: 0,
            } => {
                self.shelf.put(std::mem::take(chunks));
                out.extend_from_slice(&STAND_IN);
            }
            State::Through(0) => {}
            _ => return,
        }
        self.state = State::Prefix(Vec::with_capacity(PREFIX));
    }
}

impl<B> Body for Lifted<B>
where
    B: Body<Data = Bytes, Error = Status> + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        loop {
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => frame,
                // tonic never saw the part of a message taken so far: the
                // end inside one is said here (tonic would have said so
                // from its buffer).
                Poll::Ready(None) if this.inside() => {
                    return Poll::Ready(Some(Err(Status::internal(ENDED_INSIDE))));
                }
                other => return other,
            };
            match frame.into_data() {
                Ok(data) => {
                    let seen = this.lift(data);
                    // A frame inside a message gives tonic nothing to read.
                    if !seen.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(seen))));
                    }
                }
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// The delta ADS codec whose responses come from the [`Shelf`] of the
/// stream's [`Lifted`] body; requests are encoded as prost's codec does.
#[derive(Debug, Default)]
pub struct LiftedCodec {
    shelf: Shelf,
}

impl LiftedCodec {
    pub fn new(shelf: Shelf) -> LiftedCodec {
        LiftedCodec { shelf }
    }
}

impl Codec for LiftedCodec {
    type Encode = DeltaDiscoveryRequest;
    type Decode = DeltaDiscoveryResponse;
    type Encoder = ProstEncoder<DeltaDiscoveryRequest>;
    type Decoder = LiftedDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        LiftedDecoder {
            shelf: self.shelf.clone(),
        }
    }
}

/// Decodes each response from the shelf, in the stand-in's place.
#[derive(Debug)]
pub struct LiftedDecoder {
    shelf: Shelf,
}

impl Decoder for LiftedDecoder {
    type Item = DeltaDiscoveryResponse;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        self.next(src.remaining()).map(Some)
    }
}

impl LiftedDecoder {
    /// The response whose stand-in tonic read (`read`: the bytes tonic
    /// had for it, none for a stand-in).
    fn next(&self, read: usize) -> Result<DeltaDiscoveryResponse, Status> {
        use prost::Message as _;
        if read > 0 {
            // Only stand-ins reach tonic's decoder; a message passed
            // through was refused before it was decoded.
            return Err(Status::internal(
                "a response was not taken out of the stream before decoding",
            ));
        }
        let message = self
            .shelf
            .take()
            .ok_or_else(|| Status::internal("a response is missing from the stream's shelf"))?;
        DeltaDiscoveryResponse::decode(message)
            .map_err(|e| Status::internal(format!("a response does not decode: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{Any, Resource};
    use prost::Message as _;

    fn framed(messages: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            out.push(0);
            out.extend_from_slice(&(m.len() as u32).to_be_bytes());
            out.extend_from_slice(m);
        }
        out
    }

    /// Feeds `wire` to a [`Lifted`] in pieces of `step` bytes; what tonic
    /// would read, and the messages shelved.
    fn lift_in_pieces(wire: &[u8], step: usize, max: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
        let shelf = Shelf::default();
        let mut lifted = Lifted::new((), shelf.clone(), max);
        let mut seen = Vec::new();
        for piece in wire.chunks(step) {
            seen.extend_from_slice(&lifted.lift(Bytes::copy_from_slice(piece)));
        }
        let mut shelved = Vec::new();
        while let Some(mut m) = shelf.take() {
            shelved.push(m.copy_to_bytes(m.remaining()).to_vec());
        }
        (seen, shelved)
    }

    #[test]
    fn every_message_is_shelved_whole_and_tonic_reads_a_stand_in_however_the_frames_fall() {
        let messages: [&[u8]; 4] = [b"first", b"", b"a longer third message", b"4"];
        let wire = framed(&messages);
        for step in 1..=wire.len() {
            let (seen, shelved) = lift_in_pieces(&wire, step, 1 << 20);
            assert_eq!(seen, STAND_IN.repeat(4), "step {step}");
            assert_eq!(shelved, messages.map(<[u8]>::to_vec), "step {step}");
        }
    }

    /// A body of `frames`, then its end.
    struct Frames(VecDeque<Bytes>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    /// What the body yields until its end: the data tonic reads, or the
    /// error that ends it.
    fn drain(frames: Vec<Vec<u8>>) -> Result<Vec<u8>, Status> {
        let body = Frames(frames.into_iter().map(Bytes::from).collect());
        let mut lifted = Lifted::new(body, Shelf::default(), 1 << 20);
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut seen = Vec::new();
        loop {
            match Pin::new(&mut lifted).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(f))) => seen.extend_from_slice(&f.into_data().unwrap()),
                Poll::Ready(Some(Err(e))) => return Err(e),
                Poll::Ready(None) => return Ok(seen),
                Poll::Pending => unreachable!("the test body is always ready"),
            }
        }
    }

    #[test]
    fn a_body_ending_inside_a_message_is_an_error_and_at_a_boundary_is_not() {
        let wire = framed(&[b"whole", b"cut short"]);
        assert_eq!(drain(vec![wire.clone()]).unwrap(), STAND_IN.repeat(2));
        for cut in [wire.len() - 1, 12, 8] {
            let e = drain(vec![wire[..cut].to_vec()]).unwrap_err();
            assert_eq!(e.message(), ENDED_INSIDE, "cut at {cut}");
        }
        assert_eq!(drain(vec![wire[..10].to_vec()]).unwrap(), STAND_IN.to_vec());
    }

    #[test]
    fn a_message_past_the_limit_or_compressed_reaches_tonic_unchanged() {
        let wire = framed(&[b"0123456789"]);
        for step in [1, 3, wire.len()] {
            let (seen, shelved) = lift_in_pieces(&wire, step, 9);
            assert_eq!(
                seen, wire,
                "past the limit: tonic refuses it from its prefix"
            );
            assert!(shelved.is_empty());
        }
        let mut compressed = framed(&[b"zz"]);
        compressed[0] = 1;
        let mut wire = compressed.clone();
        wire.extend(framed(&[b"next"]));
        let (seen, shelved) = lift_in_pieces(&wire, 2, 1 << 20);
        let mut expected = compressed;
        expected.extend_from_slice(&STAND_IN);
        assert_eq!(seen, expected);
        assert_eq!(shelved, vec![b"next".to_vec()]);
    }

    #[test]
    fn a_response_decodes_from_its_frames_and_its_resources_are_slices_of_them() {
        let value = Bytes::from(vec![7u8; 3000]);
        let response = DeltaDiscoveryResponse {
            type_url: "t".into(),
            nonce: "n".into(),
            resources: (0..20)
                .map(|i| Resource {
                    name: format!("r{i}"),
                    version: "1".into(),
                    resource: Some(Any {
                        type_url: "t".into(),
                        value: value.clone(),
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let wire = framed(&[&response.encode_to_vec()]);
        let shelf = Shelf::default();
        let mut lifted = Lifted::new((), shelf.clone(), 1 << 20);
        let frames: Vec<Bytes> = wire.chunks(16 << 10).map(Bytes::copy_from_slice).collect();
        for f in &frames {
            lifted.lift(f.clone());
        }
        let mut message = shelf.take().expect("shelved");
        let within = |b: &Bytes| {
            frames.iter().any(|f| {
                let range = f.as_ptr() as usize..f.as_ptr() as usize + f.len();
                range.contains(&(b.as_ptr() as usize))
            })
        };
        let copy_check = message.parts.clone();
        assert!(copy_check.iter().all(within));
        let decoded = DeltaDiscoveryResponse::decode(&mut message).unwrap();
        assert_eq!(decoded, response);
        let sliced = decoded
            .resources
            .iter()
            .filter(|r| within(&r.resource.as_ref().unwrap().value))
            .count();
        // Only a value that spans two frames is copied.
        assert!(sliced >= 20 - frames.len(), "{sliced} of 20 not copied");
    }

    #[test]
    fn the_decoder_takes_the_shelved_response_and_refuses_what_is_not_there() {
        let shelf = Shelf::default();
        let decoder = LiftedCodec::new(shelf.clone()).decoder();
        let e = decoder.next(0).unwrap_err();
        assert!(e.message().contains("missing"), "{e}");
        let response = DeltaDiscoveryResponse {
            nonce: "7".into(),
            ..Default::default()
        };
        let mut chunks = Chunks::default();
        chunks.push(response.encode_to_vec().into());
        shelf.put(chunks);
        assert!(decoder.next(3).is_err(), "bytes tonic read itself");
        assert_eq!(decoder.next(0).unwrap(), response);
    }
}
