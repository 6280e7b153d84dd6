//! `PUT /policies/<name>`: upload a plugin; compiled and validated off the
//! data path, then swapped in. A new name is created (201), a loaded one
//! swapped (200); a refused plugin leaves the previous version: 422 with the
//! reason on one line.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::json;
use tracing::{info_span, Instrument};

use super::{json_status, text, AdminState, Body};
use tidegate_policy_host::UploadResult;

/// Largest plugin accepted by `PUT /policies/<name>`.
const MAX_PLUGIN_BYTES: usize = 32 << 20;

/// Header carrying the configuration for a plugin uploaded with PUT.
pub const POLICY_CONFIG_HEADER: &str = "tidegate-policy-config";

/// Whether `name` can name a policy: 1-64 letters, digits, '-' or '_'.
pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub(super) async fn put(
    state: Arc<AdminState>,
    name: String,
    req: Request<Incoming>,
) -> Response<Body> {
    let span = info_span!("policy_upload", policy = %name);
    put_inner(state, name, req).instrument(span).await
}

async fn put_inner(state: Arc<AdminState>, name: String, req: Request<Incoming>) -> Response<Body> {
    if !valid_name(&name) {
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
    let bytes = match Limited::new(req.into_body(), MAX_PLUGIN_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("cannot read the plugin (at most {MAX_PLUGIN_BYTES} bytes): {e}\n"),
            )
        }
    };
    let policies = state.policies.clone();
    let span = tracing::Span::current();
    let result = tokio::task::spawn_blocking(move || {
        let _entered = span.enter();
        policies.upload(&name, &bytes, config.as_deref())
    })
    .await;
    match result {
        Ok(Ok(up)) => {
            let status = match up.result {
                UploadResult::Created => StatusCode::CREATED,
                UploadResult::Loaded | UploadResult::Swapped => StatusCode::OK,
            };
            json_status(
                status,
                json!({
                    "policy": up.version.name,
                    "version": up.version.hash,
                    "size": up.version.size,
                    "result": up.result,
                    "previous": up.previous.map(|p| p.hash.clone()),
                }),
            )
        }
        Ok(Err(e)) => json_status(
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({
                "result": "refused",
                "reason": e.reason(),
                "error": e.to_string(),
                "kept": "the previous version (if any) stays in place",
            }),
        ),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("loader crashed: {e}\n"),
        ),
    }
}
