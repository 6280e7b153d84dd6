//! How many inbound connections the data path may hold: the tunnels
//! accepted on the HBONE port, and the connections their streams opened to
//! workloads. Each holds a descriptor, so without a bound one peer with one
//! valid certificate could open tunnels until the process has none left —
//! for other clients, for the workload file, for the control plane.
//!
//! Three caps, checked before the descriptor is spent:
//!
//! - **connections** (`hbone.max_connections`; 0, the default: the
//!   inbound share of the descriptor budget — three quarters of what the
//!   control plane's budget and the pods' share leave of the open-file
//!   limit, see `descriptor_budget.rs`; a configured value above the share
//!   is lowered to it, warned at start): tunnels and upstream connections
//!   of all peers together. The last quarter stays with the outbound side
//!   (captured connections, pooled tunnels) and the files; the pods'
//!   listeners and the DNS proxy's descriptors have a share of their own.
//! - **tunnels**: at most half of it, so that the streams of the tunnels
//!   already open always find descriptors to dial with.
//! - **per identity** (`hbone.max_connections_per_identity`; 0, the
//!   default: a quarter of the connections cap, half of the tunnels cap):
//!   tunnels and upstream connections of one peer identity, so that one
//!   certificate cannot take the rest from everybody else.
//!
//! A tunnel over the tunnels or connections cap is closed at accept, before
//! the TLS handshake; over its identity's cap, right after it (only then is
//! the identity known), with an HTTP/2 GOAWAY(ENHANCE_YOUR_CALM). A dial
//! over a cap is answered 503 with its reason. Each refusal is counted by
//! cap (`tidegate_inbound_limit_refusals_total{limit,kind}`) and logged at
//! `info` (at most ten lines a second) with the peer's address and, when
//! known, its identity; the open connections and the caps are gauges, so a
//! dashboard sees a cap coming before it refuses anyone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tracing::info;

use crate::config::HboneConfig;
use crate::proxy::log_limit::LogLimit;
use tidegate_base::sync::Locked;
use tidegate_protocol::identity::SpiffeId;

/// A cap that refused a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Tunnels,
    Connections,
    PerIdentity,
}

impl Limit {
    pub fn label(self) -> &'static str {
        match self {
            Limit::Tunnels => "tunnels",
            Limit::Connections => "connections",
            Limit::PerIdentity => "per_identity",
        }
    }
}

/// A connection refused by a cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OverLimit {
    #[error("the gateway holds {0} inbound tunnels, its cap (half of hbone.max_connections)")]
    Tunnels(usize),
    #[error("the gateway holds {0} inbound connections, its cap (hbone.max_connections)")]
    Connections(usize),
    #[error("the peer's identity holds {0} inbound connections, its cap (hbone.max_connections_per_identity)")]
    PerIdentity(usize),
}

impl OverLimit {
    pub fn limit(self) -> Limit {
        match self {
            OverLimit::Tunnels(_) => Limit::Tunnels,
            OverLimit::Connections(_) => Limit::Connections,
            OverLimit::PerIdentity(_) => Limit::PerIdentity,
        }
    }

    /// The `connections_failed_total` reason of a refused tunnel.
    pub fn tunnel_reason(self) -> &'static str {
        match self {
            OverLimit::Tunnels(_) => "tunnels_limit",
            OverLimit::Connections(_) => "connections_limit",
            OverLimit::PerIdentity(_) => "identity_connections_limit",
        }
    }

    /// The metric and `tidegate-reason` label of a refused stream.
    pub fn stream_reason(self) -> &'static str {
        match self {
            OverLimit::Tunnels(_) | OverLimit::Connections(_) => "connections_limit",
            OverLimit::PerIdentity(_) => "identity_connections_limit",
        }
    }
}

/// What a refusal turned away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    Tunnel,
    Dial,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    limit: &'static str,
    /// `tunnel` (closed at accept or after TLS) or `dial` (a 503).
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    /// `tunnel` or `upstream`.
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    limit: &'static str,
}

