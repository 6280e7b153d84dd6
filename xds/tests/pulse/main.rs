//! istiod's channel has a pulse: a server that stops answering — after
//! TLS, after a stream is opened, or once a stream is up — is noticed and
//! connected to again; a server that ends every stream at once is not
//! asked again every 10 ms.

mod hostile;
mod istiod;
mod scripted;
mod unix;

use std::time::Duration;

use prometheus_client::registry::Registry;
use tidegate_channel::{Pulse, Target};
use tidegate_xds::client::{ClientConfig, ADDRESS, FIRST_ANSWER_TIMEOUT};
use tidegate_xds::envelope::Node;
use tidegate_xds::{AdsClient, Handler, Rejected, Update, XdsMetrics};
use tokio::sync::watch;

use istiod::{Istiod, Misbehaviour, FLOOD};

/// Generous: only a client that never notices breaks it.
pub const WAIT: Duration = Duration::from_secs(10);

/// Counts the responses applied.
struct Count(watch::Sender<usize>);

impl Handler for Count {
    fn handle(&mut self, _: &str, _: Vec<Update>, _: Vec<String>) -> Vec<Rejected> {
        self.0.send_modify(|n| *n += 1);
        vec![]
    }
}

struct Running {
    registry: Registry,
    applied: watch::Receiver<usize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Running {
    fn metrics(&self) -> String {
        let mut s = String::new();
        prometheus_client::encoding::text::encode(&mut s, &self.registry).unwrap();
        s
    }

    fn metric(&self, series: &str) -> f64 {
        metric(&self.registry, series)
    }

    fn terminations(&self, reason: &str) -> f64 {
        self.metric(&format!(
            "istio_xds_connection_terminations_total{{reason=\"{reason}\"}}"
        ))
    }
}

/// A series' value in `registry`; 0 when a labelled series was never used.
pub fn metric(registry: &Registry, series: &str) -> f64 {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, registry).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn config(server: &Istiod, pulse: Pulse) -> ClientConfig {
    ClientConfig {
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
            id: "ztunnel~10.0.0.9~tidegate-x.istio-system~istio-system.svc.cluster.local".into(),
            ..Default::default()
        },
        types: vec![ADDRESS.into()],
        first_answer_timeout: FIRST_ANSWER_TIMEOUT,
        limits: Default::default(),
        workloads_only: false,
    }
}

fn start(server: &Istiod, pulse: Pulse, first_answer_timeout: Duration) -> Running {
    let mut registry = Registry::default();
    let client = AdsClient::new(
        ClientConfig {
            first_answer_timeout,
            ..config(server, pulse)
        },
        XdsMetrics::register(&mut registry),
    );
    let (tx, applied) = watch::channel(0);
    let task = tokio::spawn(async move { client.run(&mut Count(tx)).await });
    Running {
        registry,
        applied,
        task,
    }
}

/// Polls `check` until it holds; panics naming `what` after [`WAIT`].
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn seen_at_least(
    server: &Istiod,
    what: &str,
    check: impl FnMut(&istiod::Seen) -> bool,
) -> istiod::Seen {
    let mut seen = server.seen.clone();
    let s = tokio::time::timeout(WAIT, seen.wait_for(check))
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {WAIT:?}"))
        .unwrap()
        .clone();
    s
}

#[tokio::test]
async fn a_server_silent_after_tls_is_dropped_after_the_handshake_timeout_and_connected_again() {
    let server = Istiod::start(Misbehaviour::SilentAfterTls).await;
    let pulse = Pulse {
        handshake_timeout: Duration::from_millis(300),
        ..Pulse::default()
    };
    let c = start(&server, pulse, FIRST_ANSWER_TIMEOUT);
    seen_at_least(&server, "a second connection", |s| s.accepts >= 2).await;
    eventually("the stream counted as a timeout", || {
        c.terminations("Timeout") >= 1.0
    })
    .await;
    assert_eq!(c.metric("tidegate_xds_connected"), 0.0);
}

#[tokio::test]
async fn a_stream_never_answered_is_failed_after_the_first_answer_timeout_and_opened_again() {
    let server = Istiod::start(Misbehaviour::NeverAnswers).await;
    let c = start(&server, Pulse::default(), Duration::from_millis(300));
    let seen = seen_at_least(&server, "a second stream", |s| s.streams.len() >= 2).await;
    assert_eq!(seen.accepts, 1, "the connection itself was fine");
    eventually("the stream counted as a timeout", || {
        c.terminations("Timeout") >= 1.0
    })
    .await;
}

