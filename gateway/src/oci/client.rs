//! A small OCI Load Balancing client: signed HTTPS requests over hyper 1 and
//! tokio-rustls, one connection per request (calls are rare: a few per
//! terminating pod), each bounded by a timeout.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use serde::de::DeserializeOwned;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tracing::debug;

use super::metrics::OciMetrics;
use super::model::{Backend, ErrorBody, LoadBalancer, UpdateBackendDetails, WorkRequest};
use super::sign::{Signer, ToSign, CONTENT_TYPE};

/// The API version prefix of every path.
pub const API: &str = "/20170115";

#[derive(Clone, Debug, thiserror::Error)]
pub enum OciError {
    /// The service answered with an error status.
    #[error("{operation}: HTTP {status} {code}: {message} (opc-request-id {request_id})")]
    Status {
        operation: &'static str,
        status: u16,
        code: String,
        message: String,
        request_id: String,
    },
    #[error("{operation}: cannot reach {endpoint}: {message}")]
    Transport {
        operation: &'static str,
        endpoint: String,
        message: String,
    },
    #[error("{operation}: unexpected response body: {message}")]
    Decode {
        operation: &'static str,
        message: String,
    },
    #[error("{operation}: signing failed: {message}")]
    Sign {
        operation: &'static str,
        message: String,
    },
}

impl OciError {
    pub fn status(&self) -> Option<u16> {
        match self {
            OciError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub fn code(&self) -> &str {
        match self {
            OciError::Status { code, .. } => code,
            _ => "",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("oci.endpoint {0:?} is not an https:// URL with a host")]
    Url(String),
    #[error("oci.ca_file {path}: {message}")]
    Ca { path: String, message: String },
}

/// A parsed response.
struct Response {
    status: StatusCode,
    etag: Option<String>,
    work_request: Option<String>,
    body: Bytes,
}

/// The client for one endpoint and one signer.
pub struct OciClient {
    host: String,
    port: u16,
    /// `host[:port]` as the Host header and the signature carry it.
    authority: String,
    server_name: ServerName<'static>,
    tls: TlsConnector,
    signer: Arc<Signer>,
    timeout: Duration,
    metrics: OciMetrics,
}

impl std::fmt::Debug for OciClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciClient")
            .field("endpoint", &self.authority)
            .field("key_id", &self.signer.key_id())
            .finish()
    }
}

impl OciClient {
    /// `endpoint` is `https://host[:port]`; `roots` are the PEM CA
    /// certificates trusted for it.
    pub fn new(
        endpoint: &str,
        roots_pem: &[u8],
        ca_path: &str,
        signer: Arc<Signer>,
        timeout: Duration,
        metrics: OciMetrics,
    ) -> Result<Self, EndpointError> {
        let uri: http::Uri = endpoint
            .parse()
            .map_err(|_| EndpointError::Url(endpoint.into()))?;
        if uri.scheme_str() != Some("https") {
            return Err(EndpointError::Url(endpoint.into()));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| EndpointError::Url(endpoint.into()))?
            .clone();
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let server_name =
            ServerName::try_from(host.clone()).map_err(|_| EndpointError::Url(endpoint.into()))?;
        let tls = tls_connector(roots_pem).map_err(|message| EndpointError::Ca {
            path: ca_path.into(),
            message,
        })?;
        Ok(OciClient {
            port: authority.port_u16().unwrap_or(443),
            authority: authority.as_str().to_owned(),
            host,
            server_name,
            tls,
            signer,
            timeout,
            metrics,
        })
    }

    pub fn endpoint(&self) -> String {
        format!("https://{}", self.authority)
    }

    pub async fn get_load_balancer(&self, lb: &str) -> Result<(LoadBalancer, String), OciError> {
        let op = "GetLoadBalancer";
        let r = self
            .call(op, Method::GET, &format!("/loadBalancers/{lb}"), None, None)
            .await?;
        Ok((decode(op, &r.body)?, r.etag.unwrap_or_default()))
    }

    pub async fn get_backend(
        &self,
        lb: &str,
        set: &str,
        name: &str,
    ) -> Result<(Backend, String), OciError> {
        let op = "GetBackend";
        let path = backend_path(lb, set, name);
        let r = self.call(op, Method::GET, &path, None, None).await?;
        Ok((decode(op, &r.body)?, r.etag.unwrap_or_default()))
    }

