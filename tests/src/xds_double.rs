//! An xDS server double: istiod's delta ADS (`DeltaAggregatedResources`
//! over gRPC/TLS) as `pilot/pkg/xds/workload_test.go` describes it, with
//! resources the test scripts.
//!
//! - A stream's first request of a type is its subscription (wildcard):
//!   the double answers with every resource of the type whose version
//!   differs from the request's `initial_resource_versions`, and removes
//!   the names it holds there that the double no longer has (istiod's
//!   reconnect, `TestWorkloadReconnect`).
//! - [`XdsDouble::set`] / [`XdsDouble::remove`] push a response to every
//!   stream subscribed to the type; each response has its own nonce.
//! - Every later request is the reply to a nonce: recorded as an
//!   [`Reply`] (ACK, or NACK with its `error_detail`), awaited by tests
//!   with [`XdsDouble::reply`].
//! - [`XdsDouble::push_to_reply`]: how long after a push each stream
//!   replied to it.
//! - [`XdsDouble::cut`] ends every open stream (istiod restarting or
//!   closing at its maximum connection age).
//!
//! No authentication: the headers and the node of each stream are kept
//! for the test to check.
//!
//! [`XdsDouble::serve_unix`] serves the same resources in plaintext on a
//! Unix socket besides, as Cilium's agent does (one socket a node).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use futures::channel::mpsc;
use futures::StreamExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message as _;
use tidegate_authz::xds::{Authorization, MatchType, XdsClause, XdsMatch, XdsRule, XdsStringMatch};
use tidegate_xds::envelope::{Any, DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Resource};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// A client's reply to one response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub type_url: String,
    pub nonce: String,
    /// `Some`: a NACK, with its `error_detail.message`.
    pub nack: Option<String>,
    /// The stream it came on (0: the first opened; [`XdsDouble::opened`]).
    pub stream: usize,
    /// When the double read it.
    pub at: Instant,
}

/// A stream as it opened.
#[derive(Clone, Debug)]
pub struct Opened {
    pub node: Option<Node>,
    pub authorization: Option<String>,
    pub cluster_id: Option<String>,
    /// The first request of each type: its `initial_resource_versions`.
    pub initial: BTreeMap<String, HashMap<String, String>>,
    /// The nonce of the answer to each subscription.
    pub answered: BTreeMap<String, String>,
}

/// A running double.
pub struct XdsDouble {
    pub addr: SocketAddr,
    /// The root that issued the serving certificate (for the address listened on).
    pub root_pem: String,
    state: Arc<State>,
    events: watch::Receiver<u64>,
}

#[derive(Default)]
struct Held {
    /// type → name → (version, value).
    resources: BTreeMap<String, BTreeMap<String, (String, Bytes)>>,
    streams: Vec<Stream>,
    nonce: u64,
    replies: Vec<Reply>,
    /// Nonce → the indexes of its replies in `replies`: a reply is found
    /// without a walk of every reply so far (a bench sends thousands).
    by_nonce: HashMap<String, Vec<usize>>,
    opened: Vec<Opened>,
    version: u64,
    /// When each push was sent (by nonce).
    pushed: HashMap<String, Instant>,
}

impl Held {
    /// The replies to `nonce`, in the order they came.
    fn replies_to<'a>(&'a self, nonce: &str) -> impl Iterator<Item = &'a Reply> + Clone + 'a {
        self.by_nonce
            .get(nonce)
            .into_iter()
            .flatten()
            .map(|i| &self.replies[*i])
    }
}

struct Stream {
    types: Vec<String>,
    tx: mpsc::UnboundedSender<Result<DeltaDiscoveryResponse, tonic::Status>>,
}

struct State {
    held: Mutex<Held>,
    /// Bumped on every reply and every stream opened.
    events: watch::Sender<u64>,
}

impl State {
    fn event(&self) {
        self.events.send_modify(|n| *n += 1);
    }
}

impl XdsDouble {
    pub async fn start() -> XdsDouble {
        Self::start_on([127, 0, 0, 1].into()).await
    }

