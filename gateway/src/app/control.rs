//! The admin API, `/metrics` and the readiness probe: served through the
//! whole drain, and ready once every condition the node waits for is met.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tracing::info;

use prometheus_client::registry::Registry;
use tidegate_control::limits::{ConnLimit, ControlMetrics};

use super::core::Core;
use super::data_path::DataPath;
use super::listeners::HttpListeners;
use super::node_agents::ReadyWhen;
use super::Wiring;
use crate::admin::{self, AdminState};
use crate::config::Config;
use crate::descriptor_budget::DescriptorBudget;
use crate::inpod::pods::PodProxies;
use tidegate_base::shutdown::ShutdownWatch;

/// What the admin API, `/metrics` and the probe answer from; not ready yet.
pub(super) fn state(
    config: &Config,
    core: &Core,
    pods: Option<Arc<PodProxies>>,
    paths: &DataPath,
    descriptors: Option<DescriptorBudget>,
    metrics: Registry,
) -> Arc<AdminState> {
    Arc::new(AdminState {
        node: config.node_name.clone(),
        workloads: core.workloads.clone(),
        registry: core.tunnels.clone(),
        pool: core.pool.clone(),
        policies: core.policies.clone(),
        drains: core.drains.clone(),
        pods,
        routing: paths.routing.clone(),
        certificates: core.tls.source().clone(),
        default_grace: config.drains.default_grace,
        descriptors,
        cluster_id: config.cluster_id.clone(),
        hbone_port: config.hbone.port,
        metrics,
        ready: Default::default(),
    })
}

/// Serves the three HTTP listeners until `until` fires (the very end of a
/// shutdown: the kubelet probes a terminating gateway, operators watch
/// `GET /drains`).
pub(super) fn serve(
    config: &Config,
    listeners: HttpListeners,
    state: &Arc<AdminState>,
    control: &ControlMetrics,
    until: ShutdownWatch,
    w: &mut Wiring,
) {
    let cp = &config.control_plane;
    let limits = |listener| admin::HttpLimits {
        connections: ConnLimit::new(listener, cp.max_connections, control),
        header_read_timeout: cp.header_read_timeout,
    };
    let HttpListeners {
        admin: a,
        metrics: m,
        readiness: r,
    } = listeners;
    let s = state.clone();
    w.tasks.spawn(admin::serve(
        a,
        s,
        admin::admin,
        limits("admin"),
        until.clone(),
    ));
    let s = state.clone();
    w.tasks.spawn(admin::serve(
        m,
        s,
        admin::metrics,
        limits("metrics"),
        until.clone(),
    ));
    let s = state.clone();
    w.tasks.spawn(admin::serve(
        r,
        s,
        admin::readiness,
        limits("readiness"),
        until,
    ));
}

/// Turns `/healthz/ready` ready once every condition has been met, in
/// order (at once when there is none); a drain that starts first leaves it
/// not ready.
pub(super) fn ready_when(conditions: Vec<ReadyWhen>, state: &Arc<AdminState>, w: &mut Wiring) {
    if conditions.is_empty() {
        state.ready.store(true, Ordering::Release);
        return;
    }
    let state = state.clone();
    let mut drain = w.drain.clone();
    w.tasks.spawn(async move {
        let all = async {
            for (what, mut done) in conditions {
                if done.wait_for(|s| *s).await.is_err() {
                    return false;
                }
                info!("{what} done");
            }
            true
        };
        tokio::select! {
            ok = all => if ok {
                state.ready.store(true, Ordering::Release);
                info!("ready");
            },
            _ = drain.signaled() => {}
        }
    });
}
