//! The YAML workload file: the embedded default for local runs, watched and
//! reloaded. A file that fails to parse leaves the previous set in place.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tracing::{info, warn};

use super::{WorkloadSpec, WorkloadStore};
use crate::shutdown::ShutdownWatch;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    #[serde(default)]
    pub workloads: Vec<WorkloadSpec>,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkloadFileError {
    #[error("cannot read workload file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("workload file key `{key}`: {message}")]
    Invalid { key: String, message: String },
}

/// Parses and validates a workload file's text.
pub fn parse_workload_file(text: &str) -> Result<Vec<WorkloadSpec>, WorkloadFileError> {
    let de = serde_yaml::Deserializer::from_str(text);
    let file: WorkloadFile =
        serde_path_to_error::deserialize(de).map_err(|e| WorkloadFileError::Invalid {
            key: e.path().to_string(),
            message: e.into_inner().to_string(),
        })?;
    let mut uids = HashSet::new();
    let mut ips = HashSet::new();
    for (i, w) in file.workloads.iter().enumerate() {
        let key = |field: &str| format!("workloads[{i}].{field}");
        let bad = |field: &str, message: String| WorkloadFileError::Invalid {
            key: key(field),
            message,
        };
        if w.uid.is_empty() {
            return Err(bad("uid", "must not be empty".into()));
        }
        if !uids.insert(w.uid.clone()) {
            return Err(bad("uid", format!("duplicate uid {:?}", w.uid)));
        }
        if w.ips.is_empty() {
            return Err(bad("ips", "at least one IP is required".into()));
        }
        for ip in &w.ips {
            if !ips.insert(*ip) {
                return Err(bad("ips", format!("IP {ip} is used by two workloads")));
            }
        }
        let id = format!("spiffe://x/ns/{}/sa/{}", w.namespace, w.service_account);
        if let Err(e) = id.parse::<crate::identity::SpiffeId>() {
            return Err(bad("namespace", e.to_string()));
        }
    }
    Ok(file.workloads)
}

/// Watches a workload file and republishes the store when its content changes.
///
/// Polling (rather than inotify) is deliberate: Kubernetes ConfigMap volumes
/// swap a symlink atomically, which inotify watchers on the file miss.
pub struct WorkloadFileWatcher {
    path: PathBuf,
    interval: Duration,
    store: Arc<WorkloadStore>,
    last: Option<String>,
}

impl WorkloadFileWatcher {
    /// Loads the file once; an invalid file at start-up is an error.
    pub fn start(
        path: &Path,
        interval: Duration,
        store: Arc<WorkloadStore>,
    ) -> Result<Self, WorkloadFileError> {
        let text = read(path)?;
        store.publish(parse_workload_file(&text)?);
        Ok(WorkloadFileWatcher {
            path: path.to_owned(),
            interval,
            store,
            last: Some(text),
        })
    }

    /// Polls until the drain signal fires.
    pub async fn run(mut self, mut drain: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.poll_once(),
                _ = drain.signaled() => return,
            }
        }
    }

    fn poll_once(&mut self) {
        let text = match read(&self.path) {
            Ok(t) => t,
            Err(e) => {
                warn!(error = %e, "workload file unreadable; keeping the previous workloads");
                return;
            }
        };
        if self.last.as_deref() == Some(text.as_str()) {
            return;
        }
        match parse_workload_file(&text) {
            Ok(specs) => {
                info!(path = %self.path.display(), workloads = specs.len(), "workload file reloaded");
                self.store.publish(specs);
            }
            Err(e) => warn!(error = %e, "workload file rejected; keeping the previous workloads"),
        }
        self.last = Some(text);
    }
}

fn read(path: &Path) -> Result<String, WorkloadFileError> {
    std::fs::read_to_string(path).map_err(|source| WorkloadFileError::Read {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_entry() {
        let e = parse_workload_file(
            "workloads:\n- {uid: a, name: a, ips: [10.0.0.1], node: n}\n- {uid: a, name: b, ips: [10.0.0.2], node: n}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("workloads[1].uid") && e.contains("duplicate"),
            "{e}"
        );
        let e = parse_workload_file("workloads:\n- {uid: a, name: a, ips: [not-an-ip], node: n}\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("workloads[0].ips[0]"), "{e}");
        let e = parse_workload_file(
            "workloads:\n- {uid: a, name: a, ips: [10.0.0.1], node: n}\n- {uid: b, name: b, ips: [10.0.0.1], node: n}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("workloads[1].ips") && e.contains("10.0.0.1"),
            "{e}"
        );
    }

    #[test]
    fn store_indexes_by_ip_and_marks_local() {
        let store = WorkloadStore::new("td", "n1");
        store.publish(
            parse_workload_file(
                "workloads:\n- {uid: a, name: a, namespace: ns, service_account: sa, ips: [10.0.0.1], node: n1}\n- {uid: b, name: b, ips: [10.0.0.2], node: n2, protocol: TCP}\n",
            )
            .unwrap(),
        );
        let snap = store.snapshot();
        let a = snap.by_ip("10.0.0.1".parse().unwrap()).unwrap();
        assert!(a.local);
        assert_eq!(a.identity.to_string(), "spiffe://td/ns/ns/sa/sa");
        let b = snap.by_uid("b").unwrap();
        assert!(!b.local);
        assert_eq!(b.spec.protocol, super::super::Protocol::Tcp);
    }

    #[test]
    fn reload_keeps_previous_set_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.yaml");
        std::fs::write(
            &path,
            "workloads:\n- {uid: a, name: a, ips: [10.0.0.1], node: n}\n",
        )
        .unwrap();
        let store = WorkloadStore::new("td", "n");
        let mut w =
            WorkloadFileWatcher::start(&path, Duration::from_millis(10), store.clone()).unwrap();
        std::fs::write(&path, "workloads: [oops").unwrap();
        w.poll_once();
        assert!(
            store.snapshot().by_uid("a").is_some(),
            "a bad file must not drop workloads"
        );
        std::fs::write(
            &path,
            "workloads:\n- {uid: b, name: b, ips: [10.0.0.2], node: n}\n",
        )
        .unwrap();
        w.poll_once();
        let snap = store.snapshot();
        assert!(snap.by_uid("b").is_some() && snap.by_uid("a").is_none());
    }

    #[tokio::test]
    async fn watcher_task_publishes_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.yaml");
        std::fs::write(
            &path,
            "workloads:\n- {uid: a, name: a, ips: [10.0.0.1], node: n}\n",
        )
        .unwrap();
        let store = WorkloadStore::new("td", "n");
        let mut changes = store.subscribe();
        let (trigger, watch) = crate::shutdown::channel();
        let w =
            WorkloadFileWatcher::start(&path, Duration::from_millis(10), store.clone()).unwrap();
        changes.borrow_and_update();
        let task = tokio::spawn(w.run(watch));
        std::fs::write(
            &path,
            "workloads:\n- {uid: b, name: b, ips: [10.0.0.2], node: n}\n",
        )
        .unwrap();
        changes.changed().await.unwrap();
        assert!(store.snapshot().by_uid("b").is_some());
        trigger.start(Duration::from_secs(1));
        task.await.unwrap();
    }
}
