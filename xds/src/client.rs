//! The delta ADS client, as ztunnel speaks it to istiod.
//!
//! One gRPC stream (`DeltaAggregatedResources`) carries every subscribed
//! type. At connect, one request per type: the node (its id and metadata
//! make istiod treat the client as a node proxy), a wildcard subscription,
//! and `initial_resource_versions` — every resource held from the previous
//! stream, so a reconnect does not start over: the store is never cleared,
//! and istiod answers with what changed and removes what it no longer has.
//!
//! Each response is applied resource by resource ([`Handler::handle`]): a
//! resource that does not decode or apply is refused on its own and the
//! others are applied. The reply names the response's nonce — an ACK, or,
//! when anything was refused, a NACK whose `error_detail` lists each
//! refused name with its reason (`<name>: <reason>; …`). A refused
//! resource keeps whatever version was held before (its version is not
//! recorded, so istiod sends it again on the next stream). A response of a
//! type not subscribed is logged and ACKed, never applied.
//!
//! What a hostile or broken istiod can send is bounded ([`Limits`]): a
//! response past `max_message` is refused from its gRPC length prefix,
//! before its body is read (the stream fails and is opened again;
//! nothing held is lost), and a resource past `max_resource` is refused on
//! its own (NACKed naming the limit). A NACK repeated with the same
//! reason (istiod sending the same bad resource again and again) is
//! logged once a minute with the count of repeats, not once per response.
//!
//! A stream that ends is reconnected with a backoff from 10 ms doubling to
//! 15 s. Only a stream that delivered at least one response and then ended
//! cleanly, or the way istiod routinely closes streams (its maximum
//! connection age: GOAWAY, `Unknown`, `Cancelled`, `DeadlineExceeded`),
//! starts the backoff over; a stream that ends before any response counts
//! as a failure whatever its status, so a server that ends every stream at
//! once is not asked again every 10 ms with megabytes of
//! `initial_resource_versions`. The token is read again for every stream.
//!
//! A stream with no response within `first_answer_timeout` of being
//! requested (connecting included) is given up and counts as a failure;
//! the channel's pulse ([`channel::Pulse`]) notices a connection that went
//! silent after that, and a stream stopped half-way through a message
//! fails after the pulse's `message_timeout` ([`mid_message`]).
//!
//! With [`ClientConfig::workloads_only`] (Cilium's agent, whose server
//! sends Workloads and nothing else) an `istio.workload.Address` holding
//! a Service is refused on its own, and a response of a type not
//! subscribed is NACKed naming each of its resources instead of ACKed;
//! the rest is applied. The address is `https://` or a Unix socket
//! ([`crate::transport`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::channel::mpsc;
use prost::Message as _;
use tonic::Code;
use tracing::{debug, info, warn};

use crate::envelope::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Status, DELTA_ADS};
use crate::lifted::{Lifted, LiftedCodec, Shelf};
use crate::metrics::{Oversized, Termination, XdsMetrics};
use crate::mid_message::{self, MidMessage};
use tidegate_channel::{self as channel, Target};

/// `istio.workload.Address`: workloads and Services.
pub const ADDRESS: &str = "type.googleapis.com/istio.workload.Address";
/// `istio.security.Authorization`: L4 authorization policies.
pub const AUTHORIZATION: &str = "type.googleapis.com/istio.security.Authorization";

/// The largest response accepted by default (ztunnel's limit: a large
/// mesh's first answer is one message).
pub const MAX_MESSAGE: usize = 200 << 20;

/// The largest single resource accepted by default: a Workload is a few
/// hundred bytes, and each resource is converted from one Kubernetes
/// object (at most 1.5 MiB by default).
pub const MAX_RESOURCE: usize = 4 << 20;

/// A NACK with the reason of the previous one of its type is logged at
/// most this often (with the count of repeats).
pub const REPEAT_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// At most this many refusals are listed in a NACK's `error_detail` and
/// its log line; the rest are counted (`… and N more`).
pub const LISTED_REFUSALS: usize = 100;