    /// Listens on `ip` (an ephemeral port), its serving certificate for
    /// `ip`; serves on the runtime (and in the network namespace) of the
    /// caller.
    pub async fn start_on(ip: IpAddr) -> XdsDouble {
        let (root, root_pem) = crate::ca_double::ca("xds double root");
        let tls = crate::ca_double::serving_tls_for(&root, &root_pem, ip);
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (events, rx) = watch::channel(0);
        let state = Arc::new(State {
            held: Mutex::new(Held::default()),
            events,
        });
        tokio::spawn(serve(listener, tls, state.clone()));
        XdsDouble {
            addr,
            root_pem,
            state,
            events: rx,
        }
    }

    /// Also serves plaintext on a Unix socket at `path` (a stale file there
    /// is removed), as Cilium's agent serves `/var/run/cilium/xds.sock`;
    /// until the double is dropped.
    pub fn serve_unix(&self, path: &std::path::Path) -> std::io::Result<()> {
        let _ = std::fs::remove_file(path);
        let listener = tokio::net::UnixListener::bind(path)?;
        let state = Arc::downgrade(&self.state);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let Some(state) = state.upgrade() else {
                    return;
                };
                tokio::spawn(serve_connection(stream, state));
            }
        });
        Ok(())
    }

    /// Holds `value` as `name` of `type_url` at a new version and pushes it
    /// to every subscribed stream; returns the nonce of the push (`None`
    /// when no stream is subscribed).
    pub fn set(&self, type_url: &str, name: &str, value: impl Into<Bytes>) -> Option<String> {
        self.set_all(type_url, [(name.to_owned(), value.into())])
    }

    /// Several resources in one response.
    pub fn set_all(
        &self,
        type_url: &str,
        items: impl IntoIterator<Item = (String, Bytes)>,
    ) -> Option<String> {
        let mut held = self.state.held.lock().unwrap();
        let mut resources = Vec::new();
        for (name, value) in items {
            held.version += 1;
            let version = held.version.to_string();
            resources.push(resource(type_url, &name, &version, value.clone()));
            held.resources
                .entry(type_url.to_owned())
                .or_default()
                .insert(name, (version, value));
        }
        push(&mut held, type_url, resources, vec![])
    }

    /// Stops holding `name`; pushes its removal.
    pub fn remove(&self, type_url: &str, name: &str) -> Option<String> {
        let mut held = self.state.held.lock().unwrap();
        if let Some(r) = held.resources.get_mut(type_url) {
            r.remove(name);
        }
        push(&mut held, type_url, vec![], vec![name.to_owned()])
    }

    /// Changes what is held without telling anyone (istiod changing while
    /// the client is away).
    pub fn set_quietly(&self, type_url: &str, name: &str, value: impl Into<Bytes>) {
        let mut held = self.state.held.lock().unwrap();
        held.version += 1;
        let version = held.version.to_string();
        held.resources
            .entry(type_url.to_owned())
            .or_default()
            .insert(name.to_owned(), (version, value.into()));
    }

    /// Forgets `name` without telling anyone.
    pub fn remove_quietly(&self, type_url: &str, name: &str) {
        if let Some(r) = self.state.held.lock().unwrap().resources.get_mut(type_url) {
            r.remove(name);
        }
    }

    /// Ends every open stream cleanly, as a restarting istiod does.
    pub fn cut(&self) {
        for s in self.state.held.lock().unwrap().streams.drain(..) {
            s.tx.close_channel();
        }
    }

    /// The streams opened so far.
    pub fn opened(&self) -> Vec<Opened> {
        self.state.held.lock().unwrap().opened.clone()
    }

    /// Waits for the client's reply to `nonce`.
    pub async fn reply(&self, nonce: &str) -> Reply {
        let mut events = self.events.clone();
        loop {
            if let Some(r) = self.state.held.lock().unwrap().replies_to(nonce).next() {
                return r.clone();
            }
            events.changed().await.unwrap();
        }
    }

    /// Waits until `n` clients have replied to `nonce` (every gateway
    /// of a node pair applied one push); the first NACK's message if one
    /// refused it.
    pub async fn replied_by(&self, nonce: &str, n: usize) -> Result<(), String> {
        let mut events = self.events.clone();
        loop {
            {
                let held = self.state.held.lock().unwrap();
                let mut to = held.replies_to(nonce);
                if let Some(nack) = to.clone().find_map(|r| r.nack.clone()) {
                    return Err(nack);
                }
                if to.by_ref().count() >= n {
                    return Ok(());
                }
            }
            events.changed().await.map_err(|e| e.to_string())?;
        }
    }

    /// Waits until `n` streams have been opened.
    pub async fn opened_at_least(&self, n: usize) -> Vec<Opened> {
        let mut events = self.events.clone();
        loop {
            let opened = self.opened();
            if opened.len() >= n {
                return opened;
            }
            events.changed().await.unwrap();
        }
    }

    /// Waits for stream `index` (0: the first opened) to be answered its
    /// subscription to `type_url`; the nonce of that answer.
    pub async fn answered(&self, index: usize, type_url: &str) -> String {
        let mut events = self.events.clone();
        loop {
            if let Some(n) = self
                .state
                .held
                .lock()
                .unwrap()
                .opened
                .get(index)
                .and_then(|o| o.answered.get(type_url))
            {
                return n.clone();
            }
            events.changed().await.unwrap();
        }
    }

    /// Every reply so far.
    pub fn replies(&self) -> Vec<Reply> {
        self.state.held.lock().unwrap().replies.clone()
    }

    /// When the push of `nonce` was sent ([`XdsDouble::set`],
    /// [`XdsDouble::remove`]; not a subscription's answer).
    pub fn pushed_at(&self, nonce: &str) -> Option<Instant> {
        self.state.held.lock().unwrap().pushed.get(nonce).copied()
    }

    /// The push of `nonce` → each stream's reply to it: (stream, time,
    /// whether it was a NACK).
    pub fn push_to_reply(&self, nonce: &str) -> Vec<(usize, std::time::Duration, bool)> {
        let held = self.state.held.lock().unwrap();
        let Some(&pushed) = held.pushed.get(nonce) else {
            return Vec::new();
        };
        held.replies_to(nonce)
            .map(|r| {
                (
                    r.stream,
                    r.at.saturating_duration_since(pushed),
                    r.nack.is_some(),
                )
            })
            .collect()
    }
}

