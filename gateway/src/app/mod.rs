//! The composition root: everything the gateway runs is wired here, so the
//! whole system reads in one place and tests start it in-process.
//! [`build`] is the sequence; each step is a function named after what it
//! starts, here or in a file of its own: [`workload_source`],
//! [`certificates`], the pool, the policies, the drains, [`listeners`],
//! [`data_path`], [`node_agents`] (in-pod pods, the CNI socket) and
//! [`control`] (admin, metrics, readiness).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tidegate_control::limits::{self as control_plane, ControlMetrics};
use tokio::task::JoinSet;
use tracing::info;

use crate::admin::AdminState;
use crate::config::Config;
use crate::descriptor_budget::{DescriptorBudget, PodWants};
use crate::inpod::pods::PodProxies;
use crate::proxy::outbound::Outbound;
use crate::proxy::pool::Pool;
use crate::proxy::tunnels::InboundTunnels;
use crate::workloads::WorkloadStore;
use tidegate_base::shutdown::{self, ActiveStreams, ShutdownTrigger, ShutdownWatch};
use tidegate_policy_host::PolicyEngine;
use tidegate_protocol::tls::TlsContext;

mod certificates;
mod control;
mod control_ports;
mod core;
mod data_path;
mod listeners;
mod node_agents;
mod workload_source;

pub use certificates::cert_source;
pub use control_ports::ControlPortError;
use listeners::Listeners;
pub use workload_source::load_workloads;

/// The embedded default configuration (`tidegate run` without `--config`).
pub const DEFAULT_CONFIG: &str = include_str!("../../defaults/tidegate.yaml");
/// The embedded default workload set.
pub const DEFAULT_WORKLOADS: &str = include_str!("../../defaults/workloads.yaml");

/// Addresses actually bound (tests configure port 0).
#[derive(Clone, Copy, Debug)]
pub struct BoundAddrs {
    /// `None` in in-pod mode without `capture.node_listeners`.
    pub outbound: Option<SocketAddr>,
    /// `None` in in-pod mode without `capture.node_listeners`.
    pub inbound: Option<SocketAddr>,
    pub admin: SocketAddr,
    pub metrics: SocketAddr,
    pub readiness: SocketAddr,
    pub demo_echo: Option<SocketAddr>,
}

impl BoundAddrs {
    /// The line scripts and operators wait for, with every address bound.
    fn log_ready(&self, node: &str) {
        let none = || "none (in-pod)".to_owned();
        info!(
            node = %node,
            inbound = %self.inbound.map_or_else(none, |a| a.to_string()),
            outbound = %self.outbound.map_or_else(none, |a| a.to_string()),
            admin = %self.admin,
            metrics = %self.metrics,
            readiness = %self.readiness,
            "tidegate ready"
        );
    }
}

/// A running gateway.
pub struct App {
    pub addrs: BoundAddrs,
    pub workloads: Arc<WorkloadStore>,
    pub tunnels: Arc<InboundTunnels>,
    pub pool: Arc<Pool>,
    pub tls: Arc<TlsContext>,
    pub outbound: Arc<Outbound>,
    pub policies: Arc<PolicyEngine>,
    pub drains: Arc<crate::drains::DrainEngine>,
    /// In-pod mode: the pods served in their own namespaces.
    pub pods: Option<Arc<PodProxies>>,
    admin: Arc<AdminState>,
    streams: ActiveStreams,
    trigger: ShutdownTrigger,
    serving: Serving,
    tasks: JoinSet<()>,
    shutdown_deadline: Duration,
}

/// What every step of [`build`] adds to: the metrics registry, the
/// background tasks, and the shutdown watch those tasks stop on.
struct Wiring {
    /// No prefix of its own: `tidegate_*` below it, and Istio's `istio_*`.
    root: Registry,
    tasks: JoinSet<()>,
    drain: ShutdownWatch,
}

impl Wiring {
    fn new(drain: ShutdownWatch) -> Wiring {
        Wiring {
            root: Registry::default(),
            tasks: JoinSet::new(),
            drain,
        }
    }

    /// Where a module registers its `tidegate_*` metrics.
    fn registry(&mut self) -> &mut Registry {
        self.root.sub_registry_with_prefix("tidegate")
    }
}

