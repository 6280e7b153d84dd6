//! The `rollout` timeline: a rolling restart of the replicas behind the
//! Service VIP, one at a time, in the order a Deployment with the default
//! strategy follows (`maxSurge` 1, `maxUnavailable` 0 for three replicas):
//!
//! 1. the new pod's namespace and app start; it is listed (its node's
//!    gateway learns it, as from the pod's CNI ADD), then ready (its
//!    endpoint joins the Service);
//! 2. the old pod's deletion: its app gets SIGTERM (the kubelet), and
//!    `--endpoint-lag` later every gateway learns it is terminating (its
//!    endpoint leaves the Service; shutdown-started on node B,
//!    peer-terminating on node A);
//! 3. the app drains (`--app-drain`) and exits; CNI DEL through
//!    `tidegate-cni`; the namespace goes and the pod leaves the files;
//! 4. up to `--settle` for the client gateway's tunnels to it to go.
//!
//! The load (new connections and keep-alive streams) goes through the VIP
//! the whole time, so the client's gateway chooses among the replicas.

use std::time::{Duration, Instant};

use super::app_server::AppPod;
use super::cni;
use super::params::Params;
use super::probes::{DrainWatcher, PoolWatcher};
use super::report::{ms, Row};
use super::scenario::{lists, workload_query, Lab, Times};
use super::topology::Pod;
use super::workloads::{replica_name, replica_uid};
use super::LabError;

/// What one replaced pod's steps took.
struct Replaced {
    /// App exit → the client gateway's first dump without a tunnel to it.
    gone: String,
    still_pooled: bool,
    drain: String,
    del: Duration,
    acknowledged: bool,
    /// Node B's gateway knew no workload of the pod's uid.
    unknown: bool,
    /// When its steps happened, from the load's start.
    steps: String,
}

impl Lab {
    pub(super) async fn rollout(&mut self, p: &Params, row: &mut Row) -> Result<Times, LabError> {
        let goaways = self.goaway_watcher(&self.gw_a).await?;
        let event = Instant::now();
        let mut replaced = Vec::new();
        for index in 0..p.replicas {
            self.surge(p, Pod::Replica { gen: 1, index }).await?;
            replaced.push(self.replace(p, Pod::Replica { gen: 0, index }).await?);
        }
        // Load after the last step, to count late failures (pacing, not a
        // wait for an event).
        tokio::time::sleep(Duration::from_secs(1)).await;
        let join = |f: &dyn Fn(&Replaced) -> String| {
            replaced.iter().map(f).collect::<Vec<_>>().join(" / ")
        };
        row.baseline = 2 * u32::from(p.replicas);
        row.old_gone = join(&|r| r.gone.clone());
        row.old_tunnel_at_end = replaced.iter().any(|r| r.still_pooled);
        row.drain = join(&|r| r.drain.clone());
        row.cni = format!(
            "{} ({} of {} acknowledged)",
            join(&|r| ms(r.del)),
            replaced.iter().filter(|r| r.acknowledged).count(),
            replaced.len()
        );
        row.cni_returned = Some(true);
        let unknown = replaced.iter().filter(|r| r.unknown).count();
        if unknown > 0 {
            row.notes.push(format!(
                "CNI DEL: gateway B answered `unknown-workload` for {unknown} of {} pods \
                 (the pod's Kubernetes uid is no workload uid it holds)",
                replaced.len()
            ));
        }
        row.notes.push(format!(
            "{} pods replaced in {} (from the load's start: {}; {})",
            replaced.len(),
            ms(event.elapsed()),
            self.surged.join(", "),
            join(&|r| r.steps.clone()).replace(" / ", "; ")
        ));
        Ok(Times {
            event,
            exited: None,
            drains: None,
            goaways,
        })
    }

