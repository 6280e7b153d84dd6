//! The admin (127.0.0.1:15000), metrics (:15020) and readiness (:15021)
//! HTTP servers.
//!
//! - [`policies`]: `PUT /policies/<name>` (upload, hot swap).
//! - [`workloads`]: `/workloads/<uid>/…` lifecycle events and run-time policy bindings.
//! - [`config_dump`]: `GET /config_dump`, each workload with its phase and policy.
//! - [`slots`]: each listener's connection cap, which makes room for a new
//!   connection by closing the one idle the longest.

mod config_dump;
mod policies;
mod slots;
pub mod workloads;

pub use policies::POLICY_CONFIG_HEADER;

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::net::TcpListener;
use tracing::debug;

use crate::control_plane::ConnLimit;
use crate::policy::PolicyEngine;
use crate::proxy::pool::Pool;
use crate::proxy::tunnels::InboundTunnels;
use crate::shutdown::ShutdownWatch;
use crate::workloads::WorkloadStore;

type Body = Full<Bytes>;

/// What the admin endpoints can see.
pub struct AdminState {
    pub node: String,
    pub workloads: Arc<WorkloadStore>,
    pub registry: Arc<InboundTunnels>,
    pub pool: Arc<Pool>,
    pub policies: Arc<PolicyEngine>,
    pub drains: Arc<crate::drains::DrainEngine>,
    /// In-pod mode: the pods served in their own namespaces.
    pub pods: Option<Arc<crate::inpod::pods::PodProxies>>,
    /// Services' endpoint choice (`/config_dump` shows why one is skipped).
    pub routing: Arc<crate::proxy::outbound::Routing>,
    /// `/config_dump` shows what the certificate source holds.
    pub certificates: Arc<dyn crate::tls::CertSource>,
    /// `drains.default_grace`: the grace of a `shutdown-starting` without `?grace=`.
    pub default_grace: std::time::Duration,
    pub metrics: prometheus_client::registry::Registry,
    pub ready: AtomicBool,
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body.into())))
        .expect("static response")
}

fn json_response(v: serde_json::Value) -> Response<Body> {
    json_status(StatusCode::OK, v)
}

fn json_status(status: StatusCode, v: serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from({
            let mut body = serde_json::to_vec_pretty(&v).expect("json values serialize");
            body.push(b'\n');
            body
        })))
        .expect("static response")
}

/// Routes of the admin port.
pub async fn admin(state: Arc<AdminState>, req: Request<Incoming>) -> Response<Body> {
    if let Some(name) = req.uri().path().strip_prefix("/policies/") {
        let name = name.to_owned();
        return match *req.method() {
            Method::PUT => policies::put(state, name, req).await,
            _ => text(
                StatusCode::METHOD_NOT_ALLOWED,
                "use PUT /policies/<name> with the component as the body\n",
            ),
        };
    }
    if let Some(rest) = req.uri().path().strip_prefix("/workloads/") {
        let rest = rest.to_owned();
        return workloads::route(state, &rest, req).await;
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/drains") => json_response(json!({
            "drains": state.drains.list(),
            "peer_drains": state.drains.peer_drains(),
        })),
        (&Method::GET, "/policies") => json_response(json!({ "policies": state.policies.list() })),
        (&Method::GET, "/config_dump") => json_response(config_dump::dump(&state).await),
        (_, "/config_dump") => text(StatusCode::METHOD_NOT_ALLOWED, "use GET /config_dump\n"),
        (_, path) => text(
            StatusCode::NOT_FOUND,
            format!("no admin endpoint {path}; try GET /config_dump, GET /policies, PUT /policies/<name>\n"),
        ),
    }
}

/// Routes of the metrics port.
pub async fn metrics(state: Arc<AdminState>, req: Request<Incoming>) -> Response<Body> {
    exposition(&state.metrics, &req)
}

/// `GET /metrics`: the OpenMetrics text of `registry`.
pub fn exposition(
    registry: &prometheus_client::registry::Registry,
    req: &Request<Incoming>,
) -> Response<Body> {
    if req.uri().path() != "/metrics" {
        return text(StatusCode::NOT_FOUND, "try GET /metrics\n");
    }
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}\n"),
        );
    }
    Response::builder()
        .header(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
        .body(Full::new(Bytes::from(out)))
        .expect("static response")
}

/// Routes of the readiness port: `/healthz/ready` (traffic may be sent) and
/// `/healthz/live` (the process serves; a liveness probe must not depend on
/// readiness, or a slow first sync would get the gateway killed).
pub async fn readiness(state: Arc<AdminState>, req: Request<Incoming>) -> Response<Body> {
    match req.uri().path() {
        "/healthz/ready" => {}
        "/healthz/live" => return text(StatusCode::OK, "live\n"),
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                "try GET /healthz/ready or /healthz/live\n",
            )
        }
    }
    if state.ready.load(Ordering::Acquire) {
        text(StatusCode::OK, "ready\n")
    } else {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: starting or draining\n",
        )
    }
}

/// The limits of one HTTP listener.
#[derive(Clone, Debug)]
pub struct HttpLimits {
    /// The listener's connection cap (and its name in metrics).
    pub connections: ConnLimit,
    /// `control_plane.header_read_timeout`.
    pub header_read_timeout: Duration,
}

/// Serves HTTP/1.1 with `route` until drained; in-flight requests are short and
/// simply dropped with the process.
///
/// A connection beyond the listener's cap takes the slot of the connection
/// idle the longest (no request in progress: a half-sent head, or a
/// keep-alive between requests), which is closed; when all are inside a
/// request, the new one is closed at once (see [`slots`]). A request head
/// not complete within the header-read timeout (or an idle keep-alive
/// connection) is closed; accept errors pause the loop. Each refusal is
/// counted in `tidegate_control_refusals_total`.
pub async fn serve<S, F, Fut>(
    listener: TcpListener,
    state: Arc<S>,
    route: F,
    limits: HttpLimits,
    mut drain: ShutdownWatch,
) where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, Request<Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    let slots = slots::Slots::new(limits.connections.clone());
    loop {
        let (tcp, _) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    limits.connections.accept_failed(&e).await;
                    continue;
                }
            },
            _ = drain.signaled() => return,
        };
        let Some(slot) = slots.admit() else {
            debug!(
                listener = limits.connections.listener(),
                "over capacity, every connection in a request: connection closed"
            );
            continue;
        };
        let state = state.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            let slot = Arc::new(slot);
            let served = Arc::new(AtomicUsize::new(0));
            let requests = served.clone();
            let marks = slot.clone();
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let state = state.clone();
                let marks = marks.clone();
                marks.busy();
                requests.fetch_add(1, Ordering::Relaxed);
                async move {
                    let resp = route(state, req).await;
                    marks.idle();
                    Ok::<_, Infallible>(resp)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(tcp), svc);
            let result = tokio::select! {
                r = conn => r,
                // A newer connection took the slot: this one closes.
                _ = slot.evicted() => return,
            };
            match result {
                // An idle keep-alive connection closed after a request is not a refusal.
                Err(e) if e.is_timeout() && served.load(Ordering::Relaxed) == 0 => {
                    limits.connections.refused("header_timeout")
                }
                Err(e) if e.is_parse() || e.is_parse_too_large() => {
                    limits.connections.refused("bad_request")
                }
                _ => {}
            }
        });
    }
}