/// What one response and one resource may weigh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// A response past this is refused from its length prefix, unread.
    pub max_message: usize,
    /// A resource past this (its encoded message) is refused on its own.
    pub max_resource: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message: MAX_MESSAGE,
            max_resource: MAX_RESOURCE,
        }
    }
}

/// How long a new stream may wait for its first response, connecting
/// included: a large mesh's first answer takes istiod seconds to build.
pub const FIRST_ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

const BACKOFF_FIRST: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(15);

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub target: Target,
    /// The projected service-account token (audience `istio-ca`), read for
    /// every stream and sent as `authorization: Bearer`. Unset: none sent.
    pub token: Option<PathBuf>,
    pub cluster_id: String,
    pub node: Node,
    /// The type URLs subscribed, wildcard.
    pub types: Vec<String>,
    /// A stream with no response this long after it was requested is
    /// failed and opened again ([`FIRST_ANSWER_TIMEOUT`] by default).
    pub first_answer_timeout: Duration,
    pub limits: Limits,
    /// The server sends Workloads only (Cilium's agent): a Service, or a
    /// response of a type not subscribed, is refused with its reason.
    pub workloads_only: bool,
}

/// A resource of a response, to apply.
#[derive(Clone, Debug)]
pub struct Update {
    pub name: String,
    pub version: String,
    /// The encoded message (`Any.value`), its type already checked.
    pub value: Bytes,
}

/// A resource refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    pub name: String,
    pub reason: String,
}

/// Applies responses. Called on the client's task, one response at a
/// time, in the order they arrive.
pub trait Handler: Send {
    /// Applies `updates` and `removed` of `type_url`, each on its own;
    /// returns those of `updates` refused. A refused resource's previous
    /// version (if any) stays applied.
    fn handle(
        &mut self,
        type_url: &str,
        updates: Vec<Update>,
        removed: Vec<String>,
    ) -> Vec<Rejected>;
}

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("xds.address {0}")]
    Address(#[from] channel::AddressError),
    #[error("cannot read the token {path}: {source}")]
    Token {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("istiod not reachable: {0}")]
    Connect(String),
    #[error("istiod answered {code:?}: {message}")]
    Status { code: Code, message: String },
    /// istiod completed TLS, then sent nothing.
    #[error("istiod stopped answering: {0}")]
    NoPreface(String),
    /// istiod stopped half-way through a message.
    #[error("{0}; the stream is opened again")]
    Stalled(String),
    #[error("istiod sent no response within {after:?} of the stream being requested; check istiod's load and logs")]
    NoAnswer { after: Duration },
    /// A response's length prefix past [`Limits::max_message`]: refused
    /// before its body was read.
    #[error("istiod sent a response past the size limit (max_message_size), refused unread: {0}")]
    TooLarge(String),
}

impl StreamError {
    fn termination(&self) -> Termination {
        match self {
            StreamError::Address(_) | StreamError::Token { .. } | StreamError::Connect(_) => {
                Termination::ConnectionError
            }
            StreamError::NoPreface(_) | StreamError::NoAnswer { .. } | StreamError::Stalled(_) => {
                Termination::Timeout
            }
            StreamError::TooLarge(_) => Termination::Error,
            StreamError::Status { code, message } => {
                let routine = matches!(
                    code,
                    Code::Unknown | Code::Cancelled | Code::DeadlineExceeded
                ) || message.contains("transport is closing")
                    || message.contains("received prior goaway");
                if routine {
                    Termination::Reconnect
                } else if *code == Code::Unavailable {
                    Termination::ConnectionError
                } else {
                    Termination::Error
                }
            }
        }
    }
}

