//! A CA double for the client side of the Istio CA protocol: answers
//! `CreateCertificate` over gRPC/TLS (HTTP/2) as the test tells it — a good
//! leaf, or one of the answers a client must refuse — and counts requests.
//! No authentication: what is under test is what the client does with the
//! answer.
//!
//! [`CaDouble::start_cilium`] is Cilium's agent as a CA instead: TLS with
//! a self-signed RSA "bootstrap" certificate (`CA:FALSE`, serverAuth, for
//! `localhost` and the address), the leaf copying the CSR's subject and
//! SANs, with no key usage and no EKU, valid 30 days, signed by an RSA
//! root other than the bootstrap certificate, `[leaf, root]`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
    PKCS_ECDSA_P256_SHA256,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateSigningRequestDer, PrivateKeyDer};
use tidegate_ca::messages::{IstioCertificateRequest, IstioCertificateResponse};
use tokio::net::TcpListener;

/// What the double answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A leaf for the CSR's key and the asked identity, from the
    /// configured root, valid [`CaDouble::VALIDITY`] (or as started), the root last.
    Good,
    /// The same, but for a key of the double's own.
    OtherKey,
    /// A leaf from a root the client is not configured with, that root last.
    UnconfiguredRoot,
    /// A leaf that expired an hour ago.
    Expired,
    /// Nothing: the request stays unanswered.
    Hang,
}

/// A running double.
pub struct CaDouble {
    pub addr: SocketAddr,
    /// The root the client is configured with (it also issued the serving
    /// certificate, for 127.0.0.1).
    pub root_pem: String,
    /// The root of [`Answer::UnconfiguredRoot`].
    pub other_root_pem: String,
    /// [`CaDouble::start_cilium`]: the bootstrap certificate the client
    /// trusts (`CA_ROOT_CA`); `root_pem` is then the root that signs leaves.
    pub bootstrap_pem: Option<String>,
    state: Arc<State>,
}

struct State {
    answer: Mutex<Answer>,
    requests: AtomicUsize,
    root: Issuer<'static, KeyPair>,
    root_pem: String,
    other: Issuer<'static, KeyPair>,
    other_pem: String,
    validity: Duration,
    /// Cilium's leaves: the CSR's SANs, no key usage, no EKU.
    cilium: bool,
}

impl CaDouble {
    /// Validity of a good leaf: renewal (at half-life) comes within a
    /// second or so.
    pub const VALIDITY: Duration = Duration::from_secs(2);

    pub async fn start(answer: Answer) -> CaDouble {
        Self::start_valid_for(answer, Self::VALIDITY).await
    }

    /// The same, a good leaf valid `validity` (a client that renews
    /// at half-life stays quiet for that long).
    pub async fn start_valid_for(answer: Answer, validity: Duration) -> CaDouble {
        let (root, root_pem) = ca("configured root");
        let (other, other_pem) = ca("unconfigured root");
        let tls = serving_tls(&root, &root_pem);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            answer: Mutex::new(answer),
            requests: AtomicUsize::new(0),
            root,
            root_pem: root_pem.clone(),
            other,
            other_pem: other_pem.clone(),
            validity,
            cilium: false,
        });
        tokio::spawn(serve(listener, tls, state.clone()));
        CaDouble {
            addr,
            root_pem,
            other_root_pem: other_pem,
            bootstrap_pem: None,
            state,
        }
    }

    /// Cilium's agent as a CA, on `ip` (an ephemeral port): see the module doc.
    pub async fn start_cilium(ip: std::net::IpAddr) -> CaDouble {
        let root_key = rsa_key();
        let mut p = CertificateParams::default();
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name
            .push(DnType::CommonName, "cilium-ztunnel-ca");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let root_pem = p.self_signed(&root_key).unwrap().pem();
        let root = Issuer::new(p, root_key);
        let (other, other_pem) = ca("unconfigured root");
        let (tls, bootstrap_pem) = bootstrap_tls(ip);
        let listener = TcpListener::bind(std::net::SocketAddr::new(ip, 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            answer: Mutex::new(Answer::Good),
            requests: AtomicUsize::new(0),
            root,
            root_pem: root_pem.clone(),
            other,
            other_pem: other_pem.clone(),
            validity: CILIUM_VALIDITY,
            cilium: true,
        });
        tokio::spawn(serve(listener, tls, state.clone()));
        CaDouble {
            addr,
            root_pem,
            other_root_pem: other_pem,
            bootstrap_pem: Some(bootstrap_pem),
            state,
        }
    }

    /// Answers `answer` from the next request on.
    pub fn answer(&self, answer: Answer) {
        *self.state.answer.lock().unwrap() = answer;
    }

    /// Requests received so far.
    pub fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }
}

/// The validity of Cilium's leaves.
pub const CILIUM_VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);

/// A fresh RSA-2048 key, as Cilium's CA and bootstrap certificate use.
fn rsa_key() -> KeyPair {
    use rsa::pkcs8::EncodePrivateKey;
    let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).unwrap();
    let der = key.to_pkcs8_der().unwrap();
    KeyPair::from_pkcs8_der_and_sign_algo(&der.as_bytes().into(), &rcgen::PKCS_RSA_SHA256).unwrap()
}

