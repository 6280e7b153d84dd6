//! One connection's ledger: what the data path records of each proxied
//! connection (outbound, plaintext inbound) or inbound CONNECT stream, from
//! its acceptance to its one end — tidegate's counters, the drain's stream
//! count, Istio's report and the access line.
//!
//! Once routed, the connection is listed among those open now
//! ([`super::connections`], under its local workload) until it ends.
//!
//! A ledger ends one of three ways, each recorded once: refused
//! ([`ConnectionLedger::refuse`]: no byte was carried), finished
//! ([`ConnectionLedger::finish`]), or dropped without either when its task
//! is cancelled (the result `cancelled`). `refuse` and `finish` take the
//! ledger by value, so no path can end it twice.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use tokio::net::TcpStream;

use crate::proxy::connections::{Direction, LiveConnection, Registered};
use crate::proxy::copy::{ByteCounters, CopyError, Transferred};
use crate::proxy::istio_tcp::{Connection, Flags, Report, Reporter};
use crate::proxy::metrics::ProxyMetrics;
use crate::workloads::Workload;
use tidegate_base::shutdown::StreamGuard;
use tidegate_protocol::identity::SpiffeId;

/// The result of a connection that carried its bytes to the end.
pub const OK: &str = "ok";
/// The result of a ledger dropped unended: its task was cancelled.
pub const CANCELLED: &str = "cancelled";

/// What is recorded of one connection or stream; see the module doc.
pub struct ConnectionLedger<'a> {
    metrics: &'a ProxyMetrics,
    scope: Scope<'a>,
    /// Its place among the streams a drain waits for.
    guard: StreamGuard,
    started: Instant,
    /// Istio's report of the connection, or of its current attempt, once
    /// it is routed.
    report: Option<Report>,
    /// Counted in `streams_open` since its bytes began to move.
    carrying: bool,
    /// Its entry among the connections open now, once it is routed.
    listed: Option<Registered>,
    line: Line,
    ended: bool,
}

enum Scope<'a> {
    /// A connection accepted on a listener: counted opened and closed,
    /// failed when refused, and then reset rather than closed, so the
    /// application does not take a refusal for an empty answer.
    Connection(&'a TcpStream),
    /// A stream on an inbound tunnel (the tunnel is the connection, counted
    /// where it is accepted); a refusal is answered on the stream.
    Stream,
}

/// What the access line says beyond how the connection ended.
struct Line {
    src: SocketAddr,
    dst: SocketAddr,
    /// Empty on the line while unknown (refused before the source was
    /// found; plain TCP has no destination identity).
    src_identity: Option<SpiffeId>,
    dst_identity: Option<SpiffeId>,
    /// To a Service: the endpoint tried last.
    endpoint: Option<(Arc<Workload>, SocketAddr)>,
    /// To a Service: the endpoints tried before it and why each failed.
    refused_tries: Vec<String>,
}

/// How a connection that got through ended.
#[derive(Clone, Copy, Debug)]
pub struct Ended<'e> {
    result: &'static str,
    moved: Transferred,
    flags: Flags,
    error: Option<&'e str>,
    drained_by: Option<&'e str>,
}

impl<'e> Ended<'e> {
    /// Ended with `result` (a metric label) after moving `moved`.
    pub fn new(result: &'static str, moved: Transferred) -> Self {
        Ended {
            result,
            moved,
            flags: Flags::None,
            error: None,
            drained_by: None,
        }
    }

    /// Ended as the copy between the two sides did.
    pub fn copied(moved: Transferred, copy: &Result<(), CopyError>) -> Self {
        let result = match copy {
            Ok(()) => OK,
            Err(e) => e.reason(),
        };
        Ended::new(result, moved)
    }

    /// Cut by an authorization policy that now refuses it (`error`).
    pub fn denied(mut self, error: &'e str) -> Self {
        self.flags = Flags::Deny;
        self.error = Some(error);
        self
    }

    /// The drain that asked its tunnel to go away, if one did.
    pub fn drained_by(mut self, drain: Option<&'e str>) -> Self {
        self.drained_by = drain;
        self
    }
}

