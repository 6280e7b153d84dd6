//! One HTTPS request on a fresh connection (hyper 1 over tokio-rustls, ring):
//! what the OCI client and the workload-identity token exchange share.

use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("{0:?} is not an https:// URL with a host")]
    Url(String),
    #[error("CA certificates: {0}")]
    Ca(String),
}

/// An answer.
pub struct RawResponse {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }
}

/// An `https://host[:port]` endpoint with the roots trusted for it.
pub struct Endpoint {
    host: String,
    port: u16,
    authority: String,
    server_name: ServerName<'static>,
    tls: TlsConnector,
}

impl Endpoint {
    /// `roots_pem`: PEM CA certificates. `check_name: false` verifies the
    /// chain but not the certificate's name (the OKE proxymux is reached by
    /// IP with a certificate that may not name it; the OCI SDKs do the same).
    pub fn new(url: &str, roots_pem: &[u8], check_name: bool) -> Result<Self, EndpointError> {
        let bad = || EndpointError::Url(url.to_owned());
        let uri: http::Uri = url.parse().map_err(|_| bad())?;
        if uri.scheme_str() != Some("https") {
            return Err(bad());
        }
        let authority = uri.authority().ok_or_else(bad)?.clone();
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let server_name = ServerName::try_from(host.clone()).map_err(|_| bad())?;
        Ok(Endpoint {
            port: authority.port_u16().unwrap_or(443),
            authority: authority.as_str().to_owned(),
            host,
            server_name,
            tls: tls_connector(roots_pem, check_name).map_err(EndpointError::Ca)?,
        })
    }

    /// `host[:port]`, as the Host header carries it.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.authority)
    }

    /// Sends one request; errors are transport errors (any status is an answer).
    pub async fn send(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
    ) -> Result<RawResponse, String> {
        let mut req = Request::builder()
            .method(method)
            .uri(target)
            .header("host", &self.authority);
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| e.to_string())?;
        let tls = self
            .tls
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok(RawResponse {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }
}

fn tls_connector(roots_pem: &[u8], check_name: bool) -> Result<TlsConnector, String> {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(roots_pem) {
        let cert = cert.map_err(|e| e.to_string())?;
        // A system bundle may hold a few certificates rustls rejects; skip them.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err("no CA certificate in the file".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let config = if check_name {
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        let chain = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| e.to_string())?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly(chain)))
            .with_no_client_auth()
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Verifies the chain, validity and signatures, but not the name.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
