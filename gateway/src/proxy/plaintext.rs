//! Plaintext inbound (port 15006, in-pod mode): a client that does not speak
//! HBONE (a pod outside the mesh, a node process other than the kubelet's
//! probes) connects to a meshed pod; the pod's capture rules redirect it
//! here. The pod's workload decides with the annotation
//! `tidegate.io/inbound-plaintext`: `allow` (the default) delivers the
//! connection to the app from inside the pod with the client's own address
//! as source; `refuse` resets it, counts it and logs it.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, info_span, warn, Instrument};

use crate::authorization::{Authorizer, Facts, NotAdmitted, Transport};
use crate::proxy::congestion::Congestion;
use crate::proxy::copy::{copy_tcp, Transferred};
use crate::proxy::istio_tcp::{self, Flags, Reporter};
use crate::proxy::ledger::{self, ConnectionLedger, Ended};
use crate::proxy::metrics::ProxyMetrics;
use crate::proxy::origin::Origin;
use crate::workloads::{Workload, WorkloadStore};
use tidegate_base::shutdown::{ActiveStreams, ShutdownWatch};

/// The workload annotation that allows or refuses plaintext inbound.
pub const PLAINTEXT_ANNOTATION: &str = "tidegate.io/inbound-plaintext";

#[derive(Debug, thiserror::Error)]
pub enum PlaintextError {
    #[error("connection was not redirected (no original destination)")]
    NotRedirected,
    #[error("destination {0} is not this pod's address")]
    NotThisPod(SocketAddr),
    #[error("destination port {0} is one of the gateway's own ports")]
    OwnPort(u16),
    #[error("pod {0} is not known to discovery")]
    UnknownPod(String),
    #[error("workload {workload} refuses plaintext inbound (`{PLAINTEXT_ANNOTATION}: {value}`)")]
    Refused { workload: String, value: String },
    #[error("connection closed due to policy rejection: {0}")]
    Policy(tidegate_authz::Denial),
    #[error("app {addr} unreachable: {source}")]
    Upstream {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

impl PlaintextError {
    pub fn reason(&self) -> &'static str {
        match self {
            PlaintextError::NotRedirected => "not_redirected",
            PlaintextError::NotThisPod(_) => "not_this_pod",
            PlaintextError::OwnPort(_) => "illegal_port",
            PlaintextError::UnknownPod(_) => "unknown_pod",
            PlaintextError::Refused { .. } => "plaintext_refused",
            PlaintextError::Policy(_) => "policy_denied",
            PlaintextError::Upstream { .. } => "upstream_unreachable",
        }
    }

    /// How Istio's report of the connection closes, when it was routed.
    fn flags(&self) -> Flags {
        match self {
            PlaintextError::Policy(_) => Flags::Deny,
            _ => Flags::Connect,
        }
    }
}

/// Whether the workload takes plaintext inbound. A value other than
/// `allow` or `refuse` refuses (a typo must not open the pod) and is logged
/// with the key.
pub fn allows_plaintext(w: &Workload) -> Result<(), String> {
    match w
        .spec
        .annotations
        .get(PLAINTEXT_ANNOTATION)
        .map(String::as_str)
    {
        None | Some("allow") => Ok(()),
        Some("refuse") => Err("refuse".into()),
        Some(other) => {
            warn!(
                workload = %w.uid(),
                key = PLAINTEXT_ANNOTATION,
                value = other,
                "unknown value (expected `allow` or `refuse`); plaintext inbound refused"
            );
            Err(other.to_owned())
        }
    }
}

/// One pod's plaintext inbound listener.
pub struct PlaintextInbound {
    workloads: Arc<WorkloadStore>,
    /// The pod: connections are delivered inside its namespace.
    origin: Origin,
    own_ports: crate::proxy::inbound::OwnPorts,
    metrics: ProxyMetrics,
    streams: ActiveStreams,
    /// Congestion control of the deliveries (`tcp.app_congestion_control`).
    app_cc: Congestion,
    /// Istio's L4 authorization (no identity: STRICT refuses plaintext).
    authorizer: Arc<Authorizer>,
}

impl PlaintextInbound {
    pub fn new(
        workloads: Arc<WorkloadStore>,
        origin: Origin,
        own_ports: crate::proxy::inbound::OwnPorts,
        metrics: ProxyMetrics,
        streams: ActiveStreams,
        app_cc: Congestion,
        authorizer: Arc<Authorizer>,
    ) -> Arc<Self> {
        Arc::new(PlaintextInbound {
            workloads,
            origin,
            own_ports,
            metrics,
            streams,
            app_cc,
            authorizer,
        })
    }

