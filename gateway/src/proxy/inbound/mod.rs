//! Inbound: the HBONE listener (port 15008). Accept under the connection
//! caps ([`limits`]) → pick the destination workload from the connection's
//! original destination → TLS presenting that workload's certificate → the
//! peer identity's cap → HTTP/2 server ([`tidegate_protocol::hbone::server`]) with a
//! [`connect::ConnectHandler`] for its streams.

pub mod connect;
pub mod limits;
mod metrics;
mod pace;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, field, info, info_span, warn, Instrument};

pub use connect::OwnPorts;
use connect::{ConnectDeps, ConnectHandler, TunnelCtx};
use limits::{ConnectionLimits, Refused, TunnelSlot};
pub use metrics::InboundMetrics;
use pace::{DialBudget, PaceLimits};

use crate::authorization::Authorizer;
use crate::config::HboneConfig;
use crate::proxy::congestion::Congestion;
use crate::proxy::log_limit::LogLimit;
use crate::proxy::metrics::ProxyMetrics;
use crate::proxy::origin::Origin;
use crate::proxy::tunnels::{InboundTunnels, Registration};
use crate::workloads::{Workload, WorkloadStore};
use tidegate_base::shutdown::{ActiveStreams, ShutdownWatch};
use tidegate_protocol::hbone::io::reason_label;
use tidegate_protocol::hbone::{self, server::TunnelEnd};
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::TlsContext;

/// Everything an inbound tunnel needs; shared by all of them.
pub struct Inbound {
    tls: Arc<TlsContext>,
    tunnels: Arc<InboundTunnels>,
    connects: Arc<ConnectDeps>,
    limits: Arc<ConnectionLimits>,
    /// Refused handshakes are logged at `info`, this many at most.
    handshake_log: Arc<LogLimit>,
}

/// What the inbound side is built from (the node's; [`Inbound::for_pod`]
/// derives a pod's).
pub struct InboundDeps {
    pub workloads: Arc<WorkloadStore>,
    /// The certificates presented, one per local workload.
    pub tls: Arc<TlsContext>,
    pub cfg: HboneConfig,
    /// The gateway's own ports: a CONNECT to one of them is refused.
    pub own_ports: OwnPorts,
    pub tunnels: Arc<InboundTunnels>,
    /// tidegate's counters for `direction="inbound"`.
    pub metrics: ProxyMetrics,
    /// The streams a drain waits for.
    pub streams: ActiveStreams,
    pub inbound_metrics: InboundMetrics,
    /// Congestion control of the deliveries (`tcp.app_congestion_control`).
    pub app_cc: Congestion,
    pub limits: Arc<ConnectionLimits>,
    pub authorizer: Arc<Authorizer>,
}

impl Inbound {
    pub fn new(deps: InboundDeps) -> Arc<Self> {
        let InboundDeps {
            workloads,
            tls,
            cfg,
            own_ports,
            tunnels,
            metrics,
            streams,
            inbound_metrics,
            app_cc,
            limits,
            authorizer,
        } = deps;
        Arc::new(Inbound {
            tls,
            tunnels,
            limits,
            handshake_log: Arc::new(LogLimit::per_second()),
            connects: Arc::new(ConnectDeps {
                workloads,
                cfg,
                own_ports,
                metrics,
                active: streams,
                inbound_metrics,
                origin: Origin::Node,
                app_cc,
                authorizer,
            }),
        })
    }

    /// The authorization every inbound path of this node checks with.
    pub fn authorizer(&self) -> &Arc<Authorizer> {
        &self.connects.authorizer
    }

    /// The inbound connection caps and their counts.
    pub fn limits(&self) -> &Arc<ConnectionLimits> {
        &self.limits
    }

    /// The same inbound side for one pod's own HBONE listener: it serves
    /// only that pod, and delivers to it from inside its namespace.
    pub fn for_pod(&self, origin: Origin) -> Arc<Self> {
        let d = &self.connects;
        Arc::new(Inbound {
            tls: self.tls.clone(),
            tunnels: self.tunnels.clone(),
            limits: self.limits.clone(),
            handshake_log: self.handshake_log.clone(),
            connects: Arc::new(ConnectDeps {
                workloads: d.workloads.clone(),
                cfg: d.cfg.clone(),
                own_ports: d.own_ports.clone(),
                metrics: d.metrics.clone(),
                active: d.active.clone(),
                inbound_metrics: d.inbound_metrics.clone(),
                origin,
                app_cc: d.app_cc.clone(),
                authorizer: d.authorizer.clone(),
            }),
        })
    }

