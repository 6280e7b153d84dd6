//! `--source istio`: the gateways run `workloads.source: istio` against
//! the project's istiod double (delta ADS over gRPC/TLS), started on node
//! A's address inside node A's namespace (a thread of its own). The double
//! holds the lab's pods (pushed as they change, [`XdsFeed::apply`]) beside
//! `--background` synthetic workloads of a large cluster on other nodes
//! ([`crate::synthetic_cluster`]), and `--churn` of those is pushed during
//! the run: single-pod updates (a remote pod turning UNHEALTHY, or back)
//! at a rate, nothing to do with the lab's pods. The double records when
//! each push went out and when each gateway's stream ACKed it: the report
//! gives push → ACK per gateway for the lab's own steps and for the churn.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use prost::Message as _;
use tidegate_xds::client::ADDRESS;
use tidegate_xds::workload::{
    address, Address, NetworkAddress, Port, PortList, Service, TunnelProtocol, Workload,
    WorkloadStatus, WorkloadType,
};

use super::report::ms;
use super::LabError;
use crate::netns::NsThread;
use crate::synthetic_cluster::Set;
use crate::xds_double::XdsDouble;

/// The Service's hostname, as istiod names it.
pub const SERVICE_HOST: &str = "server.lab.svc.cluster.local";
/// The longest the double may take to start.
const START_WITHIN: Duration = Duration::from_secs(30);

/// The background set, encoded once for every policy's run.
pub struct Background {
    pub set: Option<Set>,
    items: Arc<Vec<(String, Bytes)>>,
}

impl Background {
    /// `workloads` pods over a fifth as many Services (none: an empty set).
    pub fn new(workloads: usize) -> Background {
        if workloads == 0 {
            return Background {
                set: None,
                items: Arc::default(),
            };
        }
        let set = Set {
            workloads,
            services: (workloads / 5).max(1),
        };
        Background {
            set: Some(set),
            items: Arc::new(set.resources()),
        }
    }
}

/// A lab pod as istiod sends it: HBONE, in the gateways' trust domain, an
/// endpoint of the Service (port mapping APP_PORT → APP_PORT) when `server`.
pub fn workload(
    uid: &str,
    name: &str,
    service_account: &str,
    ip: IpAddr,
    node: &str,
    server: bool,
    healthy: bool,
) -> Bytes {
    let p = u32::from(super::app_server::APP_PORT);
    let services = if server {
        [(
            format!("lab/{SERVICE_HOST}"),
            PortList {
                ports: vec![Port {
                    service_port: p,
                    target_port: p,
                    app_protocol: 0,
                }],
            },
        )]
        .into()
    } else {
        Default::default()
    };
    let status = if healthy {
        WorkloadStatus::Healthy
    } else {
        WorkloadStatus::Unhealthy
    };
    let app = if server { "server" } else { "client" };
    Address {
        r#type: Some(address::Type::Workload(Workload {
            uid: uid.to_owned(),
            name: name.to_owned(),
            namespace: "lab".into(),
            addresses: vec![octets(ip)],
            tunnel_protocol: TunnelProtocol::Hbone as i32,
            trust_domain: "cluster.local".into(),
            service_account: service_account.to_owned(),
            node: node.to_owned(),
            canonical_name: app.into(),
            canonical_revision: "v1".into(),
            workload_type: WorkloadType::Pod as i32,
            workload_name: app.into(),
            services,
            status: status as i32,
            cluster_id: "Kubernetes".into(),
            ..Default::default()
        })),
    }
    .encode_to_vec()
    .into()
}

/// An address as istiod writes it: 4 or 16 bytes.
fn octets(ip: IpAddr) -> Bytes {
    match ip {
        IpAddr::V4(v4) => Bytes::copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => Bytes::copy_from_slice(&v6.octets()),
    }
}

/// The Service `lab/server` at `vip` (resource name `lab/<hostname>`).
pub fn service(vip: IpAddr) -> (String, Bytes) {
    let p = u32::from(super::app_server::APP_PORT);
    let value = Address {
        r#type: Some(address::Type::Service(Service {
            name: "server".into(),
            namespace: "lab".into(),
            hostname: SERVICE_HOST.into(),
            addresses: vec![NetworkAddress {
                network: String::new(),
                address: octets(vip),
                length: None,
            }],
            ports: vec![Port {
                service_port: p,
                target_port: p,
                app_protocol: 0,
            }],
            ..Default::default()
        })),
    }
    .encode_to_vec()
    .into();
    (format!("lab/{SERVICE_HOST}"), value)
}

/// One push of the lab's own resources.
struct LabPush {
    what: String,
    nonce: String,
}

/// The churn task and the nonces of its pushes.
struct Churn {
    rate: u32,
    nonces: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Churn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The double, what it was last given of the lab's pods, and the pushes.
pub struct XdsFeed {
    pub double: Arc<XdsDouble>,
    /// The double's root (PEM file) and a token file, for the gateways.
    pub roots: PathBuf,
    pub token: PathBuf,
    background: Option<Set>,
    pushed: BTreeMap<String, Bytes>,
    pushes: Vec<LabPush>,
    churn: Option<Churn>,
    /// The double's runtime, in node A's namespace (dropped last).
    _thread: NsThread,
}

impl XdsFeed {
    /// Starts the double on `ip` inside `ns`, holding `background`.
    pub async fn start(
        ns: &str,
        ip: IpAddr,
        dir: &Path,
        background: &Background,
    ) -> Result<XdsFeed, LabError> {
        let thread = NsThread::idle(ns);
        let double = thread
            .run("the xDS double", START_WITHIN, async move {
                XdsDouble::start_on(ip).await
            })
            .await;
        for (name, value) in background.items.iter() {
            double.set_quietly(ADDRESS, name, value.clone());
        }
        let (roots, token) = (dir.join("xds-root.pem"), dir.join("istio-token"));
        for (path, text) in [(&roots, double.root_pem.as_str()), (&token, "lab")] {
            std::fs::write(path, text)
                .map_err(|e| LabError::Setup(format!("write {}: {e}", path.display())))?;
        }
        Ok(XdsFeed {
            double: Arc::new(double),
            roots,
            token,
            background: background.set,
            pushed: BTreeMap::new(),
            pushes: Vec::new(),
            churn: None,
            _thread: thread,
        })
    }