/// Cilium's bootstrap certificate: self-signed RSA, `CA:FALSE`,
/// serverAuth, `localhost` and `ip`; the TLS it serves and its PEM.
fn bootstrap_tls(ip: std::net::IpAddr) -> (tokio_rustls::TlsAcceptor, String) {
    let key = rsa_key();
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name
        .push(DnType::CommonName, "cilium-ztunnel-bootstrap");
    p.is_ca = IsCa::ExplicitNoCa;
    p.subject_alt_names = vec![
        SanType::DnsName("localhost".try_into().unwrap()),
        SanType::IpAddress(ip),
    ];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = p.self_signed(&key).unwrap();
    let pem = cert.pem();
    let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(tidegate_protocol::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    (tokio_rustls::TlsAcceptor::from(Arc::new(cfg)), pem)
}

pub fn ca(name: &str) -> (Issuer<'static, KeyPair>, String) {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let pem = p.self_signed(&key).unwrap().pem();
    (Issuer::new(p, key), pem)
}

pub fn serving_tls(root: &Issuer<'static, KeyPair>, root_pem: &str) -> tokio_rustls::TlsAcceptor {
    serving_tls_for(root, root_pem, [127, 0, 0, 1].into())
}

/// A serving certificate for `ip` from `root`, the root after it.
pub fn serving_tls_for(
    root: &Issuer<'static, KeyPair>,
    root_pem: &str,
    ip: std::net::IpAddr,
) -> tokio_rustls::TlsAcceptor {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = CertificateParams::default();
    p.subject_alt_names = vec![SanType::IpAddress(ip)];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = p.signed_by(&key, root).unwrap();
    let chain = vec![
        cert.der().clone(),
        CertificateDer::from_pem_slice(root_pem.as_bytes()).unwrap(),
    ];
    let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(tidegate_protocol::tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
}

async fn serve(listener: TcpListener, tls: tokio_rustls::TlsAcceptor, state: Arc<State>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let (tls, state) = (tls.clone(), state.clone());
        tokio::spawn(async move {
            let Ok(stream) = tls.accept(tcp).await else {
                return;
            };
            let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                let state = state.clone();
                async move {
                    let method = Unary(state);
                    let codec = tonic_prost::ProstCodec::<
                        IstioCertificateResponse,
                        IstioCertificateRequest,
                    >::default();
                    Ok::<_, std::convert::Infallible>(
                        tonic::server::Grpc::new(codec).unary(method, req).await,
                    )
                }
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// The unary method, as tonic's handler wants it.
struct Unary(Arc<State>);

impl tonic::server::UnaryService<IstioCertificateRequest> for Unary {
    type Response = IstioCertificateResponse;
    type Future = std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<tonic::Response<IstioCertificateResponse>, tonic::Status>,
                > + Send,
        >,
    >;

    fn call(&mut self, req: tonic::Request<IstioCertificateRequest>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            state.requests.fetch_add(1, Ordering::SeqCst);
            let answer = *state.answer.lock().unwrap();
            if answer == Answer::Hang {
                std::future::pending::<()>().await;
            }
            let req = req.into_inner();
            // Cilium's agent reads the identity from the CSR alone.
            let identity = match req.impersonated_identity() {
                Some(id) => id.to_owned(),
                None if state.cilium => String::new(),
                None => return Err(tonic::Status::invalid_argument("no ImpersonatedIdentity")),
            };
            Ok(tonic::Response::new(IstioCertificateResponse {
                cert_chain: chain(&state, answer, &identity, &req.csr),
            }))
        })
    }
}

/// The chain answered: leaf, then its root.
fn chain(state: &State, answer: Answer, identity: &str, csr_pem: &str) -> Vec<String> {
    let now = SystemTime::now();
    let hour = Duration::from_secs(3600);
    let (from, to) = match answer {
        Answer::Expired => (now - 2 * hour, now - hour),
        _ => (now - Duration::from_secs(1), now + state.validity),
    };
    let der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes()).unwrap();
    let mut request = CertificateSigningRequestParams::from_der(&der).unwrap();
    if answer == Answer::OtherKey {
        let own = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let own_csr = CertificateParams::default()
            .serialize_request(&own)
            .unwrap();
        request.public_key = CertificateSigningRequestParams::from_der(own_csr.der())
            .unwrap()
            .public_key;
    }
    let mut p = if state.cilium {
        // The CSR's subject and SANs, nothing else.
        request.params.clone()
    } else {
        let mut p = CertificateParams::default();
        p.distinguished_name = DistinguishedName::new();
        p.subject_alt_names = vec![SanType::URI(identity.try_into().unwrap())];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p
    };
    p.not_before = from.into();
    p.not_after = to.into();
    p.serial_number = Some(rcgen::SerialNumber::from_slice(
        &fastrand::u64(..).to_be_bytes(),
    ));
    let (issuer, root_pem) = match answer {
        Answer::UnconfiguredRoot => (&state.other, &state.other_pem),
        _ => (&state.root, &state.root_pem),
    };
    let leaf = CertificateSigningRequestParams {
        params: p,
        public_key: request.public_key,
    }
    .signed_by(issuer)
    .unwrap();
    vec![leaf.pem(), root_pem.clone()]
}
