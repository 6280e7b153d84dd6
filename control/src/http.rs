//! A small HTTP/1.1 server for the control plane's listeners (the gateway's
//! admin, metrics and readiness; `tidegate-ca`'s metrics): one handler per
//! listener, a connection cap that makes room by closing the connection
//! idle the longest ([`crate::slots`]), a header-read timeout, a pause
//! after accept errors.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tidegate_base::shutdown::ShutdownWatch;
use tokio::net::TcpListener;
use tracing::debug;

use crate::limits::ConnLimit;
use crate::slots;

/// What every handler answers with.
pub type Body = Full<Bytes>;

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body.into())))
        .expect("static response")
}

/// `GET /metrics` (or `/stats/prometheus`): the OpenMetrics text of `registry`.
pub fn exposition(
    registry: &prometheus_client::registry::Registry,
    req: &Request<Incoming>,
) -> Response<Body> {
    // `/stats/prometheus`: where Istio's scrape configurations look
    // (ztunnel serves both).
    if !matches!(req.uri().path(), "/metrics" | "/stats/prometheus") {
        return text(
            StatusCode::NOT_FOUND,
            "try GET /metrics or /stats/prometheus\n",
        );
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
/// keep-alive between requests), which is closed — after answering, with
/// `Connection: close`, a request it had read by then; when all are inside
/// a request, the new one is closed at once (see [`slots`]). A request head
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
        let accepted = limits.connections.accept(|| listener.accept(), &mut drain);
        let Some((tcp, _)) = accepted.await else {
            return;
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
                    let mut resp = route(state, req).await;
                    if marks.evicted_flag() {
                        // Its slot was taken: answered, then closed.
                        resp.headers_mut().insert(
                            header::CONNECTION,
                            header::HeaderValue::from_static("close"),
                        );
                    }
                    marks.idle();
                    Ok::<_, Infallible>(resp)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(TokioIo::new(tcp), svc);
            let mut conn = std::pin::pin!(conn);
            let result = tokio::select! {
                // The connection first: a request already in the socket is
                // read (and a probe answered) even when its slot was taken
                // before this task first ran.
                biased;
                r = conn.as_mut() => r,
                // A newer connection took the slot: this one closes, unless
                // it is inside a request, which is answered first.
                _ = slot.evicted() => {
                    if !slot.serving() {
                        return;
                    }
                    conn.await
                }
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

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
