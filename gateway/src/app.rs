//! The composition root: everything the gateway runs is wired here, so the
//! whole system reads in one place and tests start it in-process.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::task::JoinSet;
use tracing::info;

use crate::admin::{self, AdminState};
use crate::ca::certs::IstioCaCerts;
use crate::ca::metrics::CaMetrics;
use crate::config::{CaptureMode, CertificatesConfig, Config, WorkloadSourceKind};
use crate::control_plane::{self, ConnLimit, ControlMetrics};
use crate::inpod::capture::CapturePorts;
use crate::inpod::pods::{DataPath, PodProxies};
use crate::metrics::ProxyFamilies;
use crate::policy::{PolicyEngine, PolicyMetrics};
use crate::proxy::congestion::TcpTuning;
use crate::proxy::inbound::limits::{Caps, ConnectionLimits};
use crate::proxy::inbound::Inbound;
use crate::proxy::listener::bind;
use crate::proxy::outbound::Outbound;
use crate::proxy::pool::Pool;
use crate::proxy::tunnels::InboundTunnels;
use crate::shutdown::{self, ActiveStreams, ShutdownTrigger};
use crate::tls::{CertDir, CertSource, DevCa, TlsContext, TlsMetrics};
use crate::workloads::{
    kubernetes, parse_file, WorkloadFileMetrics, WorkloadFileWatcher, WorkloadStore,
};

/// The embedded default configuration (`tidegate run` without `--config`).
pub const DEFAULT_CONFIG: &str = include_str!("../defaults/tidegate.yaml");
/// The embedded default workload set.
pub const DEFAULT_WORKLOADS: &str = include_str!("../defaults/workloads.yaml");

/// Addresses actually bound (tests configure port 0).
#[derive(Clone, Copy, Debug)]
pub struct BoundAddrs {
    pub outbound: SocketAddr,
    pub inbound: SocketAddr,
    pub admin: SocketAddr,
    pub metrics: SocketAddr,
    pub readiness: SocketAddr,
    pub demo_echo: Option<SocketAddr>,
}

/// A running gateway.
pub struct App {
    pub addrs: BoundAddrs,
    pub workloads: Arc<WorkloadStore>,
    pub tunnels: Arc<InboundTunnels>,
    pub pool: Arc<Pool>,
    pub tls: Arc<TlsContext>,
    pub outbound: Arc<Outbound>,
    pub policies: Arc<PolicyEngine>,
    pub drains: Arc<crate::drains::DrainEngine>,
    /// In-pod mode: the pods served in their own namespaces.
    pub pods: Option<Arc<PodProxies>>,
    admin: Arc<AdminState>,
    streams: ActiveStreams,
    trigger: ShutdownTrigger,
    stop_accepting: ShutdownTrigger,
    /// Stops the admin, metrics and readiness servers at the very end.
    stop_admin: ShutdownTrigger,
    /// The HBONE and capture accept loops: awaited before tunnels drain.
    accept_loops: Vec<tokio::task::JoinHandle<()>>,
    tasks: JoinSet<()>,
    shutdown_deadline: Duration,
}

/// The certificate source a config asks for (also used by `tidegate connect`).
pub fn cert_source(config: &Config) -> anyhow::Result<Arc<dyn CertSource>> {
    Ok(match &config.certificates {
        CertificatesConfig::DevCa {
            state_dir,
            root_out,
            validity,
        } => {
            let ca = match state_dir {
                Some(dir) => DevCa::open(dir, *validity)
                    .with_context(|| format!("certificates.state_dir {}", dir.display()))?,
                None => DevCa::new(*validity)?,
            };
            if let Some(path) = root_out {
                ca.write_root(path).context("certificates.root_out")?;
            }
            Arc::new(ca)
        }
        CertificatesConfig::Dir {
            dir, trust_bundle, ..
        } => CertDir::load(dir, trust_bundle).context("certificates.dir")?,
        CertificatesConfig::IstioCa(ca) => Arc::new(
            IstioCaCerts::new(ca.settings(), CaMetrics::default())
                .context("certificates (istio-ca)")?,
        ),
    })
}

