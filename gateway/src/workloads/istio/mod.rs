//! Discovery from istiod (`workloads.source: istio`): its delta xDS, as
//! ztunnel subscribes to it — `istio.workload.Address` (workloads and
//! Services) and `istio.security.Authorization` — over TLS to
//! `workloads.istio.address`, as a node proxy (the node id and metadata
//! ztunnel sends). The client is `tidegate_xds`'s; this module converts
//! what it delivers ([`convert`]) and publishes it ([`source`]).

mod assembly;
pub mod convert;
pub mod source;

pub use assembly::Assembly;
pub use source::IstioSource;

use tidegate_channel::{Pulse, Target};
use tidegate_xds::client::{ClientConfig, ADDRESS, AUTHORIZATION, FIRST_ANSWER_TIMEOUT};
use tidegate_xds::envelope::{Node, Struct, Value};
use tidegate_xds::{AdsClient, Limits, XdsMetrics};

use crate::config::IstioConfig;
use tidegate_base::shutdown::ShutdownWatch;

/// The node istiod sees: `ztunnel~<ip>~<pod>.<ns>~<ns>.svc.cluster.local`
/// (the first segment makes istiod treat the client as a node proxy), and
/// the metadata ztunnel sends.
pub fn node(cfg: &IstioConfig, node_name: &str, cluster_id: &str) -> Node {
    let (ip, pod, ns) = (&cfg.pod_ip, &cfg.pod_name, &cfg.pod_namespace);
    let fields = [
        ("NAME", pod.as_str()),
        ("NAMESPACE", ns.as_str()),
        ("INSTANCE_IPS", ip.as_str()),
        ("NODE_NAME", node_name),
        ("CLUSTER_ID", cluster_id),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), Value::string(v)))
    .collect();
    Node {
        id: format!("ztunnel~{ip}~{pod}.{ns}~{ns}.svc.cluster.local"),
        cluster: String::new(),
        metadata: Some(Struct { fields }),
    }
}

/// The client `workloads.istio` asks for.
pub fn client(
    cfg: &IstioConfig,
    node_name: &str,
    cluster_id: &str,
    metrics: XdsMetrics,
) -> AdsClient {
    AdsClient::new(
        ClientConfig {
            target: Target {
                address: cfg.address.clone(),
                roots: cfg.roots.clone(),
                server_name: cfg.server_name.clone(),
                connect_timeout: cfg.connect_timeout,
                pulse: Pulse::default(),
            },
            token: cfg.token.clone(),
            cluster_id: cluster_id.to_owned(),
            node: node(cfg, node_name, cluster_id),
            types: vec![ADDRESS.to_owned(), AUTHORIZATION.to_owned()],
            first_answer_timeout: FIRST_ANSWER_TIMEOUT,
            limits: Limits {
                max_message: cfg.max_message_size as usize,
                max_resource: cfg.max_resource_size as usize,
            },
            workloads_only: cfg.workloads_only,
        },
        metrics,
    )
}

/// Streams from istiod into `source` until the drain signal fires.
pub async fn run(client: AdsClient, mut source: IstioSource, mut drain: ShutdownWatch) {
    tokio::select! {
        _ = client.run(&mut source) => {}
        _ = drain.signaled() => {}
    }
}
