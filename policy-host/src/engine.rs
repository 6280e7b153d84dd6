//! The policy engine: the set of loaded policies (one immutable snapshot,
//! swapped atomically by one writer), per-workload selection, decisions with
//! fallback, and hot swap from files or the admin API.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use serde::Serialize;
use tidegate_base::sync::Locked;
use tidegate_sdk as sdk;
use tracing::{info, warn};

use super::error::{FailureKind, LoadError};
use super::metrics::{DecisionLabels, KindLabels, PolicyLabels, PolicyMetrics};
use super::plugin::{PluginVersion, QuarantineRule};
use super::resolve::{resolve, Resolution, SelectedBy, Skipped};
use super::runtime::{Clock, PolicyRuntime, RuntimeLimits};
use super::validate::{validate, Bounds, Ignored};
use crate::config::PoliciesConfig;
use crate::subject::{AsSubject, Subject};

/// Loaded versions by policy name.
#[derive(Default)]
struct PolicySet {
    versions: BTreeMap<String, Arc<PluginVersion>>,
}

/// Where a policy comes from and what happened when it was last loaded.
#[derive(Clone, Debug, Default)]
pub(super) struct Source {
    pub(super) file: Option<PathBuf>,
    config: String,
    /// Digest of the file's bytes last looked at (loaded or refused).
    pub(super) file_digest: Option<u64>,
    last_error: Option<String>,
    last_error_at: Option<SystemTime>,
    /// Where the loaded version came from.
    loaded_from: Option<LoadedFrom>,
}

/// Where a loaded version came from (`GET /policies` `source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadedFrom {
    /// The configured file (`policies.plugins.<name>.file`), at start or by the watcher.
    File,
    /// `PUT /policies/<name>` (or [`PolicyEngine::install`]).
    AdminUpload,
}

/// What a successful upload did (`PUT /policies/<name>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UploadResult {
    /// A new policy name.
    Created,
    /// A configured policy that had no loaded version (its file was missing or refused).
    Loaded,
    /// Replaced the loaded version.
    Swapped,
}

/// A successful upload: the new version and the one it replaced.
pub struct Uploaded {
    pub version: Arc<PluginVersion>,
    pub previous: Option<Arc<PluginVersion>>,
    pub result: UploadResult,
}

/// The policy bound to a workload, pinned: a drain that starts with a version
/// keeps it even if a new one is swapped in meanwhile.
#[derive(Clone, Debug)]
pub struct Selection {
    pub name: String,
    pub by: SelectedBy,
    pub version: Option<Arc<PluginVersion>>,
    /// The rule that chose it and the names passed over ([`super::resolve`]).
    pub why: Cow<'static, str>,
    pub skipped: Vec<Skipped>,
}

/// Why the fallback decided instead of the plugin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FallbackReason {
    pub kind: String,
    pub detail: String,
}

/// The outcome of one event.
#[derive(Clone, Debug, Serialize)]
pub struct Decision {
    pub policy: String,
    pub version: Option<String>,
    /// Validated actions to execute.
    pub actions: Vec<sdk::Action>,
    /// Set when the fallback decided.
    pub fallback: Option<FallbackReason>,
    pub ignored: usize,
    pub clamped: usize,
    #[serde(skip)]
    pub latency: Duration,
}