/// An `istio.security.Authorization` of `namespace`, one rule of one
/// clause of `m`, encoded as the double serves it; `scope` and `action` as
/// istiod numbers them (scope 1 namespace, 2 workload selector; action 0
/// ALLOW, 1 DENY).
pub fn authorization(
    namespace: &str,
    name: &str,
    scope: i32,
    action: i32,
    m: XdsMatch,
    dry_run: bool,
) -> Bytes {
    Authorization {
        name: name.into(),
        namespace: namespace.into(),
        scope,
        action,
        rules: vec![XdsRule {
            clauses: vec![XdsClause { matches: vec![m] }],
        }],
        dry_run,
    }
    .encode_to_vec()
    .into()
}

/// A match of one principal, exactly (`<trust domain>/ns/<ns>/sa/<sa>`).
pub fn principal(p: &str) -> XdsMatch {
    XdsMatch {
        principals: vec![XdsStringMatch {
            match_type: Some(MatchType::Exact(p.into())),
        }],
        ..Default::default()
    }
}

fn resource(type_url: &str, name: &str, version: &str, value: Bytes) -> Resource {
    Resource {
        version: version.to_owned(),
        name: name.to_owned(),
        resource: Some(Any {
            type_url: type_url.to_owned(),
            value,
        }),
        aliases: vec![],
    }
}

/// Sends a response to every stream subscribed to `type_url`.
fn push(
    held: &mut Held,
    type_url: &str,
    resources: Vec<Resource>,
    removed: Vec<String>,
) -> Option<String> {
    held.nonce += 1;
    let nonce = held.nonce.to_string();
    let at = Instant::now();
    let mut sent = false;
    held.streams.retain(|s| {
        if !s.types.iter().any(|t| t == type_url) {
            return true;
        }
        let r = DeltaDiscoveryResponse {
            type_url: type_url.to_owned(),
            nonce: nonce.clone(),
            resources: resources.clone(),
            removed_resources: removed.clone(),
            ..Default::default()
        };
        let open = s.tx.unbounded_send(Ok(r)).is_ok();
        sent |= open;
        open
    });
    if sent {
        held.pushed.insert(nonce.clone(), at);
    }
    sent.then_some(nonce)
}

async fn serve(listener: TcpListener, tls: tokio_rustls::TlsAcceptor, state: Arc<State>) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        // As istiod's (Go sets TCP_NODELAY on every connection): without
        // it a small answer waited on the client's delayed ACK, and a
        // subscription of 100 workloads took 41 ms to be ACKed, not 2.
        let _ = tcp.set_nodelay(true);
        let (tls, state) = (tls.clone(), state.clone());
        tokio::spawn(async move {
            let Ok(stream) = tls.accept(tcp).await else {
                return;
            };
            serve_connection(stream, state).await;
        });
    }
}

