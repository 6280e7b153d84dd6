//! `tidegate-ca`'s gRPC listener: TLS, then HTTP/2 per connection, with the
//! limits of the gateway's own listeners ([`crate::control_plane`]):
//!
//! - at most `--max-connections` open: one more is closed at once —
//!   `tidegate_control_refusals_total{listener="ca",reason="over_capacity"}`;
//! - the TLS handshake within `--handshake-timeout`, else closed —
//!   `reason="handshake_timeout"`;
//! - a first request within `--preface-timeout` after the handshake, else
//!   closed — `reason="preface_timeout"`;
//! - a connection with no request in flight for `--idle-timeout` is closed
//!   with a GOAWAY (not a refusal: the client reconnects when it needs to);
//! - a failed accept (EMFILE…) pauses the loop, 10 ms doubling to 100 ms,
//!   logged at most once a second — `tidegate_control_accept_errors_total{listener="ca"}`.
//!
//! Drain contract: when `drain` fires the loop stops accepting and every
//! connection gets a GOAWAY; a request in flight has [`CLOSE_GRACE`] to
//! finish.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tidegate_control::limits::ConnLimit;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::debug;

use super::service::CaService;
use tidegate_base::shutdown::ShutdownWatch;

/// How long a connection told to close (GOAWAY) may take to finish its
/// requests before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// The limits of the listener (`tidegate-ca --help`).
#[derive(Clone, Debug)]
pub struct Limits {
    pub connections: ConnLimit,
    pub handshake_timeout: Duration,
    pub preface_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Accepts until `drain` fires; each connection is served on its own task.
pub async fn serve(
    listener: TcpListener,
    tls: tokio_rustls::TlsAcceptor,
    svc: CaService,
    limits: Limits,
    mut drain: ShutdownWatch,
) {
    loop {
        let accepted = limits.connections.accept(|| listener.accept(), &mut drain);
        let Some((tcp, peer)) = accepted.await else {
            return;
        };
        let Some(slot) = limits.connections.admit() else {
            debug!(%peer, "over capacity: CA connection closed");
            continue;
        };
        let conn = Connection {
            tls: tls.clone(),
            svc: svc.clone(),
            limits: limits.clone(),
            drain: drain.clone(),
        };
        tokio::spawn(async move {
            let _slot = slot;
            conn.run(tcp, peer).await;
        });
    }
}

struct Connection {
    tls: tokio_rustls::TlsAcceptor,
    svc: CaService,
    limits: Limits,
    drain: ShutdownWatch,
}

/// Requests of one connection, for its idle timeout.
#[derive(Clone, Copy, Debug)]
struct Activity {
    /// Requests received so far.
    requests: u64,
    in_flight: usize,
    /// When the connection opened or a request last started or ended.
    since: Instant,
}

/// Marks a request in flight until dropped.
struct InFlight(watch::Sender<Activity>);

impl InFlight {
    fn begin(activity: &watch::Sender<Activity>) -> InFlight {
        activity.send_modify(|a| {
            a.requests += 1;
            a.in_flight += 1;
            a.since = Instant::now();
        });
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|a| {
            a.in_flight -= 1;
            a.since = Instant::now();
        });
    }
}

impl Connection {
    async fn run(mut self, tcp: TcpStream, peer: SocketAddr) {
        let handshake = tokio::time::timeout(self.limits.handshake_timeout, self.tls.accept(tcp));
        let stream = match handshake.await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                return debug!(%peer, error = %e, "TLS handshake with a CA client failed");
            }
            Err(_) => {
                debug!(%peer, "TLS handshake with a CA client timed out; closed");
                return self.limits.connections.refused("handshake_timeout");
            }
        };
        let (activity, watched) = watch::channel(Activity {
            requests: 0,
            in_flight: 0,
            since: Instant::now(),
        });
        let svc = self.svc.clone();
        let service = hyper::service::service_fn(move |req: http::Request<Incoming>| {
            let in_flight = InFlight::begin(&activity);
            let mut svc = svc.clone();
            async move {
                let response = tower::Service::call(&mut svc, req).await;
                drop(in_flight);
                response
            }
        });
        let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .serve_connection(TokioIo::new(stream), service);
        tokio::pin!(conn);
        let limits = &self.limits;
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    debug!(%peer, error = %e, "CA connection ended with an error");
                }
                return;
            }
            reason = idle(watched, limits.preface_timeout, limits.idle_timeout) => {
                if reason == "preface_timeout" {
                    // It never spoke HTTP/2: nothing to say goodbye to.
                    debug!(%peer, "no request within the preface timeout; closed");
                    return limits.connections.refused(reason);
                }
                debug!(%peer, "idle CA connection closed");
            }
            _ = self.drain.signaled() => {}
        }
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(CLOSE_GRACE, conn).await;
    }
}

/// Resolves when the connection has had no request in flight for the
/// timeout that applies — `preface` before its first request, `idle`
/// after — naming which one ran out.
async fn idle(
    mut activity: watch::Receiver<Activity>,
    preface: Duration,
    idle: Duration,
) -> &'static str {
    loop {
        let a = *activity.borrow_and_update();
        let (limit, reason) = if a.requests == 0 {
            (preface, "preface_timeout")
        } else {
            (idle, "idle_timeout")
        };
        let changed = async {
            if activity.changed().await.is_err() {
                // The service is gone with its connection.
                std::future::pending::<Infallible>().await;
            }
        };
        if a.in_flight > 0 {
            changed.await;
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(a.since + limit) => return reason,
            _ = changed => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn activity() -> (watch::Sender<Activity>, watch::Receiver<Activity>) {
        watch::channel(Activity {
            requests: 0,
            in_flight: 0,
            since: Instant::now(),
        })
    }

    const SHORT: Duration = Duration::from_millis(20);
    const BOUND: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn a_connection_without_a_request_runs_out_of_the_preface_timeout() {
        let (_tx, rx) = activity();
        let reason = tokio::time::timeout(BOUND, idle(rx, SHORT, BOUND * 10)).await;
        assert_eq!(reason.unwrap(), "preface_timeout");
    }

    #[tokio::test]
    async fn a_request_in_flight_holds_the_connection_and_then_the_idle_timeout_applies() {
        let (tx, rx) = activity();
        let request = InFlight::begin(&tx);
        let watchdog = tokio::spawn(idle(rx, SHORT, SHORT));
        // Ten times both timeouts while the request runs.
        tokio::time::sleep(SHORT * 10).await;
        assert!(!watchdog.is_finished(), "a request in flight is not idle");
        drop(request);
        let reason = tokio::time::timeout(BOUND, watchdog).await.unwrap();
        assert_eq!(reason.unwrap(), "idle_timeout");
    }
}
