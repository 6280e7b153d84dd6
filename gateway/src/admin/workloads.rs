//! `/workloads/<workload>/…`: lifecycle events for operators, scripts and
//! tests, and run-time policy bindings. `<workload>` is a uid or
//! `<namespace>/<name>` ([`super::workload_ref`]); `<uid>` below stands for
//! either.
//!
//! - `POST /workloads/<uid>/shutdown-starting[?grace=30s]`,
//!   `POST /workloads/<uid>/teardown` (answers once the policy's hold, if
//!   any, is over), `DELETE /workloads/<uid>`.
//! - `PUT /workloads/<uid>/policy` with a policy name as the body binds the
//!   workload to it (source `admin`, above its annotation and the configured
//!   bindings; the next drain uses it); `DELETE /workloads/<uid>/policy`
//!   removes the binding. Both answer with the workload's policy report.
//!
//! A workload named `policy`, `teardown` or `shutdown-starting` in the
//! two-segment form reads as an action (`DELETE /workloads/ns/policy` is an
//! unbind of `ns`): `%2F` names it without doubt.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::json;

use super::workload_ref::{RefError, WorkloadRef};
use super::{json_response, json_status, text, AdminState, Body};
use crate::drains::{Lifecycle, Trigger};
use crate::workloads::Workload;

const USAGE: &str = "use POST /workloads/<uid>/shutdown-starting[?grace=30s], POST /workloads/<uid>/teardown, DELETE /workloads/<uid>, PUT or DELETE /workloads/<uid>/policy (<uid>: a uid or namespace%2Fname)\n";

/// The actions a path under `/workloads/<workload>/` may end with.
const ACTIONS: [&str; 3] = ["policy", "shutdown-starting", "teardown"];

/// What a request under `/workloads/` asks for, read from its method, the
/// path after `/workloads/` and the query alone (no state; fuzzed). The
/// workload is as written in the path (still percent-encoded).
#[derive(Debug, PartialEq, Eq)]
pub enum WorkloadRequest<'a> {
    Bind(&'a str),
    Unbind(&'a str),
    Lifecycle(&'a str, Lifecycle),
    /// Answered at once with this status and body.
    Refused(StatusCode, String),
}

/// Parses a `/workloads/<uid>/…` request; a `grace` longer than
/// [`crate::drains::MAX_GRACE`] or unparsable is a 400 naming the query key.
pub fn parse<'a>(
    method: &Method,
    rest: &'a str,
    query: Option<&str>,
    default_grace: std::time::Duration,
) -> WorkloadRequest<'a> {
    use WorkloadRequest as R;
    let (target, action) = match rest.rsplit_once('/') {
        Some((target, action)) if ACTIONS.contains(&action) => (target, Some(action)),
        _ => (rest, None),
    };
    match (method, action) {
        (&Method::PUT, Some("policy")) => R::Bind(target),
        (&Method::DELETE, Some("policy")) => R::Unbind(target),
        (&Method::POST, Some("shutdown-starting")) => {
            let grace = query
                .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("grace=")))
                .map(tidegate_base::duration::parse)
                .unwrap_or(Ok(default_grace));
            match grace {
                Ok(grace) if grace > crate::drains::MAX_GRACE => R::Refused(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "query `grace`: {} s is out of range; accepted: 0s to 24h\n",
                        grace.as_secs()
                    ),
                ),
                Ok(grace) => R::Lifecycle(target, Lifecycle::ShutdownStarted { grace }),
                Err(e) => R::Refused(
                    StatusCode::BAD_REQUEST,
                    format!("query `grace`: {e}; accepted: 0s to 24h\n"),
                ),
            }
        }
        (&Method::POST, Some("teardown")) => R::Lifecycle(target, Lifecycle::Teardown),
        (&Method::DELETE, None) => R::Lifecycle(target, Lifecycle::Deleted),
        _ => R::Refused(StatusCode::NOT_FOUND, USAGE.to_owned()),
    }
}

pub(super) async fn route(
    state: Arc<AdminState>,
    rest: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let parsed = parse(req.method(), rest, req.uri().query(), state.default_grace);
    let target = match &parsed {
        WorkloadRequest::Refused(status, body) => return text(*status, body.clone()),
        WorkloadRequest::Bind(t)
        | WorkloadRequest::Unbind(t)
        | WorkloadRequest::Lifecycle(t, _) => *t,
    };
    let uid = match resolve(&state, target) {
        Ok(uid) => uid,
        Err(e) => return text(e.status(), format!("{e}\n")),
    };
    match parsed {
        WorkloadRequest::Bind(_) => bind(&state, &uid, req).await,
        WorkloadRequest::Unbind(_) => unbind(&state, &uid),
        WorkloadRequest::Lifecycle(_, what) => {
            match state.drains.on_lifecycle(&uid, what, Trigger::Admin).await {
                Ok(outcome) => {
                    json_response(serde_json::to_value(outcome).expect("outcome serializes"))
                }
                Err(e) => text(StatusCode::NOT_FOUND, format!("{e}\n")),
            }
        }
        WorkloadRequest::Refused(status, body) => text(status, body),
    }
}

/// The uid `target` (a path's workload) names on this node.
fn resolve(state: &AdminState, target: &str) -> Result<String, RefError> {
    let snapshot = state.workloads.snapshot();
    WorkloadRef::parse(target, |uid| snapshot.by_uid(uid).is_some())?
        .resolve(&snapshot, &state.node)
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
