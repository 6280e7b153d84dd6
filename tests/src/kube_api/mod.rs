//! A wire-level Kubernetes API server double for discovery tests: kube-rs
//! talks to it over real HTTP/1.1 on 127.0.0.1 exactly as to a real one.
//!
//! Serves namespaced Secrets and ConfigMaps (get, create, replace),
//! TokenReview (tokens registered with [`FakeApiServer::add_token`]),
//! `GET /api/v1/{pods,namespaces,services,nodes}`,
//! `/apis/networking.k8s.io/v1/servicecidrs` and
//! `/apis/discovery.k8s.io/v1/endpointslices`, Istio's
//! `/apis/security.istio.io/v1/{authorizationpolicies,peerauthentications}`
//! (404 while "not installed"): lists (resourceVersion,
//! resourceVersionMatch, limit/continue, field and label selectors,
//! metadata-only with `Accept: ...;as=PartialObjectMetadataList`), watch
//! streams (ADDED/MODIFIED/DELETED, BOOKMARK with allowWatchBookmarks,
//! ADDED/DELETED when a change moves an object across the selectors, the
//! stream ended after timeoutSeconds), HTTPS with a bearer token
//! ([`FakeApiServer::start_tls`]), and
//! 410 Gone (a Status with reason Expired) for a resourceVersion older than
//! the last [`FakeApiServer::compact`]. Tests drive it through the handle:
//! create/update/delete objects, set a pod's deletionTimestamp, drop every
//! watch, count requests.

mod selectors;
mod server;
mod state;
mod writes;

pub use writes::TokenInfo;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use state::State;

/// The resources the double serves.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Kind {
    Pod,
    Namespace,
    Service,
    EndpointSlice,
    /// Istio's `security.istio.io/v1` CRDs (served unless
    /// [`FakeApiServer::set_installed`] removes them).
    AuthorizationPolicy,
    PeerAuthentication,
    Node,
    /// `networking.k8s.io/v1` (served unless [`FakeApiServer::set_installed`]
    /// removes it, as on a cluster older than 1.33).
    ServiceCidr,
}

impl Kind {
    fn from_path(path: &str) -> Option<Kind> {
        Some(match path {
            "/api/v1/pods" => Kind::Pod,
            "/api/v1/namespaces" => Kind::Namespace,
            "/api/v1/services" => Kind::Service,
            "/apis/discovery.k8s.io/v1/endpointslices" => Kind::EndpointSlice,
            "/apis/security.istio.io/v1/authorizationpolicies" => Kind::AuthorizationPolicy,
            "/apis/security.istio.io/v1/peerauthentications" => Kind::PeerAuthentication,
            "/api/v1/nodes" => Kind::Node,
            "/apis/networking.k8s.io/v1/servicecidrs" => Kind::ServiceCidr,
            _ => return None,
        })
    }

    fn api_version(self) -> &'static str {
        match self {
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::AuthorizationPolicy | Kind::PeerAuthentication => "security.istio.io/v1",
            Kind::ServiceCidr => "networking.k8s.io/v1",
            _ => "v1",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Namespace => "Namespace",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::PeerAuthentication => "PeerAuthentication",
            Kind::Node => "Node",
            Kind::ServiceCidr => "ServiceCIDR",
        }
    }
}

/// The running double; dropping it does not stop the server (tests end anyway).
#[derive(Clone)]
pub struct FakeApiServer {
    pub addr: SocketAddr,
    /// With [`FakeApiServer::start_tls`]: the PEM of its self-signed certificate.
    pub ca_pem: Option<String>,
    state: Arc<Mutex<State>>,
}

impl FakeApiServer {
    /// Plain HTTP (`workloads.kubernetes.api_server`, like `kubectl proxy`).
    pub async fn start() -> FakeApiServer {
        Self::serve(None).await
    }