/// Binds every listener and starts every task. Returns once the gateway is
/// ready — except with Kubernetes discovery or ZDS, where `/healthz/ready`
/// turns ready only after their first full answer (the listeners serve
/// meanwhile). The policy plugins compile while pods and listeners serve
/// already; it returns, and turns ready, once they are in.
pub async fn build(config: Config) -> anyhow::Result<App> {
    let control_plane_budget =
        control_plane::budget(&config.control_plane, config.drains.cni_socket.is_some());
    let wants = PodWants::of(&config);
    let budget = control_plane::reserve_descriptors(control_plane_budget)?
        .map(|d| DescriptorBudget::derive(d, control_plane_budget, wants));
    if let Some(b) = &budget {
        b.log(wants);
    }
    // First: a second gateway on this node refuses before it touches
    // anything the running one serves (with --take-over: taken last).
    let http = control_ports::bind(&config).await?;
    let (trigger, drain) = shutdown::channel();
    let mut w = Wiring::new(drain);
    let control = ControlMetrics::register(w.registry());
    crate::allocator::AllocatorMetrics::register(w.registry());
    let (core, source_synced) = core::start(&config, &mut w).await?;

    let mut listeners = Listeners::bind(&config, &core.tcp, http)?;
    let capture = listeners::capture_ports(&config);
    let own_ports = listeners.own_ports(&config, &capture);
    let paths = data_path::build(&config, &core, &own_ports, budget.as_ref(), &mut w);
    let source_gate = match config.workloads.source {
        crate::config::WorkloadSourceKind::Istio => "istiod's first answer of each type",
        _ => "Kubernetes discovery's first full sync",
    };
    let mut ready_when = Vec::from_iter(source_synced.map(|s| (source_gate, s)));
    let pod_path = paths.for_pods(&core, own_ports);
    let pods = node_agents::pods(&config, pod_path, capture, budget, &mut ready_when, &mut w).await;
    node_agents::cni_socket(&config, &core.drains, pods.as_ref(), &control, &mut w)?;
    let demo_echo = demo_echo(&config, &mut w).await?;
    if listeners.http.is_none() {
        // Everything else is bound: the running gateway hands its ports over.
        listeners.http = Some(control_ports::take_over(&config).await?);
    }
    let addrs = listeners.addrs(demo_echo)?;
    let metrics = std::mem::take(&mut w.root);
    let admin = control::state(&config, &core, pods.clone(), &paths, budget, metrics);
    let serving = Serving::start(&config, listeners, &paths, &admin, &control, &mut w);
    // Pods and listeners serve already (an event meanwhile is decided by
    // the fallback); readiness, and the caller, get the plugins in.
    let _ = core.plugins_loaded.clone().wait_for(|loaded| *loaded).await;
    control::ready_when(ready_when, &admin, &mut w);
    addrs.log_ready(&config.node_name);
    Ok(App {
        addrs,
        workloads: core.workloads,
        tunnels: core.tunnels,
        pool: core.pool,
        tls: core.tls,
        outbound: paths.outbound,
        policies: core.policies,
        drains: core.drains,
        pods,
        admin,
        streams: core.streams,
        trigger,
        serving,
        tasks: w.tasks,
        shutdown_deadline: config.shutdown.deadline,
    })
}

/// The listeners served: stopped in two steps by [`App::shutdown`].
struct Serving {
    /// Closes the HBONE and capture listeners.
    stop_accepting: ShutdownTrigger,
    /// The HBONE and capture accept loops: awaited before tunnels drain.
    accept_loops: Vec<tokio::task::JoinHandle<()>>,
    /// Stops the admin, metrics and readiness servers at the very end.
    stop_admin: ShutdownTrigger,
}

impl Serving {
    fn start(
        config: &Config,
        listeners: Listeners,
        paths: &data_path::DataPath,
        admin: &Arc<AdminState>,
        control: &ControlMetrics,
        w: &mut Wiring,
    ) -> Serving {
        let (stop_accepting, accepting) = shutdown::channel();
        let (inbound, outbound) = (paths.inbound.clone(), paths.outbound.clone());
        let drain = w.drain.clone();
        let mut accept_loops = Vec::new();
        if let Some(l) = listeners.inbound {
            accept_loops.push(tokio::spawn(inbound.run(l, accepting.clone(), drain)));
        }
        if let Some(l) = listeners.outbound {
            accept_loops.push(tokio::spawn(outbound.run(l, accepting)));
        }
        let (stop_admin, admin_watch) = shutdown::channel();
        if let Some(http) = listeners.http {
            control::serve(config, http, admin, control, admin_watch, w);
        }
        Serving {
            stop_accepting,
            accept_loops,
            stop_admin,
        }
    }
}

