//! `/workloads/<uid>/…`: lifecycle events for operators, scripts and tests,
//! and run-time policy bindings.
//!
//! - `POST /workloads/<uid>/shutdown-starting[?grace=30s]`,
//!   `POST /workloads/<uid>/teardown` (answers once the policy's hold, if
//!   any, is over), `DELETE /workloads/<uid>`.
//! - `PUT /workloads/<uid>/policy` with a policy name as the body binds the
//!   workload to it (source `admin`, above its annotation and the configured
//!   bindings; the next drain uses it); `DELETE /workloads/<uid>/policy`
//!   removes the binding. Both answer with the workload's policy report.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::json;

use super::{json_response, json_status, text, AdminState, Body};
use crate::drains::{Lifecycle, Trigger};
use crate::workloads::Workload;

const USAGE: &str = "use POST /workloads/<uid>/shutdown-starting[?grace=30s], POST /workloads/<uid>/teardown, DELETE /workloads/<uid>, PUT or DELETE /workloads/<uid>/policy\n";

pub(super) async fn route(
    state: Arc<AdminState>,
    rest: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let method = req.method().clone();
    let (uid, what) = match (method, rest.split_once('/')) {
        (Method::PUT, Some((uid, "policy"))) => return bind(&state, uid, req).await,
        (Method::DELETE, Some((uid, "policy"))) => return unbind(&state, uid),
        (Method::POST, Some((uid, "shutdown-starting"))) => {
            let grace = req
                .uri()
                .query()
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("grace=")))
                .map(crate::config::duration::parse)
                .unwrap_or(Ok(state.default_grace));
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
                Err(e) => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        format!("query `grace`: {e}; accepted: 0s to 24h\n"),
                    )
                }
            }
        }
        (Method::POST, Some((uid, "teardown"))) => (uid, Lifecycle::Teardown),
        (Method::DELETE, None) => (rest, Lifecycle::Deleted),
        _ => return text(StatusCode::NOT_FOUND, USAGE),
    };
    match state.drains.on_lifecycle(uid, what, Trigger::Admin).await {
        Ok(outcome) => json_response(serde_json::to_value(outcome).expect("outcome serializes")),
        Err(e) => text(StatusCode::NOT_FOUND, format!("{e}\n")),
    }
}

/// The local workload `uid`, or why there is none (answered with 404).
fn local_workload(state: &AdminState, uid: &str) -> Result<Arc<Workload>, String> {
    match state.workloads.snapshot().by_uid(uid) {
        Some(w) if w.local => Ok(w.clone()),
        Some(w) => Err(format!(
            "workload {uid:?} runs on node {}, not {}: its gateway chooses its policy\n",
            w.spec.node, state.node
        )),
        None => Err(format!("no workload with uid {uid:?} on this node\n")),
    }
}

fn report(state: &AdminState, w: &Workload, previous: Option<String>) -> Response<Body> {
    let (_, pinned) = state.drains.phase_of(w.uid());
    json_response(json!({
        "uid": w.uid(),
        "workload": format!("{}/{}", w.spec.namespace, w.spec.name),
        "previous_binding": previous,
        "policy": state.policies.report(w, pinned.as_ref()),
    }))
}

/// `PUT /workloads/<uid>/policy`, the body a policy name.
async fn bind(state: &AdminState, uid: &str, req: Request<Incoming>) -> Response<Body> {
    let w = match local_workload(state, uid) {
        Ok(w) => w,
        Err(why) => return text(StatusCode::NOT_FOUND, why),
    };
    let name = match Limited::new(req.into_body(), 1024).collect().await {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes()).trim().to_owned(),
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("the body is a policy name: {e}\n"),
            )
        }
    };
    if !super::policies::valid_name(&name) {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "the body must be a policy name (1-64 letters, digits, '-' or '_'), got {name:?}\n"
            ),
        );
    }
    match state.policies.bind(uid, &name) {
        Ok(previous) => report(state, &w, previous),
        Err(e) => json_status(
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({ "result": "refused", "error": e.to_string() }),
        ),
    }
}

/// `DELETE /workloads/<uid>/policy`.
fn unbind(state: &AdminState, uid: &str) -> Response<Body> {
    let w = match local_workload(state, uid) {
        Ok(w) => w,
        Err(why) => return text(StatusCode::NOT_FOUND, why),
    };
    let previous = state.policies.unbind(uid);
    report(state, &w, previous)
}
