//! istio-cni's ZDS as a way pods come in: the `tidegate-zds` client's
//! [`PodSink`] over a [`PodIntake`]. Any node agent speaking ZDS (Cilium's
//! agent does) comes in here; the client acks each request with what the
//! intake answered.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use tidegate_zds::{Pod, PodSink, Snapshot};
use tracing::info;

use super::{PodIntake, Removal, Source, Taken};
use crate::inpod::pods::{PodError, PodMeta};

/// The pods a ZDS client hands over, into `I`.
pub struct ZdsIntake<I>(pub Arc<I>);

impl<I: PodIntake> PodSink for ZdsIntake<I> {
    type Error = PodError;

    async fn add(&self, pod: Pod, netns: OwnedFd) -> Result<(), PodError> {
        let uid = pod.uid.clone();
        let meta = PodMeta {
            uid: pod.uid,
            name: pod.name,
            namespace: pod.namespace,
            service_account: Some(pod.service_account).filter(|s| !s.is_empty()),
            source: Source::Zds,
        };
        match self.0.add(meta, netns).await {
            Taken::Served(_) => Ok(()),
            // The node agent decides membership: not asked of the intake.
            Taken::NotMember(reason) => Err(PodError::NotMember { uid, reason }),
            Taken::Failed(e) => Err(e),
        }
    }

    async fn keep(&self, uid: &str) -> Result<(), PodError> {
        // Served already (a gateway restart re-adopts nothing from ZDS: the
        // agent re-sends an add for each pod it can re-open), or not: either
        // way there is nothing to open.
        if !self.0.keep(uid).await {
            info!(uid, "ZDS keeps a pod this gateway does not serve");
        }
        Ok(())
    }

    async fn del(&self, uid: &str) -> Result<(), PodError> {
        self.0
            .remove(uid, Removal::Drain(Source::Zds.trigger()))
            .await;
        Ok(())
    }

    async fn snapshot_done(&self, snapshot: &Snapshot) -> Result<(), PodError> {
        // Pods handed over by ZDS only: tidegate-cni's are not the agent's.
        self.0.reconcile(Source::Zds, &snapshot.named).await;
        Ok(())
    }
}
