//! Plugin files: loaded at start, and swapped in again when their bytes
//! change (a watcher off the data path).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidegate_base::shutdown::ShutdownWatch;
use tidegate_base::sync::Locked;

use super::engine::{LoadedFrom, PolicyEngine};
use super::error::LoadError;
use super::plugin::PluginVersion;

impl PolicyEngine {
    /// Loads every configured plugin file, as many at once as there are
    /// cores (a restart's plugins are ready in the time of the slowest
    /// few, not of all of them in turn). A plugin that fails is reported
    /// (log, metric, `GET /policies`) and its workloads use the fallback;
    /// the gateway serves traffic either way. Results in configured order.
    pub fn load_configured(&self) -> Vec<(String, Result<(), LoadError>)> {
        let names: Vec<(String, PathBuf)> = self
            .sources
            .locked()
            .iter()
            .filter_map(|(n, s)| s.file.clone().map(|f| (n.clone(), f)))
            .collect();
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(names.len());
        let next = AtomicUsize::new(0);
        let done = Mutex::new(Vec::with_capacity(names.len()));
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((name, file)) = names.get(i) else {
                        return;
                    };
                    let r = self.load_file(name, file).map(|_| ());
                    done.locked().push((i, name.clone(), r));
                });
            }
        });
        let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
        done.sort_by_key(|(i, _, _)| *i);
        done.into_iter().map(|(_, name, r)| (name, r)).collect()
    }

    fn load_file(&self, name: &str, file: &Path) -> Result<Arc<PluginVersion>, LoadError> {
        let bytes = std::fs::read(file).map_err(|source| LoadError::Read {
            path: file.to_owned(),
            source,
        });
        let bytes = match bytes {
            Ok(b) => b,
            Err(e) => {
                self.record(name, None, Err(&e));
                return Err(e);
            }
        };
        self.swap_in(name, &bytes, None, LoadedFrom::File)
            .map(|u| u.version)
            .inspect(|_| {
                if let Some(s) = self.sources.locked().get_mut(name) {
                    s.file_digest = Some(file_digest(&bytes));
                }
            })
            .inspect_err(|_| {
                if let Some(s) = self.sources.locked().get_mut(name) {
                    s.file_digest = Some(file_digest(&bytes));
                }
            })
    }

    /// Watches plugin files and swaps in changed ones until drained. Loading
    /// runs on a blocking thread, off the data path.
    pub async fn watch_files(self: Arc<Self>, interval: Duration, mut drain: ShutdownWatch) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = drain.signaled() => return,
            }
            let changed: Vec<(String, PathBuf)> = {
                let sources = self.sources.locked();
                sources
                    .iter()
                    .filter_map(|(n, s)| {
                        let f = s.file.as_ref()?;
                        let bytes = std::fs::read(f).ok()?;
                        (Some(file_digest(&bytes)) != s.file_digest).then(|| (n.clone(), f.clone()))
                    })
                    .collect()
            };
            for (name, file) in changed {
                let this = self.clone();
                let _ = tokio::task::spawn_blocking(move || this.load_file(&name, &file)).await;
            }
        }
    }
}

pub(super) fn file_digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}
