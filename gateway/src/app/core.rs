//! The parts every later step is built over: the workload set, mTLS, the
//! outbound pool, the policies and the drain engine.

use std::sync::Arc;

use tokio::sync::watch;

use super::{certificates, workload_source, Wiring};
use crate::config::{CaptureMode, Config};
use crate::drains::{DrainDeps, DrainEngine, DrainMetrics};
use crate::proxy::congestion::TcpTuning;
use crate::proxy::istio_tcp::IstioTcpMetrics;
use crate::proxy::metrics::ProxyFamilies;
use crate::proxy::pool::{ConnectFailure, Pool};
use crate::proxy::tunnels::InboundTunnels;
use crate::workloads::WorkloadStore;
use tidegate_base::shutdown::ActiveStreams;
use tidegate_policy_host::{PolicyEngine, PolicyMetrics};
use tidegate_protocol::tls::{TlsContext, TlsMetrics};

pub(super) struct Core {
    pub workloads: Arc<WorkloadStore>,
    pub tls: Arc<TlsContext>,
    pub families: ProxyFamilies,
    pub streams: ActiveStreams,
    pub tunnels: Arc<InboundTunnels>,
    pub tcp: TcpTuning,
    pub pool: Arc<Pool>,
    pub policies: Arc<PolicyEngine>,
    /// Rises once every configured plugin is loaded or reported.
    pub plugins_loaded: watch::Receiver<bool>,
    pub drains: Arc<DrainEngine>,
}

/// Builds and starts them; with Kubernetes discovery, also the flag its
/// first full sync raises.
pub(super) async fn start(
    config: &Config,
    w: &mut Wiring,
) -> anyhow::Result<(Core, Option<watch::Receiver<bool>>)> {
    let workloads = WorkloadStore::new(&config.trust_domain, &config.node_name);
    let synced = workload_source::start(config, &workloads, w).await?;
    let certs = certificates::certificates(config, Some(w.registry()))?;
    let certs = certs.keep(&workloads, w);
    let tls_metrics = TlsMetrics::register(w.registry());
    let tls = Arc::new(TlsContext::new(certs, &config.trust_domain, tls_metrics));
    let istio = IstioTcpMetrics::register(&mut w.root, &config.cluster_id);
    let families = ProxyFamilies::register(w.registry(), istio);
    let (streams, tunnels) = (ActiveStreams::default(), Arc::default());
    let tcp = TcpTuning::from_config(&config.tcp)?;
    let (pool, failures) = pool(config, &tls, &tcp, w);
    let (policies, plugins_loaded) = policies(config, w)?;
    let drains = drains(
        config,
        &workloads,
        &tunnels,
        (&pool, failures),
        &policies,
        w,
    )?;
    let core = Core {
        workloads,
        tls,
        families,
        streams,
        tunnels,
        tcp,
        pool,
        policies,
        plugins_loaded,
        drains,
    };
    Ok((core, synced))
}

/// The connect failures the pool reports, as the drain engine receives them.
type FailureReports = tokio::sync::mpsc::UnboundedReceiver<ConnectFailure>;

/// The outbound tunnel pool, with its idle eviction, and the receiving end
/// of its connect-failure reports.
fn pool(
    config: &Config,
    tls: &Arc<TlsContext>,
    tcp: &TcpTuning,
    w: &mut Wiring,
) -> (Arc<Pool>, FailureReports) {
    let (failures_tx, failures) = tokio::sync::mpsc::unbounded_channel();
    let pool = Pool::new(
        tls.clone(),
        config.hbone.clone(),
        config.pool.clone(),
        tcp.tunnel.clone(),
        Some(failures_tx),
        w.registry(),
    );
    w.tasks.spawn(pool.clone().evict_idle(w.drain.clone()));
    (pool, failures)
}

/// The policy engine, its configured plugins loading in the background
/// (compiled side by side), then its file watch. The returned flag rises
/// once every plugin is in or reported: readiness waits for it, the data
/// path does not — pods re-adopted at a restart are served while their
/// plugins compile, and an event meanwhile is decided by the fallback,
/// as for a plugin that fails to load (reported; traffic is served anyway).
fn policies(
    config: &Config,
    w: &mut Wiring,
) -> anyhow::Result<(Arc<PolicyEngine>, watch::Receiver<bool>)> {
    let policies = PolicyEngine::new(&config.policies, PolicyMetrics::register(w.registry()))?;
    let (loaded_tx, loaded) = watch::channel(false);
    let (engine, every, drain) = (
        policies.clone(),
        config.policies.reload_interval,
        w.drain.clone(),
    );
    w.tasks.spawn(async move {
        let loading = engine.clone();
        let started = std::time::Instant::now();
        match tokio::task::spawn_blocking(move || loading.load_configured()).await {
            Ok(results) => {
                for (name, result) in &results {
                    if let Err(e) = result {
                        tracing::error!(policy = %name, error = %e, "policy not loaded; its workloads use the fallback");
                    }
                }
                tracing::info!(plugins = results.len(), elapsed_ms = started.elapsed().as_millis() as u64,
                    "policy plugins loaded");
            }
            Err(e) => tracing::error!(error = %e, "loading the policy plugins failed; every workload uses the fallback"),
        }
        let _ = loaded_tx.send(true);
        engine.watch_files(every, drain).await;
    });
    Ok((policies, loaded))
}

/// The drain engine, following workload events and the pool's connect
/// failures (`failures`), with the OCI drainer when configured.
fn drains(
    config: &Config,
    workloads: &Arc<WorkloadStore>,
    tunnels: &Arc<InboundTunnels>,
    (pool, failures): (&Arc<Pool>, FailureReports),
    policies: &Arc<PolicyEngine>,
    w: &mut Wiring,
) -> anyhow::Result<Arc<DrainEngine>> {
    let drain = w.drain.clone();
    let oci = crate::oci::from_config(&config.oci, workloads.clone(), w.registry(), drain)?;
    let drains = DrainEngine::new(DrainDeps {
        workloads: workloads.clone(),
        tunnels: tunnels.clone(),
        pool: pool.clone(),
        policies: policies.clone(),
        cfg: config.drains.clone(),
        metrics: DrainMetrics::register(w.registry()),
        oci,
        added_by_node_agent: config.capture.mode == CaptureMode::Inpod,
    });
    let trigger = workload_source::trigger(config);
    w.tasks
        .spawn(drains.clone().watch_workloads(trigger, w.drain.clone()));
    w.tasks.spawn(
        drains
            .clone()
            .watch_connect_failures(failures, w.drain.clone()),
    );
    Ok(drains)
}
