//! The YAML workload file: the embedded default for local runs, watched and
//! reloaded. A file that fails to parse leaves the previous set in place.
//!
//! An empty (or whitespace- or comment-only) file, or one without a
//! `workloads:` key, is refused: it is what a file being rewritten in place
//! looks like half-way, and taking it as "no workloads" drained every pod.
//! An empty set says `workloads: []`. A change is applied only once two reads
//! a short settle time apart agree; writers should still replace the file
//! atomically (write a temporary file beside it, then rename it over).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use tracing::{info, warn};

use super::services::{ServiceSpec, TargetPort};
use super::{WorkloadSpec, WorkloadStore};
use tidegate_base::shutdown::ShutdownWatch;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    /// Required (`None`: the key is missing); `workloads: []` or an empty
    /// value (`Some(None)`) is the empty set.
    #[serde(default, deserialize_with = "present")]
    pub workloads: Option<Option<Vec<WorkloadSpec>>>,
    /// Optional: Services (VIPs and ports); workloads join them by name.
    #[serde(default)]
    pub services: Vec<ServiceSpec>,
    /// Optional: authorization policies (Istio's L4 AuthorizationPolicy as
    /// istiod sends it); workloads name their WORKLOAD_SELECTOR ones.
    #[serde(default)]
    pub authorization: Vec<tidegate_authz::Policy>,
}

/// A key that is present, even with an empty value (then `Some(None)`).
fn present<'de, D, T>(de: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(de).map(Some)
}

/// Why a text that is not a valid workload file is an empty one: only
/// comments, or no `workloads:` key (what a file rewritten in place looks
/// like half-way). `None`: it is something else (then invalid).
fn empty_reason(text: &str) -> Option<WorkloadFileError> {
    match serde_yaml::from_str::<serde_yaml::Value>(text) {
        Ok(serde_yaml::Value::Null) => Some(WorkloadFileError::Empty("holds only comments")),
        Ok(serde_yaml::Value::Mapping(m)) if !m.contains_key("workloads") => {
            Some(WorkloadFileError::Empty("has no `workloads:` key"))
        }
        _ => None,
    }
}

/// A workload file's content, validated.
#[derive(Clone, Debug, Default)]
pub struct Parsed {
    pub workloads: Vec<WorkloadSpec>,
    pub services: Vec<ServiceSpec>,
    pub policies: tidegate_authz::PolicyStore,
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
    #[error("the workload file {0}; a file being rewritten in place? An empty set must say `workloads: []`")]
    Empty(&'static str),
}

impl WorkloadFileError {
    /// The `reason` label of `tidegate_workload_file_rejected_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            WorkloadFileError::Read { .. } => "unreadable",
            WorkloadFileError::Invalid { .. } => "invalid",
            WorkloadFileError::Empty(_) => "empty",
        }
    }
}

/// Parses and validates a workload file's text: its workloads.
pub fn parse_workload_file(text: &str) -> Result<Vec<WorkloadSpec>, WorkloadFileError> {
    parse_file(text).map(|p| p.workloads)
}

