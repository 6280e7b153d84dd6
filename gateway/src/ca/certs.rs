//! `certificates.source: istio-ca`: a certificate per local identity from an
//! Istio CA (istiod, or `tidegate ca`), asked for on the pods' behalf.
//!
//! - Fetched when a local HBONE workload with the identity appears, and on
//!   first use by a handshake, which waits a bounded time
//!   (`first_use_wait`) for the outcome of an attempt.
//! - Renewed at half-life (ztunnel's `refresh_at`) with ±5 % jitter.
//! - A failure is retried with backoff (500 ms doubling to 150 s, ±20 %
//!   jitter) while the current certificate stays in use until it expires.
//! - Dropped when the last local workload with the identity leaves.
//!
//! The mesh's trust anchors are the roots file (re-read every
//! `reload_interval`) plus the root that ends each returned chain.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};
use tracing::{info, info_span, warn, Instrument};

use super::client::{CaClient, CaClientConfig, CaClientError};
use super::csr::{self, CsrError};
use super::messages::IstioCertificateRequest;
use super::metrics::CaMetrics;
use crate::identity::SpiffeId;
use crate::shutdown::ShutdownWatch;
use crate::tls::{identity_of, provider, CertError, CertFuture, CertSource, Roots};
use crate::workloads::{Protocol, WorkloadStore};

/// What `certificates.source: istio-ca` configures.
#[derive(Clone, Debug)]
pub struct IstioCaSettings {
    pub client: CaClientConfig,
    /// Requested validity (`validity_duration`).
    pub validity: Duration,
    /// How long a handshake waits for the first certificate of an identity.
    pub first_use_wait: Duration,
    /// How often the roots file is re-read.
    pub reload_interval: Duration,
}