/// What `/policies` shows of a plugin's declared metadata reads.
#[derive(Clone, Debug, serde::Serialize, PartialEq, Eq)]
pub struct PolicyReads {
    pub labels: Vec<String>,
    pub annotations: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct PolicyStatus {
    pub name: String,
    pub loaded: bool,
    /// Where the loaded version came from; `None` when none is loaded.
    pub source: Option<LoadedFrom>,
    /// The file the loaded version was read from (`None` for an upload).
    pub file: Option<PathBuf>,
    /// The configured file, watched: a change to it replaces the loaded
    /// version, an upload included.
    pub watched_file: Option<PathBuf>,
    pub version: Option<String>,
    pub contract: Option<String>,
    /// The label and annotation keys the plugin is handed (`*`: every key).
    pub reads: Option<PolicyReads>,
    pub size: Option<usize>,
    pub loaded_at_unix_ms: Option<u128>,
    pub calls: u64,
    pub failures: u64,
    pub instantiations: u64,
    pub quarantined: bool,
    pub last_error: Option<String>,
}

pub struct PolicyEngine {
    runtime: Arc<PolicyRuntime>,
    current: ArcSwap<PolicySet>,
    pub(super) sources: Mutex<BTreeMap<String, Source>>,
    /// One writer: loads and swaps are serialised.
    writer: Mutex<()>,
    /// Run-time bindings, workload uid → policy (`PUT /workloads/<uid>/policy`).
    pub(super) runtime_bindings: Mutex<BTreeMap<String, String>>,
    pub(super) cfg: PoliciesConfig,
    bounds: Bounds,
    quarantine: QuarantineRule,
    pub metrics: PolicyMetrics,
}

fn unix_ms(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

impl PolicyEngine {
    /// Builds the engine; no plugin is loaded yet (see [`PolicyEngine::load_configured`]).
    pub fn new(cfg: &PoliciesConfig, metrics: PolicyMetrics) -> anyhow::Result<Arc<Self>> {
        let limits = RuntimeLimits {
            call_deadline: cfg.call_deadline,
            init_deadline: cfg.init_deadline,
            memory_bytes: cfg.memory_limit as usize,
            ..RuntimeLimits::default()
        };
        let runtime = PolicyRuntime::new(limits, metrics.clone())
            .map_err(|e| anyhow::anyhow!("policy runtime: {e:#}"))?;
        let sources = cfg
            .plugins
            .iter()
            .map(|(name, spec)| {
                (
                    name.clone(),
                    Source {
                        file: Some(spec.file.clone()),
                        config: spec.config_text(),
                        ..Default::default()
                    },
                )
            })
            .collect();
        Ok(Arc::new(PolicyEngine {
            runtime,
            current: ArcSwap::from_pointee(PolicySet::default()),
            sources: Mutex::new(sources),
            writer: Mutex::new(()),
            runtime_bindings: Mutex::new(BTreeMap::new()),
            bounds: cfg.bounds(),
            quarantine: QuarantineRule {
                failures: cfg.quarantine_failures,
                window: cfg.quarantine_window,
            },
            cfg: cfg.clone(),
            metrics,
        }))
    }

    pub fn runtime(&self) -> &Arc<PolicyRuntime> {
        &self.runtime
    }

    /// Compiles and validates `bytes` (version, imports, `init`, a self-test
    /// event), then swaps it in for `name` atomically, as an upload. On any
    /// failure the previous version stays and the reason is returned and
    /// recorded. CPU-heavy: call from a blocking thread.
    pub fn install(
        &self,
        name: &str,
        bytes: &[u8],
        config: Option<&str>,
    ) -> Result<Arc<PluginVersion>, LoadError> {
        self.upload(name, bytes, config).map(|u| u.version)
    }

    /// [`PolicyEngine::install`], saying whether the name was created, loaded
    /// for the first time or swapped (`PUT /policies/<name>`).
    pub fn upload(
        &self,
        name: &str,
        bytes: &[u8],
        config: Option<&str>,
    ) -> Result<Uploaded, LoadError> {
        self.swap_in(name, bytes, config, LoadedFrom::AdminUpload)
    }

    pub(super) fn swap_in(
        &self,
        name: &str,
        bytes: &[u8],
        config: Option<&str>,
        from: LoadedFrom,
    ) -> Result<Uploaded, LoadError> {
        let _writer = self.writer.locked();
        let configured = self.cfg.plugins.contains_key(name);
        let config = match config {
            Some(c) => c.to_owned(),
            None => self
                .sources
                .locked()
                .get(name)
                .map(|s| s.config.clone())
                .unwrap_or_default(),
        };
        let started = Instant::now();
        let loaded = PluginVersion::load(&self.runtime, name, bytes, &config, self.quarantine);
        match loaded {
            Ok(v) => {
                let mut next = PolicySet {
                    versions: self.current.load().versions.clone(),
                };
                let previous = next.versions.insert(name.to_owned(), v.clone());
                self.current.store(Arc::new(next));
                info!(
                    policy = name,
                    version = %v.hash,
                    previous = previous.as_ref().map(|p| p.hash.as_str()).unwrap_or("none"),
                    took_ms = started.elapsed().as_millis() as u64,
                    source = ?from,
                    "policy loaded"
                );
                self.record(name, Some(&config), Ok(from));
                let result = match (&previous, configured) {
                    (Some(_), _) => UploadResult::Swapped,
                    (None, true) => UploadResult::Loaded,
                    (None, false) => UploadResult::Created,
                };
                Ok(Uploaded {
                    version: v,
                    previous,
                    result,
                })
            }
            Err(e) => {
                warn!(policy = name, error = %e, "policy refused; previous version stays");
                self.record(name, None, Err(&e));
                Err(e)
            }
        }
    }

    /// Counts a load and records its outcome for `GET /policies`; `config`
    /// becomes the policy's configuration only when the load succeeded.
    pub(super) fn record(
        &self,
        name: &str,
        config: Option<&str>,
        result: Result<LoadedFrom, &LoadError>,
    ) {
        let kind = match result {
            Ok(_) => "ok",
            Err(e) => e.reason(),
        };
        self.metrics
            .swaps
            .get_or_create(&KindLabels {
                policy: name.to_owned(),
                kind,
            })
            .inc();
        let mut sources = self.sources.locked();
        let s = sources.entry(name.to_owned()).or_default();
        match result {
            Ok(from) => {
                // Only a configuration the plugin accepted is kept: a
                // refused one would refuse every later load without one
                // of its own (the file watcher's, an upload without the
                // header).
                if let Some(c) = config {
                    s.config = c.to_owned();
                }
                s.last_error = None;
                s.loaded_from = Some(from);
            }
            Err(e) => {
                s.last_error = Some(e.to_string());
                s.last_error_at = Some(SystemTime::now());
            }
        }
    }

    /// The loaded version of `name`, if any.
    pub fn version(&self, name: &str) -> Option<Arc<PluginVersion>> {
        self.current.load().versions.get(name).cloned()
    }

    /// Whether `name` is a policy: configured in `policies.plugins` or uploaded.
    pub fn is_known(&self, name: &str) -> bool {
        self.known_in(&self.current.load(), name)
    }

    /// [`PolicyEngine::is_known`] against one loaded set.
    fn known_in(&self, set: &PolicySet, name: &str) -> bool {
        set.versions.contains_key(name) || self.cfg.plugins.contains_key(name)
    }

    /// Which policy `workload` gets and why ([`super::resolve`] has the
    /// precedence); the same answer [`PolicyEngine::select`] pins.
    pub fn resolve(&self, workload: &(impl AsSubject + ?Sized)) -> Resolution {
        self.resolve_in(&self.current.load(), workload.subject())
    }

    /// [`PolicyEngine::resolve`] against one loaded set: every event
    /// selects, so the set is loaded once for both the names' check and
    /// the pinned version.
    fn resolve_in(&self, set: &PolicySet, workload: Subject<'_>) -> Resolution {
        let admin = self.runtime_binding(workload.uid);
        resolve(&workload, admin.as_deref(), &self.cfg, |n| {
            self.known_in(set, n)
        })
    }

    /// The policy for a workload with its current version, pinned: a drain
    /// keeps it even if a new version is swapped in. Skipped names (an
    /// annotation naming no policy, …) are logged.
    pub fn select(&self, workload: &(impl AsSubject + ?Sized)) -> Selection {
        let workload = workload.subject();
        let set = self.current.load();
        let r = self.resolve_in(&set, workload);
        for s in &r.skipped {
            warn!(
                workload = %workload.uid,
                policy = %s.policy,
                source = s.source,
                chosen = %r.name,
                "skipped a policy name: {}", s.reason
            );
        }
        Self::pin_in(&set, r)
    }

    /// The policy deciding the events of `peer` for the local `client`
    /// ([`super::resolve::resolve_for_peer`] has the precedence), pinned.
    pub fn select_for_peer(
        &self,
        peer: &(impl AsSubject + ?Sized),
        client: &(impl AsSubject + ?Sized),
    ) -> Selection {
        let (peer, client) = (peer.subject(), client.subject());
        let set = self.current.load();
        let r =
            super::resolve::resolve_for_peer(&peer, &client, &self.cfg, |n| self.known_in(&set, n));
        for s in &r.skipped {
            warn!(peer = %peer.uid, client = %client.uid, policy = %s.policy,
                source = s.source, chosen = %r.name, "skipped a policy name: {}", s.reason);
        }
        Self::pin_in(&set, r)
    }

    /// The selection for a resolution: its current version (none for the fallback).
    pub(super) fn pin(&self, r: Resolution) -> Selection {
        Self::pin_in(&self.current.load(), r)
    }

    fn pin_in(set: &PolicySet, r: Resolution) -> Selection {
        Selection {
            version: match r.by {
                SelectedBy::Fallback => None,
                _ => set.versions.get(&r.name).cloned(),
            },
            name: r.name,
            by: r.by,
            why: r.why,
            skipped: r.skipped,
        }
    }

    /// Decides `event` with the selected version (or the fallback), then validates.
    pub fn decide(&self, selection: &Selection, event: &sdk::Event) -> Decision {
        self.decide_at(selection, event, Clock::Wall)
    }

    pub fn decide_at(&self, selection: &Selection, event: &sdk::Event, clock: Clock) -> Decision {
        let started = Instant::now();
        let (raw, fallback) = match &selection.version {
            Some(v) => match v.decide(event, clock) {
                Ok(actions) => (actions, None),
                Err(f) => {
                    self.on_failure(v, f.kind, &f.detail);
                    (
                        self.cfg.fallback.decide(event),
                        Some(FallbackReason {
                            kind: f.kind.label().to_owned(),
                            detail: f.detail,
                        }),
                    )
                }
            },
            None => {
                let fb = (selection.by != SelectedBy::Fallback).then(|| FallbackReason {
                    kind: "not_loaded".into(),
                    detail: format!("policy {} is not loaded", selection.name),
                });
                (self.cfg.fallback.decide(event), fb)
            }
        };
        let latency = started.elapsed();
        let validated = validate(event, raw, &self.bounds);
        let policy = selection.name.clone();
        match &selection.version {
            Some(v) if fallback.is_none() => {
                v.series.decided(event.kind()).inc();
                v.series.latency().observe(latency.as_secs_f64());
            }
            _ => {
                self.metrics
                    .decisions
                    .get_or_create(&DecisionLabels {
                        policy: policy.clone(),
                        event: event.kind(),
                        decided_by: self.cfg.fallback.name(),
                    })
                    .inc();
            }
        }
        for (why, action) in &validated.ignored {
            if *why == Ignored::OtherSubject {
                warn!(policy = %policy, action = ?action.subject(), "ignored an action about another workload");
            }
            self.metrics
                .ignored
                .get_or_create(&KindLabels {
                    policy: policy.clone(),
                    kind: why.label(),
                })
                .inc();
        }
        if validated.clamped > 0 {
            self.metrics
                .clamped
                .get_or_create(&PolicyLabels {
                    policy: policy.clone(),
                })
                .inc_by(validated.clamped as u64);
        }
        Decision {
            policy,
            version: selection.version.as_ref().map(|v| v.hash.clone()),
            actions: validated.actions,
            fallback,
            ignored: validated.ignored.len(),
            clamped: validated.clamped,
            latency,
        }
    }

    fn on_failure(&self, v: &PluginVersion, kind: FailureKind, detail: &str) {
        warn!(policy = %v.name, version = %v.hash, %kind, detail, "plugin call failed; the fallback decides");
        self.metrics
            .failures
            .get_or_create(&KindLabels {
                policy: v.name.clone(),
                kind: kind.label(),
            })
            .inc();
        if kind != FailureKind::Quarantined && v.is_quarantined() {
            // This failure tipped it over.
            warn!(policy = %v.name, version = %v.hash, "plugin version quarantined until replaced");
            self.metrics
                .quarantines
                .get_or_create(&PolicyLabels {
                    policy: v.name.clone(),
                })
                .inc();
        }
    }

    /// `GET /policies`.
    pub fn list(&self) -> Vec<PolicyStatus> {
        let set = self.current.load();
        let sources = self.sources.locked();
        let mut names: Vec<&String> = sources.keys().chain(set.versions.keys()).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|name| {
                let v = set.versions.get(name);
                let s = sources.get(name);
                let source = v.and(s.and_then(|s| s.loaded_from));
                PolicyStatus {
                    name: name.clone(),
                    loaded: v.is_some(),
                    source,
                    file: match source {
                        Some(LoadedFrom::File) => s.and_then(|s| s.file.clone()),
                        _ => None,
                    },
                    watched_file: s.and_then(|s| s.file.clone()),
                    version: v.map(|v| v.hash.clone()),
                    contract: v.map(|v| v.contract.to_string()),
                    reads: v.and_then(|v| v.reads()).map(|r| PolicyReads {
                        labels: r.labels.to_list(),
                        annotations: r.annotations.to_list(),
                    }),
                    size: v.map(|v| v.size),
                    loaded_at_unix_ms: v.map(|v| unix_ms(v.loaded_at)),
                    calls: v.map(|v| v.calls()).unwrap_or(0),
                    failures: v.map(|v| v.failures()).unwrap_or(0),
                    instantiations: v.map(|v| v.instantiations()).unwrap_or(0),
                    quarantined: v.is_some_and(|v| v.is_quarantined()),
                    last_error: s.and_then(|s| s.last_error.clone()),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
