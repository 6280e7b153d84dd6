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
    warn_if_plaintext_to_unknown(config);
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

/// Says at start when an address no workload or Service holds (and that
/// the mesh never held) can leave in plaintext: no cluster ranges are
/// configured and the source learns none, or `unknown_in_cluster` passes
/// them. Addresses the mesh has known are refused either way.
fn warn_if_plaintext_to_unknown(config: &Config) {
    let o = &config.outbound;
    let learns =
        config.workloads.source == WorkloadSourceKind::Kubernetes && o.learn_cluster_ranges;
    if o.unknown_in_cluster == crate::config::UnknownInCluster::Passthrough {
        tracing::warn!(
            setting = "outbound.unknown_in_cluster",
            "passthrough: a connection to an address inside the cluster's ranges that no workload or Service holds leaves in plaintext (addresses the mesh has known are still refused)"
        );
    } else if o.cluster_cidrs.is_empty() && !learns {
        tracing::warn!(
            setting = "outbound.cluster_cidrs",
            "empty, and the workload source learns no ranges: a connection to an address no workload or Service has held leaves in plaintext; set the cluster's pod and Service ranges to refuse those (addresses the mesh has known are refused either way)"
        );
    }
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
    store.publish(parsed);
    Ok(())
}