/// Why one issuance failed.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error(transparent)]
    Csr(#[from] CsrError),
    #[error(transparent)]
    Ca(#[from] CaClientError),
    #[error("the CA returned {0}")]
    BadChain(String),
    #[error("the CA returned a certificate for {got}, not the requested identity")]
    SanMismatch { got: String },
    #[error("cannot load the generated key: {0}")]
    Key(#[from] rustls::Error),
}

impl IssueError {
    /// A bounded label for `tidegate_ca_fetches_total{result}`.
    pub fn reason(&self) -> &'static str {
        match self {
            IssueError::Csr(_) | IssueError::Key(_) => "local",
            IssueError::Ca(e) => e.reason(),
            IssueError::BadChain(_) => "bad_chain",
            IssueError::SanMismatch { .. } => "san_mismatch",
        }
    }
}

#[derive(Clone, Debug)]
struct Issued {
    key: Arc<CertifiedKey>,
    serial: String,
    not_before: SystemTime,
    not_after: SystemTime,
}

impl Issued {
    fn valid_now(&self) -> bool {
        SystemTime::now() < self.not_after
    }

    /// Half-life (ztunnel's `refresh_at`), moved by up to ±5 % of the lifetime.
    fn refresh_at(&self) -> SystemTime {
        let life = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        let jitter = life.mul_f64(0.05 * (fastrand::f64() * 2.0 - 1.0).abs());
        let half = self.not_before + life / 2;
        if fastrand::bool() {
            half + jitter
        } else {
            half - jitter
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Phase {
    /// The first attempt is under way.
    Fetching,
    /// Holds a certificate; the next renewal is scheduled.
    Ready,
    /// The last attempt failed; another is scheduled.
    Retrying,
}

#[derive(Clone, Debug)]
struct Status {
    current: Option<Issued>,
    phase: Phase,
    last_error: Option<String>,
    /// Attempts finished (successful or not).
    attempts: u64,
    next_attempt: Option<SystemTime>,
}

impl Status {
    fn valid(&self) -> Option<&Issued> {
        self.current.as_ref().filter(|i| i.valid_now())
    }
}

struct Entry {
    status: watch::Receiver<Status>,
    kick: Arc<Notify>,
    task: tokio::task::AbortHandle,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct RootSet {
    /// Digest of the roots file's bytes.
    file_digest: u64,
    file: Vec<CertificateDer<'static>>,
    /// Roots that ended returned chains.
    chains: Vec<CertificateDer<'static>>,
}

/// The certificate source. Cheap to clone.
#[derive(Clone)]
pub struct IstioCaCerts {
    inner: Arc<Inner>,
}

pub(super) struct Inner {
    client: CaClient,
    settings: IstioCaSettings,
    entries: Mutex<HashMap<SpiffeId, Entry>>,
    root_set: Mutex<RootSet>,
    roots: ArcSwap<Roots>,
    metrics: CaMetrics,
}

#[derive(Debug, thiserror::Error)]
pub enum IstioCaError {
    #[error(transparent)]
    Client(#[from] CaClientError),
    #[error("certificates.roots {path}: {message}")]
    Roots { path: PathBuf, message: String },
}

impl IstioCaCerts {
    /// Reads the roots file (which must hold at least one certificate) and
    /// prepares the client; nothing is fetched yet.
    pub fn new(settings: IstioCaSettings, metrics: CaMetrics) -> Result<Self, IstioCaError> {
        let client = CaClient::new(settings.client.clone())?;
        let (digest, file) = read_roots(&settings.client.roots)?;
        let inner = Arc::new(Inner {
            client,
            root_set: Mutex::new(RootSet {
                file_digest: digest,
                file,
                chains: Vec::new(),
            }),
            roots: ArcSwap::from_pointee(Roots::default()),
            entries: Mutex::new(HashMap::new()),
            settings,
            metrics,
        });
        inner.publish_roots();
        let weak: std::sync::Weak<Inner> = Arc::downgrade(&inner);
        inner.metrics.observe(weak);
        Ok(IstioCaCerts { inner })
    }

    /// Keeps one certificate per identity of a local HBONE workload, and
    /// re-reads the roots file, until drained.
    pub async fn run(self, store: Arc<WorkloadStore>, mut drain: ShutdownWatch) {
        let mut changed = store.subscribe();
        let mut tick = tokio::time::interval(self.inner.settings.reload_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.reconcile(&store);
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                _ = tick.tick() => self.inner.reload_roots(),
                _ = drain.signaled() => break,
            }
        }
        self.inner.entries.lock().unwrap().clear();
    }

    fn reconcile(&self, store: &WorkloadStore) {
        let wanted: BTreeSet<SpiffeId> = store
            .snapshot()
            .iter()
            .filter(|w| w.local && w.spec.protocol == Protocol::Hbone)
            .map(|w| w.identity.clone())
            .collect();
        let mut entries = self.inner.entries.lock().unwrap();
        entries.retain(|id, _| {
            let keep = wanted.contains(id);
            if !keep {
                info!(identity = %id, "no local workload has this identity any more; certificate dropped");
            }
            keep
        });
        for id in wanted {
            if let std::collections::hash_map::Entry::Vacant(v) = entries.entry(id) {
                let e = self.inner.spawn(v.key());
                v.insert(e);
            }
        }
    }

    /// The identities held, for tests and `config_dump`.
    pub fn identities(&self) -> Vec<SpiffeId> {
        let mut ids: Vec<_> = self.inner.entries.lock().unwrap().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// The serial of the current certificate of `id`, if any.
    pub fn serial(&self, id: &SpiffeId) -> Option<String> {
        let entries = self.inner.entries.lock().unwrap();
        let status = entries.get(id)?.status.borrow();
        status.current.as_ref().map(|i| i.serial.clone())
    }

    async fn wait_for(&self, id: &SpiffeId) -> Result<Arc<CertifiedKey>, CertError> {
        let (mut status, kick) = {
            let mut entries = self.inner.entries.lock().unwrap();
            let e = entries
                .entry(id.clone())
                .or_insert_with(|| self.inner.spawn(id));
            (e.status.clone(), e.kick.clone())
        };
        let seen = {
            let s = status.borrow();
            if let Some(i) = s.valid() {
                return Ok(i.key.clone());
            }
            s.attempts
        };
        // No valid certificate: ask for an attempt now rather than at the
        // next backoff step, and wait for its outcome.
        kick.notify_one();
        let unavailable = |reason: String| CertError::Unavailable {
            id: Box::new(id.clone()),
            reason,
        };
        let wait = self.inner.settings.first_use_wait;
        let outcome = tokio::time::timeout(
            wait,
            status.wait_for(|s| s.valid().is_some() || s.attempts > seen),
        )
        .await;
        match outcome {
            Err(_) => Err(unavailable(format!(
                "the CA did not answer within certificates.first_use_wait ({wait:?})"
            ))),
            Ok(Err(_)) => Err(unavailable("dropped while waiting".into())),
            Ok(Ok(s)) => match s.valid() {
                Some(i) => Ok(i.key.clone()),
                None => Err(unavailable(
                    s.last_error
                        .clone()
                        .unwrap_or_else(|| "no certificate".into()),
                )),
            },
        }
    }
}

impl Inner {
    fn spawn(self: &Arc<Self>, id: &SpiffeId) -> Entry {
        let (tx, rx) = watch::channel(Status {
            current: None,
            phase: Phase::Fetching,
            last_error: None,
            attempts: 0,
            next_attempt: None,
        });
        let kick = Arc::new(Notify::new());
        let span = info_span!("ca_certificate", identity = %id);
        let task = tokio::spawn(
            self.clone()
                .keep_fresh(id.clone(), tx, kick.clone())
                .instrument(span),
        )
        .abort_handle();
        Entry {
            status: rx,
            kick,
            task,
        }
    }

    async fn keep_fresh(
        self: Arc<Self>,
        id: SpiffeId,
        status: watch::Sender<Status>,
        kick: Arc<Notify>,
    ) {
        let mut backoff = Backoff::default();
        loop {
            let started = Instant::now();
            let result = self.issue(&id).await;
            self.metrics.fetched(
                result.as_ref().err().map_or("ok", IssueError::reason),
                started.elapsed(),
            );
            let next = match result {
                Ok(issued) => {
                    backoff = Backoff::default();
                    let at = issued.refresh_at();
                    info!(serial = %issued.serial, not_after = %httpdate::fmt_http_date(issued.not_after), "certificate issued");
                    status.send_modify(|s| {
                        s.current = Some(issued);
                        s.phase = Phase::Ready;
                        s.last_error = None;
                        s.attempts += 1;
                        s.next_attempt = Some(at);
                    });
                    at.duration_since(SystemTime::now()).unwrap_or_default()
                }
                Err(e) => {
                    let delay = backoff.next();
                    let keeping = status.borrow().valid().is_some();
                    warn!(error = %e, retry_in = ?delay, keeping_current = keeping, "certificate fetch failed");
                    status.send_modify(|s| {
                        s.phase = Phase::Retrying;
                        s.last_error = Some(e.to_string());
                        s.attempts += 1;
                        s.next_attempt = Some(SystemTime::now() + delay);
                    });
                    delay
                }
            };
            let deadline = tokio::time::Instant::now() + next;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = kick.notified() => {
                        // Only a handshake without a valid certificate hurries us.
                        if status.borrow().valid().is_none() {
                            break;
                        }
                    }
                }
            }
        }
    }

    async fn issue(&self, id: &SpiffeId) -> Result<Issued, IssueError> {
        let generated = csr::generate(id)?;
        let request = IstioCertificateRequest::impersonating(
            generated.csr_pem,
            self.settings.validity.as_secs() as i64,
            &id.to_string(),
        );
        let pems = self.client.create_certificate(request).await?;
        let mut chain = Vec::new();
        for pem in &pems {
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                chain
                    .push(cert.map_err(|e| IssueError::BadChain(format!("a malformed PEM: {e}")))?);
            }
        }
        let leaf = chain
            .first()
            .ok_or_else(|| IssueError::BadChain("an empty chain".into()))?;
        let got = identity_of(leaf)
            .map_err(|e| IssueError::BadChain(format!("a leaf without a SPIFFE id: {e}")))?;
        if got != *id {
            return Err(IssueError::SanMismatch {
                got: got.to_string(),
            });
        }
        let (serial, not_before, not_after) = {
            let (_, cert) = x509_parser::parse_x509_certificate(leaf)
                .map_err(|e| IssueError::BadChain(format!("an unparsable leaf: {e}")))?;
            let v = cert.validity();
            let t = |x: x509_parser::time::ASN1Time| {
                SystemTime::UNIX_EPOCH + Duration::from_secs(x.timestamp().max(0) as u64)
            };
            (cert.raw_serial_as_string(), t(v.not_before), t(v.not_after))
        };
        let key = PrivateKeyDer::from_pem_slice(generated.key_pem.as_bytes())
            .map_err(|e| IssueError::Key(rustls::Error::General(e.to_string())))?;
        let signer = provider().key_provider.load_private_key(key)?;
        // Present the leaf and intermediates; the root (last) is the peers'
        // trust anchor, not part of what we send.
        if chain.len() > 1 {
            let root = chain.pop().expect("len > 1");
            let mut set = self.root_set.lock().unwrap();
            if !set.chains.contains(&root) {
                set.chains.push(root);
                drop(set);
                self.publish_roots();
            }
        }
        Ok(Issued {
            key: Arc::new(CertifiedKey::new(chain, signer)),
            serial,
            not_before,
            not_after,
        })
    }

    fn reload_roots(&self) {
        let path = &self.settings.client.roots;
        match read_roots(path) {
            Ok((digest, certs)) => {
                let mut set = self.root_set.lock().unwrap();
                if set.file_digest != digest {
                    set.file_digest = digest;
                    set.file = certs;
                    drop(set);
                    info!(path = %path.display(), "CA roots reloaded");
                    self.publish_roots();
                }
            }
            Err(e) => warn!(error = %e, "CA roots not reloaded; keeping the previous ones"),
        }
    }

    fn publish_roots(&self) {
        let set = self.root_set.lock().unwrap();
        let mut all: Vec<_> = set.file.clone();
        all.extend(set.chains.iter().filter(|c| !set.file.contains(c)).cloned());
        match Roots::from_certs(all) {
            Ok(r) => self.roots.store(Arc::new(r)),
            Err(e) => {
                warn!(error = %e, "a CA root is not a usable trust anchor; keeping the previous roots")
            }
        }
    }
}

impl super::metrics::ExpirySource for Inner {
    /// Seconds to expiry of each current certificate.
    fn expiries(&self) -> Vec<(String, f64)> {
        let now = SystemTime::now();
        self.entries
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(id, e)| {
                let s = e.status.borrow();
                let i = s.current.as_ref()?;
                let left = match i.not_after.duration_since(now) {
                    Ok(d) => d.as_secs_f64(),
                    Err(e) => -e.duration().as_secs_f64(),
                };
                Some((id.to_string(), left))
            })
            .collect()
    }
}

impl CertSource for IstioCaCerts {
    fn certified_key(&self, id: &SpiffeId) -> Result<Arc<CertifiedKey>, CertError> {
        let entries = self.inner.entries.lock().unwrap();
        let e = entries
            .get(id)
            .ok_or_else(|| CertError::NoCertificate(id.clone()))?;
        let s = e.status.borrow();
        match s.valid() {
            Some(i) => Ok(i.key.clone()),
            None => Err(CertError::Unavailable {
                id: Box::new(id.clone()),
                reason: s
                    .last_error
                    .clone()
                    .unwrap_or_else(|| "being fetched".into()),
            }),
        }
    }

    fn roots(&self) -> Arc<Roots> {
        self.inner.roots.load_full()
    }

    fn fetch<'a>(&'a self, id: &'a SpiffeId) -> CertFuture<'a> {
        Box::pin(self.wait_for(id))
    }

    fn dump(&self) -> Value {
        let entries = self.inner.entries.lock().unwrap();
        let mut rows: Vec<Value> = entries
            .iter()
            .map(|(id, e)| {
                let s = e.status.borrow();
                let unix = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
                json!({
                    "identity": id,
                    "state": if s.current.as_ref().is_some_and(|i| !i.valid_now()) { json!("expired") } else { json!(s.phase) },
                    "serial": s.current.as_ref().map(|i| i.serial.clone()),
                    "not_before": s.current.as_ref().map(|i| httpdate::fmt_http_date(i.not_before)),
                    "not_after": s.current.as_ref().map(|i| httpdate::fmt_http_date(i.not_after)),
                    "not_after_unix": s.current.as_ref().map(|i| unix(i.not_after)),
                    "next_attempt_unix": s.next_attempt.map(unix),
                    "attempts": s.attempts,
                    "last_error": s.last_error,
                })
            })
            .collect();
        rows.sort_by(|a, b| a["identity"].as_str().cmp(&b["identity"].as_str()));
        json!({
            "source": "istio-ca",
            "address": self.inner.settings.client.address,
            "roots": self.inner.roots.load().certs.len(),
            "identities": rows,
        })
    }
}

/// 500 ms doubling to 150 s, ±20 % jitter (ztunnel's CA backoff).
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: Duration::from_millis(500),
        }
    }
}

