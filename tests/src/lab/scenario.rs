//! One policy's run: the topology, the three gateways, the server apps and
//! the client load, then the scenario's timeline, then the row.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::app_server::{AppPod, APP_PORT};
use super::gateway::{Gateway, IstioSource, NodeFiles};
use super::load::{Counts, Endpoint, Load};
use super::params::{Params, Scenario};
use super::probes::{
    metric_sum, CounterWatcher, DrainSeen, DrainWatcher, PoolWatcher, GOAWAYS, OPENED,
};
use super::report::{ms, Row};
use super::topology::{Pod, Topology};
use super::workloads::{Sink, Workloads};
use super::xds_feed::{Background, XdsFeed};
use super::LabError;
use crate::netns::NsThread;

/// Everything one run holds. Fields drop in declaration order: the load and
/// the watchers, the apps and gateways (killed), the namespace threads, the
/// namespaces, then the files.
pub struct Lab {
    pub(super) load: Option<Load>,
    pub(super) watcher: Option<PoolWatcher>,
    pub(super) old: Option<AppPod>,
    pub(super) reuse: Option<AppPod>,
    _replacement: Option<AppPod>,
    /// `rollout`: the running replicas (generation 0, then 1).
    pub(super) replicas: Vec<(Pod, AppPod)>,
    /// `rollout`: when each new replica was ready (for the notes).
    pub(super) surged: Vec<String>,
    /// Second-generation gateways (`gateway-restart`), kept until the end.
    pub(super) restarted: Vec<Gateway>,
    pub(super) gw_a: Gateway,
    pub(super) gw_b: Gateway,
    pub(super) gw_c: Gateway,
    pa: NsThread,
    pub(super) na: NsThread,
    pub(super) nb: NsThread,
    _nc: NsThread,
    pub(super) workloads: Workloads,
    pub(super) topo: Topology,
    pub(super) dir: tempfile::TempDir,
}

