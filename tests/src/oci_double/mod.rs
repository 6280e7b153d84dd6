//! A faithful local double of the OCI Load Balancing API (20170115), for
//! tests and the demo (`cargo run -p tidegate-e2e --bin oci-double`).
//!
//! Follows the published behaviour tidegate relies on:
//! - HTTPS (a generated self-signed certificate for 127.0.0.1/localhost,
//!   written to [`OciDouble::ca_file`] for the client to trust);
//! - every request's OCI HTTP signature verified against the configured
//!   public keys: a bad or missing signature, an unknown key id, a body whose
//!   `x-content-sha256` does not match, or a `date` more than 5 minutes off
//!   → 401 `NotAuthenticated`;
//! - one ETag per load balancer, bumped on every accepted mutation and when
//!   its work request completes, returned by every GET of the load balancer
//!   or anything in it; a stale `If-Match` → 412 `NoEtagMatch`;
//! - mutations answered 204 with `opc-work-request-id`; work requests move
//!   ACCEPTED → IN_PROGRESS → SUCCEEDED (or FAILED when the backend vanished)
//!   after the configured delays, and the change is visible on GET only then;
//!   a mutation while another work request on the load balancer runs → 409
//!   `IncorrectState`;
//! - missing required fields → 400 `MissingParameter`; every error body is
//!   `{"code","message"}` with an `opc-request-id` header;
//! - at most [`DoubleConfig::backend_limit`] backends per backend set and per
//!   load balancer (400 `LimitExceeded`);
//! - fault injection: 409/429/5xx rates, an exact queue of injected
//!   answers, a hook run before the next update (a racing writer), and a
//!   "foreign controller" that rewrites a backend set with `drain=false`
//!   whenever its membership changes (as OCI's own ingress controllers do).
//!
//! It also plays the OKE proxymux for workload identity: `POST
//! /resourcePrincipalSessionTokens` with `Authorization: Bearer <service
//! account token>` and `{"podKey": "<base64 SPKI>"}` answers a JSON string of
//! base64 `{"token": "ST$<jwt>"}` and accepts signatures by that pod key
//! under key id `ST$<jwt>` from then on.
//!
//! The test side inspects state and counts calls through [`OciDouble`].

mod http;
mod verify;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use verify::public_key_der;

/// A backend in the published JSON form.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    pub name: String,
    pub ip_address: String,
    pub port: u16,
    pub weight: u32,
    pub backup: bool,
    pub drain: bool,
    pub offline: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
}

impl Backend {
    pub fn new(ip: &str, port: u16) -> Self {
        Backend {
            name: format!("{ip}:{port}"),
            ip_address: ip.to_owned(),
            port,
            weight: 1,
            backup: false,
            drain: false,
            offline: false,
            max_connections: None,
        }
    }
}

/// Random faults on mutations (each a probability in 0..=1).
#[derive(Clone, Debug, Default)]
pub struct FaultRates {
    pub conflict: f64,
    pub throttle: f64,
    pub server_error: f64,
}

#[derive(Clone, Debug)]
pub struct DoubleConfig {
    /// Key id → public key (DER `RSAPublicKey`) accepted for signatures.
    pub keys: HashMap<String, Vec<u8>>,
    /// ACCEPTED → IN_PROGRESS.
    pub accepted_delay: Duration,
    /// IN_PROGRESS → SUCCEEDED / FAILED.
    pub progress_delay: Duration,
    pub max_clock_skew: Duration,
    pub backend_limit: usize,
    pub faults: FaultRates,
    pub foreign_controller: bool,
    /// Service-account tokens the OKE proxymux endpoint
    /// (`POST /resourcePrincipalSessionTokens`) exchanges for session tokens.
    pub service_account_tokens: Vec<String>,
    pub session_lifetime: Duration,
}

impl Default for DoubleConfig {
    fn default() -> Self {
        DoubleConfig {
            keys: HashMap::new(),
            accepted_delay: Duration::from_millis(20),
            progress_delay: Duration::from_millis(30),
            max_clock_skew: Duration::from_secs(300),
            backend_limit: 512,
            faults: FaultRates::default(),
            foreign_controller: false,
            service_account_tokens: Vec::new(),
            session_lifetime: Duration::from_secs(3600),
        }
    }
}

/// One request as the double saw it.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: String,
    /// The API operation, e.g. `UpdateBackend`.
    pub operation: &'static str,
    pub path: String,
    pub status: u16,
    pub body: String,
}

pub(crate) struct Lb {
    pub etag: u64,
    pub sets: BTreeMap<String, Vec<Backend>>,
    /// The work request running on it.
    pub busy: Option<String>,
}

impl Lb {
    fn total(&self) -> usize {
        self.sets.values().map(Vec::len).sum()
    }
}

pub(crate) struct WorkRequest {
    pub lb: String,
    pub kind: &'static str,
    pub state: &'static str,
    pub message: String,
}

type Hook = Box<dyn FnOnce(&mut State) + Send>;

/// The double's whole state, behind one lock.
pub struct State {
    pub cfg: DoubleConfig,
    pub(crate) lbs: BTreeMap<String, Lb>,
    pub(crate) work_requests: BTreeMap<String, WorkRequest>,
    pub(crate) calls: Vec<Call>,
    /// `(operation, status, code)` answered instead of the real thing, in order.
    pub(crate) injected: VecDeque<(&'static str, u16, &'static str)>,
    pub(crate) before_update: Option<Hook>,
    pub(crate) next_id: u64,
    /// The next this many work requests end FAILED without applying.
    pub fail_work_requests: usize,
}

