//! The `gateway-restart` timeline: no pod terminates; one node's gateway is
//! replaced by a new process under load.

use std::time::{Duration, Instant};

use super::gateway::{Gateway, NodeFiles};
use super::params::{Node, Params};
use super::probes::{metric_sum, PoolWatcher, OPENED};
use super::report::{ms, Row};
use super::scenario::{Lab, Times};
use super::topology::Pod;
use super::LabError;

impl Lab {
    /// `gateway-restart`: a new gateway process beside the old one, then
    /// SIGTERM to the old one (an upgrade with `SO_REUSEPORT`), or SIGKILL
    /// with `--kill-old` (a crash while its replacement runs).
    pub(super) async fn restart(&mut self, p: &Params, row: &mut Row) -> Result<Times, LabError> {
        let (node, ns, rt) = match p.restart_node {
            Node::A => ('a', self.topo.node_ns('a'), self.na.handle.clone()),
            Node::B => ('b', self.topo.node_ns('b'), self.nb.handle.clone()),
        };
        let files = NodeFiles {
            node,
            workloads: self.dir.path().join(format!("workloads-{node}.yaml")),
            cni_socket: self.dir.path().join(format!("cni-{node}.sock")),
            istio: None,
            ready_within: Duration::from_secs(60),
        };
        let new = Gateway::start(&ns, rt, &files, self.dir.path(), 1).await?;
        let old = if node == 'a' { &self.gw_a } else { &self.gw_b };
        let opened_by_old_a = if node == 'a' {
            metric_sum(&old.metrics_text().await?, OPENED)
        } else {
            0.0
        };
        let goaways = self.goaway_watcher(&self.gw_a).await?;
        let event = Instant::now();
        let signal = if p.kill_old {
            libc::SIGKILL
        } else {
            libc::SIGTERM
        };
        old.proc.signal(signal);
        let (how, at) = old.proc.wait(Duration::from_secs(20)).await?;
        let what = if p.kill_old { "killed" } else { "shutdown" };
        row.drain = format!("{} (old gateway {what}: {how})", ms(at - event));
        row.old_gone = "–".into();
        row.cni = "–".into();
        if node == 'a' {
            row.notes.push(format!(
                "tunnels opened: {opened_by_old_a} by the old client gateway + the new one's"
            ));
            row.opened = opened_by_old_a;
            let old_ip = self.topo.pod_ip(Pod::Old);
            self.watcher = Some(PoolWatcher::start(new.admin.clone(), old_ip));
            let replaced = std::mem::replace(&mut self.gw_a, new);
            self.restarted.push(replaced);
        } else {
            self.restarted.push(new);
        }
        // Two more seconds of load on the new gateway (pacing, not a wait
        // for an event): failures after the restart count too.
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(Times {
            event,
            exited: None,
            drains: None,
            goaways,
        })
    }
}
