//! The per-pod proxies as the one pod intake: a `tidegate-cni` pod is
//! served if it is a mesh member (decided by the workload source), a node
//! agent's (ZDS) or a re-adopted one as handed over; a snapshot removes the
//! pods of its source it no longer names.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;

use tracing::info;

use super::{PodError, PodMeta, PodProxies};
use crate::drains::PodKey;
use crate::inpod::intake::{PodIntake, Removal, Source, Taken};

impl PodProxies {
    /// `tidegate-cni` ADD: whether the pod is a mesh member, from the
    /// workload source ([`crate::workloads::membership`]): `Some(why not)`
    /// when it is not. A pod served already (a repeated ADD, a re-created
    /// sandbox) is served again whatever its labels say now: its capture
    /// rules are in.
    async fn member(&self, pod: &PodMeta) -> Result<Option<&'static str>, PodError> {
        if self.served.lock().await.by_uid.contains_key(&pod.uid) {
            return Ok(None);
        }
        match self
            .workloads
            .membership(&pod.uid, self.membership_wait)
            .await
        {
            Some(m) if m.member => Ok(None),
            Some(m) => {
                self.metrics.add("not_member");
                Ok(Some(m.reason.describe()))
            }
            None => {
                self.metrics.add("membership_unknown");
                Err(PodError::MembershipUnknown {
                    uid: pod.uid.clone(),
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    wait_ms: self.membership_wait.as_millis(),
                })
            }
        }
    }
}

impl PodIntake for PodProxies {
    async fn add(&self, pod: PodMeta, netns: OwnedFd) -> Taken {
        if pod.source.gateway_decides_membership() {
            match self.member(&pod).await {
                Ok(None) => {}
                Ok(Some(reason)) => return Taken::NotMember(reason),
                Err(e) => return Taken::Failed(e),
            }
        }
        let (uid, namespace, name) = (pod.uid.clone(), pod.namespace.clone(), pod.name.clone());
        match self.serve(pod, netns).await {
            Ok(result) => {
                self.drains.pod_handed_over(&PodKey {
                    uid: &uid,
                    namespace: &namespace,
                    name: &name,
                });
                Taken::Served(result)
            }
            Err(e) => Taken::Failed(e),
        }
    }

    async fn keep(&self, uid: &str) -> bool {
        self.served.lock().await.by_uid.contains_key(uid)
    }

    async fn remove(&self, uid: &str, how: Removal<'_>) {
        match how {
            Removal::Drained { namespace, name } => {
                self.drains.pod_taken_back(&PodKey {
                    uid,
                    namespace,
                    name,
                });
                self.close(uid).await;
            }
            Removal::Drain(trigger) => self.teardown(uid, trigger).await,
        }
    }

    async fn reconcile(&self, source: Source, named: &BTreeSet<String>) {
        let from_source: Vec<String> = self
            .served
            .lock()
            .await
            .by_uid
            .iter()
            .filter(|(_, s)| s.source == source)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in from_source {
            if !named.contains(&uid) {
                info!(uid = %uid, "pod not in the node agent's snapshot; removing");
                self.teardown(&uid, source.trigger()).await;
            }
        }
    }
}
