//! The delta ADS client (`tidegate_xds`) against the xDS server double:
//! the node and headers istiod authenticates, per-resource ACK / NACK,
//! and a reconnect that sends what is held and is answered with what
//! changed — without the client's state being cleared.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tidegate_channel::{Pulse, Target};
use tidegate_e2e::xds_double::XdsDouble;
use tidegate_e2e::{init_tracing, metric};
use tidegate_xds::client::{ClientConfig, ADDRESS, AUTHORIZATION, FIRST_ANSWER_TIMEOUT};
use tidegate_xds::envelope::{Kind, Node, Struct, Value};
use tidegate_xds::{AdsClient, Handler, Rejected, Update, XdsMetrics};

use super::WAIT;

/// What the handler saw: every applied (name, value) and removal, in order.
#[derive(Default)]
struct Seen {
    applied: Vec<(String, String, Vec<u8>)>,
    removed: Vec<String>,
}

/// Refuses every resource whose value starts with `bad`.
struct Recorder(Arc<Mutex<Seen>>);

impl Handler for Recorder {
    fn handle(
        &mut self,
        type_url: &str,
        updates: Vec<Update>,
        removed: Vec<String>,
    ) -> Vec<Rejected> {
        let mut seen = self.0.lock().unwrap();
        seen.removed.extend(removed);
        let mut rejected = Vec::new();
        for u in updates {
            if u.value.starts_with(b"bad") {
                rejected.push(Rejected {
                    name: u.name,
                    reason: "starts with bad".into(),
                });
            } else {
                seen.applied
                    .push((type_url.to_owned(), u.name, u.value.to_vec()));
            }
        }
        rejected
    }
}

struct Running {
    seen: Arc<Mutex<Seen>>,
    registry: Registry,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn start(double: &XdsDouble) -> Running {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let roots = dir.path().join("root-cert.pem");
    std::fs::write(&roots, &double.root_pem).unwrap();
    let token = dir.path().join("istio-token");
    std::fs::write(&token, "tok\n").unwrap();
    let node = Node {
        id: "ztunnel~10.0.0.9~tidegate-x.istio-system~istio-system.svc.cluster.local".into(),
        cluster: String::new(),
        metadata: Some(Struct {
            fields: [("NODE_NAME".to_string(), Value::string("n1"))].into(),
        }),
    };
    let mut registry = Registry::default();
    let client = AdsClient::new(
        ClientConfig {
            target: Target {
                address: format!("https://{}", double.addr),
                roots,
                server_name: None,
                connect_timeout: Duration::from_secs(5),
                pulse: Pulse::default(),
            },
            token: Some(token),
            cluster_id: "c1".into(),
            node,
            types: vec![ADDRESS.into(), AUTHORIZATION.into()],
            first_answer_timeout: FIRST_ANSWER_TIMEOUT,
            limits: Default::default(),
            workloads_only: false,
        },
        XdsMetrics::register(&mut registry),
    );
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut handler = Recorder(seen.clone());
    let task = tokio::spawn(async move { client.run(&mut handler).await });
    Running {
        seen,
        registry,
        task,
        _dir: dir,
    }
}

fn text(r: &Registry) -> String {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, r).unwrap();
    s
}

#[tokio::test]
async fn subscribes_as_a_node_proxy_with_istiods_headers_and_acks_each_first_answer() {
    let double = XdsDouble::start().await;
    double.set_quietly(ADDRESS, "a", &b"one"[..]);
    let c = start(&double);
    for t in [ADDRESS, AUTHORIZATION] {
        let nonce = tokio::time::timeout(WAIT, double.answered(0, t))
            .await
            .unwrap();
        let reply = tokio::time::timeout(WAIT, double.reply(&nonce))
            .await
            .unwrap();
        assert_eq!(reply.nack, None, "{t} acknowledged");
    }
    let opened = double.opened();
    let o = &opened[0];
    let node = o.node.as_ref().expect("the node on the first request");
    assert!(node.id.starts_with("ztunnel~"), "{}", node.id);
    let meta = &node.metadata.as_ref().unwrap().fields;
    assert_eq!(meta["NODE_NAME"].kind, Some(Kind::String("n1".into())));
    assert_eq!(o.authorization.as_deref(), Some("Bearer tok"));
    assert_eq!(o.cluster_id.as_deref(), Some("c1"));
    assert!(
        o.initial.values().all(|v| v.is_empty()),
        "a first stream holds nothing"
    );
    let seen = c.seen.lock().unwrap();
    assert_eq!(
        seen.applied,
        [(ADDRESS.to_string(), "a".to_string(), b"one".to_vec())]
    );
    let m = text(&c.registry);
    assert_eq!(
        metric(&m, &format!("istio_xds_message_total{{url=\"{ADDRESS}\"}}")),
        1.0
    );
    assert_eq!(metric(&m, "tidegate_xds_connected"), 1.0);
}

