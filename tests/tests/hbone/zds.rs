//! The ZDS client (istio-cni's node agent protocol) against the wire-level
//! double of the agent (`tidegate_e2e::zds_double`), with real network
//! namespace descriptors passed by `SCM_RIGHTS`.

use std::collections::BTreeSet;
use std::fmt;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tidegate_base::shutdown::{self, ShutdownTrigger};
use tidegate_e2e::zds_double::{expect_ack, ConnState, PodSpec, Request, ZdsConn, ZdsDouble};
use tidegate_e2e::{metric, metric_or_zero, wait_for};
use tidegate_zds::{Pod, PodSink, Snapshot, ZdsClient, ZdsConfig};
use tokio::sync::watch;

const STEP: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Event {
    /// The pod and the inode of the namespace that came with it.
    Add(Pod, u64),
    Keep(String),
    Del(String),
    Snapshot(Snapshot),
}

#[derive(Debug)]
struct Refused(String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// Records what the client hands over; refuses uids starting with `refuse`.
#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<Event>>,
}

impl Recorder {
    fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    fn record(&self, uid: &str, e: Event) -> Result<(), Refused> {
        if uid.starts_with("refuse") {
            return Err(Refused(format!("no room for {uid} on this node")));
        }
        self.events.lock().unwrap().push(e);
        Ok(())
    }
}

impl PodSink for Recorder {
    type Error = Refused;

    async fn add(&self, pod: Pod, netns: OwnedFd) -> Result<(), Refused> {
        let ino = File::from(netns).metadata().unwrap().ino();
        self.record(&pod.uid.clone(), Event::Add(pod, ino))
    }

    async fn keep(&self, uid: &str) -> Result<(), Refused> {
        self.record(uid, Event::Keep(uid.into()))
    }

    async fn del(&self, uid: &str) -> Result<(), Refused> {
        self.record(uid, Event::Del(uid.into()))
    }

    async fn snapshot_done(&self, s: &Snapshot) -> Result<(), Refused> {
        self.record("", Event::Snapshot(s.clone()))
    }
}

/// A real network namespace descriptor (this process's).
fn netns() -> OwnedFd {
    File::open("/proc/self/ns/net").unwrap().into()
}

fn netns_ino() -> u64 {
    std::fs::metadata("/proc/self/ns/net").unwrap().ino()
}

fn added(uid: &str) -> Event {
    let s = PodSpec::new(uid);
    let pod = Pod {
        uid: s.uid,
        name: s.name,
        namespace: s.namespace,
        service_account: s.service_account,
    };
    Event::Add(pod, netns_ino())
}

fn uids(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

struct Harness {
    _dir: tempfile::TempDir,
    double: ZdsDouble,
    sink: Arc<Recorder>,
    ready: watch::Receiver<bool>,
    registry: Registry,
    shutdown: ShutdownTrigger,
}

impl Harness {
    /// A double listening and a client connecting to it (10 ms first backoff).
    fn start(probe_interval: Duration) -> Harness {
        tidegate_e2e::init_tracing();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("ztunnel.sock");
        let mut double = ZdsDouble::bind(&socket).unwrap();
        double.probe_interval = probe_interval;
        let sink = Arc::new(Recorder::default());
        let mut registry = Registry::default();
        let config = ZdsConfig {
            socket,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(200),
        };
        let client = ZdsClient::new(config, sink.clone(), &mut registry);
        let ready = client.ready();
        let (trigger, watch) = shutdown::channel();
        tokio::spawn(client.run(watch));
        Harness {
            _dir: dir,
            double,
            sink,
            ready,
            registry,
            shutdown: trigger,
        }
    }

    async fn accept(&self) -> ZdsConn {
        tokio::time::timeout(STEP, self.double.accept())
            .await
            .expect("the client connects")
            .unwrap()
    }

    /// Accepts and sends an empty snapshot: the client is ready.
    async fn ready_conn(&self) -> ZdsConn {
        let conn = self.accept().await;
        conn.snapshot(vec![], &[]).await.unwrap();
        conn
    }

    fn metrics(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).unwrap();
        text
    }
}

const QUIET: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn zds_hello_is_the_first_message_and_says_v1() {
    let h = Harness::start(QUIET);
    let conn = h.accept().await;
    assert_eq!(conn.hello, [0x08, 0x01], "ZdsHello{{version: V1}}");
    assert!(!*h.ready.borrow(), "ready before any snapshot");
    assert_eq!(conn.state(), ConnState::Open);
}