    fn cfg(&self) -> &HboneConfig {
        &self.connects.cfg
    }

    fn metrics(&self) -> &ProxyMetrics {
        &self.connects.metrics
    }

    /// Accepts until `stop_accepting` fires, then drops the listener so new
    /// connections are refused at once. Each tunnel drains on its own when
    /// `drain` fires: graceful GOAWAY, streams finish, closed at the deadline.
    pub async fn run(
        self: Arc<Self>,
        listener: TcpListener,
        mut stop_accepting: ShutdownWatch,
        drain: ShutdownWatch,
    ) {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop_accepting.signaled() => return,
            };
            match accepted {
                Ok((tcp, peer)) => {
                    let peer = crate::proxy::listener::canonical(peer);
                    // Before the handshake: a refused tunnel costs no TLS.
                    let slot = match self.limits.admit_tunnel() {
                        Ok(slot) => slot,
                        Err(over) => {
                            self.limits.refused(over, Refused::Tunnel, peer, None);
                            self.metrics().connection_failed(over.tunnel_reason());
                            continue;
                        }
                    };
                    let this = self.clone();
                    let drain = drain.clone();
                    tokio::spawn(async move { this.serve(tcp, peer, slot, drain).await });
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    debug!(error = %e, "inbound accept failed");
                    self.metrics().connection_failed("accept");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
    }

    async fn serve(
        self: Arc<Self>,
        tcp: TcpStream,
        peer_addr: SocketAddr,
        slot: TunnelSlot,
        drain: ShutdownWatch,
    ) {
        let dialed = match crate::proxy::listener::destination(&tcp) {
            Ok(a) => a,
            Err(_) => return self.metrics().connection_failed("no_destination"),
        };
        let span = info_span!(
            "inbound",
            peer.addr = %peer_addr,
            dst.addr = %dialed,
            dst.workload = field::Empty,
            peer.identity = field::Empty,
        );
        async move {
            let snapshot = self.connects.workloads.snapshot();
            let Some(workload) = snapshot.by_ip(dialed.ip()).filter(|w| w.local).cloned() else {
                debug!("dialed address is not a workload on this node; closing");
                return self.metrics().connection_failed("no_local_workload");
            };
            // A pod's own listener serves that pod only.
            if let Some(pod) = self.connects.origin.pod() {
                if !pod.is(&workload) {
                    debug!(pod = %pod.uid, "dialed address is another workload's; closing");
                    return self.metrics().connection_failed("not_this_pod");
                }
            }
            tracing::Span::current().record("dst.workload", workload.uid());
            let _ = tcp.set_nodelay(true);
            let Some((tls, peer)) = self.handshake(&workload, tcp).await else {
                return;
            };
            tracing::Span::current().record("peer.identity", field::display(&peer));
            let identity = match slot.identify(&peer) {
                Ok(i) => Arc::new(i),
                Err(over) => {
                    self.limits
                        .refused(over, Refused::Tunnel, peer_addr, Some(&peer));
                    self.metrics().connection_failed(over.tunnel_reason());
                    let calm = h2::Reason::ENHANCE_YOUR_CALM;
                    return hbone::server::refuse(tls, &self.cfg().settings(), calm).await;
                }
            };
            self.metrics().connections_opened.inc();
            let registration = self
                .tunnels
                .register(workload.uid(), peer.clone(), peer_addr);
            let ctx = TunnelCtx {
                peer_identity: crate::authorization::identity_of(&peer),
                peer,
                peer_addr,
                dialed,
                workload,
            };
            self.serve_tunnel(tls, ctx, identity, &registration, drain)
                .await;
            drop(registration);
            drop(slot);
            self.metrics().connections_closed.inc();
        }
        .instrument(span)
        .await
    }

    /// The TLS handshake presenting `workload`'s certificate, bounded by
    /// `hbone.connect_timeout`: the stream and the verified peer, or `None`
    /// once the failure is counted and logged.
    async fn handshake(
        &self,
        workload: &Workload,
        tcp: TcpStream,
    ) -> Option<(tidegate_protocol::tls::ServerTls, SpiffeId)> {
        let timeout = self.cfg().connect_timeout;
        let reason =
            match tokio::time::timeout(timeout, self.tls.accept(&workload.identity, tcp)).await {
                Ok(Ok(x)) => return Some(x),
                Ok(Err(e)) => {
                    self.handshake_refused(e.reason(), &e);
                    e.reason()
                }
                Err(_) => {
                    let error = format!("not done in {timeout:?}");
                    self.handshake_refused("handshake_timeout", &error);
                    "handshake_timeout"
                }
            };
        self.metrics().connection_failed(reason);
        None
    }

    /// A handshake the gateway refused (or a peer's that failed) is logged
    /// at `info`, bounded; the span names the peer's address and the
    /// workload it dialed. A peer that went away mid-handshake (a TCP
    /// probe of the port) is no refusal: `debug` only.
    fn handshake_refused(&self, reason: &'static str, error: &dyn std::fmt::Display) {
        if matches!(reason, "eof" | "io") {
            return debug!(reason, %error, "tls handshake failed");
        }
        if let Some(left_out) = self.handshake_log.admit() {
            info!(reason, %error, left_out, "inbound tls handshake refused");
        }
    }

    /// Serves the HTTP/2 side of one accepted tunnel with a
    /// [`ConnectHandler`] and counts how it ended.
    async fn serve_tunnel(
        self: &Arc<Self>,
        tls: tidegate_protocol::tls::ServerTls,
        ctx: TunnelCtx,
        identity: Arc<limits::IdentitySlot>,
        registration: &Registration,
        shutdown: ShutdownWatch,
    ) {
        let tunnel = registration.tunnel.clone();
        let commands = tunnel.goaway_commands();
        let cfg = self.cfg();
        let handler = Arc::new(ConnectHandler {
            deps: self.connects.clone(),
            ctx: Arc::new(ctx),
            tunnel,
            dials: DialBudget::new(PaceLimits {
                in_flight: cfg.max_dials_in_flight_per_tunnel,
                per_second: cfg.max_dials_per_second_per_tunnel,
                wasted_per_second: cfg.max_wasted_dials_per_second_per_tunnel,
                streams: cfg.max_concurrent_streams,
            }),
            identity,
        });
        match hbone::server::serve(tls, &cfg.settings(), handler, commands, shutdown).await {
            Err(e) => self.metrics().connection_failed(e.reason()),
            Ok(TunnelEnd::Keepalive(_)) => self.metrics().connection_failed("keepalive_timeout"),
            Ok(TunnelEnd::Deadline) => {
                debug!(
                    streams = registration.tunnel.streams(),
                    "tunnel closed at the drain deadline"
                )
            }
            Ok(TunnelEnd::Error(e)) => self.tunnel_error(&e),
            Ok(TunnelEnd::Closed) => {}
        }
    }

    /// A tunnel h2 itself closed with an error GOAWAY (a flood, a protocol
    /// violation) failed, by the code it sent; other errors (the peer went
    /// away mid-connection) are not counted as failures.
    fn tunnel_error(&self, e: &h2::Error) {
        let Some(reason) = e.reason().filter(|_| e.is_go_away() && e.is_library()) else {
            return debug!(error = %e, "tunnel ended with error");
        };
        let label = match reason {
            h2::Reason::ENHANCE_YOUR_CALM => "h2_enhance_your_calm",
            h2::Reason::PROTOCOL_ERROR => "h2_protocol_error",
            h2::Reason::FLOW_CONTROL_ERROR => "h2_flow_control_error",
            h2::Reason::FRAME_SIZE_ERROR => "h2_frame_size_error",
            h2::Reason::COMPRESSION_ERROR => "h2_compression_error",
            h2::Reason::NO_ERROR => return,
            _ => "h2_other_error",
        };
        warn!(
            code = reason_label(reason),
            "http/2 layer closed the tunnel with an error GOAWAY"
        );
        self.metrics().connection_failed(label);
    }
}
