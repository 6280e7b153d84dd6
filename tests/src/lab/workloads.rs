//! What every gateway is told of the lab's pods: the same pod list on each
//! node (a pod is local where `node` names the gateway's node), told again
//! at each lifecycle step — the workload files, rewritten atomically, or
//! (`--source istio`) the resources of an istiod double that change,
//! pushed ([`super::xds_feed`]). A pod set `terminating` starts shutting
//! down on its node and raises peer-terminating elsewhere; a pod removed
//! is deleted (peer-deleted elsewhere). The server pods are the endpoints
//! of Service `lab/server` ([`vip`]): the old pod and its replacement, or
//! in `rollout` the replicas alone.

use std::path::PathBuf;

use super::topology::{Pod, Topology};
use super::xds_feed::XdsFeed;
use super::LabError;

pub const OLD_UID: &str = "lab-server-old";
pub const REPLACEMENT_UID: &str = "lab-server-new";
pub const REUSE_UID: &str = "lab-server-reuse";

/// The Service's VIP: `10.x.9.10`, routed like any address out of the
/// client pod, so gateway A captures it.
pub fn vip(t: &Topology) -> std::net::IpAddr {
    t.addr(9, 10)
}

/// Where the pod list goes.
pub enum Sink {
    /// Every node's workload file.
    Files(Vec<PathBuf>),
    /// The istiod double every gateway subscribes to.
    Xds(Box<XdsFeed>),
}

/// istiod's uid of pod `name` of namespace `lab`.
pub fn istio_uid(name: &str) -> String {
    format!("Kubernetes//Pod/lab/{name}")
}

/// One pod as listed.
struct Entry {
    uid: String,
    name: String,
    service_account: String,
    ip: String,
    node: &'static str,
    /// A server pod (annotated with the policy, an endpoint of the Service).
    server: bool,
    ready: bool,
    state: OldState,
}

/// The pods listed, and where each is in its lifecycle.
pub struct Workloads {
    sink: Sink,
    policy: String,
    replacement_sa: &'static str,
    client: String,
    old: String,
    replacement: String,
    old_state: OldState,
    reuse: bool,
    vip: String,
    /// `rollout`: the replicas, and no old pod or replacement.
    replicas: Option<Vec<Replica>>,
}

/// One `rollout` replica in the files.
struct Replica {
    pod: Pod,
    ip: String,
    state: OldState,
    /// Ready: an endpoint of the Service (before, a pod its node knows).
    ready: bool,
}

/// A replica's uid (and pod name, after `server-`).
pub fn replica_uid(pod: Pod) -> String {
    match pod {
        Pod::Replica { gen, index } => format!("lab-server-g{gen}-{index}"),
        _ => unreachable!("only replicas are named so"),
    }
}

