//! The node's own listeners, and the ports a CONNECT must never tunnel to.

use std::net::SocketAddr;

use tokio::net::TcpListener;

use super::BoundAddrs;

use crate::config::{CaptureMode, Config};
use crate::proxy::congestion::TcpTuning;
use crate::proxy::inbound::OwnPorts;
use crate::proxy::listener::bind;
use tidegate_netns::capture::CapturePorts;

/// The ports each in-pod pod's listeners take (HBONE's as configured).
pub(super) fn capture_ports(config: &Config) -> CapturePorts {
    CapturePorts {
        hbone: config.hbone.port,
        ..CapturePorts::default()
    }
}

/// HBONE (15008), capture (15001) — not in in-pod mode unless
/// `capture.node_listeners` — with SO_REUSEPORT, and the HTTP ones
/// (exclusive).
pub(super) struct Listeners {
    pub inbound: Option<TcpListener>,
    pub outbound: Option<TcpListener>,
    /// `None` until a `--take-over` has them ([`super::control_ports`]).
    pub http: Option<HttpListeners>,
}

/// Admin, metrics and readiness.
pub(super) struct HttpListeners {
    pub admin: TcpListener,
    pub metrics: TcpListener,
    pub readiness: TcpListener,
}

impl Listeners {
    /// Binds the data path's two beside `http` (bound first, exclusively:
    /// [`super::control_ports`]); they inherit the TCP tuning.
    pub(super) fn bind(
        config: &Config,
        tcp: &TcpTuning,
        http: Option<HttpListeners>,
    ) -> anyhow::Result<Listeners> {
        let l = &config.listeners;
        let node = config.capture.binds_node_listeners();
        let listeners = Listeners {
            inbound: node.then(|| bind("inbound", l.inbound)).transpose()?,
            outbound: node.then(|| bind("outbound", l.outbound)).transpose()?,
            http,
        };
        // Inherited by every connection each accepts.
        if let Some(inbound) = &listeners.inbound {
            tcp.tunnel.apply_or_log(inbound);
        }
        if let Some(outbound) = &listeners.outbound {
            tcp.app.apply_or_log(outbound);
        }
        Ok(listeners)
    }

    /// The addresses actually bound.
    pub(super) fn addrs(&self, demo_echo: Option<SocketAddr>) -> std::io::Result<BoundAddrs> {
        let http = self
            .http
            .as_ref()
            .ok_or_else(|| std::io::Error::other("the control ports are not bound yet"))?;
        Ok(BoundAddrs {
            outbound: self
                .outbound
                .as_ref()
                .map(TcpListener::local_addr)
                .transpose()?,
            inbound: self
                .inbound
                .as_ref()
                .map(TcpListener::local_addr)
                .transpose()?,
            admin: http.admin.local_addr()?,
            metrics: http.metrics.local_addr()?,
            readiness: http.readiness.local_addr()?,
            demo_echo,
        })
    }

    /// A CONNECT to one of these on a local workload would tunnel into the
    /// gateway itself: the configured ports, the bound ones (port 0 binds
    /// another), HBONE's, and in in-pod mode the pods' capture ports.
    pub(super) fn own_ports(&self, config: &Config, capture: &CapturePorts) -> OwnPorts {
        let l = &config.listeners;
        let bound = [
            self.inbound.as_ref(),
            self.outbound.as_ref(),
            self.http.as_ref().map(|h| &h.admin),
            self.http.as_ref().map(|h| &h.metrics),
            self.http.as_ref().map(|h| &h.readiness),
        ]
        .map(|l| l.and_then(|l| l.local_addr().ok()).map_or(0, |a| a.port()));
        let configured = [l.inbound, l.outbound, l.admin, l.metrics, l.readiness].map(|a| a.port());
        let inpod = config.capture.mode == CaptureMode::Inpod;
        let pod_ports = [capture.outbound, capture.inbound_plaintext];
        OwnPorts::new(
            bound
                .into_iter()
                .chain(configured)
                .chain([config.hbone.port])
                .chain(pod_ports.into_iter().filter(|_| inpod)),
        )
    }
}
