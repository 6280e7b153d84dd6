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
use crate::policy::PolicyEngine;
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
    pub policies: Arc<PolicyEngine>,
    pub drains: Arc<crate::drains::DrainEngine>,
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

/// Largest plugin accepted by `PUT /policies/<name>`.
const MAX_PLUGIN_BYTES: usize = 32 << 20;

/// Header carrying the configuration for a plugin uploaded with PUT.
pub const POLICY_CONFIG_HEADER: &str = "tidegate-policy-config";

/// Routes of the admin port.
pub async fn admin(state: Arc<AdminState>, req: Request<Incoming>) -> Response<Body> {
    if let Some(name) = req.uri().path().strip_prefix("/policies/") {
        let name = name.to_owned();
        return match *req.method() {
            Method::PUT => put_policy(state, name, req).await,
            _ => text(
                StatusCode::METHOD_NOT_ALLOWED,
                "use PUT /policies/<name> with the component as the body\n",
            ),
        };
    }
    if let Some(rest) = req.uri().path().strip_prefix("/workloads/") {
        let rest = rest.to_owned();
        return workload_event(state, req.method().clone(), &rest, req.uri().query()).await;
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/drains") => json_response(json!({ "drains": state.drains.list() })),
        (&Method::GET, "/policies") => json_response(json!({ "policies": state.policies.list() })),
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
            format!("no admin endpoint {path}; try GET /config_dump, GET /policies, PUT /policies/<name>\n"),
        ),
    }
}

/// `POST /workloads/<uid>/shutdown-starting[?grace=30s]`,
/// `POST /workloads/<uid>/teardown`, `DELETE /workloads/<uid>`: lifecycle
/// events for operators, scripts and tests. A teardown answers once the
/// policy's hold (if any) is over.
async fn workload_event(
    state: Arc<AdminState>,
    method: Method,
    rest: &str,
    query: Option<&str>,
) -> Response<Body> {
    use crate::drains::{Lifecycle, Trigger};
    let (uid, what) = match (method, rest.split_once('/')) {
        (Method::POST, Some((uid, "shutdown-starting"))) => {
            let grace = query
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("grace=")))
                .map(crate::config::duration::parse);
            let grace = match grace {
                None => Ok(std::time::Duration::from_secs(30)),
                Some(g) => g,
            };
            match grace {
                Ok(grace) if grace > crate::drains::MAX_GRACE => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "query `grace`: {} s is out of range; accepted: 0s to 24h\n",
                            grace.as_secs()
                        ),
                    )
                }
                Ok(grace) => (uid, Lifecycle::ShutdownStarted { grace }),
                Err(e) => return text(StatusCode::BAD_REQUEST, format!("query `grace`: {e}\n")),
            }
        }
        (Method::POST, Some((uid, "teardown"))) => (uid, Lifecycle::Teardown),
        (Method::DELETE, None) => (rest, Lifecycle::Deleted),
        _ => {
            return text(
                StatusCode::NOT_FOUND,
                "use POST /workloads/<uid>/shutdown-starting[?grace=30s], POST /workloads/<uid>/teardown or DELETE /workloads/<uid>\n",
            )
        }
    };
    match state.drains.on_lifecycle(uid, what, Trigger::Admin).await {
        Ok(outcome) => json_response(serde_json::to_value(outcome).expect("outcome serializes")),
        Err(e) => text(StatusCode::NOT_FOUND, format!("{e}\n")),
    }
}

/// Compiles and validates the uploaded plugin off the data path, then swaps
/// it in. A refused plugin leaves the previous version in place: 422 with the reason.
async fn put_policy(
    state: Arc<AdminState>,
    name: String,
    req: Request<Incoming>,
) -> Response<Body> {
    use http_body_util::BodyExt;
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid_name {
        return text(
            StatusCode::BAD_REQUEST,
            format!("policy name {name:?} must be 1-64 letters, digits, '-' or '_'\n"),
        );
    }
    let config = match req.headers().get(POLICY_CONFIG_HEADER).map(|v| v.to_str()) {
        Some(Ok(c)) => Some(c.to_owned()),
        Some(Err(_)) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("header {POLICY_CONFIG_HEADER} must be visible ASCII\n"),
            )
        }
        None => None,
    };
    let body = http_body_util::Limited::new(req.into_body(), MAX_PLUGIN_BYTES);
    let bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("cannot read the plugin (at most {MAX_PLUGIN_BYTES} bytes): {e}\n"),
            )
        }
    };
    let policies = state.policies.clone();
    let result = tokio::task::spawn_blocking(move || {
        policies
            .install(&name, &bytes, config.as_deref())
            .map(|v| (v.name.clone(), v.hash.clone()))
    })
    .await;
    match result {
        Ok(Ok((name, version))) => {
            json_response(json!({ "policy": name, "version": version, "result": "swapped" }))
        }
        Ok(Err(e)) => Response::builder()
            .status(StatusCode::UNPROCESSABLE_ENTITY)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(
                serde_json::to_vec_pretty(&json!({
                    "result": "refused",
                    "reason": e.reason(),
                    "error": e.to_string(),
                    "kept": "the previous version (if any) stays in place",
                }))
                .expect("json"),
            )))
            .expect("static response"),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("loader crashed: {e}\n"),
        ),
    }
}

/// Routes of the metrics port.
pub async fn metrics(state: Arc<AdminState>, req: Request<Incoming>) -> Response<Body> {
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

/// Serves HTTP/1.1 with `route` until drained; in-flight requests are short and
/// simply dropped with the process.
pub async fn serve<F, Fut>(
    listener: TcpListener,
    state: Arc<AdminState>,
    route: F,
    mut drain: DrainWatch,
) where
    F: Fn(Arc<AdminState>, Request<Incoming>) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
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
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(state, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
