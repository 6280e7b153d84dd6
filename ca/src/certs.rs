//! `certificates.source: istio-ca`: a certificate per local identity from an
//! Istio CA (istiod, or `tidegate-ca`), asked for on the pods' behalf.
//!
//! - Fetched when a local HBONE workload with the identity appears, and on
//!   first use by a handshake, which waits a bounded time
//!   (`first_use_wait`) for the outcome of an attempt.
//! - Checked before it is installed ([`super::issued`]): the CSR's key,
//!   the identity, a chain to the configured roots, valid now. A refused
//!   answer is a failure like any other.
//! - Renewed at half-life (ztunnel's `refresh_at`) with ±5 % jitter, timed
//!   from an accepted certificate only ([`super::schedule`]).
//! - A failure is retried with backoff (500 ms doubling to 150 s, ±20 %
//!   jitter) while the current certificate stays in use until it expires;
//!   a handshake without a valid certificate may hurry the next attempt to
//!   one second after the previous one, never sooner.
//! - Dropped when the last local workload with the identity leaves.
//!
//! The mesh's trust anchors are the roots file alone (re-read every
//! `reload_interval`): a CA's answer never adds one. Rotating the root is
//! adding the new one to that file first.
//!
//! But for [`IstioCaSettings::trust_answer_root`] (Cilium's agent, whose
//! roots file is the bootstrap certificate its CA serves TLS with, not the
//! root that signs the workloads'): the last certificate of an answer,
//! received over TLS verified against the roots file, is taken as a trust
//! anchor once the answer checks against it — as ztunnel trusts its CA's
//! answer. The [`LEARNED_ROOTS`] newest such roots are kept beside the
//! file's.

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
use super::issued::{self, Refused};
use super::messages::IstioCertificateRequest;
use super::metrics::CaMetrics;
use super::schedule::{self, Backoff};
use tidegate_base::shutdown::ShutdownWatch;
use tidegate_base::sync::Locked;
use tidegate_protocol::identity::SpiffeId;
use tidegate_protocol::tls::{provider, CertError, CertFuture, CertSource, Roots};

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
    /// Trust the root an answer ends with (verified over the CA's TLS,
    /// itself verified against the roots file): Cilium's agent.
    pub trust_answer_root: bool,
}

/// How many roots learned from answers are kept (the current one and the
/// one before it, so a rotation overlaps).
pub const LEARNED_ROOTS: usize = 2;