/// Loads the configured workload file once (or the embedded set).
pub fn load_workloads(config: &Config, store: &Arc<WorkloadStore>) -> anyhow::Result<()> {
    let parsed = match &config.workloads.file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("workloads.file {}", path.display()))?;
            parse_file(&text)?
        }
        None => parse_file(DEFAULT_WORKLOADS)?,
    };
    store.publish_all(parsed.workloads, parsed.services);
    Ok(())
}

/// Binds every listener and starts every task. Returns once the gateway is
/// ready — except with Kubernetes discovery, where `/healthz/ready` turns
/// ready only after the first full sync (the listeners serve meanwhile).
pub async fn build(config: Config) -> anyhow::Result<App> {
    let cp = &config.control_plane;
    let data_path_descriptors = control_plane::reserve_descriptors(control_plane::budget(
        cp,
        config.drains.cni_socket.is_some(),
    ))?;
    let mut registry = prometheus_client::registry::Registry::with_prefix("tidegate");
    let control = ControlMetrics::register(&mut registry);
    crate::allocator::AllocatorMetrics::register(&mut registry);
    let (trigger, drain) = shutdown::channel();
    let mut tasks = JoinSet::new();

    let workloads = WorkloadStore::new(&config.trust_domain, &config.node_name);
    // Kubernetes discovery: readiness waits for its first full sync.
    let mut k8s_synced = None;
    let workload_trigger = match config.workloads.source {
        WorkloadSourceKind::File => crate::drains::Trigger::WorkloadFile,
        WorkloadSourceKind::Kubernetes => crate::drains::Trigger::Kubernetes,
    };
    match &config.workloads.file {
        _ if config.workloads.source == WorkloadSourceKind::Kubernetes => {
            let k = &config.workloads.kubernetes;
            let client = kubernetes::client_for(k).await?;
            let source = kubernetes::KubernetesSource::new(
                client,
                &config.node_name,
                k.clone(),
                workloads.clone(),
                kubernetes::KubernetesMetrics::register(&mut registry),
            );
            k8s_synced = Some(source.synced());
            tasks.spawn(source.run(drain.clone()));
        }
        Some(path) => {
            let watcher = WorkloadFileWatcher::start(
                path,
                config.workloads.reload_interval,
                workloads.clone(),
                WorkloadFileMetrics::register(&mut registry),
            )?;
            tasks.spawn(watcher.run(drain.clone()));
        }
        None => load_workloads(&config, &workloads)?,
    }

    let (source, certdir): (Arc<dyn CertSource>, Option<Arc<CertDir>>) = match &config.certificates
    {
        CertificatesConfig::Dir {
            dir, trust_bundle, ..
        } => {
            let d = CertDir::load(dir, trust_bundle).context("certificates.dir")?;
            (d.clone(), Some(d))
        }
        CertificatesConfig::DevCa { .. } => (cert_source(&config)?, None),
        CertificatesConfig::IstioCa(ca) => {
            let certs = IstioCaCerts::new(ca.settings(), CaMetrics::register(&mut registry))
                .context("certificates (istio-ca)")?;
            tasks.spawn(certs.clone().run(workloads.clone(), drain.clone()));
            (Arc::new(certs), None)
        }
    };
    if let (
        Some(d),
        CertificatesConfig::Dir {
            reload_interval, ..
        },
    ) = (certdir, &config.certificates)
    {
        tasks.spawn(d.watch(*reload_interval, drain.clone()));
    }
    let tls = Arc::new(TlsContext::new(
        source,
        &config.trust_domain,
        TlsMetrics::register(&mut registry),
    ));

    let families = ProxyFamilies::register(&mut registry);
    let streams = ActiveStreams::default();
    let tunnels = Arc::new(InboundTunnels::default());
    let tcp = TcpTuning::from_config(&config.tcp)?;
    let pool = Pool::new(
        tls.clone(),
        config.hbone.clone(),
        config.pool.clone(),
        tcp.tunnel.clone(),
        &mut registry,
    );
    tasks.spawn(pool.clone().evict_idle(drain.clone()));

    // Policies load before readiness; a plugin that fails to load is
    // reported and its workloads use the fallback — traffic is served anyway.
    let policies = PolicyEngine::new(&config.policies, PolicyMetrics::register(&mut registry))?;
    let loading = policies.clone();
    for (name, result) in tokio::task::spawn_blocking(move || loading.load_configured()).await? {
        if let Err(e) = result {
            tracing::error!(policy = %name, error = %e, "policy not loaded; its workloads use the fallback");
        }
    }
    tasks.spawn(
        policies
            .clone()
            .watch_files(config.policies.reload_interval, drain.clone()),
    );

    let drains = crate::drains::DrainEngine::new(
        workloads.clone(),
        tunnels.clone(),
        pool.clone(),
        policies.clone(),
        config.drains.clone(),
        crate::drains::DrainMetrics::register(&mut registry),
    );
    if let Some(oci) =
        crate::oci::from_config(&config.oci, workloads.clone(), &mut registry, drain.clone())?
    {
        drains.set_oci(oci);
    }
    tasks.spawn(
        drains
            .clone()
            .watch_workloads(workload_trigger, drain.clone()),
    );
    let (failures_tx, failures_rx) = tokio::sync::mpsc::unbounded_channel();
    pool.report_failures_to(failures_tx);
    tasks.spawn(
        drains
            .clone()
            .watch_connect_failures(failures_rx, drain.clone()),
    );
    let l = &config.listeners;
    let inbound_listener = bind("inbound", l.inbound)?;
    let outbound_listener = bind("outbound", l.outbound)?;
    // Inherited by every connection each accepts.
    tcp.tunnel.apply_or_log(&inbound_listener);
    tcp.app.apply_or_log(&outbound_listener);
    let admin_listener = bind("admin", l.admin)?;
    let metrics_listener = bind("metrics", l.metrics)?;
    let ready_listener = bind("readiness", l.readiness)?;

    // A CONNECT to one of these on a local workload would tunnel into the
    // gateway itself: the configured ports, and the bound ones (port 0 binds
    // another).
    let bound = [
        &inbound_listener,
        &outbound_listener,
        &admin_listener,
        &metrics_listener,
        &ready_listener,
    ]
    .map(|l| l.local_addr().map_or(0, |a| a.port()));
    let configured = [l.inbound, l.outbound, l.admin, l.metrics, l.readiness].map(|a| a.port());
    let capture_ports = CapturePorts {
        hbone: config.hbone.port,
        ..CapturePorts::default()
    };
    let inpod = config.capture.mode == CaptureMode::Inpod;
    let pod_ports = [capture_ports.outbound, capture_ports.inbound_plaintext];
    let own_ports = crate::proxy::inbound::OwnPorts::new(
        bound
            .into_iter()
            .chain(configured)
            .chain([config.hbone.port])
            .chain(pod_ports.into_iter().filter(|_| inpod)),
    );
    let caps = Caps::derive(&config.hbone, data_path_descriptors);
    info!(
        tunnels = caps.tunnels,
        connections = caps.connections,
        per_identity = caps.per_identity,
        "inbound connection caps"
    );
    let inbound = Inbound::new(
        workloads.clone(),
        tls.clone(),
        config.hbone.clone(),
        own_ports.clone(),
        tunnels.clone(),
        families.direction("inbound"),
        streams.clone(),
        crate::proxy::inbound::InboundMetrics::register(&mut registry),
        tcp.app.clone(),
        ConnectionLimits::new(caps, &mut registry),
    );
    let picker = crate::proxy::endpoints::EndpointPicker::new(
        pool.clone(),
        config.hbone.port,
        config.outbound.endpoint_choice,
        config.outbound.goaway_skip,
        crate::proxy::endpoints::EndpointMetrics::register(&mut registry),
    );
    let routing = crate::proxy::outbound::Routing::new(picker, &config.outbound, &mut registry);
    let outbound = Outbound::new(
        workloads.clone(),
        pool.clone(),
        config.hbone.port,
        families.direction("outbound"),
        streams.clone(),
        routing.clone(),
    );

    // In-pod mode: each meshed pod gets its own listeners, handed over by
    // tidegate-cni (the CNI socket), istio-cni (ZDS) or the state directory.
    let mut ready_when = Vec::new();
    let pods = if inpod {
        drains.added_by_node_agent();
        let pods = PodProxies::new(
            DataPath {
                outbound: outbound.clone(),
                inbound: inbound.clone(),
                workloads: workloads.clone(),
                own_ports: own_ports.clone(),
                plaintext_metrics: families.direction("inbound_plaintext"),
                streams: streams.clone(),
                drains: drains.clone(),
                tunnels: tunnels.clone(),
                pool: pool.clone(),
                tcp: tcp.clone(),
            },
            capture_ports,
            crate::inpod::pods::PodLimits {
                max_pods: config.capture.max_pods as usize,
                membership_wait: config.capture.membership_wait,
                data_path_descriptors,
            },
            drain.clone(),
            &mut registry,
        );
        if let Some(dir) = &config.capture.state_dir {
            let adopted = pods.adopt(dir).await;
            info!(adopted, dir = %dir.display(), "pods re-adopted from the state directory");
        }
        if let Some(socket) = &config.capture.zds_socket {
            let zds = crate::inpod::zds::ZdsClient::new(
                crate::inpod::zds::ZdsConfig {
                    socket: socket.clone(),
                    ..Default::default()
                },
                pods.clone(),
                &mut registry,
            );
            ready_when.push(("istio-cni's ZDS snapshot", zds.ready()));
            tasks.spawn(zds.run(drain.clone()));
        }
        Some(pods)
    } else {
        None
    };
    if let Some(path) = &config.drains.cni_socket {
        let l = crate::drains::cni::bind(path)
            .with_context(|| format!("drains.cni_socket {}", path.display()))?;
        let limits = crate::drains::cni::CniLimits {
            connections: ConnLimit::new("cni", cp.cni_max_connections, &control),
            read_timeout: cp.cni_read_timeout,
        };
        let handover = pods
            .clone()
            .map(|p| p as Arc<dyn crate::drains::cni::PodHandover>);
        tasks.spawn(crate::drains::cni::serve(
            l,
            drains.clone(),
            handover,
            limits,
            drain.clone(),
        ));
    }

    let demo_echo = match &config.demo {
        Some(demo) => {
            let l = crate::demo::bind_echo("demo.echo", demo.echo).await?;
            let addr = l.local_addr()?;
            info!(%addr, "demo echo backend listening");
            tasks.spawn(crate::demo::run_echo(l, drain.clone()));
            for more in &demo.more_echoes {
                let l = crate::demo::bind_echo("demo.more_echoes", *more).await?;
                info!(addr = %more, "demo echo backend listening");
                tasks.spawn(crate::demo::run_echo(l, drain.clone()));
            }
            Some(addr)
        }
        None => None,
    };

    let addrs = BoundAddrs {
        outbound: outbound_listener.local_addr()?,
        inbound: inbound_listener.local_addr()?,
        admin: admin_listener.local_addr()?,
        metrics: metrics_listener.local_addr()?,
        readiness: ready_listener.local_addr()?,
        demo_echo,
    };

    let admin_state = Arc::new(AdminState {
        node: config.node_name.clone(),
        workloads: workloads.clone(),
        registry: tunnels.clone(),
        pool: pool.clone(),
        policies: policies.clone(),
        drains: drains.clone(),
        pods: pods.clone(),
        routing: routing.clone(),
        certificates: tls.source().clone(),
        default_grace: config.drains.default_grace,
        metrics: registry,
        ready: Default::default(),
    });

    let (stop_accepting, accepting) = shutdown::channel();
    let accept_loops = vec![
        tokio::spawn(inbound.run(inbound_listener, accepting.clone(), drain.clone())),
        tokio::spawn(outbound.clone().run(outbound_listener, accepting)),
    ];
    // Admin, metrics and probes keep answering through the whole drain (the
    // kubelet probes a terminating gateway; operators watch `GET /drains`).
    let (stop_admin, admin_watch) = shutdown::channel();
    let http_limits = |listener| admin::HttpLimits {
        connections: ConnLimit::new(listener, cp.max_connections, &control),
        header_read_timeout: cp.header_read_timeout,
    };
    tasks.spawn(admin::serve(
        admin_listener,
        admin_state.clone(),
        admin::admin,
        http_limits("admin"),
        admin_watch.clone(),
    ));
    tasks.spawn(admin::serve(
        metrics_listener,
        admin_state.clone(),
        admin::metrics,
        http_limits("metrics"),
        admin_watch.clone(),
    ));
    tasks.spawn(admin::serve(
        ready_listener,
        admin_state.clone(),
        admin::readiness,
        http_limits("readiness"),
        admin_watch,
    ));
    if let Some(synced) = k8s_synced {
        ready_when.push(("Kubernetes discovery's first full sync", synced));
    }
    if ready_when.is_empty() {
        admin_state.ready.store(true, Ordering::Release);
    } else {
        let state = admin_state.clone();
        let mut drain = drain.clone();
        tasks.spawn(async move {
            let all = async {
                for (what, mut done) in ready_when {
                    if done.wait_for(|s| *s).await.is_err() {
                        return false;
                    }
                    info!("{what} done");
                }
                true
            };
            tokio::select! {
                ok = all => if ok {
                    state.ready.store(true, Ordering::Release);
                    info!("ready");
                },
                _ = drain.signaled() => {}
            }
        });
    }
    info!(
        node = %config.node_name,
        inbound = %addrs.inbound,
        outbound = %addrs.outbound,
        admin = %addrs.admin,
        metrics = %addrs.metrics,
        readiness = %addrs.readiness,
        "tidegate ready"
    );

    Ok(App {
        addrs,
        workloads,
        tunnels,
        pool,
        tls,
        outbound,
        policies,
        drains,
        pods,
        admin: admin_state,
        streams,
        trigger,
        stop_accepting,
        stop_admin,
        accept_loops,
        tasks,
        shutdown_deadline: config.shutdown.deadline,
    })
}

