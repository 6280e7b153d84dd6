//! The admin API, `/metrics` and the readiness probe: served through the
//! whole drain, and ready once every condition the node waits for is met.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tracing::info;

use prometheus_client::registry::Registry;
use tidegate_control::http::HttpLimits;
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
use tidegate_base::shutdown::{self, ShutdownWatch};

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
        live: core.families.live(),
        metrics,
        ready: Default::default(),
        hand_over: Default::default(),
    })
}

/// Serves the three HTTP listeners until `until` fires (the very end of a
/// shutdown: the kubelet probes a terminating gateway, operators watch
/// `GET /drains`) or until they are handed over to a new gateway
/// (`POST /hand-over`, [`admin::hand_over`]); each counts itself closed.
pub(super) fn serve(
    config: &Config,
    listeners: HttpListeners,
    state: &Arc<AdminState>,
    control: &ControlMetrics,
    mut until: ShutdownWatch,
    w: &mut Wiring,
) {
    let cp = &config.control_plane;
    let limits = |listener| HttpLimits {
        connections: ConnLimit::new(listener, cp.max_connections, control),
        header_read_timeout: cp.header_read_timeout,
    };
    let (stop, stopped) = shutdown::channel();
    let mut released = state.hand_over.released();
    w.tasks.spawn(async move {
        tokio::select! {
            _ = until.signaled() => {}
            _ = released.signaled() => {}
        }
        stop.start(Duration::ZERO);
    });
    let HttpListeners {
        admin: a,
        metrics: m,
        readiness: r,
    } = listeners;
    let s = state;
    spawn_server(a, s, admin::admin, limits("admin"), stopped.clone(), w);
    spawn_server(m, s, admin::metrics, limits("metrics"), stopped.clone(), w);
    spawn_server(r, s, admin::readiness, limits("readiness"), stopped, w);
}

/// One control server; counted closed when it stops.
fn spawn_server<F, Fut>(
    listener: tokio::net::TcpListener,
    state: &Arc<AdminState>,
    route: F,
    limits: HttpLimits,
    stopped: ShutdownWatch,
    w: &mut Wiring,
) where
    F: Fn(Arc<AdminState>, http::Request<hyper::body::Incoming>) -> Fut
        + Copy
        + Send
        + Sync
        + 'static,
    Fut:
        std::future::Future<Output = http::Response<tidegate_control::http::Body>> + Send + 'static,
{
    let state = state.clone();
    w.tasks.spawn(async move {
        tidegate_control::http::serve(listener, state.clone(), route, limits, stopped).await;
        state.hand_over.closed();
    });
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