    /// HTTPS with a self-signed certificate for 127.0.0.1 (a kubeconfig
    /// with `certificate-authority-data`, like a real cluster).
    pub async fn start_tls() -> FakeApiServer {
        let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(
            rustls::pki_types::PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()),
        );
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![ck.cert.der().clone()], key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let mut api = Self::serve(Some(acceptor)).await;
        api.ca_pem = Some(ck.cert.pem());
        api
    }

    async fn serve(tls: Option<tokio_rustls::TlsAcceptor>) -> FakeApiServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let st = st.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let st = st.clone();
                        async move {
                            let resp = if writes::handles(req.uri().path()) {
                                writes::handle(&st, req).await
                            } else {
                                server::handle(&st, req)
                            };
                            Ok::<_, std::convert::Infallible>(resp)
                        }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    let _ = match tls {
                        None => http.serve_connection(TokioIo::new(tcp), svc).await,
                        Some(tls) => match tls.accept(tcp).await {
                            Ok(s) => http.serve_connection(TokioIo::new(s), svc).await,
                            Err(_) => return,
                        },
                    };
                });
            }
        });
        FakeApiServer {
            addr,
            ca_pem: None,
            state,
        }
    }

    /// `http(s)://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// The `Authorization` headers seen, in order.
    pub fn authorizations(&self) -> Vec<String> {
        self.state.lock().unwrap().authorizations.clone()
    }

    /// Creates or replaces an object (by namespace and name); fills in
    /// `creationTimestamp` when missing. Returns it as stored.
    pub fn apply(&self, kind: Kind, mut obj: Value) -> Value {
        let m = &mut obj["metadata"];
        if m.get("creationTimestamp").is_none() {
            m["creationTimestamp"] = json!(rfc3339(SystemTime::now()));
        }
        self.state.lock().unwrap().put(kind, obj)
    }

    /// Changes a stored object in place; panics if it does not exist.
    pub fn modify(&self, kind: Kind, ns: &str, name: &str, f: impl FnOnce(&mut Value)) -> Value {
        let mut st = self.state.lock().unwrap();
        let mut obj = st
            .objects
            .get(&kind)
            .and_then(|m| m.get(&(ns.to_owned(), name.to_owned())))
            .unwrap_or_else(|| panic!("no {kind:?} {ns}/{name}"))
            .clone();
        f(&mut obj);
        st.put(kind, obj)
    }

    pub fn delete(&self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        self.state.lock().unwrap().remove(kind, ns, name)
    }

    /// What `kubectl delete pod` does first: `deletionTimestamp` = now + grace.
    /// Returns the deadline.
    pub fn start_pod_deletion(&self, ns: &str, name: &str, grace: Duration) -> SystemTime {
        let deadline = SystemTime::now() + grace;
        // Kubernetes timestamps have second precision.
        let secs = deadline
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let deadline = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        self.modify(Kind::Pod, ns, name, |p| {
            p["metadata"]["deletionTimestamp"] = json!(rfc3339(deadline));
            p["metadata"]["deletionGracePeriodSeconds"] = json!(grace.as_secs());
        });
        deadline
    }

    /// Ends every open watch stream (clients resume from their last resourceVersion).
    pub fn drop_watches(&self) {
        self.state.lock().unwrap().watches.clear();
    }

    /// Simulates an API server outage: while on, every list and watch gets 500 InternalError.
    pub fn set_unavailable(&self, on: bool) {
        self.state.lock().unwrap().unavailable = on;
    }

    /// Whether the resource is served (a CRD installed); requests for one
    /// that is not answer 404, as for a CRD not installed.
    pub fn set_installed(&self, kind: Kind, on: bool) {
        let mut st = self.state.lock().unwrap();
        if on {
            st.absent.remove(&kind);
        } else {
            st.absent.insert(kind);
        }
    }

    /// A BOOKMARK at the current resourceVersion to every watch that allows them.
    pub fn bookmark_all(&self) {
        self.state.lock().unwrap().bookmark_all();
    }

    /// Forgets the change history: a watch or exact list from an older
    /// resourceVersion now gets 410 Gone, forcing a relist.
    pub fn compact(&self) {
        self.state.lock().unwrap().compact();
    }

    /// Requests served for `kind`; `verb` is `list` or `watch`.
    pub fn requests(&self, kind: Kind, verb: &str) -> u64 {
        let st = self.state.lock().unwrap();
        st.requests
            .iter()
            .filter(|((k, v), _)| *k == kind && *v == verb)
            .map(|(_, n)| *n)
            .sum()
    }

    /// Requests for `kind` that asked for metadata only.
    pub fn metadata_only_requests(&self, kind: Kind) -> u64 {
        let st = self.state.lock().unwrap();
        st.metadata_only.get(&kind).copied().unwrap_or(0)
    }

    /// Registers a token TokenReview will accept.
    pub fn add_token(&self, token: &str, info: TokenInfo) {
        self.state
            .lock()
            .unwrap()
            .named
            .tokens
            .insert(token.to_owned(), info);
    }

    /// TokenReviews answered.
    pub fn token_reviews(&self) -> u64 {
        self.state.lock().unwrap().named.token_reviews
    }

    /// A namespaced Secret or ConfigMap (`resource` is `secrets` or `configmaps`).
    pub fn named(&self, resource: &str, ns: &str, name: &str) -> Option<Value> {
        let st = self.state.lock().unwrap();
        st.named
            .objects
            .get(&(resource.to_owned(), ns.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Writes a namespaced Secret or ConfigMap as an operator's `kubectl
    /// apply` would (the object as given).
    pub fn put_named(&self, resource: &str, ns: &str, name: &str, object: Value) {
        self.state.lock().unwrap().named.objects.insert(
            (resource.to_owned(), ns.to_owned(), name.to_owned()),
            object,
        );
    }

    /// Open watch streams for `kind`.
    pub fn watches(&self, kind: Kind) -> usize {
        let st = self.state.lock().unwrap();
        st.watches
            .iter()
            .filter(|w| w.kind == kind && !w.tx.is_closed())
            .count()
    }
}

/// `2026-11-29T18:48:11Z` (UTC, second precision, as the API server writes).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
