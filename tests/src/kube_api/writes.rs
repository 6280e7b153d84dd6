//! The requests that carry a body: namespaced Secrets and ConfigMaps (get,
//! create with 409 AlreadyExists, replace) and TokenReview (the
//! authentication API: a token the test registered, checked against the
//! audiences asked for, answered with the user and its pod-bound extras).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::server::{json_response, status, Body};
use super::state::State;

/// A token the double's TokenReview accepts.
#[derive(Clone, Debug)]
pub struct TokenInfo {
    /// `system:serviceaccount:<ns>:<sa>` for a service account.
    pub username: String,
    pub audiences: Vec<String>,
    /// A pod-bound projected token's pod (name, uid).
    pub pod: Option<(String, String)>,
}

#[derive(Default)]
pub(super) struct Named {
    /// (resource, namespace, name) → object.
    pub objects: HashMap<(String, String, String), Value>,
    pub tokens: HashMap<String, TokenInfo>,
    pub token_reviews: u64,
}

const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

/// `(resource, namespace, name)` of a namespaced Secret or ConfigMap path.
fn named_path(path: &str) -> Option<(String, String, Option<String>)> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let mut parts = rest.split('/');
    let ns = parts.next()?.to_owned();
    let resource = parts.next()?;
    if !matches!(resource, "secrets" | "configmaps") {
        return None;
    }
    let name = parts.next().map(str::to_owned);
    if parts.next().is_some() {
        return None;
    }
    Some((resource.to_owned(), ns, name))
}

pub(super) fn handles(path: &str) -> bool {
    path == TOKEN_REVIEWS || named_path(path).is_some()
}

pub(super) async fn handle(state: &Arc<Mutex<State>>, req: Request<Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let Ok(bytes) = body.collect().await.map(|b| b.to_bytes()) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "unreadable body");
    };
    let body: Option<Value> = serde_json::from_slice(&bytes).ok();
    let mut st = state.lock().unwrap();
    if let Some(a) = parts.headers.get(http::header::AUTHORIZATION) {
        st.authorizations
            .push(a.to_str().unwrap_or_default().to_owned());
    }
    if parts.uri.path() == TOKEN_REVIEWS {
        if parts.method != Method::POST {
            return status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "create only",
            );
        }
        let Some(review) = body else {
            return status(StatusCode::BAD_REQUEST, "BadRequest", "not a TokenReview");
        };
        st.named.token_reviews += 1;
        return json_response(
            StatusCode::CREATED,
            &review_answer(&st.named.tokens, review),
        );
    }
    let (resource, ns, name) = named_path(parts.uri.path()).expect("handles() said so");
    let kind = if resource == "secrets" {
        "Secret"
    } else {
        "ConfigMap"
    };
    let not_found = |name: &str| {
        status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("{resource} \"{name}\" not found"),
        )
    };
    match (&parts.method, name) {
        (&Method::GET, Some(name)) => {
            match st.named.objects.get(&(resource.clone(), ns, name.clone())) {
                Some(o) => json_response(StatusCode::OK, o),
                None => not_found(&name),
            }
        }
        (&Method::POST, None) => {
            let Some(mut obj) = body else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "not an object");
            };
            let Some(name) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
                return status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "metadata.name: Required value",
                );
            };
            let key = (resource.clone(), ns.clone(), name.clone());
            if st.named.objects.contains_key(&key) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    &format!("{resource} \"{name}\" already exists"),
                );
            }
            st.rv += 1;
            obj["apiVersion"] = json!("v1");
            obj["kind"] = json!(kind);
            obj["metadata"]["namespace"] = json!(ns);
            obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
            obj["metadata"]["uid"] = json!(format!("{resource}-{ns}-{name}"));
            st.named.objects.insert(key, obj.clone());
            json_response(StatusCode::CREATED, &obj)
        }
        (&Method::PUT, Some(name)) => {
            let Some(mut obj) = body else {
                return status(StatusCode::BAD_REQUEST, "BadRequest", "not an object");
            };
            let key = (resource.clone(), ns, name.clone());
            if !st.named.objects.contains_key(&key) {
                return not_found(&name);
            }
            st.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(st.rv.to_string());
            st.named.objects.insert(key, obj.clone());
            json_response(StatusCode::OK, &obj)
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "get, create or replace",
        ),
    }
}

/// What the authentication API answers for `review`.
fn review_answer(tokens: &HashMap<String, TokenInfo>, mut review: Value) -> Value {
    let token = review["spec"]["token"].as_str().unwrap_or_default();
    let wanted: Vec<String> = review["spec"]["audiences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let status = match tokens.get(token) {
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
        Some(info) => {
            let audiences: Vec<&String> = if wanted.is_empty() {
                info.audiences.iter().collect()
            } else {
                wanted
                    .iter()
                    .filter(|a| info.audiences.contains(a))
                    .collect()
            };
            if audiences.is_empty() {
                json!({"authenticated": false, "error": "token audiences are invalid for the target audiences"})
            } else {
                let mut user = json!({"username": info.username, "uid": format!("uid-{}", info.username), "groups": ["system:serviceaccounts", "system:authenticated"]});
                if let Some((name, uid)) = &info.pod {
                    user["extra"] = json!({
                        "authentication.kubernetes.io/pod-name": [name],
                        "authentication.kubernetes.io/pod-uid": [uid],
                    });
                }
                json!({"authenticated": true, "user": user, "audiences": audiences})
            }
        }
    };
    review["apiVersion"] = json!("authentication.k8s.io/v1");
    review["kind"] = json!("TokenReview");
    review["metadata"] = json!({"creationTimestamp": null});
    review["status"] = status;
    review
}