impl<'a> ConnectionLedger<'a> {
    /// A connection accepted from `client` at `src` for `dst`, counted
    /// opened now.
    pub fn connection(
        metrics: &'a ProxyMetrics,
        client: &'a TcpStream,
        guard: StreamGuard,
        src: SocketAddr,
        dst: SocketAddr,
    ) -> Self {
        metrics.connections_opened.inc();
        Self::new(metrics, Scope::Connection(client), guard, src, dst)
    }

    /// A CONNECT stream on an inbound tunnel, from `src` for `dst`.
    pub fn stream(
        metrics: &'a ProxyMetrics,
        guard: StreamGuard,
        src: SocketAddr,
        dst: SocketAddr,
    ) -> Self {
        Self::new(metrics, Scope::Stream, guard, src, dst)
    }

    fn new(
        metrics: &'a ProxyMetrics,
        scope: Scope<'a>,
        guard: StreamGuard,
        src: SocketAddr,
        dst: SocketAddr,
    ) -> Self {
        ConnectionLedger {
            metrics,
            scope,
            guard,
            started: Instant::now(),
            report: None,
            carrying: false,
            listed: None,
            line: Line {
                src,
                dst,
                src_identity: None,
                dst_identity: None,
                endpoint: None,
                refused_tries: Vec::new(),
            },
            ended: false,
        }
    }

    /// The source's identity, once it is known.
    pub fn source(&mut self, id: SpiffeId) {
        self.line.src_identity = Some(id);
    }

    /// The destination's identity (`None`: plain TCP, which has none).
    pub fn destination(&mut self, id: Option<SpiffeId>) {
        self.line.dst_identity = id;
    }

    /// The connection is routed: Istio's report opens (counted opened),
    /// and closes when the ledger ends.
    /// It is also listed among the connections open now, under its local
    /// workload (the source of an outbound one, the destination of an
    /// inbound one; one unknown: not listed), or its entry is updated (a
    /// later attempt).
    pub fn report(&mut self, c: Connection<'_>) {
        self.list(&c);
        self.report = Some(self.metrics.istio.open(c));
    }

    fn list(&mut self, c: &Connection<'_>) {
        let actual_dst = self
            .line
            .endpoint
            .as_ref()
            .map_or(self.line.dst, |(_, addr)| *addr);
        let hbone = c.mutual_tls;
        if let Some(at) = self.listed {
            self.metrics.live.update(at, |e| {
                e.actual_dst = actual_dst;
                e.hbone = hbone;
            });
            return;
        }
        let (local, direction, original_dst) = match c.reporter {
            Reporter::Source => (c.source, Direction::Outbound, Some(self.line.dst)),
            Reporter::Destination => (c.destination, Direction::Inbound, None),
        };
        let Some(local) = local else {
            return;
        };
        self.listed = Some(self.metrics.live.insert(LiveConnection {
            workload_uid: local.uid().into(),
            direction,
            src: self.line.src,
            original_dst,
            actual_dst,
            hbone,
        }));
    }

    /// The connection goes to `w` at `addr`, an endpoint of a Service.
    pub fn trying(&mut self, w: &Arc<Workload>, addr: SocketAddr) {
        self.line.endpoint = Some((w.clone(), addr));
        if let Some(at) = self.listed {
            self.metrics.live.update(at, |e| e.actual_dst = addr);
        }
    }

    /// The endpoint being tried failed its connect with `reason`, before
    /// any byte of the application's was sent: that attempt's report
    /// closes with `flags`, the line lists it, and another is chosen.
    pub fn endpoint_refused(&mut self, flags: Flags, reason: &str) {
        if let Some(report) = self.report.take() {
            report.close(flags);
        }
        if let Some(e) = self.line.endpoint() {
            self.line.endpoint = None;
            self.line.refused_tries.push(format!("{e}: {reason}"));
        }
    }

    /// Istio's byte counters as (downstream → upstream, upstream →
    /// downstream), for a copy between two sockets.
    pub fn istio_counters(&self) -> (Counter, Counter) {
        match &self.report {
            Some(r) => {
                let (received, sent) = r.counters();
                (received.clone(), sent.clone())
            }
            None => Default::default(),
        }
    }

