//! Where the workload set comes from: Kubernetes discovery, a watched
//! file, or the embedded set.

use std::sync::Arc;

use anyhow::Context as _;
use tokio::sync::watch;

use super::{Wiring, DEFAULT_WORKLOADS};
use crate::config::{Config, WorkloadSourceKind};
use crate::workloads::{
    istio, kubernetes, parse_file, WorkloadFileMetrics, WorkloadFileWatcher, WorkloadStore,
};

/// What the drain engine reports workload events as coming from.
pub(super) fn trigger(config: &Config) -> crate::drains::Trigger {
    match config.workloads.source {
        WorkloadSourceKind::File => crate::drains::Trigger::WorkloadFile,
        WorkloadSourceKind::Kubernetes => crate::drains::Trigger::Kubernetes,
        WorkloadSourceKind::Istio => crate::drains::Trigger::Istio,
    }
}

/// Starts the configured source into `store`; with Kubernetes discovery
/// or istiod, the flag its first full answer raises (readiness waits for
/// it).
pub(super) async fn start(
    config: &Config,
    store: &Arc<WorkloadStore>,
    w: &mut Wiring,
) -> anyhow::Result<Option<watch::Receiver<bool>>> {
    if config.workloads.source == WorkloadSourceKind::Kubernetes {
        let k = &config.workloads.kubernetes;
        let client = kubernetes::client_for(k).await?;
        let source = kubernetes::KubernetesSource::new(
            client,
            &config.node_name,
            k.clone(),
            store.clone(),
            kubernetes::KubernetesMetrics::register(w.registry()),
            config.outbound.learn_cluster_ranges,
        );
        let synced = source.synced();
        w.tasks.spawn(source.run(w.drain.clone()));
        return Ok(Some(synced));
    }
    if config.workloads.source == WorkloadSourceKind::Istio {
        let client = istio::client(
            &config.workloads.istio,
            &config.node_name,
            &config.cluster_id,
            tidegate_xds::XdsMetrics::register(&mut w.root),
        );
        let source = istio::IstioSource::new(store.clone());
        let synced = source.synced();
        w.tasks.spawn(istio::run(client, source, w.drain.clone()));
        return Ok(Some(synced));
    }
    match &config.workloads.file {
        Some(path) => {
            let watcher = WorkloadFileWatcher::start(
                path,
                config.workloads.reload_interval,
                store.clone(),
                WorkloadFileMetrics::register(w.registry()),
            )?;
            w.tasks.spawn(watcher.run(w.drain.clone()));
        }
        None => load_workloads(config, store)?,
    }
    Ok(None)
}

/// Loads the configured workload file once (or the embedded set).
pub fn load_workloads(config: &Config, store: &Arc<WorkloadStore>) -> anyhow::Result<()> {
    let parsed = match &config.workloads.file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("workloads.file {}", path.display()))?;
            parse_file(&text)?
        }
        None => parse_file(DEFAULT_WORKLOADS)?,
    };
    store.publish_file(parsed);
    Ok(())
}