/// Why one issuance failed.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error(transparent)]
    Csr(#[from] CsrError),
    #[error(transparent)]
    Ca(#[from] CaClientError),
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("cannot load the generated key: {0}")]
    Key(#[from] rustls::Error),
}

impl IssueError {
    /// A bounded label for `tidegate_ca_fetches_total{result}`.
    pub fn reason(&self) -> &'static str {
        match self {
            IssueError::Csr(_) | IssueError::Key(_) => "local",
            IssueError::Ca(e) => e.reason(),
            IssueError::Refused(r) => r.reason(),
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
    /// The wait before the next attempt, as scheduled when the last one ended.
    next_attempt_in: Option<Duration>,
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

/// The roots file as last read: the mesh's only trust anchors.
struct RootSet {
    /// Digest of the roots file's bytes.
    file_digest: u64,
    file: Vec<CertificateDer<'static>>,
    /// Roots learned from answers ([`IstioCaSettings::trust_answer_root`]), newest last.
    learned: Vec<CertificateDer<'static>>,
}

impl RootSet {
    fn holds(&self, root: &CertificateDer<'_>) -> bool {
        self.file.iter().chain(&self.learned).any(|c| c == root)
    }

    fn all(&self) -> Vec<CertificateDer<'static>> {
        self.file.iter().chain(&self.learned).cloned().collect()
    }
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
                learned: Vec::new(),
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

    /// Keeps one certificate per identity `wanted` holds (the node's local
    /// HBONE workloads), and re-reads the roots file, until drained or
    /// until the sender of `wanted` is gone.
    pub async fn run(
        self,
        mut wanted: watch::Receiver<BTreeSet<SpiffeId>>,
        mut drain: ShutdownWatch,
    ) {
        let mut tick = tokio::time::interval(self.inner.settings.reload_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let now = wanted.borrow_and_update().clone();
            self.reconcile(now);
            tokio::select! {
                r = wanted.changed() => if r.is_err() { break },
                _ = tick.tick() => self.inner.reload_roots(),
                _ = drain.signaled() => break,
            }
        }
        self.inner.entries.locked().clear();
    }

    fn reconcile(&self, wanted: BTreeSet<SpiffeId>) {
        let mut entries = self.inner.entries.locked();
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
        let mut ids: Vec<_> = self.inner.entries.locked().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// The serial of the current certificate of `id`, if any.
    pub fn serial(&self, id: &SpiffeId) -> Option<String> {
        let entries = self.inner.entries.locked();
        let status = entries.get(id)?.status.borrow();
        status.current.as_ref().map(|i| i.serial.clone())
    }

    async fn wait_for(&self, id: &SpiffeId) -> Result<Arc<CertifiedKey>, CertError> {
        let (mut status, kick) = {
            let mut entries = self.inner.entries.locked();
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
            next_attempt_in: None,
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
            let wait = settle(&id, result, &status, &mut backoff);
            let ended = tokio::time::Instant::now();
            let mut deadline = ended + wait;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = kick.notified() => {
                        // Only a handshake without a valid certificate
                        // hurries us, and never into a tight loop.
                        if status.borrow().valid().is_none() {
                            deadline = schedule::hurried(deadline, ended);
                        }
                    }
                }
            }
        }
    }

    /// One attempt: a fresh key and CSR, the CA's answer, checked
    /// against the configured roots before anything is installed.
    async fn issue(&self, id: &SpiffeId) -> Result<Issued, IssueError> {
        let generated = csr::generate(id)?;
        let request = IstioCertificateRequest::impersonating(
            generated.csr_pem,
            self.settings.validity.as_secs() as i64,
            &id.to_string(),
        );
        let pems = self.client.create_certificate(request).await?;
        let new_root = if self.settings.trust_answer_root {
            issued::answer_root(&pems).filter(|root| !self.root_set.locked().holds(root))
        } else {
            None
        };
        let roots = match &new_root {
            Some(root) => {
                let mut certs = self.root_set.locked().all();
                certs.push(root.clone());
                Arc::new(
                    Roots::from_certs(certs).map_err(|e| Refused::UntrustedChain {
                        reason: format!("the root the answer ends with is no trust anchor: {e}"),
                    })?,
                )
            }
            None => self.roots.load_full(),
        };
        let accepted = issued::check(id, &generated.public_key, &pems, &roots, SystemTime::now())?;
        if let Some(root) = new_root {
            self.learn_root(root);
        }
        let key = PrivateKeyDer::from_pem_slice(generated.key_pem.as_bytes())
            .map_err(|e| IssueError::Key(rustls::Error::General(e.to_string())))?;
        let signer = provider().key_provider.load_private_key(key)?;
        Ok(Issued {
            key: Arc::new(CertifiedKey::new(accepted.chain, signer)),
            serial: accepted.serial,
            not_before: accepted.not_before,
            not_after: accepted.not_after,
        })
    }

    fn reload_roots(&self) {
        let path = &self.settings.client.roots;
        match read_roots(path) {
            Ok((digest, certs)) => {
                let mut set = self.root_set.locked();
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

    /// Keeps `root`, the answer's, beside the file's (the
    /// [`LEARNED_ROOTS`] newest) and publishes the roots.
    fn learn_root(&self, root: CertificateDer<'static>) {
        {
            let mut set = self.root_set.locked();
            if set.holds(&root) {
                return;
            }
            set.learned.push(root);
            let excess = set.learned.len().saturating_sub(LEARNED_ROOTS);
            set.learned.drain(..excess);
        }
        info!("the CA's root trusted from its answer (trust_answer_root)");
        self.publish_roots();
    }

    fn publish_roots(&self) {
        let all = self.root_set.locked().all();
        match Roots::from_certs(all) {
            Ok(r) => self.roots.store(Arc::new(r)),
            Err(e) => {
                warn!(error = %e, "a CA root is not a usable trust anchor; keeping the previous roots")
            }
        }
    }
}

/// Records the outcome of one attempt in `status` and returns the wait
/// before the next: the renewal of an accepted certificate, else the next
/// backoff step — the current certificate is kept either way.
fn settle(
    id: &SpiffeId,
    result: Result<Issued, IssueError>,
    status: &watch::Sender<Status>,
    backoff: &mut Backoff,
) -> Duration {
    let now = SystemTime::now();
    let (wait, installed, error) = match result {
        Ok(issued) => {
            *backoff = Backoff::default();
            let wait = schedule::renew_in(issued.not_before, issued.not_after, now);
            info!(identity = %id, serial = %issued.serial, not_after = %httpdate::fmt_http_date(issued.not_after), renew_in = ?wait, "certificate issued");
            (wait, Some(issued), None)
        }
        Err(e) => {
            let wait = backoff.step();
            let keeping = status.borrow().valid().is_some();
            if let IssueError::Refused(_) = e {
                warn!(identity = %id, reason = e.reason(), error = %e, retry_in = ?wait, keeping_current = keeping, "CA answer refused; a certificate held stays in use");
            } else {
                warn!(identity = %id, reason = e.reason(), error = %e, retry_in = ?wait, keeping_current = keeping, "certificate fetch failed");
            }
            (wait, None, Some(e.to_string()))
        }
    };
    // One update: a waiting handshake sees the certificate and the phase together.
    status.send_modify(|s| {
        s.phase = if installed.is_some() {
            Phase::Ready
        } else {
            Phase::Retrying
        };
        if let Some(issued) = installed {
            s.current = Some(issued);
        }
        s.last_error = error;
        s.attempts += 1;
        s.next_attempt = Some(now + wait);
        s.next_attempt_in = Some(wait);
    });
    wait
}

impl super::metrics::ExpirySource for Inner {
    /// Seconds to expiry of each current certificate.
    fn expiries(&self) -> Vec<(String, f64)> {
        let now = SystemTime::now();
        self.entries
            .locked()
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
        let entries = self.inner.entries.locked();
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
        let entries = self.inner.entries.locked();
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
                    "next_attempt_in_ms": s.next_attempt_in.map(|d| d.as_millis() as u64),
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
