//! The per-pod proxies: for each meshed pod on the node, listeners opened
//! inside the pod's own network namespace — 15001 (outbound capture),
//! 15006 (plaintext inbound) and 15008 (HBONE inbound) — served by the
//! gateway's one data path ([`crate::proxy`]) with the pod as origin, and
//! (`dns.enabled`) the DNS proxy's UDP and TCP listeners on 15053
//! ([`crate::dns`]), closed with the others.
//!
//! Pods come in through [`super::intake`], which these proxies implement
//! once (`intake.rs`): from `tidegate-cni` over the CNI socket, istio-cni
//! over ZDS, or the state directory at start.
//!
//! - The same uid in the same namespace (same inode) again: nothing changes.
//! - The same uid in a new namespace (the sandbox was re-created): the old
//!   listeners close (their connections finish), new ones open.
//! - A new pod is admitted first ([`super::admission`]): never the gateway's
//!   own namespace nor one another pod has, at most `capture.max_pods`, and
//!   only with descriptors to spare.
//! - Removal (after the teardown drain): the listeners close; connections
//!   already accepted finish or end with the gateway's drain.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tracing::{debug, info, warn};

use super::admission::{Admission, Candidate, InboundClaim, Owner, Refusal};
use super::intake::source::Source;
use super::netns::{ListenOpts, NetnsSockets};
use crate::config::DNS_CAPTURE_PORT;
use crate::descriptor_budget::listeners_per_pod;
use crate::descriptor_budget::DescriptorBudget;
use crate::dns::{DnsProxy, Place};
use crate::drains::{DrainEngine, Lifecycle, PodKey, Trigger};
use crate::proxy::congestion::TcpTuning;
use crate::proxy::inbound::{Inbound, OwnPorts};
use crate::proxy::metrics::ProxyMetrics;
use crate::proxy::origin::{Origin, Pod};
use crate::proxy::outbound::Outbound;
use crate::proxy::plaintext::PlaintextInbound;
use crate::proxy::pool::Pool;
use crate::proxy::tunnels::InboundTunnels;
use crate::workloads::WorkloadStore;
use tidegate_base::shutdown::{self, ActiveStreams, ShutdownTrigger, ShutdownWatch};
use tidegate_netns::capture::CapturePorts;
use tidegate_netns::namespace::{NetnsError, NetnsId, PodNetns, MESH_MARK};

mod intake;

#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error("pod {uid}: {source}")]
    Netns { uid: String, source: NetnsError },
    #[error("pod {uid}: cannot listen on port {port} inside its namespace: {source}")]
    Listen {
        uid: String,
        port: u16,
        source: NetnsError,
    },
    #[error("pod {uid} refused: {refusal}")]
    Refused { uid: String, refusal: Refusal },
    #[error(
        "pod {namespace}/{name} (uid {uid}) is unknown to the gateway's workload source after \
         capture.membership_wait ({wait_ms} ms): its mesh membership cannot be decided yet \
         (is discovery synced? /healthz/ready)"
    )]
    MembershipUnknown {
        uid: String,
        namespace: String,
        name: String,
        wait_ms: u128,
    },
    #[error("pod {uid} is not a mesh member: {reason}")]
    NotMember { uid: String, reason: &'static str },
}

impl PodError {
    /// A bounded metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            PodError::Netns { .. } => "netns",
            PodError::Listen { .. } => "listen",
            PodError::Refused { refusal, .. } => refusal.reason(),
            PodError::MembershipUnknown { .. } => "membership_unknown",
            PodError::NotMember { .. } => "not_member",
        }
    }
}

/// Whether `e` says the pod has no IPv6 (disabled, or no ::1 on its
/// loopback).
fn no_ipv6(e: &NetnsError) -> bool {
    matches!(e, NetnsError::Socket { source, .. }
        if matches!(source.raw_os_error(), Some(libc::EADDRNOTAVAIL | libc::EAFNOSUPPORT)))
}

/// What a pod's node agent says about it.
#[derive(Clone, Debug)]
pub struct PodMeta {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: Option<String>,
    /// Who handed it over.
    pub source: Source,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug)]
