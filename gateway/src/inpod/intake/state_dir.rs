//! The state directory as a way pods come in: at start a restarted gateway
//! re-adopts every pod `tidegate-cni` recorded
//! ([`tidegate_netns::pod_records`]) whose namespace still exists, without
//! a new ADD.

use std::path::Path;

use tidegate_netns::pod_records::PodRecord;
use tracing::{info, warn};

use super::{PodIntake, Source, Taken};
use crate::inpod::pods::PodMeta;
use tidegate_netns::namespace::open_nonblocking;

/// Hands every pod recorded in `dir` to `pods`; the number served. A record
/// whose namespace is gone is removed: its pod is gone too.
pub async fn adopt<I: PodIntake>(pods: &I, dir: &Path) -> usize {
    let mut adopted = 0;
    for (path, record) in PodRecord::read_all(dir) {
        let record = match record {
            Ok(r) => r,
            Err(e) => {
                warn!(file = %path.display(), error = %e, "pod record unreadable; skipped");
                continue;
            }
        };
        let fd = match open_nonblocking(Path::new(&record.netns)) {
            Ok(fd) => fd,
            Err(e) => {
                info!(uid = %record.uid, netns = %record.netns, error = %e,
                    "recorded pod's namespace is gone; record removed");
                let _ = std::fs::remove_file(&path);
                continue;
            }
        };
        let meta = PodMeta {
            uid: record.uid.clone(),
            name: record.name,
            namespace: record.namespace,
            service_account: None,
            source: Source::StateDir,
        };
        match pods.add(meta, fd).await {
            Taken::Served(_) => adopted += 1,
            Taken::NotMember(reason) => {
                warn!(uid = %record.uid, reason, "recorded pod not re-adopted: not a mesh member")
            }
            Taken::Failed(e) => warn!(uid = %record.uid, error = %e, "recorded pod not re-adopted"),
        }
    }
    adopted
}
