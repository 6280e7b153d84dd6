//! The `crash` timeline: the old pod's app is killed — no SIGTERM, no
//! termination event, the pod still listed and ready — and the pod is
//! deleted 2 s later (CNI DEL, then the pod object), as when a container
//! dies and its pod goes after. The load goes through the Service VIP, so
//! what is measured is how soon the client's gateway stops choosing the
//! dead endpoint.

use std::time::{Duration, Instant};

use super::cni;
use super::probes::{metric_sum, DrainWatcher};
use super::report::{ms, Row};
use super::scenario::{lists, workload_query, Lab, Times};
use super::topology::Pod;
use super::workloads::OLD_UID;
use super::LabError;

/// From the kill to the pod's deletion.
const DELETED_AFTER: Duration = Duration::from_secs(2);

/// CONNECTs the client's gateway saw refused (the crashed endpoint's).
const REFUSALS: &str = "tidegate_pool_connect_refusals_total";
/// Choices that passed over an endpoint for failing.
const FAILING_SKIPS: &str = "tidegate_service_endpoint_skips_total{reason=\"failing\"}";

impl Lab {
    pub(super) async fn crash(
        &mut self,
        p: &super::params::Params,
        row: &mut Row,
    ) -> Result<Times, LabError> {
        let drains = DrainWatcher::start(self.gw_b.admin.clone(), OLD_UID.to_owned());
        let goaways = self.goaway_watcher(&self.gw_a).await?;
        let old = self.old.take().expect("the old pod runs until it crashes");
        let event = Instant::now();
        old.proc.signal(libc::SIGKILL);
        let (_, exited) = old.proc.wait(Duration::from_secs(5)).await?;
        // The pod object goes 2 s later: the scenario's own pacing.
        tokio::time::sleep(DELETED_AFTER.saturating_sub(event.elapsed())).await;
        let del = cni::del(&self.gw_b.cni_socket, "server-old", OLD_UID, p.cni_timeout).await?;
        row.cni = format!("{} (after the crash: nothing to drain)", ms(del.took));
        row.cni_returned = Some(true);
        self.topo.delete_pod(Pod::Old)?;
        self.workloads.delete_old()?;
        self.wait_dump(
            "gateway A to learn the old pod was deleted",
            &workload_query(OLD_UID),
            |d| !lists(d, OLD_UID),
        )
        .await?;
        let a = self.gw_a.metrics_text().await?;
        row.notes.push(format!(
            "crash: {} CONNECTs refused by the old pod's gateway, {} choices passed it over as failing, pod deleted {} after the kill",
            metric_sum(&a, REFUSALS),
            metric_sum(&a, FAILING_SKIPS),
            ms(event.elapsed())
        ));
        Ok(Times {
            event,
            exited: Some(exited),
            drains: Some(drains),
            goaways,
        })
    }
}
