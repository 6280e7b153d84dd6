//! The data path: inbound (HBONE on 15008, checked by authorization),
//! outbound (capture on 15001) and the routing between them, over the pool
//! and the workload set.

use std::sync::Arc;

use tracing::{info, warn};

use super::core::Core;
use super::Wiring;
use crate::authorization::{AuthorizationMetrics, Authorizer};
use crate::config::Config;
use crate::descriptor_budget::DescriptorBudget;
use crate::inpod::pods::DataPath as PodDataPath;
use crate::proxy::endpoints::{EndpointMetrics, EndpointPicker, Skips};
use crate::proxy::inbound::limits::{Caps, ConnectionLimits};
use crate::proxy::inbound::{Inbound, InboundDeps, InboundMetrics, OwnPorts};
use crate::proxy::outbound::Outbound;
use crate::proxy::routing::Routing;

pub(super) struct DataPath {
    pub inbound: Arc<Inbound>,
    pub outbound: Arc<Outbound>,
    pub routing: Arc<Routing>,
}

/// The node's data path over `core`; `budget`: the split of the
/// descriptors (the inbound caps derive from its inbound share).
pub(super) fn build(
    config: &Config,
    p: &Core,
    own_ports: &OwnPorts,
    budget: Option<&DescriptorBudget>,
    w: &mut Wiring,
) -> DataPath {
    let share = budget.map(|b| b.inbound);
    let caps = Caps::derive(&config.hbone, share);
    let configured = config.hbone.max_connections as usize;
    if configured != 0 && caps.connections < configured {
        warn!(
            configured,
            connections = caps.connections,
            "hbone.max_connections is above the inbound share of the descriptor budget; lowered to \
             it (the rest is the pods', the outbound side's and the files')"
        );
    }
    info!(
        tunnels = caps.tunnels,
        connections = caps.connections,
        per_identity = caps.per_identity,
        inbound_share = share,
        "inbound connection caps"
    );
    let authorizer = Authorizer::new(
        p.workloads.clone(),
        AuthorizationMetrics::register(w.registry()),
    );
    // Every live inbound connection is checked again at each change.
    w.tasks
        .spawn(authorizer.clone().recheck_on_change(w.drain.clone()));
    let inbound = Inbound::new(InboundDeps {
        workloads: p.workloads.clone(),
        tls: p.tls.clone(),
        cfg: config.hbone.clone(),
        own_ports: own_ports.clone(),
        tunnels: p.tunnels.clone(),
        metrics: p.families.direction("inbound"),
        streams: p.streams.clone(),
        inbound_metrics: InboundMetrics::register(w.registry()),
        app_cc: p.tcp.app.clone(),
        limits: ConnectionLimits::new(caps, w.registry()),
        authorizer,
    });
    let picker = EndpointPicker::new(
        p.pool.clone(),
        config.hbone.port,
        config.outbound.endpoint_choice,
        Skips {
            goaway: config.outbound.goaway_skip,
            failing: config.outbound.failing_skip,
        },
        EndpointMetrics::register(w.registry()),
    );
    let routing = Routing::new(picker, &config.outbound, w.registry());
    let outbound = Outbound::new(
        p.workloads.clone(),
        p.pool.clone(),
        config.hbone.port,
        p.families.direction("outbound"),
        p.streams.clone(),
        routing.clone(),
    );
    DataPath {
        inbound,
        outbound,
        routing,
    }
}

impl DataPath {
    /// What each in-pod pod's listeners serve with: this data path, bound
    /// per pod.
    pub(super) fn for_pods(&self, core: &Core, own_ports: OwnPorts) -> PodDataPath {
        PodDataPath {
            outbound: self.outbound.clone(),
            inbound: self.inbound.clone(),
            workloads: core.workloads.clone(),
            own_ports,
            plaintext_metrics: core.families.direction("inbound_plaintext"),
            streams: core.streams.clone(),
            drains: core.drains.clone(),
            tunnels: core.tunnels.clone(),
            pool: core.pool.clone(),
            tcp: core.tcp.clone(),
            // Set by the in-pod wiring when `dns.enabled`.
            dns: None,
        }
    }
}