/// Parses and validates a workload file's text: workloads and Services.
///
/// The text is parsed once, into the typed file; only a text that fails
/// that, or lacks `workloads:`, is parsed again (untyped) to tell an empty
/// file from an invalid one. A YAML value tree of a large file costs several
/// times the file's workloads, and parsing it first for every file doubled
/// the work and raised the peak of a reload.
pub fn parse_file(text: &str) -> Result<Parsed, WorkloadFileError> {
    if text.trim().is_empty() {
        return Err(WorkloadFileError::Empty("is empty"));
    }
    let de = serde_yaml::Deserializer::from_str(text);
    let file: WorkloadFile = match serde_path_to_error::deserialize(de) {
        Ok(file) => file,
        Err(e) => {
            return Err(
                empty_reason(text).unwrap_or_else(|| WorkloadFileError::Invalid {
                    key: e.path().to_string(),
                    message: e.into_inner().to_string(),
                }),
            )
        }
    };
    let Some(workloads) = file.workloads else {
        return Err(
            empty_reason(text).unwrap_or(WorkloadFileError::Empty("has no `workloads:` key"))
        );
    };
    let workloads = workloads.unwrap_or_default();
    let mut uids = HashSet::new();
    let mut ips = HashSet::new();
    for (i, w) in workloads.iter().enumerate() {
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
        if let Err(e) = id.parse::<tidegate_protocol::identity::SpiffeId>() {
            return Err(bad("namespace", e.to_string()));
        }
    }
    let services = file.services;
    check_services(&services, &workloads, &ips)?;
    let policies = super::file_authorization::check(file.authorization, &workloads)
        .map_err(|(key, message)| WorkloadFileError::Invalid { key, message })?;
    Ok(Parsed {
        workloads,
        services,
        policies,
    })
}

/// Services: a name, VIPs no workload uses, TCP ports once per VIP; every
/// Service a workload names exists.
fn check_services(
    services: &[ServiceSpec],
    workloads: &[WorkloadSpec],
    workload_ips: &HashSet<std::net::IpAddr>,
) -> Result<(), WorkloadFileError> {
    let mut keys = HashSet::new();
    let mut vip_ports = HashSet::new();
    for (i, svc) in services.iter().enumerate() {
        let bad = |field: &str, message: String| WorkloadFileError::Invalid {
            key: format!("services[{i}].{field}"),
            message,
        };
        if svc.name.is_empty() {
            return Err(bad("name", "must not be empty".into()));
        }
        if !keys.insert(svc.key()) {
            return Err(bad("name", format!("duplicate Service {}", svc.key())));
        }
        if svc.vips.is_empty() {
            return Err(bad("vips", "at least one VIP is required".into()));
        }
        if svc.ports.is_empty() {
            return Err(bad("ports", "at least one port is required".into()));
        }
        for vip in &svc.vips {
            if workload_ips.contains(vip) {
                return Err(bad("vips", format!("{vip} is a workload's IP")));
            }
        }
        for (j, p) in svc.ports.iter().enumerate() {
            let bad = |field: &str, message: String| WorkloadFileError::Invalid {
                key: format!("services[{i}].ports[{j}].{field}"),
                message,
            };
            if p.port == 0 {
                return Err(bad("port", "must not be 0".into()));
            }
            if p.protocol != "TCP" {
                return Err(bad(
                    "protocol",
                    format!("{:?}: only TCP is carried", p.protocol),
                ));
            }
            if let Some(TargetPort::Number(0)) = p.target_port {
                return Err(bad("target_port", "must not be 0".into()));
            }
            for vip in &svc.vips {
                if !vip_ports.insert((*vip, p.port)) {
                    return Err(bad(
                        "port",
                        format!("{vip}:{} belongs to two Services", p.port),
                    ));
                }
            }
        }
    }
    for (i, w) in workloads.iter().enumerate() {
        for (j, name) in w.services.iter().enumerate() {
            let key = match name.split_once('/') {
                Some(_) => name.clone(),
                None => format!("{}/{name}", w.namespace),
            };
            if !keys.contains(&key) {
                return Err(WorkloadFileError::Invalid {
                    key: format!("workloads[{i}].services[{j}]"),
                    message: format!("no Service {key} in the file's `services`"),
                });
            }
        }
    }
    Ok(())
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// `tidegate_workload_file_reloads_total` and
/// `tidegate_workload_file_rejected_total{reason}` (`empty`, `invalid`, `unreadable`).
#[derive(Clone, Debug, Default)]
pub struct WorkloadFileMetrics {
    reloads: Counter,
    rejected: Family<ReasonLabels, Counter>,
}

impl WorkloadFileMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = WorkloadFileMetrics::default();
        registry.register(
            "workload_file_reloads",
            "Workload file changes applied",
            m.reloads.clone(),
        );
        registry.register(
            "workload_file_rejected",
            "Workload file versions refused (the previous workloads stay), by reason",
            m.rejected.clone(),
        );
        m
    }

    fn rejected(&self, e: &WorkloadFileError) {
        self.rejected
            .get_or_create(&ReasonLabels { reason: e.reason() })
            .inc();
    }
}

