//! The HTTP side: list (with resourceVersion, resourceVersionMatch, limit,
//! continue), watch streams (newline-delimited WatchEvents), metadata-only
//! responses, 410 Gone, 400 for selectors it does not understand.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};

use super::selectors::Filter;
use super::state::{event, view, State, Watch};
use super::Kind;

pub(super) type Body = BoxBody<Bytes, Infallible>;

pub(super) fn handle(state: &Arc<Mutex<State>>, req: Request<Incoming>) -> Response<Body> {
    let Some(kind) = Kind::from_path(req.uri().path()) else {
        return status(StatusCode::NOT_FOUND, "NotFound", "no such resource here");
    };
    if state.lock().unwrap().absent.contains(&kind) {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        );
    }
    let q = query(req.uri().query().unwrap_or(""));
    let meta_only = req
        .headers()
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"));
    let filter = match Filter::parse(
        q.get("fieldSelector").map(String::as_str),
        q.get("labelSelector").map(String::as_str),
    ) {
        Ok(f) => f,
        Err(msg) => return status(StatusCode::BAD_REQUEST, "BadRequest", &msg),
    };
    let rv: Option<u64> = q.get("resourceVersion").and_then(|v| v.parse().ok());
    let mut st = state.lock().unwrap();
    if let Some(a) = req.headers().get(http::header::AUTHORIZATION) {
        st.authorizations
            .push(a.to_str().unwrap_or_default().to_owned());
    }
    let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    *st.requests
        .entry((kind, if watching { "watch" } else { "list" }))
        .or_default() += 1;
    if meta_only {
        *st.metadata_only.entry(kind).or_default() += 1;
    }
    if st.unavailable {
        // 500, not 503: kube's client retries 429/503/504 itself (up to 15
        // times) before its watcher sees an error.
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "the API server double is in a simulated outage",
        );
    }
    if watching {
        let since = rv.unwrap_or(st.rv);
        if since != 0 && since < st.compacted {
            let gone = status_value(
                410,
                "Expired",
                &format!("too old resource version: {since} ({})", st.compacted),
            );
            return stream_of(Some(event("ERROR", gone)), None, None);
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let since = if since == 0 { st.rv } else { since };
        st.watch(
            Watch {
                kind,
                filter,
                meta_only,
                bookmarks: q.get("allowWatchBookmarks").is_some_and(|b| b == "true"),
                tx,
            },
            since,
        );
        // The API server ends a watch after timeoutSeconds; clients re-watch.
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .map(std::time::Duration::from_secs);
        return stream_of(None, Some(rx), timeout);
    }
    let exact = q.get("resourceVersionMatch").is_some_and(|m| m == "Exact");
    if let Some(rv) = rv.filter(|rv| exact && *rv != 0 && *rv < st.compacted) {
        return status(
            StatusCode::GONE,
            "Expired",
            &format!("too old resource version: {rv} ({})", st.compacted),
        );
    }
    let all = st.list(kind, &filter);
    let offset: usize = q.get("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
    let limit: usize = q
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let page: Vec<Value> = all
        .iter()
        .skip(offset)
        .take(limit)
        .map(|o| {
            let mut v = view(o, meta_only);
            if !meta_only {
                // Real lists carry no per-item kind; clients must cope.
                v.as_object_mut().unwrap().remove("kind");
                v.as_object_mut().unwrap().remove("apiVersion");
            }
            v
        })
        .collect();
    let mut metadata = json!({"resourceVersion": st.rv.to_string()});
    if offset + page.len() < all.len() {
        metadata["continue"] = json!((offset + page.len()).to_string());
    }
    let (api_version, list_kind) = if meta_only {
        (
            "meta.k8s.io/v1".to_owned(),
            "PartialObjectMetadataList".to_owned(),
        )
    } else {
        (
            kind.api_version().to_owned(),
            format!("{}List", kind.name()),
        )
    };
    json_response(
        StatusCode::OK,
        &json!({"apiVersion": api_version, "kind": list_kind, "metadata": metadata, "items": page}),
    )
}

fn stream_of(
    first: Option<Bytes>,
    rx: Option<tokio::sync::mpsc::UnboundedReceiver<Bytes>>,
    timeout: Option<std::time::Duration>,
) -> Response<Body> {
    let rest = futures::stream::unfold(rx, |rx| async move {
        let mut rx = rx?;
        let b = rx.recv().await?;
        Some((b, Some(rx)))
    });
    let end = async move {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let rest = futures::StreamExt::take_until(rest, Box::pin(end));
    let frames = futures::StreamExt::map(
        futures::StreamExt::chain(futures::stream::iter(first), rest),
        |b| Ok::<_, Infallible>(Frame::data(b)),
    );
    Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed(StreamBody::new(frames)))
        .unwrap()
}

fn status_value(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

pub(super) fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    json_response(code, &status_value(code.as_u16(), reason, message))
}

pub(super) fn json_response(code: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(v).unwrap())).boxed())
        .unwrap()
}

fn query(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            Some((decode(k)?, decode(v)?))
        })
        .collect()
}

/// `application/x-www-form-urlencoded` decoding (`+` is a space).
fn decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = [bytes.next()?, bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}
