//! An istiod that misbehaves one way, chosen per test: it speaks just
//! enough of the delta ADS wire (HTTP/2, gRPC framing) to misbehave,
//! and records each connection accepted and each stream opened.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use bytes::{BufMut, Bytes, BytesMut};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tidegate_xds::client::ADDRESS;
use tidegate_xds::envelope::DeltaDiscoveryResponse;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio_rustls::server::TlsStream;

/// How the server misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    /// Completes TLS (ALPN `h2`), then sends nothing.
    SilentAfterTls,
    /// Answers the HTTP/2 handshake, never a stream.
    NeverAnswers,
    /// Answers the first connection's first stream once, then — on
    /// [`Istiod::freeze`] — stops reading and writing that connection
    /// while keeping it open. Later connections never answer a stream.
    AnswersThenFreezes,
    /// Ends every stream at once, without a response: OK, UNKNOWN, OK, …
    EndsAtOnce,
    /// One response, then ends the stream with UNKNOWN (istiod's maximum
    /// connection age).
    AnswersThenCloses,
    /// [`FLOOD`] responses at once on every stream, left open: a backlog.
    Floods,
}

/// The responses [`Misbehaviour::Floods`] sends at once.
pub const FLOOD: usize = 500;

#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub accepts: usize,
    /// When each stream was opened, in order.
    pub streams: Vec<Instant>,
}

pub struct Istiod {
    pub addr: SocketAddr,
    /// The PEM root that verifies the server.
    pub roots: PathBuf,
    pub seen: watch::Receiver<Seen>,
    freeze: Arc<Notify>,
    _dir: tempfile::TempDir,
}

impl Istiod {
    pub async fn start(how: Misbehaviour) -> Istiod {
        let dir = tempfile::tempdir().unwrap();
        let (tls, root_pem) = serving_tls();
        let roots = dir.path().join("root-cert.pem");
        std::fs::write(&roots, root_pem).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, seen) = watch::channel(Seen::default());
        let freeze = Arc::new(Notify::new());
        tokio::spawn(serve(listener, tls, how, Arc::new(tx), freeze.clone()));
        Istiod {
            addr,
            roots,
            seen,
            freeze,
            _dir: dir,
        }
    }

    /// [`Misbehaviour::AnswersThenFreezes`]: the first connection goes
    /// silent both ways.
    pub fn freeze(&self) {
        self.freeze.notify_one();
    }
}

async fn serve(
    listener: TcpListener,
    tls: tokio_rustls::TlsAcceptor,
    how: Misbehaviour,
    seen: Arc<watch::Sender<Seen>>,
    freeze: Arc<Notify>,
) {
    let mut silent: Vec<TlsStream<TcpStream>> = Vec::new();
    loop {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut first = false;
        seen.send_modify(|s| {
            s.accepts += 1;
            first = s.accepts == 1;
        });
        let Ok(stream) = tls.accept(tcp).await else {
            continue;
        };
        if how == Misbehaviour::SilentAfterTls {
            silent.push(stream);
            continue;
        }
        let freezes = first && how == Misbehaviour::AnswersThenFreezes;
        tokio::spawn(connection(
            stream,
            how,
            freezes,
            seen.clone(),
            freeze.clone(),
        ));
    }
}

/// A stream's handles, kept until its connection ends.
type Held = (
    http::Request<h2::RecvStream>,
    Option<h2::server::SendResponse<Bytes>>,
    Option<h2::SendStream<Bytes>>,
);

async fn connection(
    stream: TlsStream<TcpStream>,
    how: Misbehaviour,
    freezes: bool,
    seen: Arc<watch::Sender<Seen>>,
    freeze: Arc<Notify>,
) {
    let Ok(mut conn) = h2::server::handshake(stream).await else {
        return;
    };
    // Streams never ended: dropping their handles would reset them.
    let mut held: Vec<Held> = Vec::new();
    loop {
        let next = tokio::select! {
            next = conn.accept() => Some(next),
            _ = freeze.notified(), if freezes => None,
        };
        let Some(Some(Ok((request, respond)))) = next else {
            if next.is_none() {
                // Frozen: the connection stays open, never polled again.
                std::future::pending::<()>().await;
            }
            return;
        };
        let mut index = 0;
        seen.send_modify(|s| {
            index = s.streams.len();
            s.streams.push(Instant::now());
        });
        let answer = match how {
            Misbehaviour::SilentAfterTls | Misbehaviour::NeverAnswers => None,
            Misbehaviour::AnswersThenFreezes => freezes.then_some((true, None)),
            Misbehaviour::EndsAtOnce => Some((false, Some(if index % 2 == 0 { 0 } else { 2 }))),
            Misbehaviour::AnswersThenCloses => Some((true, Some(2))),
            Misbehaviour::Floods => {
                held.push((request, None, Some(flood(respond))));
                continue;
            }
        };
        match answer {
            None => held.push((request, Some(respond), None)),
            Some((response, status)) => {
                let send = answer_stream(respond, response, status);
                held.push((request, None, send));
            }
        }
    }
}

/// Answers a stream: with one response or none, then ended with `status`
/// (a gRPC code) or left open. Returns the send half when left open.
fn answer_stream(
    mut respond: h2::server::SendResponse<Bytes>,
    response: bool,
    status: Option<u32>,
) -> Option<h2::SendStream<Bytes>> {
    let head = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc");
    if !response {
        // Trailers only: the status in the response's head.
        let code = status.unwrap_or(0).to_string();
        let head = head.header("grpc-status", code).body(()).unwrap();
        respond.send_response(head, true).unwrap();
        return None;
    }
    let mut send = respond
        .send_response(head.body(()).unwrap(), false)
        .unwrap();
    send.send_data(grpc_frame(), false).unwrap();
    match status {
        Some(code) => {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", code.to_string().parse().unwrap());
            send.send_trailers(trailers).unwrap();
            None
        }
        None => Some(send),
    }
}

/// Answers a stream with [`FLOOD`] responses in one go and leaves it open.
fn flood(mut respond: h2::server::SendResponse<Bytes>) -> h2::SendStream<Bytes> {
    let head = http::Response::builder()
        .status(200)
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let mut send = respond.send_response(head, false).unwrap();
    let mut all = BytesMut::new();
    for _ in 0..FLOOD {
        all.put_slice(&grpc_frame());
    }
    send.reserve_capacity(all.len());
    send.send_data(all.freeze(), false).unwrap();
    send
}

/// One `DeltaDiscoveryResponse` of Address, nothing in it, gRPC-framed.
fn grpc_frame() -> Bytes {
    crate::scripted::frame(&DeltaDiscoveryResponse {
        type_url: ADDRESS.to_owned(),
        nonce: "1".to_owned(),
        ..Default::default()
    })
}

/// A serving certificate for 127.0.0.1 (ALPN `h2`) and the PEM root
/// that issued it.
pub fn serving_tls() -> (tokio_rustls::TlsAcceptor, String) {
    let root_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut root = CertificateParams::default();
    root.distinguished_name = DistinguishedName::new();
    root.distinguished_name
        .push(DnType::CommonName, "misbehaving istiod root");
    root.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    root.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let root_pem = root.self_signed(&root_key).unwrap().pem();
    let issuer = Issuer::new(root, root_key);
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut leaf = CertificateParams::default();
    leaf.subject_alt_names = vec![SanType::IpAddress([127, 0, 0, 1].into())];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut cfg = rustls::ServerConfig::builder_with_provider(tidegate_protocol::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    (tokio_rustls::TlsAcceptor::from(Arc::new(cfg)), root_pem)
}
