//! Pods handed over by a node agent (in-pod mode) and the CNI socket:
//! `tidegate-cni`, istio-cni's ZDS, or the state directory a restarted
//! gateway re-adopts from.

use std::sync::Arc;

use anyhow::Context as _;
use tidegate_control::limits::{ConnLimit, ControlMetrics};
use tokio::sync::watch;
use tracing::info;

use super::Wiring;
use crate::config::{CaptureMode, Config};
use crate::descriptor_budget::DescriptorBudget;
use crate::dns::DnsProxy;
use crate::drains::DrainEngine;
use crate::inpod::intake::cni_socket::{self, CniLimits};
use crate::inpod::intake::{state_dir, zds::ZdsIntake};
use crate::inpod::pods::{DataPath, PodLimits, PodProxies};
use tidegate_netns::capture::CapturePorts;
use tidegate_zds::{ZdsClient, ZdsConfig};

/// A readiness condition: what it waits for, and the flag that says so.
pub(super) type ReadyWhen = (&'static str, watch::Receiver<bool>);

/// In-pod mode: the pods served in their own namespaces, re-adopted from
/// the state directory and followed over ZDS (whose first snapshot joins
/// `ready_when`). `None` in node mode.
pub(super) async fn pods(
    config: &Config,
    mut data_path: DataPath,
    capture: CapturePorts,
    budget: Option<DescriptorBudget>,
    ready_when: &mut Vec<ReadyWhen>,
    w: &mut Wiring,
) -> Option<Arc<PodProxies>> {
    if config.capture.mode != CaptureMode::Inpod {
        return None;
    }
    if config.dns.enabled {
        // The DNS proxy's node-wide bounds, as the pods' share holds them.
        let mut dns = config.dns.clone();
        if let Some(b) = &budget {
            dns.max_in_flight = u32::try_from(b.dns_forwards).unwrap_or(u32::MAX);
            dns.max_tcp_connections = u32::try_from(b.dns_tcp).unwrap_or(u32::MAX);
        }
        data_path.dns = Some(DnsProxy::new(
            &dns,
            data_path.workloads.clone(),
            w.registry(),
        ));
    }
    let limits = PodLimits {
        max_pods: config.capture.max_pods as usize,
        membership_wait: config.capture.membership_wait,
        budget,
    };
    let pods = PodProxies::new(data_path, capture, limits, w.drain.clone(), &mut w.root);
    if let Some(dir) = &config.capture.state_dir {
        let adopted = state_dir::adopt(pods.as_ref(), dir).await;
        info!(adopted, dir = %dir.display(), "pods re-adopted from the state directory");
    }
    if let Some(socket) = &config.capture.zds_socket {
        let zds = ZdsClient::new(
            ZdsConfig {
                socket: socket.clone(),
                ..Default::default()
            },
            Arc::new(ZdsIntake(pods.clone())),
            w.registry(),
        );
        ready_when.push(("istio-cni's ZDS snapshot", zds.ready()));
        w.tasks.spawn(zds.run(w.drain.clone()));
    }
    Some(pods)
}

/// The CNI socket `tidegate-cni` asks on (DEL, and ADD in in-pod mode),
/// when configured.
pub(super) fn cni_socket(
    config: &Config,
    drains: &Arc<DrainEngine>,
    pods: Option<&Arc<PodProxies>>,
    control: &ControlMetrics,
    w: &mut Wiring,
) -> anyhow::Result<()> {
    let Some(path) = &config.drains.cni_socket else {
        return Ok(());
    };
    let cp = &config.control_plane;
    let l =
        cni_socket::bind(path).with_context(|| format!("drains.cni_socket {}", path.display()))?;
    let limits = CniLimits {
        connections: ConnLimit::new("cni", cp.cni_max_connections, control),
        read_timeout: cp.cni_read_timeout,
    };
    w.tasks.spawn(cni_socket::serve(
        l,
        drains.clone(),
        pods.cloned(),
        limits,
        w.drain.clone(),
    ));
    Ok(())
}