/// One HTTP/2 connection of delta ADS streams.
async fn serve_connection<S>(stream: S, state: Arc<State>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
        let state = state.clone();
        async move {
            let codec =
                tonic_prost::ProstCodec::<DeltaDiscoveryResponse, DeltaDiscoveryRequest>::default();
            Ok::<_, std::convert::Infallible>(
                tonic::server::Grpc::new(codec)
                    .streaming(Ads(state), req)
                    .await,
            )
        }
    });
    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), svc)
        .await;
}

/// The streaming method, as tonic's handler wants it.
struct Ads(Arc<State>);

type Responses = mpsc::UnboundedReceiver<Result<DeltaDiscoveryResponse, tonic::Status>>;

impl tonic::server::StreamingService<DeltaDiscoveryRequest> for Ads {
    type Response = DeltaDiscoveryResponse;
    type ResponseStream = Responses;
    type Future = std::future::Ready<Result<tonic::Response<Responses>, tonic::Status>>;

    fn call(
        &mut self,
        req: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Self::Future {
        let header = |k: &str| {
            req.metadata()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let (authorization, cluster_id) = (header("authorization"), header("clusterid"));
        let (tx, rx) = mpsc::unbounded();
        let state = self.0.clone();
        let index = {
            let mut held = state.held.lock().unwrap();
            held.opened.push(Opened {
                node: None,
                authorization,
                cluster_id,
                initial: BTreeMap::new(),
                answered: BTreeMap::new(),
            });
            held.opened.len() - 1
        };
        tokio::spawn(requests(state, index, req.into_inner(), tx));
        std::future::ready(Ok(tonic::Response::new(rx)))
    }
}

/// Reads a stream's requests: subscriptions, then replies.
async fn requests(
    state: Arc<State>,
    index: usize,
    mut incoming: tonic::Streaming<DeltaDiscoveryRequest>,
    tx: mpsc::UnboundedSender<Result<DeltaDiscoveryResponse, tonic::Status>>,
) {
    let mut subscribed: Vec<String> = Vec::new();
    while let Some(Ok(req)) = incoming.next().await {
        let mut held = state.held.lock().unwrap();
        if !subscribed.contains(&req.type_url) {
            subscribed.push(req.type_url.clone());
            let opened = &mut held.opened[index];
            if opened.node.is_none() {
                opened.node = req.node.clone();
            }
            opened
                .initial
                .insert(req.type_url.clone(), req.initial_resource_versions.clone());
            // The answer to the subscription: what differs, what is gone.
            let mine = held
                .resources
                .get(&req.type_url)
                .cloned()
                .unwrap_or_default();
            let resources = mine
                .iter()
                .filter(|(name, (v, _))| req.initial_resource_versions.get(*name) != Some(v))
                .map(|(name, (v, value))| resource(&req.type_url, name, v, value.clone()))
                .collect();
            let removed = req
                .initial_resource_versions
                .keys()
                .filter(|name| !mine.contains_key(*name))
                .cloned()
                .collect();
            held.nonce += 1;
            let nonce = held.nonce.to_string();
            held.opened[index]
                .answered
                .insert(req.type_url.clone(), nonce.clone());
            let _ = tx.unbounded_send(Ok(DeltaDiscoveryResponse {
                type_url: req.type_url.clone(),
                nonce,
                resources,
                removed_resources: removed,
                ..Default::default()
            }));
            // Registered (or re-registered with one more type) under the
            // same lock as the answer: no push can come in between.
            held.streams.retain(|s| !s.tx.same_receiver(&tx));
            held.streams.push(Stream {
                types: subscribed.clone(),
                tx: tx.clone(),
            });
        } else {
            let at = held.replies.len();
            held.by_nonce
                .entry(req.response_nonce.clone())
                .or_default()
                .push(at);
            held.replies.push(Reply {
                type_url: req.type_url,
                nonce: req.response_nonce,
                nack: req.error_detail.map(|e| e.message),
                stream: index,
                at: Instant::now(),
            });
        }
        drop(held);
        state.event();
    }
}