#[tokio::test]
async fn zds_snapshot_adds_and_keeps_and_reports_unnamed_pods_gone() {
    let mut h = Harness::start(QUIET);
    let conn = h.accept().await;
    let adds = vec![
        (PodSpec::new("a"), netns()),
        (PodSpec::new("b"), netns()),
        (PodSpec::new("c"), netns()),
    ];
    conn.snapshot(adds, &[]).await.unwrap();
    h.ready.wait_for(|r| *r).await.unwrap();
    conn.drop_connection().await;
    // The agent restarts and replays what it has: a (with its namespace), b kept, c gone.
    let conn = h.accept().await;
    conn.snapshot(vec![(PodSpec::new("a"), netns())], &["b"])
        .await
        .unwrap();
    let events = h.sink.events();
    let first = Snapshot {
        named: uids(&["a", "b", "c"]),
        gone: BTreeSet::new(),
    };
    let second = Snapshot {
        named: uids(&["a", "b"]),
        gone: uids(&["c"]),
    };
    let want = vec![
        added("a"),
        added("b"),
        added("c"),
        Event::Snapshot(first),
        added("a"),
        Event::Keep("b".into()),
        Event::Snapshot(second),
    ];
    assert_eq!(events, want);
}

#[tokio::test]
async fn zds_add_with_zero_or_two_fds_is_nacked_and_the_connection_goes_on() {
    let h = Harness::start(QUIET);
    let conn = h.ready_conn().await;
    let none = conn
        .request(Request::Add(PodSpec::new("x")), vec![])
        .await
        .unwrap();
    assert!(
        none.contains("AddWorkload carries 0 file descriptors"),
        "{none}"
    );
    let two = conn
        .request(Request::Add(PodSpec::new("x")), vec![netns(), netns()])
        .await
        .unwrap();
    assert!(
        two.contains("AddWorkload carries 2 file descriptors"),
        "{two}"
    );
    let on_del = conn
        .request(Request::Del("x".into()), vec![netns()])
        .await
        .unwrap();
    assert!(
        on_del.contains("DelWorkload carries 1 file descriptors"),
        "{on_del}"
    );
    expect_ack("add y", conn.add(PodSpec::new("y"), netns()).await.unwrap()).unwrap();
    let events = h.sink.events();
    assert_eq!(events.last(), Some(&added("y")), "{events:?}");
    assert!(!events.contains(&added("x")), "{events:?}");
    let m = h.metrics();
    assert_eq!(
        metric(&m, r#"zds_messages_total{kind="add",result="fd_count"}"#),
        2.0
    );
    assert_eq!(
        metric(&m, r#"zds_messages_total{kind="del",result="fd_count"}"#),
        1.0
    );
    assert_eq!(
        metric(&m, r#"zds_messages_total{kind="add",result="ok"}"#),
        1.0
    );
}

#[tokio::test]
async fn zds_del_is_acked_after_the_sink_removed_the_pod() {
    let h = Harness::start(QUIET);
    let conn = h.ready_conn().await;
    expect_ack("add", conn.add(PodSpec::new("p"), netns()).await.unwrap()).unwrap();
    expect_ack("del", conn.del("p").await.unwrap()).unwrap();
    assert_eq!(h.sink.events().last(), Some(&Event::Del("p".into())));
    assert_eq!(
        metric(
            &h.metrics(),
            r#"zds_messages_total{kind="del",result="ok"}"#
        ),
        1.0
    );
}

#[tokio::test]
async fn zds_a_sink_error_is_the_ack_text() {
    let h = Harness::start(QUIET);
    let conn = h.ready_conn().await;
    let ack = conn.add(PodSpec::new("refuse-1"), netns()).await.unwrap();
    assert_eq!(ack, "no room for refuse-1 on this node");
    let ack = conn.del("refuse-2").await.unwrap();
    assert_eq!(ack, "no room for refuse-2 on this node");
    expect_ack(
        "add after",
        conn.add(PodSpec::new("ok"), netns()).await.unwrap(),
    )
    .unwrap();
    assert_eq!(
        metric(
            &h.metrics(),
            r#"zds_messages_total{kind="add",result="sink"}"#
        ),
        1.0
    );
}

#[tokio::test]
async fn zds_oversize_garbage_and_out_of_order_messages_are_nacked_and_the_connection_goes_on() {
    let h = Harness::start(QUIET);
    let conn = h.ready_conn().await;
    let cases: [(Request, &str); 5] = [
        (Request::Raw(vec![0x0a; 2000]), "longer than 1024 bytes"),
        (
            Request::Raw(vec![0xff, 0xff, 0xff]),
            "cannot decode the WorkloadRequest",
        ),
        (Request::Raw(vec![0x3a, 0x00]), "without payload"),
        (
            Request::Keep("late".into()),
            "KeepWorkload for late after SnapshotSent",
        ),
        (Request::SnapshotSent, "a second SnapshotSent"),
    ];
    for (request, want) in cases {
        let what = format!("{request:?}");
        let ack = conn.request(request, vec![]).await.unwrap();
        assert!(ack.contains(want), "{what}: ack {ack:?}, want {want:?}");
    }
    let ack = conn
        .request(Request::Raw(vec![0x0a, 0x03, 0x0a, 0x01, b'u']), vec![])
        .await
        .unwrap();
    assert!(
        ack.contains("AddWorkload for u without workload_info"),
        "{ack}"
    );
    expect_ack("del after", conn.del("p").await.unwrap()).unwrap();
    assert_eq!(conn.state(), ConnState::Open);
    let m = h.metrics();
    assert_eq!(
        metric(
            &m,
            r#"zds_messages_total{kind="invalid",result="too_long"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(&m, r#"zds_messages_total{kind="invalid",result="decode"}"#),
        2.0
    );
    assert_eq!(
        metric(
            &m,
            r#"zds_messages_total{kind="keep",result="out_of_order"}"#
        ),
        1.0
    );
}

#[tokio::test]
async fn zds_reconnects_after_the_agent_drops_and_is_ready_only_after_the_snapshot() {
    tidegate_e2e::init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("ztunnel.sock");
    // The client starts first: the agent is not there yet.
    let sink = Arc::new(Recorder::default());
    let mut registry = Registry::default();
    let config = ZdsConfig {
        socket: socket.clone(),
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    };
    let client = ZdsClient::new(config, sink.clone(), &mut registry);
    let mut ready = client.ready();
    let (_trigger, watch) = shutdown::channel();
    tokio::spawn(client.run(watch));
    let reconnects = |r: &Registry| {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, r).unwrap();
        metric(&text, "zds_reconnects_total")
    };
    wait_for("a failed connect retried", STEP, || {
        std::future::ready((reconnects(&registry) >= 1.0).then_some(()))
    })
    .await;
    let double = ZdsDouble::bind(&socket).unwrap();
    let conn = tokio::time::timeout(STEP, double.accept())
        .await
        .unwrap()
        .unwrap();
    expect_ack("add", conn.add(PodSpec::new("a"), netns()).await.unwrap()).unwrap();
    assert!(!*ready.borrow(), "ready after an add, before SnapshotSent");
    expect_ack("snapshot", conn.snapshot_sent().await.unwrap()).unwrap();
    ready.wait_for(|r| *r).await.unwrap();
    let before = reconnects(&registry);
    conn.drop_connection().await;
    let conn = tokio::time::timeout(STEP, double.accept())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        conn.hello,
        [0x08, 0x01],
        "hello again on the new connection"
    );
    assert!(reconnects(&registry) > before);
    assert!(
        *ready.borrow(),
        "stays ready while the snapshot is replayed"
    );
    conn.snapshot(vec![(PodSpec::new("a"), netns())], &[])
        .await
        .unwrap();
    expect_ack("del", conn.del("a").await.unwrap()).unwrap();
}

#[tokio::test]
async fn zds_the_keepalive_probe_finds_a_quiet_live_client_and_sees_it_leave() {
    let h = Harness::start(Duration::from_millis(20));
    let mut conn = h.ready_conn().await;
    wait_for("three probes", STEP, || {
        std::future::ready((conn.probes() >= 3).then_some(()))
    })
    .await;
    assert_eq!(
        conn.state(),
        ConnState::Open,
        "the client sent nothing unsolicited"
    );
    expect_ack(
        "add after probes",
        conn.add(PodSpec::new("p"), netns()).await.unwrap(),
    )
    .unwrap();
    assert_eq!(
        metric_or_zero(
            &h.metrics(),
            r#"zds_messages_total{kind="invalid",result="decode"}"#
        ),
        0.0
    );
    h.shutdown.start(Duration::ZERO);
    let end = tokio::time::timeout(STEP, conn.closed()).await;
    assert_eq!(
        end.expect("the client closes on shutdown"),
        ConnState::ClosedByClient
    );
}

fn series(h: &Harness, name: &str) -> f64 {
    metric(&h.metrics(), name)
}

/// An agent that accepts and closes at once (before any snapshot) is
/// retried with a wait that doubles each time, to the maximum; a connection
/// that delivered its snapshot brings the wait back to the first one.
/// The waits are read from the client's own gauge when the next connection
/// arrives; each connection is awaited, none is timed.
#[tokio::test]
async fn zds_an_agent_that_closes_at_once_is_retried_with_a_doubling_wait() {
    // 10 ms doubling, at most 200 ms.
    let h = Harness::start(QUIET);
    h.accept().await.drop_connection().await;
    let mut waits = Vec::new();
    for _ in 0..6 {
        let conn = h.accept().await;
        waits.push(series(&h, "zds_reconnect_delay_seconds"));
        conn.drop_connection().await;
    }
    assert_eq!(waits, [0.01, 0.02, 0.04, 0.08, 0.16, 0.2]);
    // Every connection was one attempt.
    let conn = h.accept().await;
    assert_eq!(series(&h, "zds_reconnects_total"), 7.0);
    // This one delivers its snapshot: the next wait is the first again.
    conn.snapshot(vec![], &[]).await.unwrap();
    conn.drop_connection().await;
    let conn = h.accept().await;
    assert_eq!(series(&h, "zds_reconnect_delay_seconds"), 0.01);
    conn.drop_connection().await;
    let _conn = h.accept().await;
    assert_eq!(series(&h, "zds_reconnect_delay_seconds"), 0.02);
}

const FDS_CHILD: &str = "TIDEGATE_TEST_ZDS_FDS_EXHAUSTED";

/// The namespace descriptor of an add arrives when the gateway has no
/// descriptor left: the NACK names the exhaustion (not "too many file
/// descriptors attached to one message"), and once descriptors are free
/// again the next add is served on the same connection. The open-file
/// limit is the whole process's, so this runs in a child process (this
/// test binary again, running only this test).
#[tokio::test]
async fn zds_an_add_arriving_without_a_free_descriptor_is_nacked_naming_the_exhaustion() {
    if tidegate_e2e::rerun::is_child(FDS_CHILD) {
        return at_the_descriptor_limit().await;
    }
    tidegate_e2e::rerun::alone(
        "zds::zds_an_add_arriving_without_a_free_descriptor_is_nacked_naming_the_exhaustion",
        FDS_CHILD,
        "child: NACK named the exhaustion",
    );
}

async fn at_the_descriptor_limit() {
    let h = Harness::start(QUIET);
    let conn = h.ready_conn().await;
    let netns_fd = netns();
    // Lower the limit to just above the highest descriptor open, then fill
    // every free slot below it.
    let highest = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap();
    let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    rlimit::setrlimit(rlimit::Resource::NOFILE, highest + 1, hard).unwrap();
    let mut fillers = Vec::new();
    while let Ok(f) = File::open("/dev/null") {
        fillers.push(f);
    }
    let ack = conn.add(PodSpec::new("p"), netns_fd).await.unwrap();
    drop(fillers);
    rlimit::setrlimit(rlimit::Resource::NOFILE, soft, hard).unwrap();
    assert!(
        ack.starts_with("the file descriptor sent with the request could not be received: the gateway is out of file descriptors ("),
        "{ack}"
    );
    assert!(!ack.contains("too many"), "{ack}");
    assert_eq!(
        series(
            &h,
            r#"zds_messages_total{kind="invalid",result="descriptors"}"#
        ),
        1.0
    );
    expect_ack(
        "add after",
        conn.add(PodSpec::new("p"), netns()).await.unwrap(),
    )
    .unwrap();
    assert_eq!(h.sink.events().last(), Some(&added("p")));
    println!("child: NACK named the exhaustion ({ack})");
}