impl From<tonic::Status> for StreamError {
    fn from(s: tonic::Status) -> Self {
        if let Some(message) = channel::no_preface(&s) {
            return StreamError::NoPreface(message);
        }
        if s.message().starts_with(mid_message::STALLED) {
            return StreamError::Stalled(s.message().to_owned());
        }
        // tonic's refusal of a length prefix past the decoding limit.
        if s.code() == Code::OutOfRange && s.message().contains("message length too large") {
            return StreamError::TooLarge(s.message().to_owned());
        }
        StreamError::Status {
            code: s.code(),
            message: s.message().to_owned(),
        }
    }
}

/// The client: what it holds across streams is the version of every
/// resource applied, by type.
pub struct AdsClient {
    cfg: ClientConfig,
    metrics: XdsMetrics,
    /// Type → resource name → version.
    held: HashMap<String, foldhash::HashMap<String, String>>,
    repeats: Repeats,
}

impl AdsClient {
    pub fn new(cfg: ClientConfig, metrics: XdsMetrics) -> AdsClient {
        AdsClient {
            cfg,
            metrics,
            held: HashMap::new(),
            repeats: Repeats::default(),
        }
    }

    /// Streams from istiod into `handler`, reconnecting, until dropped.
    pub async fn run(mut self, handler: &mut dyn Handler) {
        let channel = match crate::transport::connect_lazy(&self.cfg.target) {
            Ok(c) => c,
            Err(e) => {
                // Checked when the configuration is read; a client built
                // around it anyway has nowhere to go.
                warn!(error = %e, "xDS client not started");
                return;
            }
        };
        let mut backoff = BACKOFF_FIRST;
        loop {
            let mut answered = false;
            let ended = self.stream(channel.clone(), handler, &mut answered).await;
            self.metrics.connected.set(0);
            if let Err(StreamError::TooLarge(_)) = &ended {
                self.metrics.oversized(Oversized::Message);
            }
            let reason = match &ended {
                Ok(()) => Termination::Complete,
                Err(e) => e.termination(),
            };
            let routine = matches!(reason, Termination::Complete | Termination::Reconnect);
            let reason = if routine && !answered {
                Termination::Unanswered
            } else {
                reason
            };
            self.metrics.terminated(reason);
            if routine && answered {
                info!(address = %self.cfg.target.address, ?reason, "xDS stream ended; reconnecting");
                backoff = BACKOFF_FIRST;
            } else {
                let error = match &ended {
                    Ok(()) => "ended before any response".to_owned(),
                    Err(e) if routine => format!("ended before any response: {e}"),
                    Err(e) => e.to_string(),
                };
                warn!(address = %self.cfg.target.address, ?reason, %error, retry_in = ?backoff, "xDS stream failed");
            }
            tokio::time::sleep(backoff).await;
            if !(routine && answered) {
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// One stream, until it ends; `answered` is set once a response arrived.
    async fn stream(
        &mut self,
        channel: tonic::transport::Channel,
        handler: &mut dyn Handler,
        answered: &mut bool,
    ) -> Result<(), StreamError> {
        let (tx, rx) = mpsc::unbounded::<DeltaDiscoveryRequest>();
        for type_url in &self.cfg.types {
            let held = self.held.get(type_url).map_or_else(HashMap::new, |held| {
                held.iter()
                    .map(|(name, version)| (name.clone(), version.clone()))
                    .collect()
            });
            let _ = tx.unbounded_send(DeltaDiscoveryRequest {
                node: Some(self.cfg.node.clone()),
                type_url: type_url.clone(),
                initial_resource_versions: held,
                ..Default::default()
            });
        }
        let mut request = tonic::Request::new(rx);
        let md = request.metadata_mut();
        if let Some(path) = &self.cfg.token {
            let token = std::fs::read_to_string(path).map_err(|source| StreamError::Token {
                path: path.clone(),
                source,
            })?;
            let value =
                format!("Bearer {}", token.trim())
                    .parse()
                    .map_err(|_| StreamError::Token {
                        path: path.clone(),
                        source: std::io::Error::other("the token is not a valid header value"),
                    })?;
            md.insert("authorization", value);
        }
        if let Ok(v) = self.cfg.cluster_id.parse() {
            md.insert("clusterid", v);
        }
        let stalled = self.cfg.target.pulse.message_timeout;
        let max_message = self.cfg.limits.max_message;
        // Each response is decoded from the frames that brought it, not
        // from a buffer the stream keeps at the size of its largest.
        let shelf = Shelf::default();
        let bodies = shelf.clone();
        let channel = tower::ServiceBuilder::new()
            .map_response(move |r: http::Response<tonic::body::Body>| {
                let shelf = bodies.clone();
                r.map(|body| Lifted::new(MidMessage::new(body, stalled), shelf, max_message))
            })
            .service(channel);
        let mut grpc = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(self.cfg.limits.max_message);
        grpc.ready()
            .await
            .map_err(|e| StreamError::Connect(e.to_string()))?;
        let codec = LiftedCodec::new(shelf);
        // Connecting happens inside the call (the channel is lazy): the
        // bound on the first answer covers it.
        let after = self.cfg.first_answer_timeout;
        let deadline = tokio::time::Instant::now() + after;
        let no_answer = |_| StreamError::NoAnswer { after };
        let mut responses = tokio::time::timeout_at(
            deadline,
            grpc.streaming(
                request,
                http::uri::PathAndQuery::from_static(DELTA_ADS),
                codec,
            ),
        )
        .await
        .map_err(no_answer)??
        .into_inner();
        self.metrics.connected.set(1);
        info!(address = %self.cfg.target.address, "xDS stream open");
        let mut next = tokio::time::timeout_at(deadline, responses.message())
            .await
            .map_err(no_answer)??;
        while let Some(response) = next {
            *answered = true;
            let reply = self.apply(response, handler);
            if tx.unbounded_send(reply).is_err() {
                break;
            }
            // Responses already received are ready at once, and applying
            // one never waits: without a yield, a backlog would be applied
            // to its end before whoever holds this future (the gateway's
            // shutdown) is polled again. A backlog never holds the exit;
            // istiod resends what was not acknowledged on the next stream.
            tokio::task::yield_now().await;
            next = responses.message().await?;
        }
        Ok(())
    }

    /// Applies one response; returns its ACK or NACK.
    fn apply(
        &mut self,
        response: DeltaDiscoveryResponse,
        handler: &mut dyn Handler,
    ) -> DeltaDiscoveryRequest {
        let url = response.type_url.clone();
        XdsMetrics::url(&self.metrics.messages, &url, 1);
        XdsMetrics::url(
            &self.metrics.message_bytes,
            &url,
            response.encoded_len() as u64,
        );
        let mut ack = DeltaDiscoveryRequest {
            type_url: url.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        };
        if !self.cfg.types.contains(&url) && self.cfg.workloads_only {
            let rejected: Vec<Rejected> = response
                .resources
                .iter()
                .map(|r| Rejected {
                    name: r.name.clone(),
                    reason: format!(
                        "of type {url:?}, not subscribed (the server sends Workloads only)"
                    ),
                })
                .collect();
            XdsMetrics::url(&self.metrics.rejected, &url, rejected.len() as u64);
            let message = if rejected.is_empty() {
                format!("a response of type {url:?}, not subscribed")
            } else {
                nack_message(&rejected)
            };
            if let Some(repeated) =
                self.repeats
                    .log(&format!("unsubscribed {url}"), &message, Instant::now())
            {
                warn!(type_url = %url, repeated, %message, "xDS response of a type not subscribed; refused (NACK)");
            }
            ack.error_detail = Some(Status { code: 0, message });
            return ack;
        }
        if !self.cfg.types.contains(&url) {
            let message = format!("a response of type {url:?}, not subscribed");
            if let Some(repeated) =
                self.repeats
                    .log(&format!("unsubscribed {url}"), &message, Instant::now())
            {
                warn!(type_url = %url, repeated, "xDS response of a type not subscribed; acknowledged and ignored");
            }
            return ack;
        }
        let Triage {
            mut updates,
            removed,
            mut rejected,
            oversized,
        } = triage(response, self.cfg.limits);
        if self.cfg.workloads_only && url == ADDRESS {
            updates.retain(|u| {
                if !holds_service(&u.value) {
                    return true;
                }
                rejected.push(Rejected {
                    name: u.name.clone(),
                    reason: SERVICE_REFUSED.to_owned(),
                });
                false
            });
        }
        for _ in 0..oversized {
            self.metrics.oversized(Oversized::Resource);
        }
        let versions: Vec<(String, String)> = updates
            .iter()
            .map(|u| (u.name.clone(), u.version.clone()))
            .collect();
        let held = self.held.entry(url.clone()).or_default();
        for name in &removed {
            held.remove(name);
        }
        rejected.extend(handler.handle(&url, updates, removed));
        let refused: foldhash::HashSet<&str> = rejected.iter().map(|r| r.name.as_str()).collect();
        for (name, version) in versions {
            if !refused.contains(name.as_str()) {
                held.insert(name, version);
            }
        }
        if !rejected.is_empty() {
            XdsMetrics::url(&self.metrics.rejected, &url, rejected.len() as u64);
            let message = nack_message(&rejected);
            if let Some(repeated) = self.repeats.log(&url, &message, Instant::now()) {
                warn!(type_url = %url, refused = rejected.len(), repeated, %message, "xDS resources refused (NACK); the others are applied");
            } else {
                debug!(type_url = %url, refused = rejected.len(), "xDS resources refused again, for the same reasons (NACK)");
            }
            ack.error_detail = Some(Status { code: 0, message });
        } else {
            debug!(type_url = %url, "xDS response applied");
        }
        ack
    }
}

/// A response sorted: the resources to apply, the names removed, the
/// resources refused before they reach the handler (no resource, another
/// type than the response's, past [`Limits::max_resource`]) and how many
/// of those were past the limit.
#[derive(Debug, Default)]
pub struct Triage {
    pub updates: Vec<Update>,
    pub removed: Vec<String>,
    pub rejected: Vec<Rejected>,
    pub oversized: usize,
}

/// Sorts `response`'s resources (see [`Triage`]). Public for the fuzz
/// target, which drives the handler the way the client does.
pub fn triage(response: DeltaDiscoveryResponse, limits: Limits) -> Triage {
    let url = response.type_url;
    let mut t = Triage {
        updates: Vec::with_capacity(response.resources.len()),
        removed: response.removed_resources,
        ..Default::default()
    };
    for r in response.resources {
        let refuse = |reason: String| Rejected {
            name: r.name.clone(),
            reason,
        };
        match r.resource {
            Some(any) if any.type_url != url => t
                .rejected
                .push(refuse(format!("carries a {}, not a {url}", any.type_url))),
            Some(any) if any.value.len() > limits.max_resource => {
                t.oversized += 1;
                t.rejected.push(refuse(format!(
                    "{} bytes, past the limit of {} bytes on one resource (max_resource_size)",
                    any.value.len(),
                    limits.max_resource
                )));
            }
            Some(any) => t.updates.push(Update {
                name: r.name,
                version: r.version,
                value: any.value,
            }),
            None => t.rejected.push(refuse("no resource in the update".into())),
        }
    }
    t
}

/// Why a Service is refused from a server that sends Workloads only.
pub const SERVICE_REFUSED: &str = "a Service, from a server that sends Workloads only (Cilium's socket load balancer resolves Services before the proxy sees them)";

/// Whether an encoded `istio.workload.Address` holds a Service (its
/// oneof's tag 2), read from its field keys without decoding the rest.
fn holds_service(value: &[u8]) -> bool {
    use prost::encoding::{decode_key, skip_field, DecodeContext};
    let mut buf = value;
    while !buf.is_empty() {
        let Ok((tag, wire_type)) = decode_key(&mut buf) else {
            return false;
        };
        if tag == 2 {
            return true;
        }
        if skip_field(wire_type, tag, &mut buf, DecodeContext::default()).is_err() {
            return false;
        }
    }
    false
}

/// A NACK's `error_detail`: `<name>: <reason>; …`, the first
/// [`LISTED_REFUSALS`] listed and the rest counted.
fn nack_message(rejected: &[Rejected]) -> String {
    let mut message = rejected
        .iter()
        .take(LISTED_REFUSALS)
        .map(|r| format!("{}: {}", r.name, r.reason))
        .collect::<Vec<_>>()
        .join("; ");
    if rejected.len() > LISTED_REFUSALS {
        message.push_str(&format!(
            "; and {} more refused",
            rejected.len() - LISTED_REFUSALS
        ));
    }
    message
}

/// The last message logged per key (a type URL), to log a repeat of it
/// at most once per [`REPEAT_LOG_INTERVAL`].
#[derive(Debug, Default)]
struct Repeats {
    last: HashMap<String, Repeat>,
}

#[derive(Debug)]
struct Repeat {
    message: String,
    logged_at: Instant,
    /// Repeats not logged since `logged_at`.
    unlogged: u64,
}

impl Repeats {
    /// `Some(repeats not logged)` when `message` under `key` is to be
    /// logged now: new, or the same as before and not logged for
    /// [`REPEAT_LOG_INTERVAL`].
    fn log(&mut self, key: &str, message: &str, now: Instant) -> Option<u64> {
        match self.last.get_mut(key) {
            Some(r)
                if r.message == message
                    && now.duration_since(r.logged_at) < REPEAT_LOG_INTERVAL =>
            {
                r.unlogged += 1;
                None
            }
            Some(r) if r.message == message => {
                let repeated = std::mem::take(&mut r.unlogged);
                r.logged_at = now;
                Some(repeated)
            }
            _ => {
                self.last.insert(
                    key.to_owned(),
                    Repeat {
                        message: message.to_owned(),
                        logged_at: now,
                        unlogged: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_message_is_logged_once_an_interval_with_the_repeats_counted() {
        let mut r = Repeats::default();
        let t0 = Instant::now();
        assert_eq!(r.log("t", "m", t0), Some(0));
        for i in 1..=3 {
            assert_eq!(r.log("t", "m", t0 + Duration::from_secs(i)), None);
        }
        assert_eq!(r.log("u", "m", t0), Some(0), "another key");
        let later = t0 + REPEAT_LOG_INTERVAL;
        assert_eq!(r.log("t", "m", later), Some(3));
        assert_eq!(r.log("t", "m", later), None);
        assert_eq!(r.log("t", "other", later), Some(0), "another message");
    }

    #[test]
    fn a_service_is_told_from_a_workload_by_its_oneof_tag() {
        use crate::workload::{address, Address, Service, Workload};
        let encode = |t| Address { r#type: Some(t) }.encode_to_vec();
        let workload = encode(address::Type::Workload(Workload {
            uid: "pod-uid".into(),
            ..Default::default()
        }));
        let service = encode(address::Type::Service(Service {
            hostname: "a.ns.svc.cluster.local".into(),
            ..Default::default()
        }));
        assert!(!holds_service(&workload));
        assert!(holds_service(&service));
        assert!(!holds_service(&[]), "an empty Address holds nothing");
        assert!(
            !holds_service(&[0xff]),
            "a broken key is left to the decoder"
        );
    }

    #[test]
    fn a_nack_lists_the_first_hundred_refusals_and_counts_the_rest() {
        let rejected: Vec<Rejected> = (0..LISTED_REFUSALS + 7)
            .map(|i| Rejected {
                name: format!("r{i}"),
                reason: "bad".into(),
            })
            .collect();
        let m = nack_message(&rejected);
        assert!(m.starts_with("r0: bad; r1: bad"), "{m}");
        assert!(m.ends_with("r99: bad; and 7 more refused"), "{m}");
        assert_eq!(nack_message(&rejected[..1]), "r0: bad");
    }
}