struct PodMetrics {
    pods: Gauge,
    max_pods: Gauge,
    adds: Family<ResultLabel, Counter>,
    refusals: Family<ReasonLabel, Counter>,
    removes: Counter,
    /// ztunnel's names for the same, which its dashboard reads.
    istio: WorkloadManagerMetrics,
}

/// ztunnel's `workload_manager_*`: pods served, hand-overs in progress,
/// proxies started and stopped.
#[derive(Clone, Debug, Default)]
struct WorkloadManagerMetrics {
    active: Gauge,
    pending: Gauge,
    started: Counter,
    stopped: Counter,
}

impl WorkloadManagerMetrics {
    fn register(r: &mut Registry) -> Self {
        let m = WorkloadManagerMetrics::default();
        let r = r.sub_registry_with_prefix("workload_manager");
        r.register(
            "active_proxy_count",
            "The total number current workloads with active proxies (unstable)",
            m.active.clone(),
        );
        r.register(
            "pending_proxy_count",
            "The total number current workloads with pending proxies (unstable)",
            m.pending.clone(),
        );
        r.register(
            "proxies_started",
            "The total number of proxies that were started (unstable)",
            m.started.clone(),
        );
        r.register(
            "proxies_stopped",
            "The total number of proxies that were stopped (unstable)",
            m.stopped.clone(),
        );
        m
    }
}

impl PodMetrics {
    /// `root` carries no prefix: tidegate's under `tidegate_inpod_`, ztunnel's
    /// names beside them.
    fn register(root: &mut Registry) -> Self {
        let istio = WorkloadManagerMetrics::register(root);
        let m = PodMetrics {
            pods: Gauge::default(),
            max_pods: Gauge::default(),
            adds: Family::default(),
            refusals: Family::default(),
            removes: Counter::default(),
            istio,
        };
        let r = root
            .sub_registry_with_prefix("tidegate")
            .sub_registry_with_prefix("inpod");
        r.register(
            "pods",
            "Pods served in their own network namespace",
            m.pods.clone(),
        );
        r.register(
            "max_pods",
            "The most pods served at once: capture.max_pods, or fewer when the pods' descriptor share (at most half of the descriptors the control plane leaves, beside the DNS proxy's; eight a pod with the DNS proxy, four without) holds fewer",
            m.max_pods.clone(),
        );
        r.register(
            "refusals",
            "Pods not served, by reason (gateway_netns, netns_taken, pod_limit, descriptor_share, descriptors, netns, listen)",
            m.refusals.clone(),
        );
        r.register(
            "adds",
            "Pods handed over, by result (added, unchanged, replaced, failed; tidegate-cni only: \
             not_member, membership_unknown)",
            m.adds.clone(),
        );
        r.register(
            "removes",
            "Pods whose listeners were closed",
            m.removes.clone(),
        );
        m
    }

    fn add(&self, result: &'static str) {
        self.adds.get_or_create(&ResultLabel { result }).inc();
        if matches!(result, "added" | "replaced") {
            self.istio.started.inc();
        }
    }

    fn served(&self, n: usize) {
        self.pods.set(n as i64);
        self.istio.active.set(n as i64);
    }
}

struct Served {
    pod: Arc<Pod>,
    source: Source,
    /// Closes the pod's listeners.
    stop: ShutdownTrigger,
    since: std::time::SystemTime,
}

/// The served pods by uid, and which uid each namespace belongs to.
#[derive(Default)]
struct ServedPods {
    by_uid: BTreeMap<String, Served>,
    by_netns: HashMap<NetnsId, String>,
}

impl ServedPods {
    /// Serves `s`; the same uid's old entry (another namespace) is returned.
    fn insert(&mut self, s: Served) -> Option<Served> {
        let old = self.remove(&s.pod.uid);
        self.by_netns.insert(s.pod.netns.id(), s.pod.uid.clone());
        self.by_uid.insert(s.pod.uid.clone(), s);
        old
    }