    /// Accepts until `stop` fires.
    pub async fn run(self: Arc<Self>, listener: TcpListener, mut stop: ShutdownWatch) {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop.signaled() => return,
            };
            match accepted {
                Ok((tcp, src)) => {
                    let src = crate::proxy::listener::canonical(src);
                    let this = self.clone();
                    tokio::spawn(async move { this.serve(tcp, src).await });
                }
                Err(e) => {
                    debug!(error = %e, "plaintext accept failed");
                    self.metrics.connection_failed("accept");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
    }

    async fn serve(&self, tcp: TcpStream, src: SocketAddr) {
        let dst = crate::proxy::listener::original_dst(&tcp);
        let span = info_span!("inbound_plaintext", src.addr = %src, dst.addr = ?dst);
        async {
            let guard = self.streams.track();
            let line_dst = dst.unwrap_or(src);
            let mut ledger =
                ConnectionLedger::connection(&self.metrics, &tcp, guard, src, line_dst);
            let result = match dst {
                None => Err(PlaintextError::NotRedirected),
                Some(dst) => self.deliver(&tcp, src, dst, &mut ledger).await,
            };
            match result {
                Ok(moved) => ledger.finish(Ended::new(ledger::OK, moved)),
                Err(e) => {
                    match &e {
                        PlaintextError::Refused { .. } | PlaintextError::Policy(_) => {
                            info!(error = %e, "plaintext connection refused")
                        }
                        _ => debug!(error = %e, "plaintext connection failed"),
                    }
                    ledger.refuse(e.reason(), e.flags(), Some(&e.to_string()));
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Delivers the connection to the app (Istio's report opens in
    /// `ledger` once the workload is known); what was moved.
    async fn deliver(
        &self,
        tcp: &TcpStream,
        src: SocketAddr,
        dst: SocketAddr,
        ledger: &mut ConnectionLedger<'_>,
    ) -> Result<Transferred, PlaintextError> {
        let pod = self
            .origin
            .pod()
            .expect("plaintext inbound is served in a pod's namespace");
        if self.own_ports.contains(dst.port()) {
            return Err(PlaintextError::OwnPort(dst.port()));
        }
        let workload = pod
            .workload(&self.workloads.snapshot())
            .cloned()
            .ok_or_else(|| PlaintextError::UnknownPod(pod.uid.clone()))?;
        if !workload.spec.ips.contains(&dst.ip()) {
            return Err(PlaintextError::NotThisPod(dst));
        }
        allows_plaintext(&workload).map_err(|value| PlaintextError::Refused {
            workload: format!("{}/{}", workload.spec.namespace, workload.spec.name),
            value,
        })?;
        ledger.report(istio_tcp::Connection {
            reporter: Reporter::Destination,
            source: self.workloads.snapshot().by_ip(src.ip()).map(|w| &**w),
            source_identity: None,
            source_baggage: None,
            destination: Some(&workload),
            service: None,
            mutual_tls: false,
        });
        // Registered before its check: a policy change in between is seen.
        let admitted = self
            .authorizer
            .admit(Facts {
                src,
                dst,
                identity: None,
                workload_uid: workload.uid().to_owned(),
                transport: Transport::Plaintext,
            })
            .map_err(|e| match e {
                NotAdmitted::Policy(denial) => PlaintextError::Policy(denial),
                NotAdmitted::WorkloadGone => PlaintextError::UnknownPod(pod.uid.clone()),
            })?;
        let upstream = self
            .origin
            .connect(dst, Some(src.ip()), &self.app_cc)
            .await
            .map_err(|source| PlaintextError::Upstream { addr: dst, source })?;
        let _ = upstream.set_nodelay(true);
        let (received, sent) = ledger.istio_counters();
        let copy = async {
            tokio::join!(
                copy_tcp(tcp, &upstream, &received),
                copy_tcp(&upstream, tcp, &sent)
            )
        };
        let (up, down) = tokio::select! {
            copied = copy => copied,
            denial = admitted.refused() => {
                ledger::reset(&upstream);
                return Err(PlaintextError::Policy(denial));
            }
        };
        let moved = Transferred {
            tcp_to_h2: *up.as_ref().unwrap_or(&0),
            h2_to_tcp: *down.as_ref().unwrap_or(&0),
        };
        for (e, way) in [(up.err(), "client → app"), (down.err(), "app → client")] {
            if let Some(e) = e {
                debug!(error = %e, way, "plaintext copy ended with an error");
            }
        }
        Ok(moved)
    }
}
