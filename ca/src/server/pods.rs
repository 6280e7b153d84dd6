//! The pods the CA sees, for the node authorizer: a watch of every pod not
//! in phase `Failed` (istiod's `saNode` index), kept as name → facts and
//! (node, namespace, service account) → count. A re-list builds a new
//! index and swaps it in whole.

use std::collections::HashMap;
use std::sync::RwLock;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::sync::watch;
use tracing::warn;

use crate::impersonation::{PodFacts, Pods};
use tidegate_base::shutdown::ShutdownWatch;
use tidegate_base::sync::ReadWriteLocked;

#[derive(Default)]
struct Index {
    by_name: HashMap<(String, String), PodFacts>,
    on_node: HashMap<(String, String, String), usize>,
}

impl Index {
    fn add(&mut self, pod: &Pod) {
        let Some((key, facts)) = facts_of(pod) else {
            return;
        };
        self.remove(&key);
        *self
            .on_node
            .entry((
                facts.node.clone(),
                key.0.clone(),
                facts.service_account.clone(),
            ))
            .or_default() += 1;
        self.by_name.insert(key, facts);
    }

    fn remove(&mut self, key: &(String, String)) {
        if let Some(old) = self.by_name.remove(key) {
            let k = (old.node, key.0.clone(), old.service_account);
            if let Some(n) = self.on_node.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.on_node.remove(&k);
                }
            }
        }
    }
}

fn facts_of(pod: &Pod) -> Option<((String, String), PodFacts)> {
    let m = &pod.metadata;
    let spec = pod.spec.as_ref()?;
    Some((
        (m.namespace.clone()?, m.name.clone()?),
        PodFacts {
            uid: m.uid.clone()?,
            service_account: spec
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".into()),
            // A pod not yet scheduled runs on no node.
            node: spec.node_name.clone().unwrap_or_default(),
        },
    ))
}

#[derive(Default)]
pub struct PodIndex {
    index: RwLock<Index>,
}

impl Pods for PodIndex {
    fn get(&self, namespace: &str, name: &str) -> Option<PodFacts> {
        let i = self.index.read_locked();
        i.by_name
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    fn any_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        !node.is_empty()
            && self.index.read_locked().on_node.contains_key(&(
                node.to_owned(),
                namespace.to_owned(),
                service_account.to_owned(),
            ))
    }
}

impl PodIndex {
    /// Follows the pods until drained; `synced` turns true after the first list.
    pub async fn follow(
        &self,
        client: kube::Client,
        synced: watch::Sender<bool>,
        mut drain: ShutdownWatch,
    ) {
        let pods: Api<Pod> = Api::all(client);
        let cfg = watcher::Config::default().fields("status.phase!=Failed");
        let mut stream = std::pin::pin!(watcher::watcher(pods, cfg).default_backoff());
        let mut pending: Option<Index> = None;
        loop {
            let ev = tokio::select! {
                ev = stream.next() => ev,
                _ = drain.signaled() => return,
            };
            match ev {
                None => return,
                Some(Err(e)) => warn!(error = %e, "pod watch failed; retrying"),
                Some(Ok(Event::Init)) => pending = Some(Index::default()),
                Some(Ok(Event::InitApply(p))) => {
                    if let Some(i) = pending.as_mut() {
                        i.add(&p);
                    }
                }
                Some(Ok(Event::InitDone)) => {
                    if let Some(i) = pending.take() {
                        *self.index.write_locked() = i;
                    }
                    synced.send_replace(true);
                }
                Some(Ok(Event::Apply(p))) => self.index.write_locked().add(&p),
                Some(Ok(Event::Delete(p))) => {
                    if let Some((key, _)) = facts_of(&p) {
                        self.index.write_locked().remove(&key);
                    }
                }
            }
        }
    }
}
