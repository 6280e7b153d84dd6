//! A hostile istiod: what it sends is refused or ignored with a specific
//! outcome, and the client keeps everything it held and the stream (or a
//! new one) serving — oversized messages and resources, 100,000
//! resources in one response, the same bad resource again and again,
//! types never subscribed, stalls after the headers and mid-message
//! (a first answer, and a later one on a connection that still answers
//! PINGs).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use prometheus_client::registry::Registry;
use tidegate_channel::{Pulse, Target};
use tidegate_xds::client::{ClientConfig, Limits, ADDRESS, AUTHORIZATION, FIRST_ANSWER_TIMEOUT};
use tidegate_xds::envelope::{Any, DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Resource};
use tidegate_xds::{AdsClient, Handler, Rejected, Update, XdsMetrics};
use tokio::sync::watch;

use crate::scripted::{Received, Says, Script, Scripted};
use crate::{eventually, metric};

/// What the handler holds, as a gateway would: name → version.
#[derive(Clone, Debug, Default)]
struct Held {
    resources: BTreeMap<String, String>,
    /// Each call's type URL and number of updates.
    calls: Vec<(String, usize)>,
}

/// Applies every update but those whose value is `bad`.
struct Holds(watch::Sender<Held>);

impl Handler for Holds {
    fn handle(
        &mut self,
        type_url: &str,
        updates: Vec<Update>,
        removed: Vec<String>,
    ) -> Vec<Rejected> {
        let mut rejected = Vec::new();
        self.0.send_modify(|h| {
            h.calls.push((type_url.to_owned(), updates.len()));
            for u in updates {
                if u.value.as_ref() == b"bad" {
                    rejected.push(Rejected {
                        name: u.name,
                        reason: "bad value".into(),
                    });
                } else {
                    h.resources.insert(u.name, u.version);
                }
            }
            for name in removed {
                h.resources.remove(&name);
            }
        });
        rejected
    }
}

/// The log lines written at `warn` and above while it is the default.
/// (A test's capture: its lock is taken directly, outside the lock
/// convention of `tidegate_base::sync`, which this crate does not import.)
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

#[allow(clippy::disallowed_methods)]
impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    #[allow(clippy::disallowed_methods)]
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Captures this thread's warnings (the client runs on the test's
    /// single-threaded runtime).
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }
}

struct Client {
    registry: Registry,
    held: watch::Receiver<Held>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Client {
    fn start(server: &Scripted, limits: Limits, first_answer_timeout: Duration) -> Client {
        Client::start_with(server, limits, first_answer_timeout, Pulse::default())
    }

    fn start_with(
        server: &Scripted,
        limits: Limits,
        first_answer_timeout: Duration,
        pulse: Pulse,
    ) -> Client {
        let mut registry = Registry::default();
        let cfg = ClientConfig {
            target: Target {
                address: format!("https://{}", server.addr),
                roots: server.roots.clone(),
                server_name: None,
                connect_timeout: Duration::from_secs(5),
                pulse,
            },
            token: None,
            cluster_id: "c1".into(),
            node: Node {
                id: "ztunnel~10.0.0.9~tidegate-x.istio-system~istio-system.svc.cluster.local"
                    .into(),
                ..Default::default()
            },
            types: vec![ADDRESS.into()],
            first_answer_timeout,
            limits,
            workloads_only: false,
        };
        let client = AdsClient::new(cfg, XdsMetrics::register(&mut registry));
        let (tx, held) = watch::channel(Held::default());
        let task = tokio::spawn(async move { client.run(&mut Holds(tx)).await });
        Client {
            registry,
            held,
            task,
        }
    }

    fn metric(&self, series: &str) -> f64 {
        metric(&self.registry, series)
    }

    fn held(&self) -> Held {
        self.held.borrow().clone()
    }
}

fn resource(name: &str, value: impl Into<Bytes>) -> Resource {
    resource_of(ADDRESS, name, value)
}

fn resource_of(type_url: &str, name: &str, value: impl Into<Bytes>) -> Resource {
    Resource {
        version: "1".into(),
        resource: Some(Any {
            type_url: type_url.into(),
            value: value.into(),
        }),
        name: name.into(),
        aliases: Vec::new(),
    }
}

fn response(nonce: &str, resources: Vec<Resource>) -> Says {
    response_of(ADDRESS, nonce, resources)
}

fn response_of(type_url: &str, nonce: &str, resources: Vec<Resource>) -> Says {
    Says::Response(DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: nonce.into(),
        resources,
        ..Default::default()
    })
}