#[derive(Clone, Debug, Default)]
struct LimitMetrics {
    refusals: Family<RefusalLabels, Counter>,
    open: Family<KindLabels, Gauge>,
    caps: Family<LimitLabels, Gauge>,
    identities: Gauge,
}

/// The caps in force: configured, or derived from the descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub tunnels: usize,
    pub connections: usize,
    pub per_identity: usize,
}

/// No cap: the open-file limit could not be read (or is infinite) and none
/// was configured.
const UNBOUNDED: usize = usize::MAX / 2;

impl Caps {
    /// `share`: the budget's inbound share of the descriptors (`None`:
    /// unknown). A configured value (not 0) wins over the derived one, up
    /// to the share.
    pub fn derive(cfg: &HboneConfig, share: Option<u64>) -> Caps {
        let share = share.map_or(UNBOUNDED, |s| usize::try_from(s).unwrap_or(UNBOUNDED));
        let connections = match cfg.max_connections {
            0 => share,
            n => (n as usize).min(share),
        }
        .max(2);
        let per_identity = match cfg.max_connections_per_identity {
            0 => connections / 4,
            n => n as usize,
        }
        .max(1);
        Caps {
            tunnels: connections / 2,
            connections,
            per_identity,
        }
    }
}

/// The inbound caps and their counts, for the node's listener and every
/// pod's (they share the process's descriptors).
#[derive(Debug)]
pub struct ConnectionLimits {
    caps: Caps,
    tunnels: AtomicUsize,
    connections: AtomicUsize,
    identities: Mutex<HashMap<SpiffeId, Arc<AtomicUsize>>>,
    metrics: LimitMetrics,
    log: LogLimit,
}