    /// A new replica starts and is listed ready; returns once the client's
    /// gateway knows it.
    async fn surge(&mut self, p: &Params, pod: Pod) -> Result<(), LabError> {
        self.topo.add_pod(pod)?;
        let name = replica_name(pod);
        let counts = self.load().counts.clone();
        let app = AppPod::start(
            &self.topo.pod_ns(pod),
            &name,
            p.app_drain,
            &self.dir.path().join(format!("app-{name}.log")),
        )
        .await?;
        self.replicas.push((pod, app));
        // Created: its node knows it (as from its CNI ADD or the pod watch)
        // before it is ready and any client may pick it.
        self.workloads
            .add_replica(pod, self.topo.pod_ip(pod), false)?;
        let uid = self.workloads.workload_uid(&replica_uid(pod), &name);
        self.wait_dump_of(
            &self.gw_b,
            "gateway B to learn the new replica",
            &workload_query(&uid),
            |d| lists(d, &uid),
        )
        .await?;
        self.workloads.ready_replica(pod)?;
        self.wait_dump(
            "gateway A to learn the new replica is ready",
            SERVICE_QUERY,
            |d| is_endpoint(d, &uid),
        )
        .await?;
        self.surged
            .push(format!("{name} ready {}", counts.since_start()));
        Ok(())
    }

    /// One old replica's termination, from SIGTERM to deletion and the
    /// client's tunnels to it gone.
    async fn replace(&mut self, p: &Params, pod: Pod) -> Result<Replaced, LabError> {
        let (pod_uid, name) = (replica_uid(pod), replica_name(pod));
        // The gateways' uid (istiod's, through xDS); CNI names the pod's own.
        let uid = self.workloads.workload_uid(&pod_uid, &name);
        let ip = self.topo.pod_ip(pod);
        let watcher = PoolWatcher::start(self.gw_a.admin.clone(), ip);
        let drains = DrainWatcher::start(self.gw_b.admin.clone(), uid.clone());
        let at = self
            .replicas
            .iter()
            .position(|(r, _)| *r == pod)
            .expect("the replica runs until replaced");
        let (_, app) = self.replicas.remove(at);
        let counts = self.load().counts.clone();
        let mut steps = format!("{name}: SIGTERM {}", counts.since_start());
        app.proc.signal(libc::SIGTERM);
        // The gateways learn of the deletion `--endpoint-lag` after the
        // kubelet's SIGTERM (the scenario's pacing).
        tokio::time::sleep(p.endpoint_lag).await;
        let deadline = super::probes::unix_ms() + p.grace.as_millis();
        self.workloads.terminate_replica(pod, deadline)?;
        steps.push_str(&format!(", terminating {}", counts.since_start()));
        let exited = match app.proc.wait(p.grace).await {
            Ok((_, at)) => at,
            Err(_) => {
                // The kubelet's SIGKILL at the end of the grace period.
                app.proc.signal(libc::SIGKILL);
                app.proc.wait(Duration::from_secs(5)).await?.1
            }
        };
        steps.push_str(&format!(", exited {}", counts.since_start()));
        let del = cni::del(&self.gw_b.cni_socket, &name, &pod_uid, p.cni_timeout).await?;
        self.topo.delete_pod(pod)?;
        self.workloads.delete_replica(pod)?;
        steps.push_str(&format!(", deleted {}", counts.since_start()));
        self.wait_dump(
            "gateway A to learn the replica was deleted",
            &workload_query(&uid),
            |d| !lists(d, &uid),
        )
        .await?;
        let settle_from = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        while watcher.old_present() && settle_from.elapsed() < p.settle {
            tick.tick().await;
        }
        let trace = watcher
            .trace
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone_summary();
        let gone = match (trace.old_gone_at, trace.old_present) {
            (_, true) => "still pooled".into(),
            (Some(g), false) if g >= exited => ms(g - exited),
            (Some(_), false) => "before exit".into(),
            (None, false) => "none seen".into(),
        };
        let seen = drains.seen();
        let drain = match (seen.duration(), &seen.view) {
            (Some(d), _) => ms(d),
            (None, Some(_)) => "not ended".into(),
            (None, None) => "none".into(),
        };
        Ok(Replaced {
            gone,
            still_pooled: trace.old_present,
            drain,
            del: del.took,
            acknowledged: del.acknowledged,
            unknown: del.unknown,
            steps,
        })
    }
}

/// The dump query that lists the Service `lab/server` alone.
const SERVICE_QUERY: &str = "only=services&service=lab%2Fserver";

/// Whether the dump lists `uid` as a ready endpoint of a Service.
fn is_endpoint(dump: &serde_json::Value, uid: &str) -> bool {
    dump["services"].as_array().is_some_and(|services| {
        services.iter().any(|s| {
            s["endpoint_choice"].as_array().is_some_and(|e| {
                e.iter()
                    .any(|e| e["workload_uid"] == uid && e["conditions"]["ready"] == true)
            })
        })
    })
}