impl App {
    /// The Prometheus text of this gateway's metrics (what `/metrics` serves).
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.admin.metrics)
            .expect("encoding to a String cannot fail");
        out
    }

    /// Streams open in either direction.
    pub fn open_streams(&self) -> usize {
        self.streams.count()
    }

    /// Drains and stops: listeners close at once, inbound tunnels get a
    /// graceful GOAWAY, pooled tunnels are evicted (GOAWAY once their streams
    /// end); returns when no stream is left or at the deadline, whichever first.
    pub async fn shutdown(mut self) {
        // Listeners close first: once they are gone, a peer told to go away
        // can only reach a gateway that takes new connections (a new one
        // bound with SO_REUSEPORT during an upgrade), never this one.
        self.stop_accepting.start(self.shutdown_deadline);
        if let Some(pods) = &self.pods {
            pods.stop_accepting().await;
        }
        for l in self.accept_loops.drain(..) {
            let _ = l.await;
        }
        let deadline = self.trigger.start(self.shutdown_deadline);
        self.admin.ready.store(false, Ordering::Release);
        // Listeners are closing; the policies plan first, then the default
        // drain (graceful GOAWAY inbound, client-side GOAWAY on the pool).
        let plan = self.drains.on_gateway_shutdown(self.shutdown_deadline);
        if !plan.is_empty() {
            info!(actions = ?plan, "gateway shutdown plan from the policies");
        }
        self.pool.evict_all();
        info!(
            streams = self.streams.count(),
            deadline_ms = self.shutdown_deadline.as_millis() as u64,
            "draining"
        );
        // Streams cut at the deadline end within moments (their tunnels
        // close at once): counted for the last line, not waited on longer.
        const CUT_SETTLE: Duration = Duration::from_millis(500);
        self.streams.drain(deadline, CUT_SETTLE).await.log();
        self.stop_admin.start(Duration::ZERO);
        self.drains.shutdown().await;
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }

    /// Runs until SIGTERM or SIGINT, then [`App::shutdown`].
    pub async fn run_until_signal(self) -> anyhow::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => info!("SIGTERM"),
            _ = int.recv() => info!("SIGINT"),
        }
        self.shutdown().await;
        Ok(())
    }
}