/// The demo's echo backends (`demo:`), if configured; the first one's address.
async fn demo_echo(config: &Config, w: &mut Wiring) -> anyhow::Result<Option<SocketAddr>> {
    let Some(demo) = &config.demo else {
        return Ok(None);
    };
    let l = crate::demo::bind_echo("demo.echo", demo.echo).await?;
    let addr = l.local_addr()?;
    info!(%addr, "demo echo backend listening");
    w.tasks.spawn(crate::demo::run_echo(l, w.drain.clone()));
    for more in &demo.more_echoes {
        let l = crate::demo::bind_echo("demo.more_echoes", *more).await?;
        info!(addr = %more, "demo echo backend listening");
        w.tasks.spawn(crate::demo::run_echo(l, w.drain.clone()));
    }
    Ok(Some(addr))
}

impl App {
    /// The Prometheus text of this gateway's metrics (what `/metrics` serves).
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.admin.metrics)
            .expect("encoding to a String cannot fail");
        out
    }

    /// Streams open in either direction.
    pub fn open_streams(&self) -> usize {
        self.streams.count()
    }

    /// Drains and stops: listeners close at once, inbound tunnels get a
    /// graceful GOAWAY, pooled tunnels are evicted (GOAWAY once their streams
    /// end); returns when no stream and no inbound tunnel is left (each
    /// tunnel's GOAWAY exchange done, so a stream its peer sent before it
    /// read the GOAWAY is served, not reset) or at the deadline, whichever
    /// first.
    pub async fn shutdown(mut self) {
        // Listeners close first: once they are gone, a peer told to go away
        // can only reach a gateway that takes new connections (a new one
        // bound with SO_REUSEPORT during an upgrade), never this one.
        self.serving.stop_accepting.start(self.shutdown_deadline);
        if let Some(pods) = &self.pods {
            pods.stop_accepting().await;
        }
        for l in self.serving.accept_loops.drain(..) {
            let _ = l.await;
        }
        let deadline = self.trigger.start(self.shutdown_deadline);
        self.admin.ready.store(false, Ordering::Release);
        // Listeners are closing; the policies plan first, then the default
        // drain (graceful GOAWAY inbound, client-side GOAWAY on the pool).
        let plan = self.drains.on_gateway_shutdown(self.shutdown_deadline);
        if !plan.is_empty() {
            info!(actions = ?plan, "gateway shutdown plan from the policies");
        }
        self.pool.evict_all();
        info!(
            streams = self.streams.count(),
            deadline_ms = self.shutdown_deadline.as_millis() as u64,
            "draining"
        );
        // Streams cut at the deadline end within moments (their tunnels
        // close at once): counted for the last line, not waited on longer.
        const CUT_SETTLE: Duration = Duration::from_millis(500);
        self.streams.drain(deadline, CUT_SETTLE).await.log();
        // No stream open is not yet no stream coming: a peer may have sent
        // one on a tunnel before it read this gateway's GOAWAY (late when
        // closing thousands of pod listeners held the runtime). Each tunnel
        // closes when its GOAWAY exchange is done; at the deadline, at once.
        let tunnels = self.tunnels.len();
        let left = self.tunnels.wait_closed(deadline + CUT_SETTLE).await;
        if tunnels > 0 {
            info!(tunnels, left, "inbound tunnels closed");
        }
        // Streams accepted on them meanwhile end before the gateway goes.
        let _ = tokio::time::timeout_at(deadline + CUT_SETTLE, self.streams.idle()).await;
        self.serving.stop_admin.start(Duration::ZERO);
        self.drains.shutdown().await;
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }

    /// Runs until SIGTERM or SIGINT, then [`App::shutdown`].
    pub async fn run_until_signal(self) -> anyhow::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => info!("SIGTERM"),
            _ = int.recv() => info!("SIGINT"),
        }
        self.shutdown().await;
        Ok(())
    }
}