/// A changed file is applied once two reads this far apart agree (or
/// `workloads.reload_interval`, if shorter).
pub const SETTLE: Duration = Duration::from_millis(200);

/// Watches a workload file and republishes the store when its content changes.
///
/// Polling (rather than inotify) is deliberate: Kubernetes ConfigMap volumes
/// swap a symlink atomically, which inotify watchers on the file miss.
pub struct WorkloadFileWatcher {
    path: PathBuf,
    interval: Duration,
    store: Arc<WorkloadStore>,
    metrics: WorkloadFileMetrics,
    /// The text last applied or refused.
    last: Option<String>,
    /// The last read failed (logged once, not on every tick).
    unreadable: bool,
}

impl WorkloadFileWatcher {
    /// Loads the file once; an invalid (or empty) file at start-up is an error.
    pub fn start(
        path: &Path,
        interval: Duration,
        store: Arc<WorkloadStore>,
        metrics: WorkloadFileMetrics,
    ) -> Result<Self, WorkloadFileError> {
        let text = read(path)?;
        let parsed = parse_file(&text)?;
        store.publish(parsed);
        Ok(WorkloadFileWatcher {
            path: path.to_owned(),
            interval,
            store,
            metrics,
            last: Some(text),
            unreadable: false,
        })
    }

    /// Polls until the drain signal fires. A change is applied once the file
    /// has been stable for the settle time: a truncate-then-write is not
    /// seen half-written.
    pub async fn run(mut self, mut drain: ShutdownWatch) {
        let settle = self.interval.min(SETTLE);
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = drain.signaled() => return,
            }
            let Some(text) = self.changed() else {
                continue;
            };
            match settled(text, settle, &mut drain, || self.read()).await {
                Settled::Stable(text) => self.apply(text),
                Settled::Unreadable => {}
                Settled::Drained => return,
            }
        }
    }

    /// The file's text if it differs from the last applied or refused one.
    fn changed(&mut self) -> Option<String> {
        let text = self.read()?;
        (self.last.as_deref() != Some(text.as_str())).then_some(text)
    }

    fn read(&mut self) -> Option<String> {
        match read(&self.path) {
            Ok(t) => {
                self.unreadable = false;
                Some(t)
            }
            Err(e) => {
                if !std::mem::replace(&mut self.unreadable, true) {
                    self.metrics.rejected(&e);
                    warn!(path = %self.path.display(), error = %e, "workload file unreadable; keeping the previous workloads");
                }
                None
            }
        }
    }

    fn apply(&mut self, text: String) {
        match parse_file(&text) {
            Ok(parsed) => {
                info!(path = %self.path.display(), workloads = parsed.workloads.len(),
                    services = parsed.services.len(), policies = parsed.policies.len(),
                    "workload file reloaded");
                self.metrics.reloads.inc();
                self.store.publish(parsed);
            }
            Err(e) => {
                self.metrics.rejected(&e);
                warn!(path = %self.path.display(), reason = e.reason(), error = %e, "workload file rejected; keeping the previous workloads");
            }
        }
        self.last = Some(text);
    }

    /// One poll without the settle time (unit tests).
    #[cfg(test)]
    fn poll_once(&mut self) {
        if let Some(text) = self.changed() {
            self.apply(text);
        }
    }
}

enum Settled {
    /// Two reads `settle` apart returned this.
    Stable(String),
    Unreadable,
    Drained,
}

