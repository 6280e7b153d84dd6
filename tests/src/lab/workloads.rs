//! The workload files every gateway watches: the same pod list on each node
//! (a pod is local where `node` names the gateway's node), rewritten
//! atomically at each lifecycle step. A pod set `terminating` starts
//! shutting down on its node and raises peer-terminating elsewhere; a pod
//! removed from the files is deleted (peer-deleted elsewhere). The server
//! pods are the endpoints of Service `lab/server` ([`Workloads::vip`]): the
//! old pod and its replacement, or in `rollout` the replicas alone.

use std::path::PathBuf;

use super::topology::{Pod, Topology};
use super::LabError;

pub const OLD_UID: &str = "lab-server-old";
pub const REPLACEMENT_UID: &str = "lab-server-new";
pub const REUSE_UID: &str = "lab-server-reuse";

/// The Service's VIP: `10.x.9.10`, routed like any address out of the
/// client pod, so gateway A captures it.
pub fn vip(t: &Topology) -> std::net::Ipv4Addr {
    t.addr(9, 10)
}

/// The pods the files list, and where each is in its lifecycle.
pub struct Workloads {
    pub files: Vec<PathBuf>,
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
    pub fn new(t: &Topology, files: Vec<PathBuf>, policy: &str, different_sa: bool) -> Workloads {
        Workloads {
            files,
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

    /// A server pod, an endpoint of the Service.
    fn server(&self, uid: &str, name: &str, sa: &str, ip: &str, node: &str, extra: &str) -> String {
        self.pod(
            uid,
            name,
            sa,
            ip,
            node,
            &format!(", services: [server]{extra}"),
        )
    }

    /// A server pod, in no Service unless `extra` says so.
    fn pod(&self, uid: &str, name: &str, sa: &str, ip: &str, node: &str, extra: &str) -> String {
        format!(
            "- {{uid: {uid}, name: {name}, namespace: lab, service_account: {sa}, ips: [{ip}], \
             node: {node}, labels: {{app: server}}, \
             annotations: {{tidegate.io/drain-policy: {}}}{extra}}}\n",
            self.policy
        )
    }

    fn text(&self) -> String {
        let mut s = format!(
            "workloads:\n- {{uid: lab-client, name: client, namespace: lab, service_account: client, \
             ips: [{}], node: node-a, labels: {{app: client}}}}\n",
            self.client
        );
        if let Some(replicas) = &self.replicas {
            for r in replicas {
                let (uid, name) = (replica_uid(r.pod), replica_name(r.pod));
                match r.state {
                    OldState::Running if !r.ready => {
                        s.push_str(&self.pod(&uid, &name, "server", &r.ip, "node-b", ""))
                    }
                    OldState::Running => {
                        s.push_str(&self.server(&uid, &name, "server", &r.ip, "node-b", ""))
                    }
                    OldState::Terminating(deadline) => s.push_str(&self.server(
                        &uid,
                        &name,
                        "server",
                        &r.ip,
                        "node-b",
                        &format!(", state: terminating, deletion_deadline_unix_ms: {deadline}"),
                    )),
                    OldState::Deleted => {}
                }
            }
            return s + &self.services();
        }
        match self.old_state {
            OldState::Running => {
                s.push_str(&self.server(OLD_UID, "server-old", "server", &self.old, "node-b", ""))
            }
            OldState::Terminating(deadline) => s.push_str(&self.server(
                OLD_UID,
                "server-old",
                "server",
                &self.old,
                "node-b",
                &format!(", state: terminating, deletion_deadline_unix_ms: {deadline}"),
            )),
            OldState::Deleted => {}
        }
        s.push_str(&self.server(
            REPLACEMENT_UID,
            "server-new",
            self.replacement_sa,
            &self.replacement,
            "node-c",
            "",
        ));
        if self.reuse {
            s.push_str(&self.server(REUSE_UID, "server-reuse", "server", &self.old, "node-b", ""));
        }
        s + &self.services()
    }

    fn services(&self) -> String {
        format!(
            "services:\n- {{name: server, namespace: lab, vips: [{}], ports: [{{port: {p}, target_port: {p}}}]}}\n",
            self.vip,
            p = super::app_server::APP_PORT
        )
    }

    /// Writes every node's file (each replaced atomically).
    pub fn write(&self) -> Result<(), LabError> {
        let text = self.text();
        for path in &self.files {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, &text)
                .and_then(|()| std::fs::rename(&tmp, path))
                .map_err(|e| LabError::Setup(format!("write {}: {e}", path.display())))?;
        }
        Ok(())
    }

    pub fn terminate_old(&mut self, deadline_unix_ms: u128) -> Result<(), LabError> {
        self.old_state = OldState::Terminating(deadline_unix_ms);
        self.write()
    }

    pub fn delete_old(&mut self) -> Result<(), LabError> {
        self.old_state = OldState::Deleted;
        self.write()
    }

    /// A replica listed at `ip`, ready (an endpoint of the Service) or
    /// not yet.
    pub fn add_replica(
        &mut self,
        pod: Pod,
        ip: std::net::Ipv4Addr,
        ready: bool,
    ) -> Result<(), LabError> {
        self.replicas_mut().push(Replica {
            pod,
            ip: ip.to_string(),
            state: OldState::Running,
            ready,
        });
        self.write()
    }

    /// A replica turned ready: it joins the Service's endpoints.
    pub fn ready_replica(&mut self, pod: Pod) -> Result<(), LabError> {
        if let Some(r) = self.replicas_mut().iter_mut().find(|r| r.pod == pod) {
            r.ready = true;
        }
        self.write()
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
        self.write()
    }

    fn replicas_mut(&mut self) -> &mut Vec<Replica> {
        self.replicas
            .as_mut()
            .expect("Workloads::for_rollout before the replicas")
    }

    pub fn add_reuse(&mut self) -> Result<(), LabError> {
        self.reuse = true;
        self.write()
    }
}