fn script(
    f: impl Fn(usize, usize, &DeltaDiscoveryRequest) -> Vec<Says> + Send + Sync + 'static,
) -> Script {
    Arc::new(f)
}

/// The reply to `nonce`, once received.
async fn reply_to(server: &Scripted, nonce: &str) -> Received {
    let all = server
        .received_until(&format!("the reply to {nonce}"), |r| {
            r.iter().any(|(_, q)| q.response_nonce == nonce)
        })
        .await;
    all.into_iter()
        .find(|(_, q)| q.response_nonce == nonce)
        .unwrap()
}

/// A length prefix of `len` bytes, uncompressed.
fn prefix(len: u32) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_u8(0);
    b.put_u32(len);
    b
}

/// istiod's answers on the first stream (a small one, then `second`);
/// on the next, one more resource once the client said what it holds.
fn first_then(second: Says) -> Script {
    script(move |stream, n, _| match (stream, n) {
        (0, 0) => vec![response("1", vec![resource("a", "a")])],
        (0, 1) => vec![second.clone()],
        (1, 0) => vec![response("3", vec![resource("b", "b")])],
        _ => vec![],
    })
}

/// A response past `max_message` is refused from its length prefix —
/// counted, logged naming the limit — the stream is opened again with
/// what was held, and nothing held is lost.
#[tokio::test]
async fn a_response_past_the_message_limit_is_refused_and_the_stream_recovers_with_what_it_held() {
    let logs = Logs::default();
    let _capture = logs.capture();
    let big = response("2", vec![resource("big", vec![7u8; 100 << 10])]);
    let server = Scripted::start(first_then(big)).await;
    let limits = Limits {
        max_message: 64 << 10,
        ..Limits::default()
    };
    let c = Client::start(&server, limits, FIRST_ANSWER_TIMEOUT);
    let (stream, _) = reply_to(&server, "3").await;
    assert_eq!(stream, 1, "one stream failed, one opened again");
    let all = server.received.borrow().clone();
    let (_, reopened) = all.iter().find(|(s, _)| *s == 1).unwrap();
    assert_eq!(
        reopened.initial_resource_versions,
        [("a".to_owned(), "1".to_owned())].into(),
        "the new stream names what was held"
    );
    assert!(
        !all.iter().any(|(_, q)| q.response_nonce == "2"),
        "never answered"
    );
    let held: Vec<String> = c.held().resources.into_keys().collect();
    assert_eq!(held, ["a", "b"]);
    assert_eq!(
        c.metric("tidegate_xds_oversized_total{kind=\"message\"}"),
        1.0
    );
    assert_eq!(
        c.metric("istio_xds_connection_terminations_total{reason=\"Error\"}"),
        1.0
    );
    let text = logs.text();
    assert!(
        text.contains("max_message_size") && text.contains("65536"),
        "{text}"
    );
}

/// The default limit, a length prefix of 300 MiB and no body: refused
/// at the prefix — a client that waited for the body would hang here.
#[tokio::test]
async fn a_length_prefix_past_the_default_limit_is_refused_before_any_body() {
    let claim = Says::Raw(prefix(300 << 20).freeze());
    let server = Scripted::start(first_then(claim)).await;
    let c = Client::start(&server, Limits::default(), FIRST_ANSWER_TIMEOUT);
    reply_to(&server, "3").await;
    assert_eq!(
        c.metric("tidegate_xds_oversized_total{kind=\"message\"}"),
        1.0
    );
    let held: Vec<String> = c.held().resources.into_keys().collect();
    assert_eq!(held, ["a", "b"]);
}

