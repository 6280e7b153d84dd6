//! Inbound: the HBONE listener (port 15008). Accept → pick the destination
//! workload from the connection's original destination → TLS presenting that
//! workload's certificate → HTTP/2 server ([`crate::hbone::server`]) with a
//! [`connect::ConnectHandler`] for its streams.

pub mod connect;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, field, info_span, Instrument};

use connect::{ConnectHandler, TunnelCtx};

use crate::config::HboneConfig;
use crate::hbone::{self, server::TunnelEnd};
use crate::metrics::ProxyMetrics;
use crate::proxy::tunnels::{InboundTunnels, Registration};
use crate::shutdown::{ActiveStreams, ShutdownWatch};
use crate::tls::TlsContext;
use crate::workloads::WorkloadStore;

/// GOAWAYs sent on inbound tunnels because a drain asked.
#[derive(Clone, Debug)]
pub struct GoawayMetrics {
    sent: prometheus_client::metrics::counter::Counter,
    latency: prometheus_client::metrics::histogram::Histogram,
}

impl GoawayMetrics {
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = GoawayMetrics {
            sent: Default::default(),
            // 5 µs .. ~5 s
            latency: prometheus_client::metrics::histogram::Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(5e-6, 2.0, 20),
            ),
        };
        registry.register(
            "drain_goaways_sent",
            "GOAWAYs sent on inbound tunnels because a drain asked",
            m.sent.clone(),
        );
        registry.register(
            "drain_event_to_goaway_seconds",
            "Time from the decision to the GOAWAY handed to the tunnel",
            m.latency.clone(),
        );
        m
    }
}

/// Everything an inbound tunnel needs; shared by all of them.
pub struct Inbound {
    pub(crate) workloads: Arc<WorkloadStore>,
    pub(crate) tls: Arc<TlsContext>,
    pub(crate) cfg: HboneConfig,
    pub(crate) tunnels: Arc<InboundTunnels>,
    pub(crate) metrics: ProxyMetrics,
    pub(crate) streams: ActiveStreams,
    pub(crate) goaways: GoawayMetrics,
}

impl Inbound {
    pub fn new(
        workloads: Arc<WorkloadStore>,
        tls: Arc<TlsContext>,
        cfg: HboneConfig,
        tunnels: Arc<InboundTunnels>,
        metrics: ProxyMetrics,
        streams: ActiveStreams,
        goaways: GoawayMetrics,
    ) -> Arc<Self> {
        Arc::new(Inbound {
            workloads,
            tls,
            cfg,
            tunnels,
            metrics,
            streams,
            goaways,
        })
    }

    /// Records the first GOAWAY a command made a tunnel send.
    pub(crate) fn goaway_sent(&self, cmd: crate::hbone::GoawayCommand) {
        self.goaways.sent.inc();
        self.goaways
            .latency
            .observe(cmd.issued.elapsed().as_secs_f64());
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
                    let this = self.clone();
                    let drain = drain.clone();
                    tokio::spawn(async move { this.serve(tcp, peer, drain).await });
                }
                Err(e) => {
                    // EMFILE and friends: back off briefly instead of spinning.
                    debug!(error = %e, "inbound accept failed");
                    self.metrics.connection_failed("accept");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
    }

    async fn serve(self: Arc<Self>, tcp: TcpStream, peer_addr: SocketAddr, drain: ShutdownWatch) {
        let dialed = match crate::proxy::listener::destination(&tcp) {
            Ok(a) => a,
            Err(_) => return self.metrics.connection_failed("no_destination"),
        };
        let span = info_span!(
            "inbound",
            peer.addr = %peer_addr,
            dst.addr = %dialed,
            dst.workload = field::Empty,
            peer.identity = field::Empty,
        );
        async move {
            let snapshot = self.workloads.snapshot();
            let Some(workload) = snapshot.by_ip(dialed.ip()).filter(|w| w.local).cloned() else {
                debug!("dialed address is not a workload on this node; closing");
                return self.metrics.connection_failed("no_local_workload");
            };
            tracing::Span::current().record("dst.workload", workload.uid());
            let _ = tcp.set_nodelay(true);
            let handshake = tokio::time::timeout(
                self.cfg.connect_timeout,
                self.tls.accept(&workload.identity, tcp),
            )
            .await;
            let (tls, peer) = match handshake {
                Ok(Ok(x)) => x,
                Ok(Err(e)) => {
                    debug!(error = %e, "tls handshake failed");
                    return self.metrics.connection_failed(e.reason());
                }
                Err(_) => return self.metrics.connection_failed("handshake_timeout"),
            };
            tracing::Span::current().record("peer.identity", field::display(&peer));
            self.metrics.connections_opened.inc();
            let registration = self
                .tunnels
                .register(workload.uid(), peer.clone(), peer_addr);
            let ctx = TunnelCtx {
                peer,
                peer_addr,
                dialed,
                workload,
            };
            self.serve_tunnel(tls, ctx, &registration, drain).await;
            drop(registration);
            self.metrics.connections_closed.inc();
        }
        .instrument(span)
        .await
    }

    /// Serves the HTTP/2 side of one accepted tunnel with a
    /// [`ConnectHandler`] and counts how it ended.
    async fn serve_tunnel(
        self: &Arc<Self>,
        tls: crate::tls::ServerTls,
        ctx: TunnelCtx,
        registration: &Registration,
        shutdown: ShutdownWatch,
    ) {
        let tunnel = registration.tunnel.clone();
        let commands = tunnel.goaway_commands();
        let handler = ConnectHandler {
            inbound: self.clone(),
            ctx: Arc::new(ctx),
            tunnel,
        };
        match hbone::server::serve(tls, &self.cfg, &handler, commands, shutdown).await {
            Err(e) => self.metrics.connection_failed(e.reason()),
            Ok(TunnelEnd::Keepalive(_)) => self.metrics.connection_failed("keepalive_timeout"),
            Ok(TunnelEnd::Deadline) => {
                debug!(
                    streams = registration.tunnel.streams(),
                    "tunnel closed at the drain deadline"
                )
            }
            Ok(TunnelEnd::Closed | TunnelEnd::Error(_)) => {}
        }
    }
}