#[tokio::test]
async fn a_connection_gone_silent_both_ways_is_noticed_by_keepalive_and_replaced() {
    let server = Istiod::start(Misbehaviour::AnswersThenFreezes).await;
    let pulse = Pulse {
        keepalive_interval: Duration::from_millis(200),
        keepalive_timeout: Duration::from_millis(300),
        ..Pulse::default()
    };
    let c = start(&server, pulse, FIRST_ANSWER_TIMEOUT);
    let mut applied = c.applied.clone();
    tokio::time::timeout(WAIT, applied.wait_for(|n| *n >= 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.metric("tidegate_xds_connected"), 1.0);
    // No FIN, no RST: the server stops reading and writing.
    server.freeze();
    // The replacement connection never answers its stream: the gauge
    // stays at 0 once the frozen stream is given up.
    seen_at_least(&server, "a second connection", |s| s.accepts >= 2).await;
    eventually("the connected gauge at 0", || {
        c.metric("tidegate_xds_connected") == 0.0
    })
    .await;
    let ends: f64 = ["Timeout", "Reconnect", "ConnectionError", "Error"]
        .iter()
        .map(|r| c.terminations(r))
        .sum();
    assert_eq!(ends, 1.0, "{}", c.metrics());
}

/// Lower bounds only: a slow machine spaces streams further apart, never
/// closer.
#[tokio::test]
async fn a_server_ending_every_stream_before_any_response_gets_a_growing_backoff() {
    // OK, UNKNOWN, OK, …: each ends the stream at once, no response.
    let server = Istiod::start(Misbehaviour::EndsAtOnce).await;
    let c = start(&server, Pulse::default(), FIRST_ANSWER_TIMEOUT);
    let seen = seen_at_least(&server, "six streams", |s| s.streams.len() >= 6).await;
    for (i, pair) in seen.streams.windows(2).take(5).enumerate() {
        let backoff = Duration::from_millis(10 << i);
        let gap = pair[1] - pair[0];
        assert!(
            gap >= backoff,
            "stream {} followed stream {i} after {gap:?}, before the backoff ({backoff:?})",
            i + 1
        );
    }
    eventually("each counted as unanswered", || {
        c.terminations("Unanswered") >= 5.0
    })
    .await;
    assert_eq!(c.terminations("Complete"), 0.0);
    assert_eq!(c.terminations("Reconnect"), 0.0);
}

/// istiod's routine close (its maximum connection age) after a response
/// stays cheap: twelve streams within [`WAIT`], where a backoff doubling
/// from 10 ms would need 20 s.
#[tokio::test]
async fn a_routine_close_after_a_response_reconnects_at_once() {
    let server = Istiod::start(Misbehaviour::AnswersThenCloses).await;
    let c = start(&server, Pulse::default(), FIRST_ANSWER_TIMEOUT);
    seen_at_least(&server, "twelve streams", |s| s.streams.len() >= 12).await;
    eventually("each counted as a reconnect", || {
        c.terminations("Reconnect") >= 11.0
    })
    .await;
    assert_eq!(c.terminations("Unanswered"), 0.0);
}

/// Stops the run (as the gateway's shutdown does) from the first
/// response it applies.
struct StopAtFirst {
    applied: usize,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Handler for StopAtFirst {
    fn handle(&mut self, _: &str, _: Vec<Update>, _: Vec<String>) -> Vec<Rejected> {
        self.applied += 1;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        vec![]
    }
}

/// A backlog never holds the exit: with hundreds of responses received
/// and not yet applied, a shutdown ends the run after the response being
/// applied, not after the backlog (istiod resends on the next stream).
#[tokio::test]
async fn a_shutdown_does_not_wait_for_a_backlog_of_responses() {
    let server = Istiod::start(Misbehaviour::Floods).await;
    let mut registry = Registry::default();
    let client = AdsClient::new(
        config(&server, Pulse::default()),
        XdsMetrics::register(&mut registry),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let mut handler = StopAtFirst {
        applied: 0,
        stop: Some(stop),
    };
    let run = async {
        tokio::select! {
            _ = client.run(&mut handler) => {}
            _ = stopped => {}
        }
    };
    tokio::time::timeout(WAIT, run).await.expect("the run ends");
    assert!(
        handler.applied <= 2,
        "{} of {FLOOD} queued responses applied after the shutdown",
        handler.applied
    );
}
