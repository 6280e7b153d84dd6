//! Cilium's agent as the xDS server: plaintext gRPC on a Unix socket,
//! reached by each of the address forms ztunnel's Cilium fork reads, and
//! Workloads only — a Service, or a response of a type not subscribed, is
//! NACKed with its reason while the rest is applied.

use std::collections::BTreeSet;
use std::time::Duration;

use prometheus_client::registry::Registry;
use prost::Message as _;
use tidegate_channel::{Pulse, Target};
use tidegate_xds::client::{
    ClientConfig, Limits, ADDRESS, AUTHORIZATION, FIRST_ANSWER_TIMEOUT, SERVICE_REFUSED,
};
use tidegate_xds::envelope::{Any, DeltaDiscoveryResponse, Node, Resource};
use tidegate_xds::workload::{address, Address, Service, Workload};
use tidegate_xds::{AdsClient, Handler, Rejected, Update, XdsMetrics};
use tokio::sync::watch;

use crate::scripted::{Received, Says, Scripted};
use crate::{eventually, metric};

/// The names applied, as a gateway holds them.
struct Names(watch::Sender<BTreeSet<String>>);

impl Handler for Names {
    fn handle(&mut self, _: &str, updates: Vec<Update>, removed: Vec<String>) -> Vec<Rejected> {
        self.0.send_modify(|held| {
            for u in updates {
                held.insert(u.name);
            }
            for name in removed {
                held.remove(&name);
            }
        });
        vec![]
    }
}

fn client(address: String, registry: &mut Registry) -> AdsClient {
    AdsClient::new(
        ClientConfig {
            target: Target {
                address,
                roots: "/nonexistent/roots.pem".into(),
                server_name: None,
                connect_timeout: Duration::from_secs(5),
                pulse: Pulse::default(),
            },
            token: None,
            cluster_id: "Kubernetes".into(),
            node: Node::default(),
            types: vec![ADDRESS.into(), AUTHORIZATION.into()],
            first_answer_timeout: FIRST_ANSWER_TIMEOUT,
            limits: Limits::default(),
            workloads_only: true,
        },
        XdsMetrics::register(registry),
    )
}

fn address_of(name: &str, t: address::Type) -> Resource {
    Resource {
        name: name.into(),
        version: String::new(),
        resource: Some(Any {
            type_url: ADDRESS.into(),
            value: Address { r#type: Some(t) }.encode_to_vec().into(),
        }),
        aliases: Vec::new(),
    }
}

/// A pod as Cilium's agent sends it: keyed by its UID, `node` the host IP.
fn pod(uid: &str) -> Resource {
    address_of(
        uid,
        address::Type::Workload(Workload {
            uid: uid.into(),
            name: format!("pod-{uid}"),
            namespace: "shop".into(),
            service_account: "default".into(),
            node: "192.168.1.7".into(),
            ..Default::default()
        }),
    )
}

/// The agent's answers: to the Address subscription, a pod, a Service and
/// another pod; to the Authorization one, nothing; then a response of a
/// type nobody subscribed to.
fn cilium_like() -> crate::scripted::Script {
    std::sync::Arc::new(|_, _, req| {
        if !req.response_nonce.is_empty() {
            return vec![];
        }
        if req.type_url == AUTHORIZATION {
            return vec![Says::Response(DeltaDiscoveryResponse {
                type_url: AUTHORIZATION.into(),
                nonce: "authz".into(),
                ..Default::default()
            })];
        }
        let service = address_of(
            "shop/web.shop.svc.cluster.local",
            address::Type::Service(Service {
                hostname: "web.shop.svc.cluster.local".into(),
                ..Default::default()
            }),
        );
        vec![
            Says::Response(DeltaDiscoveryResponse {
                type_url: ADDRESS.into(),
                nonce: "pods".into(),
                resources: vec![pod("uid-1"), service, pod("uid-2")],
                ..Default::default()
            }),
            Says::Response(DeltaDiscoveryResponse {
                type_url: "type.googleapis.com/cilium.Unknown".into(),
                nonce: "unknown".into(),
                resources: vec![Resource {
                    name: "mystery".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        ]
    })
}

fn reply<'a>(all: &'a [Received], nonce: &str) -> &'a Received {
    all.iter()
        .find(|(_, q)| q.response_nonce == nonce)
        .unwrap_or_else(|| panic!("no reply to {nonce}"))
}

#[tokio::test]
async fn each_unix_address_form_reaches_the_agent_and_only_workloads_are_applied() {
    for form in ["unix://", "unix:", "unix://localhost"] {
        let server = Scripted::start_unix(cilium_like()).await;
        let socket = server.socket.clone().unwrap();
        let mut registry = Registry::default();
        let c = client(format!("{form}{}", socket.display()), &mut registry);
        let (tx, held) = watch::channel(BTreeSet::new());
        let task = tokio::spawn(async move { c.run(&mut Names(tx)).await });
        let all = server
            .received_until(&format!("{form}: the replies"), |r| {
                ["pods", "unknown", "authz"]
                    .iter()
                    .all(|n| r.iter().any(|(_, q)| q.response_nonce == *n))
            })
            .await;
        let (_, pods) = reply(&all, "pods");
        let detail = pods.error_detail.as_ref().expect("the Service is NACKed");
        assert_eq!(
            detail.message,
            format!("shop/web.shop.svc.cluster.local: {SERVICE_REFUSED}"),
            "{form}"
        );
        let (_, unknown) = reply(&all, "unknown");
        let detail = unknown
            .error_detail
            .as_ref()
            .expect("the unknown type is NACKed");
        assert!(
            detail.message.starts_with("mystery: ") && detail.message.contains("not subscribed"),
            "{form}: {}",
            detail.message
        );
        let (_, authz) = reply(&all, "authz");
        assert!(
            authz.error_detail.is_none(),
            "an empty Authorization is ACKed"
        );
        eventually("both pods applied", || held.borrow().len() == 2).await;
        assert_eq!(
            *held.borrow(),
            BTreeSet::from(["uid-1".to_owned(), "uid-2".to_owned()]),
            "{form}: the pods are served, the Service is not"
        );
        assert_eq!(
            metric(
                &registry,
                &format!("tidegate_xds_rejected_resources_total{{url=\"{ADDRESS}\"}}")
            ),
            1.0
        );
        task.abort();
    }
}

#[test]
fn the_unix_channel_pings_no_more_often_than_cilium_allows() {
    let eager = Pulse {
        keepalive_interval: Duration::from_secs(1),
        ..Pulse::default()
    };
    assert_eq!(
        tidegate_xds::transport::unix_keepalive(&eager),
        Duration::from_secs(15)
    );
    assert_eq!(
        tidegate_xds::transport::unix_keepalive(&Pulse::default()),
        Duration::from_secs(30)
    );
}