/// Re-reads every `settle` until two consecutive reads agree.
async fn settled(
    mut text: String,
    settle: Duration,
    drain: &mut ShutdownWatch,
    mut read: impl FnMut() -> Option<String>,
) -> Settled {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(settle) => {}
            _ = drain.signaled() => return Settled::Drained,
        }
        match read() {
            Some(again) if again == text => return Settled::Stable(text),
            Some(again) => text = again,
            None => return Settled::Unreadable,
        }
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

    /// `w.yaml` in `dir` with one local workload `a`.
    fn one_workload_file(dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("w.yaml");
        std::fs::write(
            &path,
            "workloads:\n- {uid: a, name: a, ips: [10.0.0.1], node: n}\n",
        )
        .unwrap();
        path
    }

    #[test]
    fn reload_keeps_previous_set_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = one_workload_file(dir.path());
        let store = WorkloadStore::new("td", "n");
        let mut w = WorkloadFileWatcher::start(
            &path,
            Duration::from_millis(10),
            store.clone(),
            Default::default(),
        )
        .unwrap();
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
        let path = one_workload_file(dir.path());
        let store = WorkloadStore::new("td", "n");
        let mut changes = store.subscribe();
        let (trigger, watch) = tidegate_base::shutdown::channel();
        let w = WorkloadFileWatcher::start(
            &path,
            Duration::from_millis(10),
            store.clone(),
            Default::default(),
        )
        .unwrap();
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

    #[test]
    fn an_empty_file_is_refused_unless_it_says_so() {
        for text in [
            "",
            "  \n\t\n",
            "# nothing yet\n",
            "other: 1\n",
            "services: []\n",
        ] {
            let e = parse_workload_file(text).unwrap_err();
            assert_eq!(e.reason(), "empty", "{text:?}: {e}");
            assert!(e.to_string().contains("workloads: []"), "{e}");
        }
        assert_eq!(parse_workload_file("workloads: []\n").unwrap(), vec![]);
        assert_eq!(parse_workload_file("workloads:\n").unwrap(), vec![]);
    }

    #[test]
    fn a_truncated_file_keeps_the_workloads_and_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = one_workload_file(dir.path());
        let store = WorkloadStore::new("td", "n");
        let mut registry = Registry::default();
        let metrics = WorkloadFileMetrics::register(&mut registry);
        let mut w =
            WorkloadFileWatcher::start(&path, Duration::from_millis(10), store.clone(), metrics)
                .unwrap();
        std::fs::write(&path, "").unwrap();
        w.poll_once();
        assert!(
            store.snapshot().by_uid("a").is_some(),
            "an empty file must not drop workloads"
        );
        std::fs::write(&path, "workloads: []\n").unwrap();
        w.poll_once();
        assert!(
            store.snapshot().by_uid("a").is_none(),
            "`workloads: []` empties the set"
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"workload_file_rejected_total{reason="empty"} 1"#),
            "{text}"
        );
        assert!(text.contains("workload_file_reloads_total 1"), "{text}");
    }

    /// A file read mid-rewrite is applied only once two reads a settle
    /// time apart agree: never the empty or the half-written version.
    #[tokio::test]
    async fn a_change_is_applied_only_once_two_reads_agree() {
        let (_trigger, mut watch) = tidegate_base::shutdown::channel();
        let settle = Duration::from_millis(1);
        let mut reads = vec![
            "",
            "workloads:\n- {uid: a",
            "workloads: []\n",
            "workloads: []\n",
        ]
        .into_iter()
        .map(str::to_owned);
        let got = settled("workloads:\n".into(), settle, &mut watch, || reads.next()).await;
        assert!(matches!(got, Settled::Stable(ref t) if t == "workloads: []\n"));
        assert_eq!(reads.next(), None, "every version was read");
        let got = settled("same".into(), settle, &mut watch, || Some("same".into())).await;
        assert!(matches!(got, Settled::Stable(ref t) if t == "same"));
        let got = settled("x".into(), settle, &mut watch, || None).await;
        assert!(matches!(got, Settled::Unreadable));
    }
}