    fn remove(&mut self, uid: &str) -> Option<Served> {
        let s = self.by_uid.remove(uid)?;
        self.by_netns.remove(&s.pod.netns.id());
        Some(s)
    }

    /// The pod other than `uid` served in namespace `id`.
    fn owner_of(&self, id: NetnsId, uid: &str) -> Option<Owner> {
        let owner = self.by_netns.get(&id).filter(|o| *o != uid)?;
        let s = self.by_uid.get(owner)?;
        Some(Owner {
            uid: owner.clone(),
            namespace: s.pod.namespace.clone(),
            name: s.pod.name.clone(),
        })
    }

    fn len(&self) -> usize {
        self.by_uid.len()
    }
}

/// A served pod as `/config_dump` shows it.
#[derive(Debug, Serialize)]
pub struct PodDump {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub netns_inode: u64,
    pub source: &'static str,
    pub since_unix_ms: u128,
}

/// Everything the per-pod listeners share.
pub struct PodProxies {
    sockets: NetnsSockets,
    outbound: Arc<Outbound>,
    inbound: Arc<Inbound>,
    workloads: Arc<WorkloadStore>,
    own_ports: OwnPorts,
    plaintext_metrics: ProxyMetrics,
    streams: ActiveStreams,
    drains: Arc<DrainEngine>,
    tunnels: Arc<InboundTunnels>,
    pool: Arc<Pool>,
    tcp: TcpTuning,
    ports: CapturePorts,
    /// The DNS proxy on 15053 (`dns.enabled`).
    dns: Option<Arc<DnsProxy>>,
    /// The gateway's drain: inbound tunnels on pod listeners drain with it.
    drain: ShutdownWatch,
    /// `capture.membership_wait`: how long a `tidegate-cni` ADD waits for
    /// the workload source to learn of its pod.
    membership_wait: Duration,
    served: tokio::sync::Mutex<ServedPods>,
    admission: Admission,
    metrics: PodMetrics,
}

/// The shared parts of the data path the pod listeners are made from.
pub struct DataPath {
    pub outbound: Arc<Outbound>,
    pub inbound: Arc<Inbound>,
    pub workloads: Arc<WorkloadStore>,
    pub own_ports: OwnPorts,
    pub plaintext_metrics: ProxyMetrics,
    pub streams: ActiveStreams,
    pub drains: Arc<DrainEngine>,
    pub tunnels: Arc<InboundTunnels>,
    pub pool: Arc<Pool>,
    /// Congestion control of the pod listeners' sockets.
    pub tcp: TcpTuning,
    /// The DNS proxy each pod gets on 15053 (`None`: `dns.enabled: false`).
    pub dns: Option<Arc<DnsProxy>>,
}

/// How many pods, and how long an ADD waits for its pod's membership.
#[derive(Clone, Copy, Debug)]
pub struct PodLimits {
    /// `capture.max_pods`.
    pub max_pods: usize,
    /// `capture.membership_wait`.
    pub membership_wait: Duration,
    /// The split of the descriptors (`None`: the open-file limit is
    /// unknown); the pods' share bounds them.
    pub budget: Option<DescriptorBudget>,
}

