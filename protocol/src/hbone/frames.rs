//! Following the frame boundaries of an HTTP/2 byte stream from outside h2,
//! to see the frames h2 acts on without telling us: the error-coded
//! RST_STREAM and GOAWAY it writes on its own (`io.rs`, server side), and
//! the GOAWAY a peer sends a client (`client_io.rs`).
//!
//! Only frame headers (9 bytes) and, for RST_STREAM and GOAWAY, the error
//! code are copied; every other payload byte is skipped, so following a
//! bulk stream costs a few comparisons per frame.

pub(crate) const FRAME_HEADER: usize = 9;
pub(crate) const TYPE_RST_STREAM: u8 = 0x3;
pub(crate) const TYPE_GOAWAY: u8 = 0x7;

/// An RST_STREAM or GOAWAY frame, with its error code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ErrorFrame {
    /// GOAWAY (the whole connection) rather than RST_STREAM (one stream).
    pub goaway: bool,
    pub reason: h2::Reason,
}

/// Follows the frame boundaries of an HTTP/2 byte stream (after the
/// client preface, which is not a frame).
#[derive(Debug)]
pub(crate) struct FrameScan {
    /// The frame header, then the payload bytes up to the error code.
    head: [u8; FRAME_HEADER + 8],
    filled: usize,
    /// How many bytes of `head` this frame needs (9, 13 or 17).
    want: usize,
    /// Payload bytes still to pass over.
    skip: usize,
}

impl Default for FrameScan {
    fn default() -> Self {
        FrameScan {
            head: [0; FRAME_HEADER + 8],
            filled: 0,
            want: FRAME_HEADER,
            skip: 0,
        }
    }
}

impl FrameScan {
    /// Consumes the next bytes of the stream; calls `found` for every
    /// RST_STREAM and GOAWAY frame whose error code they complete.
    pub(crate) fn scan(&mut self, mut buf: &[u8], found: &mut impl FnMut(ErrorFrame)) {
        while !buf.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(buf.len());
                self.skip -= n;
                buf = &buf[n..];
                continue;
            }
            let n = (self.want - self.filled).min(buf.len());
            self.head[self.filled..self.filled + n].copy_from_slice(&buf[..n]);
            self.filled += n;
            buf = &buf[n..];
            if self.filled == self.want {
                self.frame_part_done(found);
            }
        }
    }

    fn frame_part_done(&mut self, found: &mut impl FnMut(ErrorFrame)) {
        let len = u32::from_be_bytes([0, self.head[0], self.head[1], self.head[2]]) as usize;
        let kind = self.head[3];
        let code_at = match kind {
            TYPE_RST_STREAM if len >= 4 => Some(0),
            TYPE_GOAWAY if len >= 8 => Some(4),
            _ => None,
        };
        match code_at {
            Some(at) if self.want == FRAME_HEADER => {
                // Read on up to the end of the error code.
                self.want = FRAME_HEADER + at + 4;
                return;
            }
            Some(at) => {
                let c = &self.head[FRAME_HEADER + at..FRAME_HEADER + at + 4];
                found(ErrorFrame {
                    goaway: kind == TYPE_GOAWAY,
                    reason: h2::Reason::from(u32::from_be_bytes([c[0], c[1], c[2], c[3]])),
                });
            }
            None => {}
        }
        self.skip = len - (self.want - FRAME_HEADER);
        self.filled = 0;
        self.want = FRAME_HEADER;
    }
}

/// Test helpers: frames as bytes.
#[cfg(test)]
pub(crate) mod wire {
    use super::*;

    pub(crate) fn frame(kind: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, 0];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    pub(crate) fn goaway(code: u32) -> Vec<u8> {
        let mut p = 7u32.to_be_bytes().to_vec();
        p.extend_from_slice(&code.to_be_bytes());
        p.extend_from_slice(b"debug data");
        frame(TYPE_GOAWAY, 0, &p)
    }

    pub(crate) fn rst(stream: u32, code: u32) -> Vec<u8> {
        frame(TYPE_RST_STREAM, stream, &code.to_be_bytes())
    }

    /// Every error frame `scan` finds in `bytes` fed `piece` bytes at a time.
    pub(crate) fn scan_in_pieces(bytes: &[u8], piece: usize) -> Vec<ErrorFrame> {
        let mut scan = FrameScan::default();
        let mut out = Vec::new();
        for chunk in bytes.chunks(piece) {
            scan.scan(chunk, &mut |f| out.push(f));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::wire::*;
    use super::*;

    #[test]
    fn finds_every_reset_and_goaway_across_any_split() {
        let mut bytes = frame(0x4, 0, &[0; 12]); // SETTINGS
        bytes.extend(frame(0x0, 1, &[7; 40_000])); // DATA, payload skipped
        bytes.extend(rst(3, 1)); // PROTOCOL_ERROR
        bytes.extend(rst(5, 8)); // CANCEL
        bytes.extend(goaway(0)); // NO_ERROR
        bytes.extend(frame(0x6, 0, &[0; 8])); // PING
        bytes.extend(frame(TYPE_GOAWAY, 0, &[0; 3])); // too short for a code: skipped
        bytes.extend(goaway(0xb)); // ENHANCE_YOUR_CALM
        let f = |goaway, code: u32| ErrorFrame {
            goaway,
            reason: h2::Reason::from(code),
        };
        let want = vec![f(false, 1), f(false, 8), f(true, 0), f(true, 0xb)];
        for piece in [1, 2, 5, 9, 13, 1000, bytes.len()] {
            assert_eq!(scan_in_pieces(&bytes, piece), want, "split every {piece}");
        }
    }
}