/// Takes one unit of `counter` unless it is at `max`.
fn take(counter: &AtomicUsize, max: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

impl ConnectionLimits {
    pub fn new(caps: Caps, registry: &mut Registry) -> Arc<Self> {
        let metrics = LimitMetrics::default();
        registry.register(
            "inbound_limit_refusals",
            "Inbound tunnels and upstream dials refused by a connection cap, by cap \
             (tunnels, connections, per_identity) and kind (tunnel, dial)",
            metrics.refusals.clone(),
        );
        registry.register(
            "inbound_connections_open",
            "Inbound connections held now: tunnels, and upstream connections to workloads",
            metrics.open.clone(),
        );
        registry.register(
            "inbound_connection_caps",
            "The inbound connection caps in force (configured or derived from the open-file limit)",
            metrics.caps.clone(),
        );
        registry.register(
            "inbound_peer_identities",
            "Peer identities holding inbound connections now",
            metrics.identities.clone(),
        );
        for (limit, v) in [
            (Limit::Tunnels, caps.tunnels),
            (Limit::Connections, caps.connections),
            (Limit::PerIdentity, caps.per_identity),
        ] {
            let v = i64::try_from(v).unwrap_or(i64::MAX);
            metrics
                .caps
                .get_or_create(&LimitLabels {
                    limit: limit.label(),
                })
                .set(v);
        }
        for kind in ["tunnel", "upstream"] {
            let _ = metrics.open.get_or_create(&KindLabels { kind });
        }
        Arc::new(ConnectionLimits {
            caps,
            tunnels: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            identities: Mutex::new(HashMap::new()),
            metrics,
            log: LogLimit::per_second(),
        })
    }

    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// Inbound connections held now (tunnels and upstream connections).
    pub fn open_connections(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    /// A slot for a tunnel just accepted, before its handshake.
    pub fn admit_tunnel(self: &Arc<Self>) -> Result<TunnelSlot, OverLimit> {
        if !take(&self.tunnels, self.caps.tunnels) {
            return Err(OverLimit::Tunnels(self.caps.tunnels));
        }
        if !take(&self.connections, self.caps.connections) {
            self.tunnels.fetch_sub(1, Ordering::AcqRel);
            return Err(OverLimit::Connections(self.caps.connections));
        }
        self.gauge("tunnel").inc();
        Ok(TunnelSlot {
            limits: self.clone(),
        })
    }

    /// Counts and logs (bounded) a refusal.
    pub fn refused(
        &self,
        over: OverLimit,
        kind: Refused,
        peer: std::net::SocketAddr,
        identity: Option<&SpiffeId>,
    ) {
        let kind = match kind {
            Refused::Tunnel => "tunnel",
            Refused::Dial => "dial",
        };
        self.metrics
            .refusals
            .get_or_create(&RefusalLabels {
                limit: over.limit().label(),
                kind,
            })
            .inc();
        if let Some(left_out) = self.log.admit() {
            info!(
                peer.addr = %peer,
                peer.identity = identity.map(tracing::field::display),
                limit = over.limit().label(),
                kind,
                reason = %over,
                left_out,
                "inbound connection refused over a connection cap"
            );
        }
    }

    fn gauge(&self, kind: &'static str) -> Gauge {
        self.metrics
            .open
            .get_or_create(&KindLabels { kind })
            .clone()
    }

    /// Forgets `id`'s count once nothing holds it (under the map's lock,
    /// where every new holder of it starts).
    fn release_identity(&self, id: &SpiffeId, count: &Arc<AtomicUsize>) {
        if count.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let mut map = self.identities.locked();
        let idle = map
            .get(id)
            .is_some_and(|c| Arc::ptr_eq(c, count) && c.load(Ordering::Acquire) == 0);
        if idle {
            map.remove(id);
            self.metrics.identities.set(map.len() as i64);
        }
    }
}

/// An accepted tunnel's place under the global caps.
#[derive(Debug)]
pub struct TunnelSlot {
    limits: Arc<ConnectionLimits>,
}

impl TunnelSlot {
    /// The tunnel's peer is `id`: takes its place under the identity's cap.
    pub fn identify(&self, id: &SpiffeId) -> Result<IdentitySlot, OverLimit> {
        let l = &self.limits;
        let max = l.caps.per_identity;
        let mut map = l.identities.locked();
        let count = map.entry(id.clone()).or_default().clone();
        if !take(&count, max) {
            return Err(OverLimit::PerIdentity(max));
        }
        l.metrics.identities.set(map.len() as i64);
        Ok(IdentitySlot {
            limits: l.clone(),
            id: id.clone(),
            count,
        })
    }
}

impl Drop for TunnelSlot {
    fn drop(&mut self) {
        let l = &self.limits;
        l.tunnels.fetch_sub(1, Ordering::AcqRel);
        l.connections.fetch_sub(1, Ordering::AcqRel);
        l.gauge("tunnel").dec();
    }
}

/// A tunnel's place under its peer identity's cap.
#[derive(Debug)]
pub struct IdentitySlot {
    limits: Arc<ConnectionLimits>,
    id: SpiffeId,
    count: Arc<AtomicUsize>,
}

impl IdentitySlot {
    /// A slot for one upstream connection of this tunnel's stream.
    pub fn admit_dial(&self) -> Result<DialSlot, OverLimit> {
        let l = &self.limits;
        if !take(&l.connections, l.caps.connections) {
            return Err(OverLimit::Connections(l.caps.connections));
        }
        if !take(&self.count, l.caps.per_identity) {
            l.connections.fetch_sub(1, Ordering::AcqRel);
            return Err(OverLimit::PerIdentity(l.caps.per_identity));
        }
        l.gauge("upstream").inc();
        Ok(DialSlot {
            limits: l.clone(),
            id: self.id.clone(),
            count: self.count.clone(),
        })
    }

    pub fn limits(&self) -> &Arc<ConnectionLimits> {
        &self.limits
    }
}

impl Drop for IdentitySlot {
    fn drop(&mut self) {
        self.limits.release_identity(&self.id, &self.count);
    }
}

/// One upstream connection's place under the caps: held as long as the socket.
#[derive(Debug)]
pub struct DialSlot {
    limits: Arc<ConnectionLimits>,
    id: SpiffeId,
    count: Arc<AtomicUsize>,
}

impl Drop for DialSlot {
    fn drop(&mut self) {
        let l = &self.limits;
        l.connections.fetch_sub(1, Ordering::AcqRel);
        l.gauge("upstream").dec();
        l.release_identity(&self.id, &self.count);
    }
}

#[cfg(test)]
mod tests;
