//! `istio.v1.auth.IstioCertificateService/CreateCertificate`, served with
//! tonic's codec and unary handler (the service written by hand: no protoc).
//! Every refusal is `Unauthenticated` without a reason, as istiod answers;
//! the reason goes to the log.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::authn::Authenticator;
use super::pods::PodIndex;
use super::root::CaRoot;
use crate::csr;
use crate::impersonation::Authorizer;
use crate::messages::{IstioCertificateRequest, IstioCertificateResponse};
use crate::CREATE_CERTIFICATE;

/// What a request is checked against and signed with.
pub struct Ca {
    pub root: CaRoot,
    pub authn: Authenticator,
    pub authorizer: Authorizer,
    pub pods: Arc<PodIndex>,
    /// Requested validities are clamped to this (0 or less asks for it).
    pub max_validity: Duration,
}

impl Ca {
    pub async fn create_certificate(
        &self,
        req: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        let authorization = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let req = req.into_inner();
        let caller = match self.authn.authenticate(authorization.as_deref()).await {
            Ok(c) => c,
            Err(e) if e.is_internal() => {
                warn!(error = %e, "cannot authenticate a caller");
                return Err(Status::unavailable("cannot authenticate now"));
            }
            Err(e) => {
                warn!(reason = %e, "refused: authentication");
                return Err(Status::unauthenticated("request authenticate failure"));
            }
        };
        let requested = req.impersonated_identity();
        let identity = self
            .authorizer
            .decide(&caller, requested, self.pods.as_ref())
            .map_err(|e| {
                warn!(caller = %format!("{}/{}", caller.namespace, caller.service_account), requested, reason = %e, "refused: authorization");
                Status::unauthenticated("request authenticate failure")
            })?;
        let csr = csr::read(&req.csr).map_err(|e| {
            warn!(identity = %identity, reason = %e, "refused: CSR");
            Status::invalid_argument(format!("CSR: {e}"))
        })?;
        let validity = match u64::try_from(req.validity_duration) {
            Ok(s) if s > 0 => Duration::from_secs(s).min(self.max_validity),
            _ => self.max_validity,
        };
        let leaf = csr
            .sign(&identity, validity, &self.root.issuer)
            .map_err(|e| Status::internal(e.to_string()))?;
        info!(identity = %identity, caller = %format!("{}/{}", caller.namespace, caller.service_account), validity = ?validity, "certificate issued");
        // One PEM per element, the root last (as istiod answers).
        Ok(Response::new(IstioCertificateResponse {
            cert_chain: vec![leaf.pem(), self.root.cert_pem.clone()],
        }))
    }
}

/// The tonic service: one method; anything else is `Unimplemented`.
#[derive(Clone)]
pub struct CaService(pub Arc<Ca>);

impl tonic::server::NamedService for CaService {
    const NAME: &'static str = "istio.v1.auth.IstioCertificateService";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<B> tower::Service<http::Request<B>> for CaService
where
    B: hyper::body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != CREATE_CERTIFICATE {
            let path = req.uri().path().to_owned();
            return Box::pin(async move {
                Ok(Status::unimplemented(format!("no method {path}")).into_http())
            });
        }
        let ca = self.0.clone();
        let method = tower::service_fn(move |r: Request<IstioCertificateRequest>| {
            let ca = ca.clone();
            async move { ca.create_certificate(r).await }
        });
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<IstioCertificateResponse, IstioCertificateRequest>::default();
            Ok(tonic::server::Grpc::new(codec).unary(method, req).await)
        })
    }
}
