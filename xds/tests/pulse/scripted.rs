//! An istiod that answers each request the client sends by a script: a
//! hostile one sends what the script says — oversized messages, a bad
//! resource again and again, types never subscribed, half a message —
//! and records every request (the client's subscriptions, ACKs and
//! NACKs) with the stream it came on. It serves TLS on loopback, as
//! istiod, or plaintext on a Unix socket, as Cilium's agent.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message as _;
use tidegate_xds::envelope::{DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What the server sends on a stream.
#[derive(Clone, Debug)]
pub enum Says {
    /// One response, gRPC-framed.
    Response(DeltaDiscoveryResponse),
    /// Bytes as they are (a length prefix alone, half a message).
    Raw(Bytes),
    /// Ends the stream with this gRPC status.
    End(u32),
}

/// A request received: the stream's index (in the order streams were
/// opened) and the request.
pub type Received = (usize, DeltaDiscoveryRequest);

/// Answers the `n`th request of stream `stream` (both from 0).
pub type Script = Arc<dyn Fn(usize, usize, &DeltaDiscoveryRequest) -> Vec<Says> + Send + Sync>;

pub struct Scripted {
    pub addr: SocketAddr,
    /// The Unix socket served instead of TLS ([`Scripted::start_unix`]).
    pub socket: Option<PathBuf>,
    pub roots: PathBuf,
    pub received: watch::Receiver<Vec<Received>>,
    _dir: tempfile::TempDir,
}

impl Scripted {
    pub async fn start(script: Script) -> Scripted {
        let dir = tempfile::tempdir().unwrap();
        let (tls, root_pem) = crate::istiod::serving_tls();
        let roots = dir.path().join("root-cert.pem");
        std::fs::write(&roots, root_pem).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, received) = watch::channel(Vec::new());
        let tx = Arc::new(tx);
        let streams = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let Ok(stream) = tls.accept(tcp).await else {
                    continue;
                };
                tokio::spawn(serve_connection(
                    stream,
                    script.clone(),
                    tx.clone(),
                    streams.clone(),
                ));
            }
        });
        Scripted {
            addr,
            socket: None,
            roots,
            received,
            _dir: dir,
        }
    }

    /// The same server in plaintext on a Unix socket (`addr` unused).
    pub async fn start_unix(script: Script) -> Scripted {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("xds.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let (tx, received) = watch::channel(Vec::new());
        let tx = Arc::new(tx);
        let streams = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                tokio::spawn(serve_connection(
                    stream,
                    script.clone(),
                    tx.clone(),
                    streams.clone(),
                ));
            }
        });
        Scripted {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            socket: Some(socket),
            roots: dir.path().join("no-roots.pem"),
            received,
            _dir: dir,
        }
    }

    /// Waits (up to `crate::WAIT`) until `check` holds of the requests received.
    pub async fn received_until(
        &self,
        what: &str,
        check: impl FnMut(&Vec<Received>) -> bool,
    ) -> Vec<Received> {
        let mut rx = self.received.clone();
        let r = tokio::time::timeout(crate::WAIT, rx.wait_for(check))
            .await
            .unwrap_or_else(|_| panic!("{what}: not within {:?}", crate::WAIT))
            .unwrap()
            .clone();
        r
    }
}

/// One HTTP/2 connection: each stream served by the script.
async fn serve_connection<S>(
    stream: S,
    script: Script,
    tx: Arc<watch::Sender<Vec<Received>>>,
    streams: Arc<std::sync::atomic::AtomicUsize>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let Ok(mut conn) = h2::server::handshake(stream).await else {
        return;
    };
    while let Some(Ok((request, respond))) = conn.accept().await {
        let index = streams.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::spawn(serve_stream(
            index,
            request,
            respond,
            script.clone(),
            tx.clone(),
        ));
    }
}

async fn serve_stream(
    index: usize,
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    script: Script,
    received: Arc<watch::Sender<Vec<Received>>>,
) {
    let head = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    let mut body = request.into_body();
    let mut buf = BytesMut::new();
    let mut n = 0;
    while let Some(Ok(data)) = body.data().await {
        let _ = body.flow_control().release_capacity(data.len());
        buf.put_slice(&data);
        while buf.len() >= 5 {
            let len = u32::from_be_bytes(buf[1..5].try_into().unwrap()) as usize;
            if buf.len() < 5 + len {
                break;
            }
            buf.advance(5);
            let message = buf.split_to(len);
            let req = DeltaDiscoveryRequest::decode(message.freeze()).unwrap();
            received.send_modify(|r| r.push((index, req.clone())));
            for s in script(index, n, &req) {
                match s {
                    Says::Response(r) => {
                        let _ = send.send_data(frame(&r), false);
                    }
                    Says::Raw(bytes) => {
                        let _ = send.send_data(bytes, false);
                    }
                    Says::End(code) => {
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", code.to_string().parse().unwrap());
                        let _ = send.send_trailers(trailers);
                        return;
                    }
                }
            }
            n += 1;
        }
    }
    // The client went away: keep nothing open.
    drop(send);
}

/// `response`, gRPC-framed.
pub fn frame(response: &DeltaDiscoveryResponse) -> Bytes {
    let body = response.encode_to_vec();
    let mut frame = BytesMut::with_capacity(5 + body.len());
    frame.put_u8(0);
    frame.put_u32(body.len() as u32);
    frame.put_slice(&body);
    frame.freeze()
}
