//! A small OCI Load Balancing client: signed HTTPS requests over hyper 1 and
//! tokio-rustls, one connection per request (calls are rare: a few per
//! terminating pod), each bounded by a timeout.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::Method;
use serde::de::DeserializeOwned;
use tracing::debug;

use crate::auth::Credentials;
use crate::transport::{self, Endpoint};

use crate::metrics::CallMetrics;
use crate::model::{
    Backend, BackendSet, ErrorBody, LoadBalancer, UpdateBackendDetails, WorkRequest,
};
use crate::sign::{ToSign, CONTENT_TYPE};

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
    #[error("{operation}: cannot sign the request: {message}")]
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
    status: u16,
    etag: Option<String>,
    work_request: Option<String>,
    body: Bytes,
}

/// The client for one endpoint and one identity.
pub struct OciClient {
    endpoint: Endpoint,
    auth: Credentials,
    timeout: Duration,
    metrics: CallMetrics,
}

impl std::fmt::Debug for OciClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciClient")
            .field("endpoint", &self.endpoint.url())
            .finish()
    }
}

impl OciClient {
    /// `endpoint` is `https://host[:port]`; `roots_pem` are the PEM CA
    /// certificates trusted for it (read from `ca_path`).
    pub fn new(
        endpoint: &str,
        roots_pem: &[u8],
        ca_path: &str,
        auth: Credentials,
        timeout: Duration,
        metrics: CallMetrics,
    ) -> Result<Self, EndpointError> {
        let endpoint = Endpoint::new(endpoint, roots_pem, true).map_err(|e| match e {
            transport::EndpointError::Url(url) => EndpointError::Url(url),
            transport::EndpointError::Ca(message) => EndpointError::Ca {
                path: ca_path.into(),
                message,
            },
        })?;
        Ok(OciClient {
            endpoint,
            auth,
            timeout,
            metrics,
        })
    }

    pub fn endpoint(&self) -> String {
        self.endpoint.url()
    }

    pub async fn get_load_balancer(&self, lb: &str) -> Result<(LoadBalancer, String), OciError> {
        self.get("GetLoadBalancer", &format!("/loadBalancers/{lb}"))
            .await
    }

    pub async fn get_backend_set(
        &self,
        lb: &str,
        set: &str,
    ) -> Result<(BackendSet, String), OciError> {
        let path = format!("/loadBalancers/{lb}/backendSets/{set}");
        self.get("GetBackendSet", &path).await
    }

    pub async fn get_backend(
        &self,
        lb: &str,
        set: &str,
        name: &str,
    ) -> Result<(Backend, String), OciError> {
        self.get("GetBackend", &backend_path(lb, set, name)).await
    }

    /// A GET: the decoded object and the ETag that came with it.
    async fn get<T: DeserializeOwned>(
        &self,
        op: &'static str,
        path: &str,
    ) -> Result<(T, String), OciError> {
        let r = self.call(op, Method::GET, path, None, None).await?;
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
        let path = format!("/loadBalancerWorkRequests/{id}");
        Ok(self.get("GetWorkRequest", &path).await?.0)
    }

    /// One API call, bounded by the timeout and counted. A 401 with a
    /// session token renews the session and tries once more (the token may
    /// have been revoked or the clock moved); an API key's 401 is final.
    async fn call(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        if_match: Option<&str>,
    ) -> Result<Response, OciError> {
        let mut renewed = false;
        loop {
            let result = tokio::time::timeout(
                self.timeout,
                self.call_once(operation, method.clone(), path, body.clone(), if_match),
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
                Ok(r) => r.status.to_string(),
                Err(OciError::Status { status, .. }) => status.to_string(),
                Err(_) => "error".to_owned(),
            };
            self.metrics.call(operation, status);
            match &result {
                Err(e) if e.status() == Some(401) && !renewed && self.auth.renew().await => {
                    renewed = true;
                }
                _ => return result,
            }
        }
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
        let sign_error = |message: String| OciError::Sign { operation, message };
        let signer = self
            .auth
            .signer()
            .await
            .map_err(|e| sign_error(e.to_string()))?;
        let signed = signer
            .sign(&ToSign {
                method: method.as_str(),
                target: &target,
                host: self.endpoint.authority(),
                date: &date,
                body: body.as_deref(),
            })
            .map_err(|e| sign_error(e.to_string()))?;
        let mut headers = vec![
            ("date", date.clone()),
            ("authorization", signed.authorization),
            ("accept", CONTENT_TYPE.to_owned()),
        ];
        if let Some(etag) = if_match {
            headers.push(("if-match", etag.to_owned()));
        }
        if let (Some(b), Some(sha)) = (&body, signed.content_sha256) {
            headers.push(("content-type", CONTENT_TYPE.to_owned()));
            headers.push(("content-length", b.len().to_string()));
            headers.push(("x-content-sha256", sha));
        }
        let r = self
            .endpoint
            .send(method.as_str(), &target, &headers, body.unwrap_or_default())
            .await
            .map_err(transport)?;
        debug!(operation, %method, path = %target, status = r.status, "oci call");
        if !(200..300).contains(&r.status) {
            let e: ErrorBody = serde_json::from_slice(&r.body).unwrap_or_default();
            return Err(OciError::Status {
                operation,
                status: r.status,
                code: e.code,
                message: e.message,
                request_id: r.header("opc-request-id").unwrap_or_default(),
            });
        }
        Ok(Response {
            status: r.status,
            etag: r.header("etag"),
            work_request: r.header("opc-work-request-id"),
            body: r.body,
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