/// A replica's pod name.
pub fn replica_name(pod: Pod) -> String {
    replica_uid(pod).replacen("lab-", "", 1)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OldState {
    Running,
    /// Terminating with this deadline (unix ms).
    Terminating(u128),
    Deleted,
}

impl Workloads {
    pub fn new(t: &Topology, sink: Sink, policy: &str, different_sa: bool) -> Workloads {
        Workloads {
            sink,
            policy: policy.to_owned(),
            replacement_sa: if different_sa { "server-v2" } else { "server" },
            client: t.pod_ip(Pod::Client).to_string(),
            old: t.pod_ip(Pod::Old).to_string(),
            replacement: t.pod_ip(Pod::Replacement).to_string(),
            old_state: OldState::Running,
            reuse: false,
            vip: vip(t).to_string(),
            replicas: None,
        }
    }

    /// `rollout`: the files list the replicas instead of the old pod and
    /// its replacement (none listed yet).
    pub fn for_rollout(mut self) -> Workloads {
        self.replicas = Some(Vec::new());
        self
    }

    /// Every pod listed, as the gateways are to see it.
    fn entries(&self) -> Vec<Entry> {
        let server = |uid: &str, name: &str, sa: &str, ip: &str, node, ready, state| Entry {
            uid: uid.to_owned(),
            name: name.to_owned(),
            service_account: sa.to_owned(),
            ip: ip.to_owned(),
            node,
            server: true,
            ready,
            state,
        };
        let mut out = vec![Entry {
            uid: "lab-client".into(),
            name: "client".into(),
            service_account: "client".into(),
            ip: self.client.clone(),
            node: "node-a",
            server: false,
            ready: true,
            state: OldState::Running,
        }];
        if let Some(replicas) = &self.replicas {
            for r in replicas.iter().filter(|r| r.state != OldState::Deleted) {
                let (uid, name) = (replica_uid(r.pod), replica_name(r.pod));
                out.push(server(
                    &uid, &name, "server", &r.ip, "node-b", r.ready, r.state,
                ));
            }
            return out;
        }
        if self.old_state != OldState::Deleted {
            let old = &self.old;
            out.push(server(
                OLD_UID,
                "server-old",
                "server",
                old,
                "node-b",
                true,
                self.old_state,
            ));
        }
        out.push(server(
            REPLACEMENT_UID,
            "server-new",
            self.replacement_sa,
            &self.replacement,
            "node-c",
            true,
            OldState::Running,
        ));
        if self.reuse {
            let old = &self.old;
            out.push(server(
                REUSE_UID,
                "server-reuse",
                "server",
                old,
                "node-b",
                true,
                OldState::Running,
            ));
        }
        out
    }

    /// The workload file: a server pod is an endpoint of the Service once
    /// ready, and stays one while terminating.
    fn text(&self) -> String {
        let mut s = String::from("workloads:\n");
        for e in self.entries() {
            let (app, annotations) = if e.server {
                (
                    "server",
                    format!(
                        ", annotations: {{tidegate.io/drain-policy: {}}}",
                        self.policy
                    ),
                )
            } else {
                ("client", String::new())
            };
            let mut extra = String::new();
            if e.server && (e.ready || e.state != OldState::Running) {
                extra.push_str(", services: [server]");
            }
            if let OldState::Terminating(deadline) = e.state {
                extra.push_str(&format!(
                    ", state: terminating, deletion_deadline_unix_ms: {deadline}"
                ));
            }
            s.push_str(&format!(
                "- {{uid: {}, name: {}, namespace: lab, service_account: {}, ips: ['{}'], \
                 node: {}, labels: {{app: {app}}}{annotations}{extra}}}\n",
                e.uid, e.name, e.service_account, e.ip, e.node
            ));
        }
        s + &format!(
            "services:\n- {{name: server, namespace: lab, vips: ['{}'], ports: [{{port: {p}, target_port: {p}}}]}}\n",
            self.vip,
            p = super::app_server::APP_PORT
        )
    }

    /// The same pods as istiod's resources (by resource name): each a
    /// workload of uid `Kubernetes//Pod/lab/<name>`, HEALTHY when ready
    /// and not terminating (istiod: UNHEALTHY when not ready or being
    /// deleted), a server pod naming the Service whatever its status; and
    /// the Service.
    fn resources(&self) -> Vec<(String, bytes::Bytes)> {
        let mut out: Vec<(String, bytes::Bytes)> = self
            .entries()
            .iter()
            .map(|e| {
                let healthy = e.ready && e.state == OldState::Running;
                (
                    istio_uid(&e.name),
                    super::xds_feed::workload(
                        &istio_uid(&e.name),
                        &e.name,
                        &e.service_account,
                        e.ip.parse().expect("lab pod IPs are addresses"),
                        e.node,
                        e.server,
                        healthy,
                    ),
                )
            })
            .collect();
        out.push(super::xds_feed::service(
            self.vip.parse().expect("the VIP is an address"),
        ));
        out
    }

    /// The uid the gateways know pod `pod_uid` (named `name`) by: the
    /// pod's own in the workload files, istiod's form through xDS.
    pub fn workload_uid(&self, pod_uid: &str, name: &str) -> String {
        match self.sink {
            Sink::Files(_) => pod_uid.to_owned(),
            Sink::Xds(_) => istio_uid(name),
        }
    }

    /// Tells every gateway: rewrites each node's file (replaced
    /// atomically), or pushes what changed through the xDS double (`what`
    /// names the step in the report).
    fn publish(&mut self, what: &str) -> Result<(), LabError> {
        match &self.sink {
            Sink::Files(files) => {
                let text = self.text();
                for path in files {
                    let tmp = path.with_extension("tmp");
                    std::fs::write(&tmp, &text)
                        .and_then(|()| std::fs::rename(&tmp, path))
                        .map_err(|e| LabError::Setup(format!("write {}: {e}", path.display())))?;
                }
            }
            Sink::Xds(_) => {
                let resources = self.resources();
                if let Sink::Xds(feed) = &mut self.sink {
                    feed.apply(resources, what);
                }
            }
        }
        Ok(())
    }

    /// The first listing, before the gateways start.
    pub fn write(&mut self) -> Result<(), LabError> {
        self.publish("initial")
    }

    /// `--source istio`: the double feeding the gateways.
    pub fn feed(&mut self) -> Option<&mut XdsFeed> {
        match &mut self.sink {
            Sink::Files(_) => None,
            Sink::Xds(feed) => Some(feed),
        }
    }

    pub fn terminate_old(&mut self, deadline_unix_ms: u128) -> Result<(), LabError> {
        self.old_state = OldState::Terminating(deadline_unix_ms);
        self.publish("old pod terminating")
    }

    pub fn delete_old(&mut self) -> Result<(), LabError> {
        self.old_state = OldState::Deleted;
        self.publish("old pod deleted")
    }

    /// A replica listed at `ip`, ready (an endpoint of the Service) or
    /// not yet.
    pub fn add_replica(
        &mut self,
        pod: Pod,
        ip: std::net::IpAddr,
        ready: bool,
    ) -> Result<(), LabError> {
        self.replicas_mut().push(Replica {
            pod,
            ip: ip.to_string(),
            state: OldState::Running,
            ready,
        });
        let what = if ready { "listed ready" } else { "listed" };
        self.publish(&format!("{} {what}", replica_name(pod)))
    }

    /// A replica turned ready: it joins the Service's endpoints.
    pub fn ready_replica(&mut self, pod: Pod) -> Result<(), LabError> {
        if let Some(r) = self.replicas_mut().iter_mut().find(|r| r.pod == pod) {
            r.ready = true;
        }
        self.publish(&format!("{} ready", replica_name(pod)))
    }

    /// A replica terminating (its deletion deadline in unix ms).
    pub fn terminate_replica(&mut self, pod: Pod, deadline_unix_ms: u128) -> Result<(), LabError> {
        self.set_replica(pod, OldState::Terminating(deadline_unix_ms))
    }

    /// A replica deleted: gone from the files.
    pub fn delete_replica(&mut self, pod: Pod) -> Result<(), LabError> {
        self.set_replica(pod, OldState::Deleted)?;
        self.replicas_mut().retain(|r| r.state != OldState::Deleted);
        Ok(())
    }

    fn set_replica(&mut self, pod: Pod, state: OldState) -> Result<(), LabError> {
        if let Some(r) = self.replicas_mut().iter_mut().find(|r| r.pod == pod) {
            r.state = state;
        }
        let what = match state {
            OldState::Running => "running",
            OldState::Terminating(_) => "terminating",
            OldState::Deleted => "deleted",
        };
        self.publish(&format!("{} {what}", replica_name(pod)))
    }

    fn replicas_mut(&mut self) -> &mut Vec<Replica> {
        self.replicas
            .as_mut()
            .expect("Workloads::for_rollout before the replicas")
    }

    pub fn add_reuse(&mut self) -> Result<(), LabError> {
        self.reuse = true;
        self.publish("new pod at the old IP")
    }
}