    /// Returns the work request id.
    pub async fn update_backend(
        &self,
        lb: &str,
        set: &str,
        name: &str,
        details: &UpdateBackendDetails,
        if_match: &str,
    ) -> Result<String, OciError> {
        let op = "UpdateBackend";
        let body = serde_json::to_vec(details).expect("serializing plain fields cannot fail");
        let path = backend_path(lb, set, name);
        let r = self
            .call(op, Method::PUT, &path, Some(body), Some(if_match))
            .await?;
        work_request_id(op, r)
    }

    /// Returns the work request id.
    pub async fn delete_backend(
        &self,
        lb: &str,
        set: &str,
        name: &str,
        if_match: &str,
    ) -> Result<String, OciError> {
        let op = "DeleteBackend";
        let path = backend_path(lb, set, name);
        let r = self
            .call(op, Method::DELETE, &path, None, Some(if_match))
            .await?;
        work_request_id(op, r)
    }

    pub async fn get_work_request(&self, id: &str) -> Result<WorkRequest, OciError> {
        let op = "GetWorkRequest";
        let path = format!("/loadBalancerWorkRequests/{id}");
        let r = self.call(op, Method::GET, &path, None, None).await?;
        decode(op, &r.body)
    }

    async fn call(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        if_match: Option<&str>,
    ) -> Result<Response, OciError> {
        let result = tokio::time::timeout(
            self.timeout,
            self.call_once(operation, method, path, body, if_match),
        )
        .await
        .unwrap_or_else(|_| {
            Err(OciError::Transport {
                operation,
                endpoint: self.endpoint(),
                message: format!("no answer within {:?}", self.timeout),
            })
        });
        let status = match &result {
            Ok(r) => r.status.as_u16().to_string(),
            Err(OciError::Status { status, .. }) => status.to_string(),
            Err(_) => "error".to_owned(),
        };
        self.metrics.call(operation, status);
        result
    }

    async fn call_once(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        if_match: Option<&str>,
    ) -> Result<Response, OciError> {
        let transport = |message: String| OciError::Transport {
            operation,
            endpoint: self.endpoint(),
            message,
        };
        let target = format!("{API}{path}");
        let date = httpdate::fmt_http_date(SystemTime::now());
        let signed = self
            .signer
            .sign(&ToSign {
                method: method.as_str(),
                target: &target,
                host: &self.authority,
                date: &date,
                body: body.as_deref(),
            })
            .map_err(|e| OciError::Sign {
                operation,
                message: e.to_string(),
            })?;
        let mut req = Request::builder()
            .method(method.clone())
            .uri(&target)
            .header("host", &self.authority)
            .header("date", &date)
            .header("authorization", signed.authorization)
            .header("accept", CONTENT_TYPE);
        if let Some(etag) = if_match {
            req = req.header("if-match", etag);
        }
        if let (Some(b), Some(sha)) = (&body, signed.content_sha256) {
            req = req
                .header("content-type", CONTENT_TYPE)
                .header("content-length", b.len())
                .header("x-content-sha256", sha);
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| transport(e.to_string()))?;

        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| transport(e.to_string()))?;
        let tls = self
            .tls
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| transport(format!("TLS: {e}")))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| transport(e.to_string()))?;
        tokio::spawn(conn);
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| transport(e.to_string()))?;
        let status = resp.status();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let etag = header("etag");
        let work_request = header("opc-work-request-id");
        let request_id = header("opc-request-id").unwrap_or_default();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| transport(e.to_string()))?
            .to_bytes();
        debug!(operation, %method, path = %target, status = status.as_u16(), "oci call");
        if !status.is_success() {
            let e: ErrorBody = serde_json::from_slice(&body).unwrap_or_default();
            return Err(OciError::Status {
                operation,
                status: status.as_u16(),
                code: e.code,
                message: e.message,
                request_id,
            });
        }
        Ok(Response {
            status,
            etag,
            work_request,
            body,
        })
    }
}

fn backend_path(lb: &str, set: &str, name: &str) -> String {
    format!("/loadBalancers/{lb}/backendSets/{set}/backends/{name}")
}

fn work_request_id(operation: &'static str, r: Response) -> Result<String, OciError> {
    r.work_request.ok_or(OciError::Decode {
        operation,
        message: "no opc-work-request-id header".into(),
    })
}

fn decode<T: DeserializeOwned>(operation: &'static str, body: &[u8]) -> Result<T, OciError> {
    serde_json::from_slice(body).map_err(|e| OciError::Decode {
        operation,
        message: e.to_string(),
    })
}

fn tls_connector(roots_pem: &[u8]) -> Result<TlsConnector, String> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(roots_pem) {
        let cert = cert.map_err(|e| e.to_string())?;
        // A system bundle may hold a few certificates rustls rejects; skip them.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err("no CA certificate in the file".into());
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}