impl PodProxies {
    /// Call it from one of the gateway's threads: their namespace is the
    /// gateway's own, never a pod's.
    pub fn new(
        data: DataPath,
        ports: CapturePorts,
        limits: PodLimits,
        drain: ShutdownWatch,
        root: &mut Registry,
    ) -> Arc<Self> {
        let own_netns = tidegate_netns::namespace::current_id()
            .inspect_err(|e| warn!(error = %e, "cannot read the gateway's own network namespace; a pod handed it would not be refused"))
            .ok();
        let budget = limits.budget;
        let admission = Admission {
            own_netns,
            listeners: listeners_per_pod(data.dns.is_some()),
            max_pods: limits.max_pods,
            budget,
            inbound: Some(InboundClaim::new(
                data.inbound.limits().clone(),
                budget.as_ref(),
            )),
        };
        let max = admission.effective_max();
        if max < limits.max_pods {
            // The descriptor budget's own warning says why, with its figures.
            warn!(
                max_pods = limits.max_pods,
                served_at_most = max,
                "capture.max_pods is above what the pods' descriptor share holds; raise the open-file limit (LimitNOFILE) to serve more"
            );
        } else {
            info!(
                max_pods = max,
                pods_descriptors = budget.map(|b| b.pods),
                "in-pod pod limit"
            );
        }
        let metrics = PodMetrics::register(root);
        metrics.max_pods.set(i64::try_from(max).unwrap_or(i64::MAX));
        Arc::new(PodProxies {
            sockets: NetnsSockets::new(),
            outbound: data.outbound,
            inbound: data.inbound,
            workloads: data.workloads,
            own_ports: data.own_ports,
            plaintext_metrics: data.plaintext_metrics,
            streams: data.streams,
            drains: data.drains,
            tunnels: data.tunnels,
            pool: data.pool,
            tcp: data.tcp,
            ports,
            dns: data.dns,
            drain,
            membership_wait: limits.membership_wait,
            served: Default::default(),
            admission,
            metrics,
        })
    }