#[tokio::test]
async fn a_bad_resource_is_nacked_by_name_and_the_rest_of_its_response_applied() {
    let double = XdsDouble::start().await;
    let c = start(&double);
    let first = tokio::time::timeout(WAIT, double.answered(0, ADDRESS))
        .await
        .unwrap();
    tokio::time::timeout(WAIT, double.reply(&first))
        .await
        .unwrap();
    let nonce = double
        .set_all(
            ADDRESS,
            [
                ("good".to_string(), b"fine".to_vec().into()),
                ("broken".to_string(), b"bad bytes".to_vec().into()),
            ],
        )
        .expect("a stream is subscribed");
    let reply = tokio::time::timeout(WAIT, double.reply(&nonce))
        .await
        .unwrap();
    let nack = reply.nack.expect("a NACK");
    assert_eq!(nack, "broken: starts with bad");
    let applied: Vec<String> = c
        .seen
        .lock()
        .unwrap()
        .applied
        .iter()
        .map(|a| a.1.clone())
        .collect();
    assert_eq!(applied, ["good"]);
    let m = text(&c.registry);
    assert_eq!(
        metric(
            &m,
            &format!("tidegate_xds_rejected_resources_total{{url=\"{ADDRESS}\"}}")
        ),
        1.0
    );
}

#[tokio::test]
async fn a_reconnect_sends_what_is_held_and_applies_only_what_changed() {
    let double = XdsDouble::start().await;
    double.set_quietly(ADDRESS, "kept", &b"k"[..]);
    double.set_quietly(ADDRESS, "changed", &b"v1"[..]);
    double.set_quietly(ADDRESS, "gone", &b"g"[..]);
    double.set_quietly(ADDRESS, "refused", &b"bad"[..]);
    let c = start(&double);
    let first = tokio::time::timeout(WAIT, double.answered(0, ADDRESS))
        .await
        .unwrap();
    let reply = tokio::time::timeout(WAIT, double.reply(&first))
        .await
        .unwrap();
    assert_eq!(reply.nack.as_deref(), Some("refused: starts with bad"));

    // While the stream is up nothing is pushed of these changes; then
    // istiod restarts.
    double.set_quietly(ADDRESS, "changed", &b"v2"[..]);
    double.remove_quietly(ADDRESS, "gone");
    double.cut();
    // Answered: its subscription, with what it holds, has arrived.
    let second = tokio::time::timeout(WAIT, double.answered(1, ADDRESS))
        .await
        .unwrap();
    let opened = double.opened();
    let held = &opened[1].initial[ADDRESS];
    let mut names: Vec<&str> = held.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(
        names,
        ["changed", "gone", "kept"],
        "the refused one is not claimed"
    );
    let reply = tokio::time::timeout(WAIT, double.reply(&second))
        .await
        .unwrap();
    assert_eq!(reply.nack.as_deref(), Some("refused: starts with bad"));
    let seen = c.seen.lock().unwrap();
    let applied: Vec<(&str, &[u8])> = seen
        .applied
        .iter()
        .map(|(_, n, v)| (n.as_str(), v.as_slice()))
        .collect();
    // First stream: three applied; second: only the change.
    assert_eq!(applied.len(), 4, "{applied:?}");
    assert_eq!(applied[3], ("changed", &b"v2"[..]));
    assert_eq!(seen.removed, ["gone"]);
    let m = text(&c.registry);
    assert_eq!(
        metric(
            &m,
            "istio_xds_connection_terminations_total{reason=\"Complete\"}"
        ),
        1.0
    );
}
