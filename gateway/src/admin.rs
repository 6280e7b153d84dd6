//! The admin (127.0.0.1:15000), metrics (:15020) and readiness (:15021)
//! HTTP servers.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tracing::debug;

use crate::drain::DrainWatch;
use crate::pool::Pool;
use crate::registry::Registry;
use crate::workloads::WorkloadStore;

type Body = Full<Bytes>;

/// What the admin endpoints can see.
pub struct AdminState {
    pub node: String,
    pub workloads: Arc<WorkloadStore>,
    pub registry: Arc<Registry>,
    pub pool: Arc<Pool>,
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
    Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec_pretty(&v).expect("json values serialize"),
        )))
        .expect("static response")
}

/// Routes of the admin port.
pub fn admin(state: &AdminState, req: &Request<Incoming>) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/config_dump") => {
            let snapshot = state.workloads.snapshot();
            let workloads: Vec<_> = snapshot.iter().map(|w| w.as_ref()).collect();
            json_response(json!({
                "node": state.node,
                "workloads": workloads,
                "workloads_generation": snapshot.generation,
                "inbound_tunnels": state.registry.dump(),
                "pool": state.pool.dump(),
            }))
        }
        (_, "/config_dump") => text(StatusCode::METHOD_NOT_ALLOWED, "use GET /config_dump\n"),
        (_, path) => text(
            StatusCode::NOT_FOUND,
            format!("no admin endpoint {path}; try GET /config_dump\n"),
        ),
    }
}

/// Routes of the metrics port.
pub fn metrics(state: &AdminState, req: &Request<Incoming>) -> Response<Body> {
    if req.uri().path() != "/metrics" {
        return text(StatusCode::NOT_FOUND, "try GET /metrics\n");
    }
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &state.metrics) {
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

/// Routes of the readiness port.
pub fn readiness(state: &AdminState, req: &Request<Incoming>) -> Response<Body> {
    if req.uri().path() != "/healthz/ready" {
        return text(StatusCode::NOT_FOUND, "try GET /healthz/ready\n");
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

/// Serves HTTP/1.1 with `route` until drained; in-flight requests are short and
/// simply dropped with the process.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AdminState>,
    route: fn(&AdminState, &Request<Incoming>) -> Response<Body>,
    mut drain: DrainWatch,
) {
    loop {
        let (tcp, _) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    debug!(error = %e, "admin accept failed");
                    continue;
                }
            },
            _ = drain.signaled() => return,
        };
        let state = state.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let resp = route(&state, &req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