    /// Serves `meta` inside `netns`: `added`, `unchanged` (same pod, same
    /// namespace) or `replaced` (same pod, re-created sandbox).
    async fn serve(&self, meta: PodMeta, netns: OwnedFd) -> Result<&'static str, PodError> {
        self.metrics.istio.pending.inc();
        let r = self.serve_inner(meta, netns).await;
        self.metrics.istio.pending.dec();
        self.metrics.add(match &r {
            Ok(result) => result,
            Err(_) => "failed",
        });
        if let Err(e) = &r {
            // The caller logs the error with its source's context.
            let reason = e.reason();
            self.metrics
                .refusals
                .get_or_create(&ReasonLabel { reason })
                .inc();
        }
        r
    }

    async fn serve_inner(&self, meta: PodMeta, netns: OwnedFd) -> Result<&'static str, PodError> {
        let uid = meta.uid.clone();
        let netns = PodNetns::from_fd(netns).map_err(|source| PodError::Netns {
            uid: uid.clone(),
            source,
        })?;
        // One add at a time: a repeated ADD racing the first must not open
        // the listeners twice.
        let mut served = self.served.lock().await;
        let replaced = match served.by_uid.get(&uid) {
            Some(s) if s.pod.netns.id() == netns.id() => return Ok("unchanged"),
            Some(_) => true,
            None => false,
        };
        let owner = served.owner_of(netns.id(), &uid);
        let candidate = Candidate {
            netns: netns.id(),
            owner: owner.as_ref(),
            served: served.len(),
            replacing: replaced,
        };
        self.admission
            .check(&candidate)
            .map_err(|refusal| PodError::Refused {
                uid: uid.clone(),
                refusal,
            })?;
        let pod = Arc::new(Pod {
            uid: uid.clone(),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            service_account: meta.service_account.clone(),
            netns: Arc::new(netns),
            sockets: self.sockets,
        });
        let stop = self.listen(&pod).await?;
        if let Some(old) = served.insert(Served {
            pod: pod.clone(),
            source: meta.source,
            stop,
            since: std::time::SystemTime::now(),
        }) {
            old.stop.start(Duration::ZERO);
        }
        self.metrics.served(served.len());
        let result = if replaced { "replaced" } else { "added" };
        info!(uid = %uid, pod = %format!("{}/{}", meta.namespace, meta.name), source = meta.source.label(),
            netns_inode = pod.netns.id().ino, result, "pod served in its own network namespace");
        Ok(result)
    }

    /// A listener on `[::]:port` in the pod, dual-stack as ztunnel's; on
    /// `0.0.0.0:port` in a pod without IPv6 (no `::1`, `disable_ipv6`):
    /// logged once, the pod served on IPv4.
    fn listen_any(
        &self,
        pod: &Arc<Pod>,
        port: u16,
        opts: ListenOpts,
    ) -> Result<tokio::net::TcpListener, PodError> {
        let at = |ip: IpAddr| SocketAddr::new(ip, port);
        match self
            .sockets
            .listen(&pod.netns, at(Ipv6Addr::UNSPECIFIED.into()), opts)
        {
            Ok(l) => Ok(l),
            Err(NetnsError::Socket { what, source })
                if crate::proxy::listener::ipv6_off(&source) =>
            {
                let v6 = NetnsError::Socket { what, source };
                let l = self
                    .sockets
                    .listen(&pod.netns, at(Ipv4Addr::UNSPECIFIED.into()), opts)
                    .map_err(|source| PodError::Listen {
                        uid: pod.uid.clone(),
                        port,
                        source,
                    })?;
                debug!(uid = %pod.uid, port, error = %v6, "no IPv6 in the pod: listening on 0.0.0.0");
                crate::proxy::listener::ipv6_unavailable(&v6);
                Ok(l)
            }
            Err(source) => Err(PodError::Listen {
                uid: pod.uid.clone(),
                port,
                source,
            }),
        }
    }

    /// Opens the pod's listeners (three, and 15053 UDP and TCP on each
    /// loopback address with the DNS proxy) and starts their loops; the
    /// returned trigger closes them.
    async fn listen(&self, pod: &Arc<Pod>) -> Result<ShutdownTrigger, PodError> {
        let opts = ListenOpts {
            mark: MESH_MARK,
            transparent: false,
            backlog: 1024,
        };
        let mut listeners = Vec::new();
        for (port, cc) in [
            (self.ports.outbound, &self.tcp.app),
            (self.ports.inbound_plaintext, &self.tcp.app),
            (self.ports.hbone, &self.tcp.tunnel),
        ] {
            let l = self.listen_any(pod, port, opts)?;
            // Inherited by every connection it accepts.
            cc.apply_or_log(&l);
            listeners.push(l);
        }
        let hbone = listeners.pop().expect("three listeners");
        let plaintext = listeners.pop().expect("three listeners");
        let outbound = listeners.pop().expect("three listeners");
        let dns = match &self.dns {
            Some(dns) => Some(self.dns_listeners(dns, pod)?),
            None => None,
        };
        let (stop, watch) = shutdown::channel();
        if let Some((dns, udp, tcp)) = dns {
            for u in udp {
                tokio::spawn(dns.clone().serve_udp(u, watch.clone()));
            }
            for t in tcp {
                tokio::spawn(dns.clone().serve_tcp(t, watch.clone()));
            }
        }
        let origin = Origin::Pod(pod.clone());
        tokio::spawn(
            self.outbound
                .for_pod(origin.clone())
                .run(outbound, watch.clone()),
        );
        tokio::spawn(self.inbound.for_pod(origin.clone()).run(
            hbone,
            watch.clone(),
            self.drain.clone(),
        ));
        let plain = PlaintextInbound::new(
            self.workloads.clone(),
            origin,
            self.own_ports.clone(),
            self.plaintext_metrics.clone(),
            self.streams.clone(),
            self.tcp.app.clone(),
            self.inbound.authorizer().clone(),
        );
        tokio::spawn(plain.run(plaintext, watch));
        Ok(stop)
    }

    /// The pod's DNS proxy and its listeners on 127.0.0.1:15053 and
    /// [::1]:15053 (UDP, TCP), marked like every socket the gateway makes
    /// in the pod. Loopback, as ztunnel binds them: the pod's redirect
    /// (REDIRECT of a locally made packet) sends its queries to the
    /// loopback address of their family, and a UDP answer must leave from
    /// there for the kernel to give it back the address the pod asked (an
    /// answer from the pod's own address is dropped by the pod's
    /// resolver); and nothing outside the pod reaches them. A pod without
    /// IPv6 (no ::1) gets the IPv4 pair only.
    #[allow(clippy::type_complexity)]
    fn dns_listeners(
        &self,
        dns: &Arc<DnsProxy>,
        pod: &Arc<Pod>,
    ) -> Result<
        (
            Arc<crate::dns::PodDns>,
            Vec<tokio::net::UdpSocket>,
            Vec<tokio::net::TcpListener>,
        ),
        PodError,
    > {
        let err = |source| PodError::Listen {
            uid: pod.uid.clone(),
            port: DNS_CAPTURE_PORT,
            source,
        };
        let opts = ListenOpts {
            mark: MESH_MARK,
            transparent: false,
            backlog: 128,
        };
        let (mut udp, mut tcp) = (Vec::new(), Vec::new());
        for ip in [
            IpAddr::from(Ipv4Addr::LOCALHOST),
            Ipv6Addr::LOCALHOST.into(),
        ] {
            let addr = SocketAddr::new(ip, DNS_CAPTURE_PORT);
            let pair = self
                .sockets
                .listen(&pod.netns, addr, opts)
                .and_then(|t| Ok((t, self.sockets.udp_bind(&pod.netns, addr, MESH_MARK, true)?)));
            match pair {
                Ok((t, u)) => {
                    tcp.push(t);
                    udp.push(u);
                }
                Err(e) if ip.is_ipv6() && no_ipv6(&e) => {
                    debug!(uid = %pod.uid, error = %e, "no IPv6 loopback in the pod: DNS proxy on 127.0.0.1:15053 only");
                }
                Err(e) => return Err(err(e)),
            }
        }
        let place = Place::Pod {
            netns: pod.netns.clone(),
            sockets: self.sockets,
        };
        Ok((dns.pod(&pod.uid, &pod.namespace, place), udp, tcp))
    }

    /// The pod's network is gone (after its teardown drain): its listeners
    /// close, and whatever tunnels it still has — inbound to it, pooled
    /// from it — are closed at once. `false` when it was not served.
    async fn close(&self, uid: &str) -> bool {
        let mut served = self.served.lock().await;
        let Some(s) = served.remove(uid) else {
            return false;
        };
        s.stop.start(Duration::ZERO);
        self.metrics.served(served.len());
        self.metrics.removes.inc();
        self.metrics.istio.stopped.inc();
        drop(served);
        let inbound = self.tunnels.close_current(uid, "pod removed");
        let netns = Some(s.pod.netns.id());
        let outbound = self.pool.evict_matching(true, |k| k.src_netns == netns);
        info!(
            uid,
            inbound, outbound, "pod's listeners closed; its remaining tunnels closed"
        );
        true
    }

    /// The network teardown of a pod its node agent took back: the policy
    /// decides (the hold is honoured), then the listeners close.
    async fn teardown(&self, uid: &str, trigger: Trigger) {
        // The pod's workload may be keyed otherwise than the pod (istiod).
        let named = self
            .served
            .lock()
            .await
            .by_uid
            .get(uid)
            .map(|s| (s.pod.namespace.clone(), s.pod.name.clone()));
        let (namespace, name) = named.unwrap_or_default();
        let workload_uid = self
            .workloads
            .snapshot()
            .pod_workload(uid, &namespace, &name)
            .map_or_else(|| uid.to_owned(), |w| w.uid().to_owned());
        if let Err(e) = self
            .drains
            .on_lifecycle(&workload_uid, Lifecycle::Teardown, trigger)
            .await
        {
            info!(uid, error = %e, "teardown of a pod discovery does not know; closing its listeners");
        }
        self.drains.pod_taken_back(&PodKey {
            uid,
            namespace: &namespace,
            name: &name,
        });
        // The pod's network is gone: so is it as an endpoint, now, whatever
        // discovery still lists (handed over again, it comes back).
        self.workloads.remove(&workload_uid);
        self.close(uid).await;
    }

    /// The gateway is stopping: every pod's listeners close.
    pub async fn stop_accepting(&self) {
        for s in self.served.lock().await.by_uid.values() {
            s.stop.start(Duration::ZERO);
        }
    }

    pub async fn dump(&self) -> Vec<PodDump> {
        let served = self.served.lock().await;
        served
            .by_uid
            .values()
            .map(|s| PodDump {
                uid: s.pod.uid.clone(),
                name: s.pod.name.clone(),
                namespace: s.pod.namespace.clone(),
                netns_inode: s.pod.netns.id().ino,
                source: s.source.label(),
                since_unix_ms: s
                    .since
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis()),
            })
            .collect()
    }
}
