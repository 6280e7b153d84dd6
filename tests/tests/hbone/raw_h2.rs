//! A raw HTTP/2 client over the real mTLS: it writes frames itself (HPACK
//! literals, no Huffman, no table) so it can send what the h2 crate refuses
//! to send, and hands over the server's frames exactly as they arrive.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tidegate_e2e::TwoNodes;
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::{ClientTls, DevCa, TlsContext, TlsMetrics};
use tokio::io::{AsyncReadExt, AsyncWriteExt, WriteHalf};
use tokio::sync::mpsc;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const REFUSED_STREAM: u32 = 0x7;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// One frame as the server sent it.
#[derive(Debug)]
pub struct Frame {
    pub kind: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The error code of a RST_STREAM or GOAWAY.
    pub fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            RST_STREAM => 0,
            GOAWAY => 4,
            _ => return None,
        };
        let b = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

pub struct RawH2 {
    write: WriteHalf<ClientTls>,
    frames: mpsc::UnboundedReceiver<Frame>,
    next_stream: u32,
}

/// A TLS connection as `demo/client` to the echo workload's HBONE address
/// (ALPN h2, nothing sent yet).
pub async fn tls_to_echo(nodes: &TwoNodes) -> ClientTls {
    let ca = Arc::new(DevCa::open(&nodes.ca_dir(), Duration::from_secs(600)).unwrap());
    let tls = TlsContext::new(ca, "cluster.local", TlsMetrics::default());
    let addr = SocketAddr::new(
        nodes.echo.ip(),
        nodes.server.addrs.inbound.expect("node listeners").port(),
    );
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let id = |sa| SpiffeId::new("cluster.local", "demo", sa);
    tls.connect(&id("client"), &id("echo"), addr.ip(), tcp)
        .await
        .unwrap()
}

/// An mTLS connection as `demo/client` to the echo workload's HBONE address,
/// with the client preface and an empty SETTINGS already sent.
pub async fn connect(nodes: &TwoNodes) -> RawH2 {
    let stream = tls_to_echo(nodes).await;
    let (mut read, write) = tokio::io::split(stream);
    let (tx, frames) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let mut head = [0u8; 9];
            if read.read_exact(&mut head).await.is_err() {
                return;
            }
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0; len];
            if read.read_exact(&mut payload).await.is_err() {
                return;
            }
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let frame = Frame {
                kind: head[3],
                stream,
                payload,
            };
            if tx.send(frame).is_err() {
                return;
            }
        }
    });
    let mut raw = RawH2 {
        write,
        frames,
        next_stream: 1,
    };
    raw.write
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    raw.send_frame(0x4, 0, 0, &[]).await;
    raw
}

fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK header block of literals without indexing (RFC 7541 §6.2.2).
fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        assert!(name.len() < 127 && value.len() < 127);
        block.push(0x00);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    block
}

impl RawH2 {
    async fn send_frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let f = frame_bytes(kind, flags, stream, payload);
        self.write.write_all(&f).await.unwrap();
    }

    /// Opens a stream with these header fields (END_HEADERS, not
    /// END_STREAM); returns its id.
    pub async fn open(&mut self, fields: &[(&str, &str)]) -> u32 {
        let id = self.next_stream;
        self.next_stream += 2;
        self.send_frame(HEADERS, 0x4, id, &header_block(fields))
            .await;
        id
    }

    /// DATA on stream `id` (END_STREAM when `end`).
    pub async fn data(&mut self, id: u32, bytes: &[u8], end: bool) {
        self.send_frame(DATA, u8::from(end), id, bytes).await;
    }

    /// Answers the server's PING (ACK, the same 8 bytes).
    pub async fn ping_ack(&mut self, payload: &[u8]) {
        self.send_frame(PING, 0x1, 0, payload).await;
    }

    /// Many streams in one write; returns how many were written before the
    /// server closed the connection.
    pub async fn open_many(&mut self, fields: &[(&str, &str)], n: usize) -> usize {
        let block = header_block(fields);
        let mut written = 0;
        for chunk in (0..n).collect::<Vec<_>>().chunks(64) {
            let mut bytes = Vec::new();
            for _ in chunk {
                bytes.extend(frame_bytes(HEADERS, 0x4, self.next_stream, &block));
                self.next_stream += 2;
            }
            if self.write.write_all(&bytes).await.is_err() {
                return written;
            }
            written += chunk.len();
        }
        written
    }

    /// The next frame from the server that `want` accepts (others are
    /// skipped); panics after 5 s or when the connection ends first.
    pub async fn until(&mut self, what: &str, want: impl Fn(&Frame) -> bool) -> Frame {
        let wait = async {
            while let Some(f) = self.frames.recv().await {
                if want(&f) {
                    return f;
                }
            }
            panic!("connection ended before {what}");
        };
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .unwrap_or_else(|_| panic!("no {what} within 5 s"))
    }
}
