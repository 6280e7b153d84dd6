//! The `termination` timeline (and `ip-reuse`, `cni-hung` on top of it):
//! shutdown starts → the app drains and exits → CNI DEL → deleted.

use std::time::{Duration, Instant};

use super::app_server::AppPod;
use super::cni;
use super::params::{Params, Scenario};
use super::probes::DrainWatcher;
use super::report::{ms, Row};
use super::scenario::{lists, workload_query, Lab, Times};
use super::topology::Pod;
use super::workloads::{OLD_UID, REUSE_UID};
use super::LabError;

impl Lab {
    /// Shutdown starts → the app drains and exits → CNI DEL → deleted (→ the
    /// IP goes to a new pod).
    pub(super) async fn terminate(&mut self, p: &Params, row: &mut Row) -> Result<Times, LabError> {
        let drains = DrainWatcher::start(self.gw_b.admin.clone(), OLD_UID.to_owned());
        let goaways = self.goaway_watcher(&self.gw_a).await?;
        let old = self.old.take().expect("the old pod runs until terminated");
        let event = Instant::now();
        let deadline = super::probes::unix_ms() + p.grace.as_millis();
        self.workloads.terminate_old(deadline)?;
        old.proc.signal(libc::SIGTERM);
        let ready = vec![self.endpoint(Pod::Replacement)];
        if p.endpoint_lag.is_zero() {
            self.load().set_endpoints(ready);
        } else {
            self.load().set_endpoints_after(p.endpoint_lag, ready);
        }
        let exited = match old.proc.wait(p.grace).await {
            Ok((_, at)) => at,
            Err(_) => {
                // The kubelet's SIGKILL at the end of the grace period.
                old.proc.signal(libc::SIGKILL);
                row.notes.push(format!(
                    "the app did not exit within the grace period ({})",
                    ms(p.grace)
                ));
                old.proc.wait(Duration::from_secs(5)).await?.1
            }
        };
        if p.scenario == Scenario::CniHung {
            self.gw_b.proc.signal(libc::SIGSTOP);
        }
        let del = cni::del(&self.gw_b.cni_socket, "server-old", OLD_UID, p.cni_timeout).await;
        if p.scenario == Scenario::CniHung {
            self.gw_b.proc.signal(libc::SIGCONT);
        }
        let del = del?;
        row.cni = format!(
            "{} ({})",
            ms(del.took),
            if del.acknowledged {
                "acknowledged"
            } else {
                "not drained"
            }
        );
        row.cni_returned = Some(true);
        if !del.success {
            row.notes.push(format!("CNI DEL failed: {}", del.stderr));
        }
        self.topo.delete_pod(Pod::Old)?;
        self.workloads.delete_old()?;
        self.wait_dump(
            "gateway A to learn the old pod was deleted",
            &workload_query(OLD_UID),
            |d| !lists(d, OLD_UID),
        )
        .await?;
        if p.scenario == Scenario::IpReuse {
            self.reuse_ip(p).await?;
            row.baseline = 3;
        }
        Ok(Times {
            event,
            exited: Some(exited),
            drains: Some(drains),
            goaways,
        })
    }

    /// `ip-reuse`: a new pod gets the old pod's IP and joins the endpoints.
    async fn reuse_ip(&mut self, p: &Params) -> Result<(), LabError> {
        self.topo.add_pod(Pod::Reuse)?;
        let app = AppPod::start(
            &self.topo.pod_ns(Pod::Reuse),
            "reuse",
            p.app_drain,
            &self.dir.path().join("app-reuse.log"),
        )
        .await?;
        self.reuse = Some(app);
        self.workloads.add_reuse()?;
        self.wait_dump(
            "gateway A to learn the new pod at the old IP",
            &workload_query(REUSE_UID),
            |d| lists(d, REUSE_UID),
        )
        .await?;
        self.watcher().mark_reuse();
        self.load().set_endpoints(vec![
            self.endpoint(Pod::Replacement),
            self.endpoint(Pod::Reuse),
        ]);
        Ok(())
    }
}
