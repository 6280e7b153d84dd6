//! DNS over TCP's framing on 15053 (RFC 1035 §4.2.2: a two-byte length,
//! then the message), with a bound on each step so that no client holds a
//! connection, or the memory behind it, past `dns.timeout`:
//!
//! - the next query, prefix and all, must arrive within `dns.timeout`:
//!   nothing at all is `idle`; half a prefix or part of a message is
//!   `stalled`; the client closing mid-message is `incomplete`;
//! - a length past [`MAX_QUERY`] is `oversized`, closed at once, before
//!   anything is read into memory;
//! - an answer must be taken by the client within `dns.timeout`: a client
//!   that never reads (or reads a byte at a time) is a `slow_reader`.
//!
//! Each reason is counted (`tidegate_dns_tcp_closed_total`); a connection
//! is one task, so the others are not held up meanwhile.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::{timeout, timeout_at, Instant};

/// The largest query taken over TCP. A query is a header, one name of at
/// most 255 bytes and an EDNS record; with the padding of RFC 8467 (to 468
/// bytes) and every common option it stays under 1 KiB.
pub const MAX_QUERY: usize = 4096;

/// Why the proxy closed a connection (a metric label).
pub type Closed = &'static str;

/// The next query on `stream`: `Ok(None)` when the client closed between
/// messages.
pub async fn read_query<S: AsyncRead + Unpin>(
    stream: &mut S,
    within: Duration,
) -> Result<Option<Vec<u8>>, Closed> {
    let deadline = Instant::now() + within;
    let mut prefix = [0u8; 2];
    let mut got = 0;
    while got < prefix.len() {
        match timeout_at(deadline, stream.read(&mut prefix[got..])).await {
            Err(_) if got == 0 => return Err("idle"),
            Err(_) => return Err("stalled"),
            Ok(Ok(0) | Err(_)) if got == 0 => return Ok(None),
            Ok(Ok(0) | Err(_)) => return Err("incomplete"),
            Ok(Ok(n)) => got += n,
        }
    }
    let len = usize::from(u16::from_be_bytes(prefix));
    if len > MAX_QUERY {
        return Err("oversized");
    }
    let mut query = vec![0u8; len];
    match timeout_at(deadline, stream.read_exact(&mut query)).await {
        Err(_) => Err("stalled"),
        Ok(Err(_)) => Err("incomplete"),
        Ok(Ok(_)) => Ok(Some(query)),
    }
}

/// Sends `answer` on `stream`, framed, within `within`. `Err(None)`: the
/// client is gone.
pub async fn write_answer<S: AsyncWrite + Unpin>(
    stream: &mut S,
    answer: &[u8],
    within: Duration,
) -> Result<(), Option<Closed>> {
    let len = u16::try_from(answer.len()).map_err(|_| None)?;
    let mut framed = Vec::with_capacity(answer.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(answer);
    match timeout(within, stream.write_all(&framed)).await {
        Err(_) => Err(Some("slow_reader")),
        Ok(Err(_)) => Err(None),
        Ok(Ok(())) => Ok(()),
    }
}
