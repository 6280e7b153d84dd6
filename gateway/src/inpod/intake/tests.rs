//! The intake's adapters over a recording double: each source's requests
//! become the one intake's calls, and its answers the source's.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use tidegate_base::sync::Locked;
use tidegate_netns::pod_records::PodRecord;
use tidegate_zds::PodSink;

use super::zds::ZdsIntake;
use super::{state_dir, PodIntake, Removal, Source, Taken};
use crate::inpod::pods::{PodError, PodMeta};

/// Records every call; answers `add` with `NotMember` for uid `outsider`.
#[derive(Default)]
struct Recorder(Mutex<Vec<String>>);

impl Recorder {
    fn calls(&self) -> Vec<String> {
        self.0.locked().clone()
    }
}

impl PodIntake for Recorder {
    async fn add(&self, pod: PodMeta, _netns: OwnedFd) -> Taken {
        let sa = pod.service_account.as_deref().unwrap_or("-");
        let call = format!("add {} {} {sa}", pod.uid, pod.source.label());
        self.0.locked().push(call);
        match pod.uid.as_str() {
            "outsider" => Taken::NotMember("not in the mesh"),
            _ => Taken::Served("added"),
        }
    }

    async fn keep(&self, uid: &str) -> bool {
        self.0.locked().push(format!("keep {uid}"));
        false
    }

    async fn remove(&self, uid: &str, how: Removal<'_>) {
        self.0.locked().push(format!("remove {uid} {how:?}"));
    }

    async fn reconcile(&self, source: Source, named: &BTreeSet<String>) {
        let call = format!("reconcile {} {named:?}", source.label());
        self.0.locked().push(call);
    }
}

fn a_namespace() -> OwnedFd {
    OwnedFd::from(std::fs::File::open("/proc/self/ns/net").unwrap())
}

#[tokio::test]
async fn zds_requests_are_the_intakes_calls_and_its_answers_the_acks() {
    let pods = Arc::new(Recorder::default());
    let zds = ZdsIntake(pods.clone());
    let pod = |uid: &str, sa: &str| tidegate_zds::Pod {
        uid: uid.into(),
        name: "web".into(),
        namespace: "demo".into(),
        service_account: sa.into(),
    };
    zds.add(pod("a", "web-sa"), a_namespace()).await.unwrap();
    zds.add(pod("b", ""), a_namespace()).await.unwrap();
    let nack = zds.add(pod("outsider", ""), a_namespace()).await;
    assert!(
        matches!(&nack, Err(PodError::NotMember { uid, .. }) if uid == "outsider"),
        "{nack:?}"
    );
    zds.keep("a").await.unwrap();
    zds.del("b").await.unwrap();
    let snapshot = tidegate_zds::Snapshot {
        named: ["a".to_owned()].into(),
        gone: ["b".to_owned()].into(),
    };
    zds.snapshot_done(&snapshot).await.unwrap();
    assert_eq!(
        pods.calls(),
        [
            "add a zds web-sa",
            "add b zds -",
            "add outsider zds -",
            "keep a",
            "remove b Drain(Zds)",
            "reconcile zds {\"a\"}",
        ]
    );
}

#[tokio::test]
async fn the_state_directory_hands_over_live_records_and_removes_dead_ones() {
    let dir = tempfile::tempdir().unwrap();
    let record = |uid: &str, netns: &str| PodRecord {
        uid: uid.into(),
        name: uid.into(),
        namespace: "demo".into(),
        netns: netns.into(),
        ips: Vec::new(),
    };
    record("alive", "/proc/self/ns/net")
        .write(dir.path())
        .unwrap();
    record("gone", "/run/netns/no-such-pod")
        .write(dir.path())
        .unwrap();
    let pods = Recorder::default();
    assert_eq!(state_dir::adopt(&pods, dir.path()).await, 1);
    assert_eq!(pods.calls(), ["add alive state-dir -"]);
    assert!(PodRecord::path(dir.path(), "alive").unwrap().exists());
    assert!(!PodRecord::path(dir.path(), "gone").unwrap().exists());
}