impl State {
    pub(crate) fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{:06}", self.next_id)
    }

    /// A membership change of `set`: the foreign controller (if on) rewrites
    /// the whole set with `drain=false`.
    pub(crate) fn membership_changed(&mut self, lb: &str, set: &str) {
        if !self.cfg.foreign_controller {
            return;
        }
        if let Some(l) = self.lbs.get_mut(lb) {
            if let Some(backends) = l.sets.get_mut(set) {
                for b in backends.iter_mut() {
                    b.drain = false;
                }
                l.etag += 1;
            }
        }
    }

    /// Adds a backend, enforcing the limits.
    pub fn add_backend(&mut self, lb: &str, set: &str, b: Backend) -> Result<(), String> {
        let limit = self.cfg.backend_limit;
        let l = self
            .lbs
            .get_mut(lb)
            .ok_or_else(|| format!("no load balancer {lb}"))?;
        if l.total() >= limit {
            return Err(format!("load balancer {lb} already has {limit} backends"));
        }
        let backends = l.sets.entry(set.to_owned()).or_default();
        if backends.len() >= limit {
            return Err(format!("backend set {set} already has {limit} backends"));
        }
        if backends.iter().any(|x| x.name == b.name) {
            return Err(format!("backend {} exists", b.name));
        }
        backends.push(b);
        l.etag += 1;
        self.membership_changed(lb, set);
        Ok(())
    }

    pub fn backend_mut(&mut self, lb: &str, set: &str, name: &str) -> Option<&mut Backend> {
        self.lbs
            .get_mut(lb)?
            .sets
            .get_mut(set)?
            .iter_mut()
            .find(|b| b.name == name)
    }

    /// A change by another writer (console, another controller): applied at
    /// once, and the load balancer's ETag moves.
    pub fn other_writer(&mut self, lb: &str, set: &str, name: &str, f: impl FnOnce(&mut Backend)) {
        if let Some(b) = self.backend_mut(lb, set, name) {
            f(b);
        }
        if let Some(l) = self.lbs.get_mut(lb) {
            l.etag += 1;
        }
    }
}

/// A running double.
pub struct OciDouble {
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
    state: Arc<Mutex<State>>,
}

impl OciDouble {
    /// Binds `127.0.0.1:0` (or `bind`) and serves until the runtime ends.
    pub async fn start(cfg: DoubleConfig) -> OciDouble {
        Self::start_on("127.0.0.1:0".parse().unwrap(), cfg).await
    }

    pub async fn start_on(bind: SocketAddr, cfg: DoubleConfig) -> OciDouble {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(Mutex::new(State {
            cfg,
            lbs: BTreeMap::new(),
            work_requests: BTreeMap::new(),
            calls: Vec::new(),
            injected: VecDeque::new(),
            before_update: None,
            next_id: 0,
            fail_work_requests: 0,
        }));
        let (addr, ca_pem) = http::serve(bind, state.clone()).await;
        std::fs::write(dir.path().join("ca.pem"), ca_pem).unwrap();
        OciDouble { addr, dir, state }
    }

    pub fn endpoint(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The PEM certificate to trust (`oci.ca_file`).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Runs `f` on the state (under its lock).
    pub fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    pub fn add_load_balancer(&self, id: &str) {
        self.with(|s| {
            s.lbs.insert(
                id.to_owned(),
                Lb {
                    etag: 1,
                    sets: BTreeMap::new(),
                    busy: None,
                },
            )
        });
    }

    pub fn add_backend(&self, lb: &str, set: &str, ip: &str, port: u16) -> Result<(), String> {
        self.with(|s| s.add_backend(lb, set, Backend::new(ip, port)))
    }

    pub fn backend(&self, lb: &str, set: &str, name: &str) -> Option<Backend> {
        self.with(|s| s.backend_mut(lb, set, name).cloned())
    }

    pub fn etag(&self, lb: &str) -> u64 {
        self.with(|s| s.lbs[lb].etag)
    }

    /// Answers the next `count` calls of `operation` (`*`: any) with `status`/`code`.
    pub fn inject(&self, operation: &'static str, status: u16, code: &'static str, count: usize) {
        self.with(|s| {
            for _ in 0..count {
                s.injected.push_back((operation, status, code));
            }
        });
    }

    /// Runs `f` when the next UpdateBackend arrives, before its `If-Match`
    /// is checked (a writer racing the client's read-modify-write).
    pub fn before_next_update(&self, f: impl FnOnce(&mut State) + Send + 'static) {
        self.with(|s| s.before_update = Some(Box::new(f)));
    }

    pub fn set_foreign_controller(&self, on: bool) {
        self.with(|s| s.cfg.foreign_controller = on);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.with(|s| s.calls.clone())
    }

    /// Calls of `operation` answered with `status`.
    pub fn count(&self, operation: &str, status: u16) -> usize {
        self.with(|s| {
            s.calls
                .iter()
                .filter(|c| c.operation == operation && c.status == status)
                .count()
        })
    }

    /// Mutations (UpdateBackend, DeleteBackend) whose path names `backend`.
    pub fn mutations_of(&self, backend: &str) -> usize {
        self.with(|s| {
            s.calls
                .iter()
                .filter(|c| c.method != "GET" && c.path.ends_with(&format!("/backends/{backend}")))
                .count()
        })
    }
}