impl Lab {
    /// Builds run `run`'s namespaces and starts its processes with the
    /// server pods annotated with `policy`.
    /// `background`: `--source istio`'s set (the istiod double's).
    pub async fn start(
        p: &Params,
        policy: &str,
        run: usize,
        background: Option<&Background>,
    ) -> Result<Lab, LabError> {
        let dir = tempfile::Builder::new()
            .prefix("drain-lab-")
            .tempdir()
            .map_err(|e| LabError::Setup(format!("temporary directory: {e}")))?;
        let rollout = p.scenario == Scenario::Rollout;
        let mut topo = Topology::new(run, p.ipv6);
        topo.build_nodes()?;
        let first_replicas: Vec<Pod> = (0..if rollout { p.replicas } else { 0 })
            .map(|index| Pod::Replica { gen: 0, index })
            .collect();
        let pods = if rollout {
            vec![Pod::Client]
        } else {
            vec![Pod::Client, Pod::Old, Pod::Replacement]
        };
        for pod in pods.into_iter().chain(first_replicas.iter().copied()) {
            topo.add_pod(pod)?;
        }
        let feed = match background {
            Some(bg) => {
                Some(XdsFeed::start(&topo.node_ns('a'), topo.addr(0, 1), dir.path(), bg).await?)
            }
            None => None,
        };
        let node_ip = |node| match node {
            'a' => topo.addr(0, 1),
            'b' => topo.addr(0, 2),
            _ => topo.addr(4, 2),
        };
        // Startup converts the whole set: a second per 500 background
        // workloads beside the minute a small set gets.
        let ready_within = Duration::from_secs(60 + u64::from(p.background) / 500);
        let files: Vec<NodeFiles> = ['a', 'b', 'c']
            .into_iter()
            .map(|node| NodeFiles {
                node,
                workloads: dir.path().join(format!("workloads-{node}.yaml")),
                cni_socket: dir.path().join(format!("cni-{node}.sock")),
                istio: feed.as_ref().map(|f| IstioSource {
                    address: format!("https://{}", f.double.addr),
                    roots: f.roots.clone(),
                    token: f.token.clone(),
                    pod_ip: node_ip(node),
                    policy: policy.to_owned(),
                }),
                ready_within,
            })
            .collect();
        let sink = match feed {
            Some(feed) => Sink::Xds(Box::new(feed)),
            None => Sink::Files(files.iter().map(|f| f.workloads.clone()).collect()),
        };
        let mut workloads = Workloads::new(&topo, sink, policy, p.different_sa);
        if rollout {
            workloads = workloads.for_rollout();
            for &pod in &first_replicas {
                workloads.add_replica(pod, topo.pod_ip(pod), true)?;
            }
        }
        workloads.write()?;
        let [na, nb, nc] = ['a', 'b', 'c'].map(|n| NsThread::idle(&topo.node_ns(n)));
        // Gateway A first: it creates the development CA the others open.
        let mut started = Vec::with_capacity(3);
        for (i, (node, thread)) in [('a', &na), ('b', &nb), ('c', &nc)].into_iter().enumerate() {
            let ns = topo.node_ns(node);
            started
                .push(Gateway::start(&ns, thread.handle.clone(), &files[i], dir.path(), 0).await?);
        }
        let mut started = started.into_iter();
        let mut next = || started.next().expect("three gateways started");
        let (gw_a, gw_b, gw_c) = (next(), next(), next());
        if let Some(feed) = workloads.feed() {
            tracing::info!(
                a = ?gw_a.ready_after,
                b = ?gw_b.ready_after,
                c = ?gw_c.ready_after,
                background = p.background,
                "gateways ready (xDS)"
            );
            feed.start_churn(p.churn);
        }
        let app = |pod, name: String| {
            let (ns, drain) = (topo.pod_ns(pod), p.app_drain);
            let log = dir.path().join(format!("app-{name}.log"));
            async move { AppPod::start(&ns, &name, drain, &log).await }
        };
        let (mut old, mut replacement, mut replicas) = (None, None, Vec::new());
        if rollout {
            for &pod in &first_replicas {
                replicas.push((pod, app(pod, super::workloads::replica_name(pod)).await?));
            }
        } else {
            old = Some(app(Pod::Old, "old".into()).await?);
            replacement = Some(app(Pod::Replacement, "replacement".into()).await?);
        }
        let pa = NsThread::idle(&topo.pod_ns(Pod::Client));
        Ok(Lab {
            load: None,
            watcher: None,
            old,
            reuse: None,
            _replacement: replacement,
            replicas,
            surged: Vec::new(),
            gw_a,
            gw_b,
            gw_c,
            pa,
            na,
            nb,
            _nc: nc,
            workloads,
            topo,
            dir,
            restarted: Vec::new(),
        })
    }

    pub(super) fn endpoint(&self, pod: Pod) -> Endpoint {
        let name = match pod {
            Pod::Client => "client",
            Pod::Old => "old pod",
            Pod::Replacement => "replacement",
            Pod::Reuse => "pod at the reused IP",
            Pod::Replica { .. } => "replica",
        };
        (name, SocketAddr::new(self.topo.pod_ip(pod), APP_PORT))
    }

