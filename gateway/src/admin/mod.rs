//! The admin (127.0.0.1:15000), metrics (:15020) and readiness (:15021)
//! HTTP servers.
//!
//! - [`policies`]: `PUT /policies/<name>` (upload, hot swap).
//! - [`workloads`]: `/workloads/<uid>/…` lifecycle events and run-time policy bindings;
//!   [`workload_ref`]: a uid or `namespace/name` there.
//! - [`config_dump`]: `GET /config_dump`, each workload with its phase and policy;
//!   [`dump_query`]: the sections, workload or Service a query narrows it to;
//!   ztunnel's shape of it for `istioctl ztunnel-config`: [`ztunnel_view`]
//!   (workloads, Services), [`ztunnel_policies`], [`ztunnel_certificates`],
//!   [`workload_state`] (connections).
//! - [`hand_over`]: `GET /version`, `POST /hand-over` (one gateway per node).
//!
//! The server itself (connection cap, slots, timeouts) is
//! `tidegate-control`'s, shared with `tidegate-ca`.

mod config_dump;
pub mod dump_query;
pub mod hand_over;
mod policies;
pub mod workload_ref;
mod workload_state;
pub mod workloads;
mod ztunnel_certificates;
mod ztunnel_policies;
mod ztunnel_view;

pub use policies::POLICY_CONFIG_HEADER;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::json;
use tidegate_control::http::{exposition, text, Body};

use crate::proxy::pool::Pool;
use crate::proxy::tunnels::InboundTunnels;
use crate::workloads::WorkloadStore;
use tidegate_policy_host::PolicyEngine;

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
    pub routing: Arc<crate::proxy::routing::Routing>,
    /// `/config_dump` shows what the certificate source holds.
    pub certificates: Arc<dyn tidegate_protocol::tls::CertSource>,
    /// `drains.default_grace`: the grace of a `shutdown-starting` without `?grace=`.
    pub default_grace: std::time::Duration,
    /// The split of the open-file limit (`None`: the limit is unknown).
    pub descriptors: Option<crate::descriptor_budget::DescriptorBudget>,
    /// `cluster_id`: each workload's `clusterId` in `/config_dump`.
    pub cluster_id: String,
    /// `hbone.port`: where an inbound tunnel lands (`workloadState`).
    pub hbone_port: u16,
    /// The connections open now (`workloadState`).
    pub live: Arc<crate::proxy::connections::LiveConnections>,
    pub metrics: prometheus_client::registry::Registry,
    pub ready: AtomicBool,
    /// `POST /hand-over` releases the admin, metrics and readiness listeners.
    pub hand_over: hand_over::HandOver,
}

/// The admin, metrics and readiness listeners: what `POST /hand-over` releases.
pub const CONTROL_LISTENERS: usize = 3;

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
        (&Method::GET, "/version") => hand_over::version(&state),
        (&Method::POST, "/hand-over") => hand_over::post(state, req, CONTROL_LISTENERS).await,
        (&Method::GET, "/config_dump") => match dump_query::parse(req.uri().query()) {
            Ok(q) => json_response(config_dump::dump(&state, &q).await),
            Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
        },
        (_, "/config_dump") => text(StatusCode::METHOD_NOT_ALLOWED, "use GET /config_dump\n"),
        (_, path) => text(
            StatusCode::NOT_FOUND,
            format!("no admin endpoint {path}; try GET /config_dump, GET /policies, PUT /policies/<name>, GET /drains, GET /version\n"),
        ),
    }
}

/// Routes of the metrics port.
pub async fn metrics(state: Arc<AdminState>, req: Request<Incoming>) -> Response<Body> {
    exposition(&state.metrics, &req)
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