    /// Pushes what differs from the last call: changed resources in one
    /// response, each removed one in its own (as the double sends them).
    /// Before any gateway subscribed, the double only holds them.
    pub fn apply(&mut self, resources: Vec<(String, Bytes)>, what: &str) {
        let changed: Vec<(String, Bytes)> = resources
            .iter()
            .filter(|(name, value)| self.pushed.get(name) != Some(value))
            .cloned()
            .collect();
        let now: BTreeMap<String, Bytes> = resources.into_iter().collect();
        let removed: Vec<String> = self
            .pushed
            .keys()
            .filter(|name| !now.contains_key(*name))
            .cloned()
            .collect();
        self.pushed = now;
        let mut nonces = Vec::new();
        if !changed.is_empty() {
            nonces.extend(self.double.set_all(ADDRESS, changed));
        }
        for name in removed {
            nonces.extend(self.double.remove(ADDRESS, &name));
        }
        self.pushes.extend(nonces.into_iter().map(|nonce| LabPush {
            what: what.to_owned(),
            nonce,
        }));
    }

    /// Starts pushing `rate` single-pod updates of the background per
    /// second (on the caller's runtime) until the feed is dropped.
    pub fn start_churn(&mut self, rate: u32) {
        let Some(set) = self.background.filter(|_| rate > 0) else {
            return;
        };
        let nonces = Arc::new(Mutex::new(Vec::new()));
        let (double, out) = (self.double.clone(), nonces.clone());
        let task = tokio::spawn(async move {
            let remote = set.remote();
            let mut tick = tokio::time::interval(Duration::from_secs(1) / rate);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            for k in 0.. {
                tick.tick().await;
                let (name, value) = set.update(&remote, k);
                if let Some(nonce) = double.set(ADDRESS, &name, value) {
                    out.lock().unwrap_or_else(|e| e.into_inner()).push(nonce);
                }
            }
        });
        self.churn = Some(Churn { rate, nonces, task });
    }

    /// Stops the churn (the report still counts its pushes).
    pub fn stop_churn(&mut self) {
        if let Some(c) = &self.churn {
            c.task.abort();
        }
    }

    /// Which node's gateway each stream is (by the pod name in its node id).
    fn stream_nodes(&self) -> Vec<Option<char>> {
        self.double
            .opened()
            .iter()
            .map(|o| {
                let id = o.node.as_ref().map(|n| n.id.as_str()).unwrap_or("");
                ['a', 'b', 'c']
                    .into_iter()
                    .find(|n| id.contains(&format!("tidegate-node-{n}.")))
            })
            .collect()
    }

    /// The report's lines: each lab push → each gateway's ACK, and the
    /// churn's push → ACK per gateway (p50 / p99 / max, how many were not
    /// ACKed, NACKs).
    pub fn report(&self) -> Vec<String> {
        let nodes = self.stream_nodes();
        let node_of = |stream: usize| nodes.get(stream).copied().flatten();
        let mut lines = Vec::new();
        let steps: Vec<String> = self
            .pushes
            .iter()
            .map(|p| {
                let mut acks = self.double.push_to_reply(&p.nonce);
                acks.sort_by_key(|(s, _, _)| node_of(*s));
                let acks: Vec<String> = acks
                    .iter()
                    .map(|(s, d, nack)| {
                        let node = node_of(*s).map_or('?', |n| n.to_ascii_uppercase());
                        format!("{node} {}{}", ms(*d), if *nack { " (NACK)" } else { "" })
                    })
                    .collect();
                format!("{}: {}", p.what, acks.join(", "))
            })
            .collect();
        lines.push(format!(
            "xDS push → ACK of the lab's own updates: {}",
            steps.join("; ")
        ));
        if let Some(c) = &self.churn {
            let nonces = c.nonces.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let mut per_node: BTreeMap<char, (Vec<Duration>, usize)> = BTreeMap::new();
            for nonce in &nonces {
                for (s, d, nack) in self.double.push_to_reply(nonce) {
                    if let Some(n) = node_of(s) {
                        let e = per_node.entry(n).or_default();
                        e.0.push(d);
                        e.1 += usize::from(nack);
                    }
                }
            }
            let cells: Vec<String> = per_node
                .iter_mut()
                .map(|(n, (lags, nacks))| {
                    lags.sort();
                    let q = |f: f64| lags[((lags.len() - 1) as f64 * f).round() as usize];
                    format!(
                        "{} p50 {} / p99 {} / max {}, {} not ACKed, {nacks} NACKs",
                        n.to_ascii_uppercase(),
                        ms(q(0.5)),
                        ms(q(0.99)),
                        ms(q(1.0)),
                        nonces.len() - lags.len()
                    )
                })
                .collect();
            lines.push(format!(
                "churn: {} pushes at {}/s, push → ACK: {}",
                nonces.len(),
                c.rate,
                cells.join("; ")
            ));
        }
        lines
    }
}