    /// Istio's byte counters for a copy between a stream and a socket,
    /// the socket being the connection's initiator (`tcp_is_downstream`)
    /// or its target.
    pub fn istio_byte_counters(&self, tcp_is_downstream: bool) -> ByteCounters {
        match &self.report {
            Some(r) => r.byte_counters(tcp_is_downstream),
            None => ByteCounters::default(),
        }
    }

    /// Its bytes begin to move: counted in `streams_open` until it ends,
    /// and in the drain's count as closed cleanly or reset by its result.
    pub fn carrying(&mut self) {
        self.metrics.streams_open.inc();
        self.carrying = true;
    }

    /// Refused or failed before carrying a byte, for `reason` (a metric
    /// label): Istio's report (if routed) closes with `flags`; a
    /// connection is counted failed and reset; the access line names
    /// `reason` and `error`.
    pub fn refuse(mut self, reason: &'static str, flags: Flags, error: Option<&str>) {
        if let Scope::Connection(client) = self.scope {
            self.metrics.connection_failed(reason);
            reset(client);
        }
        let refused = Ended {
            result: reason,
            moved: Transferred::default(),
            flags,
            error,
            drained_by: None,
        };
        self.end(refused);
    }

    /// Ended after it got through: see [`Ended`].
    ///
    /// A ledger ends once; a second end does not compile:
    ///
    /// ```compile_fail
    /// # fn twice(ledger: tidegate::proxy::ledger::ConnectionLedger<'_>) {
    /// use tidegate::proxy::ledger::{Ended, OK};
    /// ledger.finish(Ended::new(OK, Default::default()));
    /// ledger.finish(Ended::new(OK, Default::default()));
    /// # }
    /// ```
    pub fn finish(mut self, ended: Ended<'_>) {
        self.end(ended);
    }

    fn end(&mut self, e: Ended<'_>) {
        self.ended = true;
        if let Some(at) = self.listed.take() {
            self.metrics.live.remove(at);
        }
        if let Some(report) = self.report.take() {
            report.close(e.flags);
        }
        if self.carrying {
            self.metrics.streams_open.dec();
            self.guard.finished(e.result == OK);
        }
        self.metrics.stream_ended(e.result);
        self.line
            .emit(self.metrics.direction, e, self.started.elapsed());
        if let Scope::Connection(_) = self.scope {
            self.metrics.connections_closed.inc();
        }
    }
}

/// A ledger neither refused nor finished: its task was cancelled (the
/// runtime shut down, or a caller of the data path gave up on it).
impl Drop for ConnectionLedger<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.end(Ended::new(CANCELLED, Transferred::default()));
        }
    }
}

/// Ends `tcp` with a reset rather than a FIN when it closes: a refused,
/// failed or cut connection must not look like a normal end of stream.
pub fn reset(tcp: &TcpStream) {
    let _ = socket2::SockRef::from(tcp).set_linger(Some(Duration::ZERO));
}

impl Line {
    /// The endpoint tried last, as the line names it.
    fn endpoint(&self) -> Option<String> {
        let (w, addr) = self.endpoint.as_ref()?;
        Some(format!("{} at {addr}", w.uid()))
    }

    fn emit(&self, direction: &'static str, e: Ended<'_>, duration: Duration) {
        let id = |i: &Option<SpiffeId>| i.as_ref().map(ToString::to_string).unwrap_or_default();
        let refused = (!self.refused_tries.is_empty()).then(|| self.refused_tries.join("; "));
        let endpoint = self.endpoint();
        tracing::info!(
            target: "tidegate::access",
            direction,
            src.identity = id(&self.src_identity),
            dst.identity = id(&self.dst_identity),
            src.addr = %self.src,
            dst.addr = %self.dst,
            bytes_to_tunnel = e.moved.tcp_to_h2,
            bytes_from_tunnel = e.moved.h2_to_tcp,
            duration_ms = duration.as_millis() as u64,
            result = e.result,
            error = e.error,
            drained_by = e.drained_by,
            endpoint = endpoint.as_deref(),
            refused_tries = refused.as_deref(),
            "stream ended"
        );
    }
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