/// One resource far larger than any real one: NACKed naming the limit,
/// counted; the others of the response applied, the stream kept.
#[tokio::test]
async fn a_resource_past_the_resource_limit_is_nacked_naming_the_limit_and_the_rest_applied() {
    let server = Scripted::start(script(|stream, n, _| match (stream, n) {
        (0, 0) => vec![response(
            "1",
            vec![resource("a", "a"), resource("huge", vec![0u8; 8192])],
        )],
        _ => vec![],
    }))
    .await;
    let limits = Limits {
        max_resource: 4096,
        ..Limits::default()
    };
    let c = Client::start(&server, limits, FIRST_ANSWER_TIMEOUT);
    let (_, nack) = reply_to(&server, "1").await;
    let detail = nack.error_detail.expect("a NACK").message;
    assert_eq!(
        detail,
        "huge: 8192 bytes, past the limit of 4096 bytes on one resource (max_resource_size)"
    );
    assert_eq!(c.held().resources.into_keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(
        c.metric("tidegate_xds_oversized_total{kind=\"resource\"}"),
        1.0
    );
    assert_eq!(
        c.metric(&format!(
            "tidegate_xds_rejected_resources_total{{url=\"{ADDRESS}\"}}"
        )),
        1.0
    );
}

/// 100,000 resources in one response (under the message limit, which is
/// what bounds a response's memory): applied in one call and
/// acknowledged; the next stream names all of them.
#[tokio::test]
async fn a_hundred_thousand_resources_in_one_response_are_applied_and_held() {
    const N: usize = 100_000;
    let server = Scripted::start(script(|stream, n, _| match (stream, n) {
        (0, 0) => {
            let resources = (0..N)
                .map(|i| resource(&format!("Kubernetes//Pod/shop/web-{i}"), "w"))
                .collect();
            vec![response("1", resources)]
        }
        // istiod's routine close (its maximum connection age).
        (0, 1) => vec![Says::End(2)],
        _ => vec![],
    }))
    .await;
    let c = Client::start(&server, Limits::default(), FIRST_ANSWER_TIMEOUT);
    let (_, ack) = reply_to(&server, "1").await;
    assert_eq!(ack.error_detail, None, "an ACK");
    let all = server
        .received_until("a second stream", |r| r.iter().any(|(s, _)| *s == 1))
        .await;
    let (_, reopened) = all.iter().find(|(s, _)| *s == 1).unwrap();
    assert_eq!(reopened.initial_resource_versions.len(), N);
    let held = c.held();
    assert_eq!(held.calls, [(ADDRESS.to_owned(), N)]);
    assert_eq!(held.resources.len(), N);
}

/// istiod sends the same bad resource again and again: each is NACKed
/// with the same reason, on the one stream (no reconnect), the good
/// resource stays, the counter rises with each — and it is logged once,
/// not fifty times.
#[tokio::test]
async fn a_bad_resource_resent_over_and_over_is_nacked_each_time_on_one_stream_logged_once() {
    const TIMES: usize = 50;
    let logs = Logs::default();
    let _capture = logs.capture();
    let server = Scripted::start(script(|stream, n, _| match (stream, n) {
        (0, 0) => vec![response(
            "0",
            vec![resource("good", "good"), resource("evil", "bad")],
        )],
        (0, n) if n < TIMES => vec![response(&n.to_string(), vec![resource("evil", "bad")])],
        _ => vec![],
    }))
    .await;
    let c = Client::start(&server, Limits::default(), FIRST_ANSWER_TIMEOUT);
    reply_to(&server, &(TIMES - 1).to_string()).await;
    let all = server.received.borrow().clone();
    assert!(all.iter().all(|(s, _)| *s == 0), "one stream");
    let nacks: Vec<String> = all
        .iter()
        .filter_map(|(_, q)| Some(q.error_detail.as_ref()?.message.clone()))
        .collect();
    assert_eq!(nacks, vec!["evil: bad value".to_owned(); TIMES]);
    assert_eq!(
        c.metric(&format!(
            "tidegate_xds_rejected_resources_total{{url=\"{ADDRESS}\"}}"
        )),
        TIMES as f64
    );
    assert_eq!(c.held().resources.into_keys().collect::<Vec<_>>(), ["good"]);
    let text = logs.text();
    let warned = text.matches("xDS resources refused (NACK)").count();
    assert_eq!(warned, 1, "{text}");
    let ends: f64 = ["Error", "Reconnect", "Complete", "Timeout", "Unanswered"]
        .iter()
        .map(|r| {
            c.metric(&format!(
                "istio_xds_connection_terminations_total{{reason=\"{r}\"}}"
            ))
        })
        .sum();
    assert_eq!(ends, 0.0);
}

/// What was never subscribed is never applied: a response of a type the
/// client did not ask for is acknowledged and ignored; a resource of
/// another type inside a response is NACKed naming both types.
#[tokio::test]
async fn what_was_never_subscribed_is_never_applied() {
    let server = Scripted::start(script(|stream, n, _| match (stream, n) {
        (0, 0) => vec![
            response_of(
                AUTHORIZATION,
                "x",
                vec![resource_of(AUTHORIZATION, "ns/p", "p")],
            ),
            response(
                "y",
                vec![resource("a", "a"), resource_of(AUTHORIZATION, "ns/q", "q")],
            ),
        ],
        _ => vec![],
    }))
    .await;
    let c = Client::start(&server, Limits::default(), FIRST_ANSWER_TIMEOUT);
    let (_, ack) = reply_to(&server, "x").await;
    assert_eq!(
        (ack.type_url.as_str(), ack.error_detail),
        (AUTHORIZATION, None)
    );
    let (_, nack) = reply_to(&server, "y").await;
    assert_eq!(
        nack.error_detail.unwrap().message,
        format!("ns/q: carries a {AUTHORIZATION}, not a {ADDRESS}")
    );
    let held = c.held();
    assert_eq!(
        held.calls,
        [(ADDRESS.to_owned(), 1)],
        "only the subscribed type"
    );
    assert_eq!(held.resources.into_keys().collect::<Vec<_>>(), ["a"]);
}

/// The first answer stalls — after the response headers, or half-way
/// through a message: the bound on a stream's first answer gives it up
/// and a new stream is opened.
#[tokio::test]
async fn a_first_answer_stalled_after_headers_or_mid_message_is_given_up_and_opened_again() {
    let mut half = prefix(100);
    half.put_slice(&[0x22; 10]);
    let half = half.freeze();
    for stall in [None, Some(half)] {
        let server = Scripted::start(script(move |_, n, _| match (n, &stall) {
            (0, Some(half)) => vec![Says::Raw(half.clone())],
            _ => vec![],
        }))
        .await;
        let c = Client::start(&server, Limits::default(), Duration::from_millis(300));
        server
            .received_until("a second stream", |r| r.iter().any(|(s, _)| *s == 1))
            .await;
        eventually("the stream counted as a timeout", || {
            c.metric("istio_xds_connection_terminations_total{reason=\"Timeout\"}") >= 1.0
        })
        .await;
    }
}

/// A later message stalls half-way on a connection that still answers
/// PINGs (the keepalive sees nothing wrong, the first answer came long
/// ago): the stream fails after `message_timeout` without a byte, is
/// opened again with what was held, and the new stream applies.
#[tokio::test]
async fn a_later_message_stalled_mid_way_fails_the_stream_which_is_opened_again() {
    let mut half = prefix(100);
    half.put_slice(&[0x22; 10]);
    let server = Scripted::start(first_then(Says::Raw(half.freeze()))).await;
    let pulse = Pulse {
        message_timeout: Duration::from_millis(300),
        ..Pulse::default()
    };
    let c = Client::start_with(&server, Limits::default(), FIRST_ANSWER_TIMEOUT, pulse);
    let (stream, _) = reply_to(&server, "3").await;
    assert_eq!(stream, 1);
    let all = server.received.borrow().clone();
    let (_, reopened) = all.iter().find(|(s, _)| *s == 1).unwrap();
    assert_eq!(
        reopened.initial_resource_versions,
        [("a".to_owned(), "1".to_owned())].into()
    );
    let held: Vec<String> = c.held().resources.into_keys().collect();
    assert_eq!(held, ["a", "b"]);
    assert_eq!(
        c.metric("istio_xds_connection_terminations_total{reason=\"Timeout\"}"),
        1.0
    );
}
