//! How pods are handed over: `tidegate-cni` over the CNI socket (mesh
//! members only, decided by the workload source) and istio-cni over ZDS
//! (the node agent decides; its snapshot removes the pods it no longer
//! names).

use std::os::fd::OwnedFd;

use futures::future::BoxFuture;
use tracing::info;

use super::{PodError, PodMeta, PodProxies};
use crate::drains::cni::{Handed, HandedPod, PodHandover};
use crate::drains::{PodKey, Trigger};
use tidegate_zds as zds;

impl PodProxies {
    /// `tidegate-cni` ADD: whether the pod is a mesh member, from the
    /// workload source ([`crate::workloads::membership`]). A pod served
    /// already (a repeated ADD, a re-created sandbox) is served again
    /// whatever its labels say now: its capture rules are in.
    async fn member(&self, pod: &HandedPod) -> Result<Option<&'static str>, String> {
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
                Err(format!(
                    "pod {}/{} (uid {}) is unknown to the gateway's workload source after \
                     capture.membership_wait ({} ms): its mesh membership cannot be decided yet \
                     (is discovery synced? /healthz/ready)",
                    pod.namespace,
                    pod.name,
                    pod.uid,
                    self.membership_wait.as_millis()
                ))
            }
        }
    }
}

impl PodHandover for PodProxies {
    fn add(&self, pod: HandedPod, netns: OwnedFd) -> BoxFuture<'_, Result<Handed, String>> {
        Box::pin(async move {
            if let Some(reason) = self.member(&pod).await? {
                return Ok(Handed::NotMember(reason));
            }
            let meta = PodMeta {
                uid: pod.uid,
                name: pod.name,
                namespace: pod.namespace,
                service_account: None,
                source: "cni",
            };
            PodProxies::add(self, meta, netns)
                .await
                .map(Handed::Served)
                .map_err(|e| e.to_string())
        })
    }

    fn remove(&self, uid: String) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            PodProxies::remove(self, &uid).await;
        })
    }
}

impl zds::PodSink for PodProxies {
    type Error = PodError;

    async fn add(&self, pod: zds::Pod, netns: OwnedFd) -> Result<(), PodError> {
        let key = (pod.uid.clone(), pod.namespace.clone(), pod.name.clone());
        let meta = PodMeta {
            uid: pod.uid,
            name: pod.name,
            namespace: pod.namespace,
            service_account: Some(pod.service_account).filter(|s| !s.is_empty()),
            source: "zds",
        };
        PodProxies::add(self, meta, netns).await?;
        self.drains.pod_handed_over(&PodKey {
            uid: &key.0,
            namespace: &key.1,
            name: &key.2,
        });
        Ok(())
    }

    async fn keep(&self, uid: &str) -> Result<(), PodError> {
        // Served already (a gateway restart re-adopts nothing from ZDS: the
        // agent re-sends an add for each pod it can re-open), or not: either
        // way there is nothing to open.
        if !self.served.lock().await.by_uid.contains_key(uid) {
            info!(uid, "ZDS keeps a pod this gateway does not serve");
        }
        Ok(())
    }

    async fn del(&self, uid: &str) -> Result<(), PodError> {
        self.teardown(uid, Trigger::Zds).await;
        Ok(())
    }

    async fn snapshot_done(&self, snapshot: &zds::Snapshot) -> Result<(), PodError> {
        // Pods handed over by ZDS only: tidegate-cni's are not the agent's.
        let from_zds: Vec<String> = self
            .served
            .lock()
            .await
            .by_uid
            .iter()
            .filter(|(_, s)| s.source == "zds")
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in from_zds {
            if !snapshot.named.contains(&uid) {
                info!(uid = %uid, "pod not in the node agent's snapshot; removing");
                self.teardown(&uid, Trigger::Zds).await;
            }
        }
        Ok(())
    }
}