    /// Starts the load on both server pods and waits until it flows.
    async fn warm_up(&mut self, p: &Params) -> Result<(), LabError> {
        if p.scenario != Scenario::Rollout {
            // (`rollout` watches each replaced pod in turn.)
            let old_ip = self.topo.pod_ip(Pod::Old);
            self.watcher = Some(PoolWatcher::start(self.gw_a.admin.clone(), old_ip));
        }
        let endpoints = if matches!(p.scenario, Scenario::Crash | Scenario::Rollout) {
            // Through the Service: the client's gateway chooses the pod.
            let vip = super::workloads::vip(&self.topo);
            vec![("service", SocketAddr::new(vip, APP_PORT))]
        } else {
            vec![self.endpoint(Pod::Old), self.endpoint(Pod::Replacement)]
        };
        let load = Load::start(&self.pa.handle, endpoints, p.rate, p.long_streams);
        let c = load.counts.clone();
        self.load = Some(load);
        let want_short = u64::from(p.rate / 2).max(5).min(u64::from(p.rate));
        let want_long = 2 * u64::from(p.long_streams);
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        loop {
            tick.tick().await;
            let (so, lo) = (Counts::get(&c.short_ok), Counts::get(&c.long_ok));
            if so >= want_short && lo >= want_long {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(20) {
                let failures = c.failures.lock().unwrap_or_else(|e| e.into_inner()).clone();
                return Err(LabError::Timeout(format!(
                    "the load to flow before the event ({so} short and {lo} long-stream requests \
                     succeeded in 20 s; first failures: {failures:#?})"
                )));
            }
        }
    }

    /// Runs the scenario and returns its row.
    pub async fn run(&mut self, p: &Params, policy: &str) -> Result<Row, LabError> {
        self.warm_up(p).await?;
        let mut row = Row {
            policy: policy.to_owned(),
            baseline: 2,
            ..Row::default()
        };
        let t = match p.scenario {
            Scenario::GatewayRestart => self.restart(p, &mut row).await?,
            Scenario::Crash => self.crash(p, &mut row).await?,
            Scenario::Rollout => self.rollout(p, &mut row).await?,
            _ => self.terminate(p, &mut row).await?,
        };
        self.finish(p, &mut row, t).await?;
        let ready = [&self.gw_a, &self.gw_b, &self.gw_c].map(|g| ms(g.ready_after));
        if let Some(feed) = self.workloads.feed() {
            feed.stop_churn();
            row.notes.push(format!(
                "xDS: {} background workloads; gateways ready after A {}, B {}, C {}",
                p.background, ready[0], ready[1], ready[2]
            ));
            row.notes.extend(feed.report());
        }
        if p.scenario == Scenario::Rollout {
            let per_pod = |n: u64| n as f64 / f64::from(p.replicas);
            row.notes.push(format!(
                "failed per replaced pod: {:.1} short, {:.1} long-stream",
                per_pod(row.short_failed),
                per_pod(row.long_failed)
            ));
        }
        Ok(row)
    }

    /// After the last step: the client's old-pod tunnels get `settle` to
    /// go, the load runs one more second (late failures), then the row.
    async fn finish(&mut self, p: &Params, row: &mut Row, t: Times) -> Result<(), LabError> {
        if let Some(exited) = t.exited {
            row.notes.push(format!(
                "app exited {} after the event",
                ms(exited - t.event)
            ));
            let settle_from = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            while self.watcher().old_present() && settle_from.elapsed() < p.settle {
                tick.tick().await;
            }
            // Load after the last lifecycle step, to count late failures
            // (pacing, not a wait for an event).
            tokio::time::sleep(Duration::from_secs(1)).await;
            let trace = self
                .watcher()
                .trace
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone_summary();
            row.old_tunnel_at_end = trace.old_present;
            row.old_gone = match (trace.old_gone_at, trace.old_present, trace.old_seen) {
                (_, true, _) => format!(
                    "still pooled at the end ({} after exit)",
                    ms(exited.elapsed())
                ),
                (Some(g), false, _) if g >= exited => ms(g - exited),
                (Some(_), false, _) => "before the app exited".into(),
                (None, false, 0) => "no tunnel to the old pod seen".into(),
                (None, false, _) => "–".into(),
            };
        }
        let load = self.load.take().expect("load started in warm_up");
        let c = load.stop().await;
        row.short_failed = Counts::get(&c.short_failed);
        row.short_total = row.short_failed + Counts::get(&c.short_ok);
        row.long_failed = Counts::get(&c.long_failed);
        row.long_total = row.long_failed + Counts::get(&c.long_ok);
        let failures = c.failures.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(first) = failures.first() {
            row.notes.push(format!("first failure: {first}"));
        }
        let a = self.gw_a.metrics_text().await?;
        row.opened += metric_sum(&a, OPENED);
        let trace = self.watcher.as_ref().map(|w| {
            w.trace
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone_summary()
        });
        let first_goaway = trace.as_ref().and_then(|t| t.first_goaway);
        // The counter's first rise, or a tunnel the dump showed GOAWAYed,
        // whichever was seen first.
        let seen = [t.goaways.rose_at(), first_goaway]
            .into_iter()
            .flatten()
            .filter(|g| *g >= t.event)
            .min();
        row.first_goaway = match seen {
            Some(g) => ms(g - t.event),
            None if metric_sum(&a, GOAWAYS) > 0.0 => "received, not seen by the polls".into(),
            None => "none".into(),
        };
        if let Some(trace) = trace {
            row.notes.push(format!(
                "pool polled {} times, longest gap {}",
                trace.polls,
                ms(trace.max_gap)
            ));
        }
        if let Some(drains) = t.drains {
            row.drain = drain_cell(&drains.seen());
        }
        Ok(())
    }

    /// Polls gateway A's `/config_dump?<query>` (5 ms) until `check`
    /// holds, at most 10 s.
    pub(super) async fn wait_dump(
        &self,
        what: &str,
        query: &str,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<(), LabError> {
        self.wait_dump_of(&self.gw_a, what, query, check).await
    }

    /// Polls `gw`'s `/config_dump?<query>` (5 ms) until `check` holds, at
    /// most 10 s. The query narrows the dump to what `check` reads: a
    /// gateway holding a large cluster would build every workload otherwise.
    pub(super) async fn wait_dump_of(
        &self,
        gw: &Gateway,
        what: &str,
        query: &str,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<(), LabError> {
        let started = Instant::now();
        let path = format!("/config_dump?{query}");
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        loop {
            tick.tick().await;
            if let Ok(body) = gw.admin.get_ok(&path).await {
                if serde_json::from_str(&body).is_ok_and(|d| check(&d)) {
                    return Ok(());
                }
            }
            if started.elapsed() > Duration::from_secs(10) {
                return Err(LabError::Timeout(format!("{what} (10 s)")));
            }
        }
    }

    /// Watches `gw`'s GOAWAY counter from its present value.
    pub(super) async fn goaway_watcher(&self, gw: &Gateway) -> Result<CounterWatcher, LabError> {
        let from = metric_sum(&gw.metrics_text().await?, GOAWAYS);
        Ok(CounterWatcher::start(gw.metrics.clone(), GOAWAYS, from))
    }

    pub(super) fn load(&self) -> &Load {
        self.load.as_ref().expect("load started in warm_up")
    }
    pub(super) fn watcher(&self) -> &PoolWatcher {
        self.watcher.as_ref().expect("watcher started in warm_up")
    }

    /// The gateways' logs (for an error report).
    pub fn log_tails(&self) -> String {
        let mut s = String::new();
        for (name, gw) in [("A", &self.gw_a), ("B", &self.gw_b)] {
            s.push_str(&format!(
                "--- gateway {name} ({}) ---\n{}\n",
                gw.log.display(),
                gw.log_tail()
            ));
        }
        s
    }
}

/// When the scenario's steps happened.
pub(super) struct Times {
    pub(super) event: Instant,
    /// The old app's exit (none in `gateway-restart`).
    pub(super) exited: Option<Instant>,
    pub(super) drains: Option<DrainWatcher>,
    /// The client gateway's GOAWAY counter, from just before the event.
    pub(super) goaways: CounterWatcher,
}

/// The dump query that lists workload `uid` alone.
pub(super) fn workload_query(uid: &str) -> String {
    format!(
        "only=workloads&workload={}",
        uid.replace('%', "%25").replace('/', "%2F")
    )
}

pub(super) fn lists(dump: &serde_json::Value, uid: &str) -> bool {
    dump["workloads"]
        .as_array()
        .is_some_and(|w| w.iter().any(|w| w["uid"] == uid))
}

fn drain_cell(seen: &DrainSeen) -> String {
    let Some(view) = &seen.view else {
        return "no drain recorded".into();
    };
    let left = view["tunnels_remaining"].as_u64().unwrap_or(0);
    let left = if left > 0 {
        format!(", {left} tunnel(s) left")
    } else {
        String::new()
    };
    match (seen.duration(), view["ended"].as_str()) {
        (Some(d), Some(how)) => format!("{} ({how}{left})", ms(d)),
        _ => format!(
            "not ended ({}{left})",
            view["phase"].as_str().unwrap_or("?")
        ),
    }
}