impl Backoff {
    const MAX: Duration = Duration::from_secs(150);

    fn next(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(Self::MAX);
        d.mul_f64(0.8 + 0.4 * fastrand::f64())
    }
}

fn read_roots(path: &PathBuf) -> Result<(u64, Vec<CertificateDer<'static>>), IstioCaError> {
    use std::hash::{Hash, Hasher};
    let bad = |message: String| IstioCaError::Roots {
        path: path.clone(),
        message,
    };
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("malformed PEM: {e}")))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate".into()));
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    pem.hash(&mut h);
    Ok((h.finish(), certs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_half_a_second_to_150_seconds_with_jitter() {
        let mut b = Backoff::default();
        let steps: Vec<Duration> = (0..12).map(|_| b.next()).collect();
        let base = [
            0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 150.0, 150.0, 150.0,
        ];
        for (d, want) in steps.iter().zip(base) {
            let s = d.as_secs_f64();
            assert!(
                s >= want * 0.8 - 1e-9 && s <= want * 1.2 + 1e-9,
                "{s} vs {want}"
            );
        }
    }

    #[test]
    fn renewal_falls_at_half_life_within_the_jitter() {
        let nb = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let key = Arc::new(CertifiedKey::new(
            vec![],
            provider()
                .key_provider
                .load_private_key(
                    PrivateKeyDer::from_pem_slice(
                        csr::generate(&"spiffe://td/ns/a/sa/b".parse().unwrap())
                            .unwrap()
                            .key_pem
                            .as_bytes(),
                    )
                    .unwrap(),
                )
                .unwrap(),
        ));
        let i = Issued {
            key,
            serial: "01".into(),
            not_before: nb,
            not_after: nb + Duration::from_secs(1000),
        };
        for _ in 0..200 {
            let at = i.refresh_at().duration_since(nb).unwrap().as_secs_f64();
            assert!((450.0..=550.0).contains(&at), "{at}");
        }
    }
}
