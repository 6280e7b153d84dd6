//! In-pod capture end to end (issue 14): two nodes, pods created as a
//! container runtime does, the real `tidegate-cni` run with the CNI
//! environment and stdin for ADD and DEL — no test-side capture rule: the
//! plugin installs them inside each pod — and in-process gateways in
//! `capture.mode: inpod` inside the node namespaces (topology in
//! `tidegate_e2e::inpod`).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidegate_e2e::cni::{inpod_conf, CniPod};
use tidegate_e2e::inpod::InpodTopology;
use tidegate_e2e::netns::{gateway_config, Gateway, NetnsGuard, NsThread, ECHO_PORT, STEP};
use tidegate_e2e::{metric_or_zero, write_atomically};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{congestion_controls, hold_connection, host_congestion, round_trip, skip, start_echo};

#[path = "dns.rs"]
pub(crate) mod dns;

const CLIENT_UID: &str = "pa-uid";
const SERVER_UID: &str = "pb-uid";

fn workloads_yaml(t: &InpodTopology, server_annotations: &str) -> String {
    format!(
        r#"workloads:
- {{uid: {CLIENT_UID}, name: client, namespace: demo, service_account: client, ips: [{a}], node: node-a}}
- {{uid: {SERVER_UID}, name: echo, namespace: demo, service_account: echo, ips: [{b}], node: node-b, annotations: {{{server_annotations}}}}}
- {{uid: pc-uid, name: legacy, namespace: demo, service_account: legacy, ips: [{c}], node: node-a, protocol: TCP}}
- {{uid: intruder-uid, name: intruder, namespace: demo, service_account: echo, ips: [{i}], node: node-b}}
- {{uid: node-uid, name: echo, namespace: demo, service_account: echo, ips: [{n}], node: node-b}}
"#,
        a = t.pod_a(),
        b = t.pod_b(),
        c = t.pod_c(),
        i = t.addr(2, 3),
        n = t.addr(2, 4),
    )
}

/// A node: its namespace, its gateway's files, a thread to run commands in it.
struct Node {
    ns: String,
    name: &'static str,
    socket: PathBuf,
    state: PathBuf,
    /// Pods come from istio-cni over ZDS (this socket) instead of tidegate-cni.
    zds: Option<PathBuf>,
    /// `capture.max_pods`, when set.
    max_pods: Option<u32>,
    /// More configuration, appended as is.
    extra: String,
    /// Commands (tidegate-cni, probes) run from here, in the node's namespace.
    shell: NsThread,
}

impl Node {
    fn new(dir: &Path, ns: &str, name: &'static str) -> Node {
        Node {
            ns: ns.to_owned(),
            name,
            socket: dir.join(format!("{name}.sock")),
            state: dir.join(format!("{name}-pods")),
            zds: None,
            max_pods: None,
            extra: String::new(),
            shell: NsThread::idle(ns),
        }
    }

    fn config_extra(&self) -> String {
        let max_pods = self
            .max_pods
            .map(|n| format!("  max_pods: {n}\n"))
            .unwrap_or_default();
        let capture = if let Some(zds) = &self.zds {
            format!(
                "capture:\n  mode: inpod\n  zds_socket: {}\n{max_pods}",
                zds.display()
            )
        } else {
            format!(
                "capture:\n  mode: inpod\n  state_dir: {}\n{max_pods}drains:\n  cni_socket: {}\n",
                self.state.display(),
                self.socket.display()
            )
        };
        capture + &self.extra
    }

    async fn gateway(&self, dir: &Path) -> Gateway {
        let cfg = gateway_config(
            self.name,
            &dir.join("ca"),
            &dir.join("workloads.yaml"),
            &self.config_extra(),
        );
        Gateway::start(self.name, &self.ns, cfg).await
    }

    /// `tidegate-cni <command>` for `pod` as the node's runtime runs it.
    async fn cni(&self, command: &str, pod: CniPod<'static>, pod_ip: IpAddr) -> Output {
        let conf = inpod_conf(&self.socket, &self.state, pod_ip);
        let command = command.to_owned();
        let what = format!("tidegate-cni {command} {}", pod.uid);
        self.shell
            .run(&what, STEP, async move {
                tidegate_e2e::cni::run(&tidegate_e2e::cni::binary(), &command, &pod, &conf)
                    .expect("run tidegate-cni")
            })
            .await
    }
}

fn stdout_json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "tidegate-cni printed no JSON ({e}): stdout {:?} stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed: stdout {} stderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Fields drop in order: gateways and threads first, then their files,
/// then the namespaces.
struct Scenario {
    t: InpodTopology,
    gw_a: Gateway,
    gw_b: Gateway,
    a: Node,
    b: Node,
    pa: NsThread,
    pb: NsThread,
    pc: NsThread,
    /// The peer address of every connection pod B's echo server accepted.
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    dir: tempfile::TempDir,
    _guard: NetnsGuard,
}

fn pa_pod(t: &InpodTopology) -> CniPod<'static> {
    CniPod {
        namespace: "demo",
        name: "client",
        uid: CLIENT_UID,
        netns: InpodTopology::netns_path(&t.pa).leak(),
    }
}

fn pb_pod(t: &InpodTopology) -> CniPod<'static> {
    CniPod {
        namespace: "demo",
        name: "echo",
        uid: SERVER_UID,
        netns: InpodTopology::netns_path(&t.pb).leak(),
    }
}

/// Pod C: on node A, in the workload file with `protocol: TCP` — outside
/// the mesh.
fn pc_pod(t: &InpodTopology) -> CniPod<'static> {
    CniPod {
        namespace: "demo",
        name: "legacy",
        uid: "pc-uid",
        netns: InpodTopology::netns_path(&t.pc).leak(),
    }
}

/// Whether the in-pod capture rules are in pod namespace `ns`.
fn captured(ns: &str) -> bool {
    std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "iptables",
            "-t",
            "nat",
            "-S",
            "ISTIO_OUTPUT",
        ])
        .output()
        .expect("run iptables in the pod's namespace")
        .status
        .success()
}

impl Scenario {
    /// Topology, both gateways, the echo server in pod B; no pod enrolled.
    async fn start(k: u8) -> Scenario {
        Self::start_with(k, |_| {}).await
    }

    /// [`Scenario::start`], with node B's settings changed by `b_setup`
    /// before its gateway starts.
    async fn start_with(k: u8, b_setup: impl FnOnce(&mut Node)) -> Scenario {
        Self::start_with_both(k, |_| {}, b_setup).await
    }

    /// [`Scenario::start`], with each node's settings changed before its
    /// gateway starts.
    async fn start_with_both(
        k: u8,
        a_setup: impl FnOnce(&mut Node),
        b_setup: impl FnOnce(&mut Node),
    ) -> Scenario {
        tidegate_e2e::init_tracing();
        let t = InpodTopology::new("ip", k);
        let guard = t.build();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("workloads.yaml"), workloads_yaml(&t, "")).unwrap();
        let mut a = Node::new(dir.path(), &t.na, "node-a");
        a_setup(&mut a);
        let mut b = Node::new(dir.path(), &t.nb, "node-b");
        b_setup(&mut b);
        let gw_a = a.gateway(dir.path()).await;
        let gw_b = b.gateway(dir.path()).await;
        let (pa, pb, pc) = (
            NsThread::idle(&t.pa),
            NsThread::idle(&t.pb),
            NsThread::idle(&t.pc),
        );
        let peers = start_echo(&pb).await;
        Scenario {
            t,
            dir,
            a,
            b,
            gw_a,
            gw_b,
            pa,
            pb,
            pc,
            peers,
            _guard: guard,
        }
    }

    /// Enrolls pod A on node A and pod B on node B with `tidegate-cni` ADD.
    async fn enroll_both(&self) {
        let out = self
            .a
            .cni("ADD", pa_pod(&self.t), self.t.pod_a().into())
            .await;
        ok("ADD pod A", &out);
        // The previous result comes back untouched.
        assert_eq!(
            stdout_json(&out)["ips"][0]["address"],
            format!("{}/24", self.t.pod_a())
        );
        let out = self
            .b
            .cni("ADD", pb_pod(&self.t), self.t.pod_b().into())
            .await;
        ok("ADD pod B", &out);
    }

    fn server(&self) -> SocketAddr {
        SocketAddr::new(self.t.pod_b().into(), ECHO_PORT)
    }

    fn last_peer(&self) -> SocketAddr {
        *self
            .peers
            .lock()
            .unwrap()
            .last()
            .expect("the echo server saw a connection")
    }
}

fn inbound_failed(text: &str, reason: &str) -> f64 {
    metric_or_zero(
        text,
        &format!(
            r#"tidegate_connections_failed_total{{direction="inbound_plaintext",reason="{reason}"}}"#
        ),
    )
}

#[tokio::test]
async fn inpod_an_unmodified_client_reaches_a_pod_on_another_node_through_hbone() {
    if skip() {
        return;
    }
    let s = Scenario::start(0).await;
    s.enroll_both().await;
    // In-pod mode: nothing of the data path listens in the gateways' own
    // namespaces (as ztunnel); 15001 and 15008 are inside the pods.
    for node in [&s.t.na, &s.t.nb] {
        for port in [15001, 15006, 15008] {
            assert_eq!(listeners(node, port), 0, "{port} in {node}");
        }
    }
    assert_eq!(listeners(&s.t.pb, 15008), 1, "15008 in pod B");
    // 1 byte, 64 KiB and 4 MiB, byte-exact both ways, from a plain socket in pod A.
    for (len, seed) in [(1, 1), (64 << 10, 2), (4 << 20, 3)] {
        round_trip(&s.pa, s.server(), len, seed)
            .await
            .unwrap_or_else(|e| panic!("{len} bytes: {e}"));
        // Pod B's app sees pod A's own address as its peer.
        assert_eq!(s.last_peer().ip(), IpAddr::from(s.t.pod_a()), "{len} bytes");
    }
    // One tunnel, from pod A's identity to pod B's, dialed from inside pod A.
    let dump_a = s.gw_a.admin_ok("GET", "/config_dump").await;
    let pool = dump_a["pool"].as_array().unwrap();
    assert_eq!(pool.len(), 1, "{dump_a}");
    assert_eq!(pool[0]["src"], "spiffe://cluster.local/ns/demo/sa/client");
    assert_eq!(pool[0]["dst"], "spiffe://cluster.local/ns/demo/sa/echo");
    let pods_a = &dump_a["capture"]["pods"];
    assert_eq!(pods_a[0]["uid"], CLIENT_UID, "{dump_a}");
    assert_eq!(pods_a[0]["source"], "cni");
    // Gateway B accepted it in pod B's namespace, from pod A's address.
    let dump_b = s.gw_b.admin_ok("GET", "/config_dump").await;
    let tunnels = dump_b["inbound_tunnels"].as_array().unwrap();
    assert_eq!(tunnels.len(), 1, "{dump_b}");
    assert_eq!(tunnels[0]["workload_uid"], SERVER_UID);
    assert_eq!(
        tunnels[0]["peer_identity"],
        "spiffe://cluster.local/ns/demo/sa/client"
    );
    assert_eq!(
        tunnels[0]["peer_addr"]
            .as_str()
            .unwrap()
            .split(':')
            .next()
            .unwrap(),
        s.t.pod_a().to_string()
    );
    // Each application connection went through gateway A's outbound side once.
    let ma = s.gw_a.metrics().await;
    assert_eq!(
        tidegate_e2e::metric(
            &ma,
            r#"tidegate_connections_opened_total{direction="outbound"}"#
        ),
        3.0
    );
}

#[tokio::test]
async fn inpod_probes_and_a_pods_own_address_bypass_the_gateway_and_plaintext_obeys_the_workload() {
    if skip() {
        return;
    }
    let s = Scenario::start(1).await;
    s.enroll_both().await;
    let opened = |text: &str, dir: &str| {
        metric_or_zero(
            text,
            &format!(r#"tidegate_connections_opened_total{{direction="{dir}"}}"#),
        )
    };
    // A kubelet-style probe from node B's own namespace: SNATed by the rule
    // ADD put on the node, let through by the pod's rules, straight to the app.
    let nb = &s.b.shell;
    round_trip(nb, s.server(), 100, 4)
        .await
        .expect("probe from the node");
    assert_eq!(s.last_peer().ip().to_string(), "169.254.7.127");
    // Pod B to its own address: not captured.
    round_trip(&s.pb, s.server(), 100, 5)
        .await
        .expect("pod B to itself");
    assert_eq!(s.last_peer().ip(), IpAddr::from(s.t.pod_b()));
    let m = s.gw_b.metrics().await;
    assert_eq!(
        opened(&m, "outbound"),
        0.0,
        "nothing went through gateway B's outbound side"
    );
    assert_eq!(
        opened(&m, "inbound_plaintext"),
        0.0,
        "nor its plaintext inbound"
    );
    // A pod outside the mesh reaches pod B through 15006, seen with its own address.
    round_trip(&s.pc, s.server(), 1000, 6)
        .await
        .expect("plaintext from pod C");
    assert_eq!(s.last_peer().ip(), IpAddr::from(s.t.pod_c()));
    let m = s.gw_b.metrics().await;
    assert_eq!(opened(&m, "inbound_plaintext"), 1.0);
    // The workload refuses plaintext: reset, counted, and the app sees nothing.
    write_atomically(
        &s.dir.path().join("workloads.yaml"),
        &workloads_yaml(&s.t, "tidegate.io/inbound-plaintext: refuse"),
    );
    tidegate_e2e::wait_for("plaintext refused", STEP, || async {
        let r = round_trip(&s.pc, s.server(), 10, 7).await;
        let m = s.gw_b.metrics().await;
        (r.is_err() && inbound_failed(&m, "plaintext_refused") >= 1.0).then_some(())
    })
    .await;
    let seen = s.peers.lock().unwrap().len();
    round_trip(&s.pc, s.server(), 10, 8)
        .await
        .expect_err("plaintext is refused");
    assert_eq!(
        s.peers.lock().unwrap().len(),
        seen,
        "a refused connection reached the app"
    );
    // Meshed traffic is untouched by the setting.
    round_trip(&s.pa, s.server(), 100, 8)
        .await
        .expect("HBONE still served");
}

#[tokio::test]
async fn inpod_cni_add_fails_clearly_and_del_is_idempotent() {
    if skip() {
        return;
    }
    let s = Scenario::start(2).await;
    // A pod whose namespace disappeared before ADD ran.
    let gone = CniPod {
        netns: "/var/run/netns/tidegate-no-such-pod",
        ..pb_pod(&s.t)
    };
    let out = s.b.cni("ADD", gone, s.t.pod_b().into()).await;
    assert!(!out.status.success());
    let err = stdout_json(&out);
    assert_eq!(err["code"], 3, "{err}");
    assert!(
        err["msg"].as_str().unwrap().contains("namespace is gone"),
        "{err}"
    );
    assert!(
        err["details"]
            .as_str()
            .unwrap()
            .contains("tidegate-no-such-pod"),
        "{err}"
    );
    // The gateway is not listening (a wrong socket): ADD fails, try again
    // later, and leaves no record behind.
    let mut wrong = Node::new(s.dir.path(), &s.t.nb, "node-b");
    wrong.socket = s.dir.path().join("nobody.sock");
    let out = wrong.cni("ADD", pb_pod(&s.t), s.t.pod_b().into()).await;
    assert!(!out.status.success());
    let err = stdout_json(&out);
    assert_eq!(err["code"], 11, "{err}");
    assert!(
        err["msg"]
            .as_str()
            .unwrap()
            .contains("not started outside the mesh"),
        "{err}"
    );
    assert!(tidegate_netns::pod_records::PodRecord::read_all(&wrong.state).is_empty());
    // A real ADD, twice: the second changes nothing.
    for _ in 0..2 {
        ok(
            "ADD",
            &s.b.cni("ADD", pb_pod(&s.t), s.t.pod_b().into()).await,
        );
    }
    let m = s.gw_b.metrics().await;
    assert_eq!(
        metric_or_zero(&m, r#"tidegate_inpod_adds_total{result="added"}"#),
        1.0
    );
    assert_eq!(
        metric_or_zero(&m, r#"tidegate_inpod_adds_total{result="unchanged"}"#),
        1.0
    );
    assert_eq!(tidegate_e2e::metric(&m, "tidegate_inpod_pods"), 1.0);
    // ztunnel's names for the same, which its dashboard reads.
    assert_eq!(
        tidegate_e2e::metric(&m, "workload_manager_active_proxy_count"),
        1.0
    );
    assert_eq!(
        tidegate_e2e::metric(&m, "workload_manager_pending_proxy_count"),
        0.0
    );
    assert_eq!(
        tidegate_e2e::metric(&m, "workload_manager_proxies_started_total"),
        1.0
    );
    assert_eq!(
        tidegate_netns::pod_records::PodRecord::read_all(&s.b.state).len(),
        1
    );
    // DEL twice: both succeed; the listeners close and the record goes.
    for _ in 0..2 {
        ok(
            "DEL",
            &s.b.cni("DEL", pb_pod(&s.t), s.t.pod_b().into()).await,
        );
    }
    let m = s.gw_b.metrics().await;
    assert_eq!(tidegate_e2e::metric(&m, "tidegate_inpod_pods"), 0.0);
    assert_eq!(
        tidegate_e2e::metric(&m, "workload_manager_active_proxy_count"),
        0.0
    );
    assert_eq!(
        tidegate_e2e::metric(&m, "workload_manager_proxies_stopped_total"),
        1.0
    );
    assert!(tidegate_netns::pod_records::PodRecord::read_all(&s.b.state).is_empty());
    // DEL of a pod never added succeeds too.
    let unknown = CniPod {
        uid: "never-added",
        ..pb_pod(&s.t)
    };
    ok(
        "DEL unknown",
        &s.b.cni("DEL", unknown, s.t.pod_b().into()).await,
    );
}

/// Opens short connections from pod A to pod B every 10 ms (100/s) until
/// stopped; counts successes and failures.
struct Load {
    stop: tokio::sync::watch::Sender<bool>,
    done: tokio::sync::oneshot::Receiver<(usize, Vec<String>)>,
}

impl Load {
    fn start(pa: &NsThread, dst: SocketAddr) -> Load {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let (tx, done) = tokio::sync::oneshot::channel();
        pa.handle.spawn(async move {
            let (mut ok, mut failed) = (0, Vec::new());
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let mut inflight = tokio::task::JoinSet::new();
            while !*stopped.borrow() {
                tokio::select! {
                    _ = tick.tick() => {
                        inflight.spawn(async move {
                            let mut tcp = TcpStream::connect(dst).await.map_err(|e| format!("connect: {e}"))?;
                            tcp.write_all(b"ping").await.map_err(|e| format!("write: {e}"))?;
                            tcp.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
                            let mut back = Vec::new();
                            tcp.read_to_end(&mut back).await.map_err(|e| format!("read: {e}"))?;
                            (back == b"ping").then_some(()).ok_or(format!("got {back:?}"))
                        });
                    }
                    _ = stopped.changed() => {}
                    Some(r) = inflight.join_next() => match r {
                        Ok(Ok(())) => ok += 1,
                        Ok(Err(e)) => failed.push(e),
                        Err(e) => failed.push(e.to_string()),
                    },
                }
            }
            while let Some(r) = inflight.join_next().await {
                match r {
                    Ok(Ok(())) => ok += 1,
                    Ok(Err(e)) => failed.push(e),
                    Err(e) => failed.push(e.to_string()),
                }
            }
            let _ = tx.send((ok, failed));
        });
        Load { stop, done }
    }

    async fn stop(self) -> (usize, Vec<String>) {
        let _ = self.stop.send(true);
        tokio::time::timeout(STEP, self.done)
            .await
            .expect("load generator stops")
            .expect("load generator result")
    }
}

#[tokio::test]
async fn inpod_a_restarted_gateway_readopts_its_pods_and_no_request_fails() {
    if skip() {
        return;
    }
    let s = Scenario::start(3).await;
    s.enroll_both().await;
    round_trip(&s.pa, s.server(), 100, 9)
        .await
        .expect("warm up");
    let Scenario {
        t,
        gw_a: _gw_a,
        gw_b: old_b,
        a: _a,
        b,
        pa,
        pb: _pb,
        pc: _pc,
        peers,
        dir,
        _guard,
    } = s;
    let server = SocketAddr::new(t.pod_b().into(), ECHO_PORT);
    let load = Load::start(&pa, server);
    let count = || peers.lock().unwrap().len();
    tidegate_e2e::wait_for("load flowing", STEP, || async {
        (count() > 100).then_some(())
    })
    .await;
    // The upgrade on node B: a new gateway binds beside the old one (same
    // ports inside pod B, SO_REUSEPORT) and re-adopts pod B from the state
    // directory — no new ADD; then the old one drains and exits.
    let new_b = b.gateway(dir.path()).await;
    let m = new_b.metrics().await;
    assert_eq!(tidegate_e2e::metric(&m, "tidegate_inpod_pods"), 1.0, "{m}");
    let dump = new_b.admin_ok("GET", "/config_dump").await;
    assert_eq!(dump["capture"]["pods"][0]["source"], "state-dir", "{dump}");
    // Dropping it runs its whole shutdown (listeners close, tunnels get
    // GOAWAY and drain) and joins its thread.
    drop(old_b);
    let after = count();
    // Traffic goes on through the new gateway.
    tidegate_e2e::wait_for("connections after the restart", STEP, || async {
        (count() > after + 100).then_some(())
    })
    .await;
    let (ok, failed) = load.stop().await;
    println!("restart under load: {ok} ok, {} failed", failed.len());
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        ok + failed.len(),
        &failed[..failed.len().min(5)]
    );
    let m = new_b.metrics().await;
    assert!(
        metric_or_zero(
            &m,
            r#"tidegate_connections_opened_total{direction="inbound"}"#
        ) >= 1.0,
        "the new gateway took the tunnels: {m}"
    );
}

#[tokio::test]
async fn inpod_istio_cni_drives_the_gateway_over_zds() {
    use tidegate_e2e::zds_double::{expect_ack, PodSpec, ZdsDouble};
    if skip() {
        return;
    }
    let zds_dir = tempfile::tempdir().unwrap();
    let socket = zds_dir.path().join("ztunnel.sock");
    let mut double = ZdsDouble::bind(&socket).unwrap();
    // istio-cni probes an idle connection every 5 s; quicker here.
    double.probe_interval = Duration::from_millis(20);
    let s = Scenario::start_with(4, |b| b.zds = Some(socket.clone())).await;
    // Pod A by tidegate-cni on node A; pod B by istio-cni on node B.
    ok(
        "ADD pod A",
        &s.a.cni("ADD", pa_pod(&s.t), s.t.pod_a().into()).await,
    );
    let pod_b = || PodSpec {
        uid: SERVER_UID.into(),
        name: "echo".into(),
        namespace: "demo".into(),
        service_account: "echo".into(),
    };
    let netns_b = || {
        std::os::fd::OwnedFd::from(std::fs::File::open(InpodTopology::netns_path(&s.t.pb)).unwrap())
    };
    let conn = tokio::time::timeout(STEP, double.accept())
        .await
        .expect("the gateway connects to the node agent")
        .expect("hello V1");
    // Not ready before the snapshot, ready after it.
    assert_eq!(s.gw_b.readiness().await, 503);
    conn.snapshot(vec![(pod_b(), netns_b())], &[])
        .await
        .expect("snapshot acked");
    tidegate_e2e::wait_for("ready after the snapshot", STEP, || async {
        (s.gw_b.readiness().await == 200).then_some(())
    })
    .await;
    install_pod_b_rules(&s).await;
    round_trip(&s.pa, s.server(), 64 << 10, 10)
        .await
        .expect("traffic over ZDS-handed pod");
    assert_eq!(s.last_peer().ip(), IpAddr::from(s.t.pod_a()));
    let dump = s.gw_b.admin_ok("GET", "/config_dump").await;
    assert_eq!(dump["capture"]["pods"][0]["source"], "zds", "{dump}");
    // The keepalive probe found the quiet connection alive.
    tidegate_e2e::wait_for("a keepalive probe", STEP, || {
        std::future::ready((conn.probes() > 0).then_some(()))
    })
    .await;
    // The agent restarts: the gateway reconnects; the same pod in the same
    // namespace again changes nothing.
    conn.drop_connection().await;
    let conn = tokio::time::timeout(STEP, double.accept())
        .await
        .expect("the gateway reconnects")
        .expect("hello V1");
    conn.snapshot(vec![(pod_b(), netns_b())], &[])
        .await
        .expect("second snapshot acked");
    let m = s.gw_b.metrics().await;
    assert_eq!(
        metric_or_zero(&m, r#"tidegate_inpod_adds_total{result="unchanged"}"#),
        1.0,
        "{m}"
    );
    round_trip(&s.pa, s.server(), 100, 11)
        .await
        .expect("still served");
    // DelWorkload: the teardown drain, then pod B's listeners close.
    expect_ack("del", conn.del(SERVER_UID).await.unwrap()).unwrap();
    let m = s.gw_b.metrics().await;
    assert_eq!(tidegate_e2e::metric(&m, "tidegate_inpod_pods"), 0.0, "{m}");
    round_trip(&s.pa, s.server(), 100, 12)
        .await
        .expect_err("pod B is no longer served");
}

/// The gateways' sockets on the app side (the captured connection in pod
/// A, the delivery in pod B) use `tcp.app_congestion_control`, their
/// tunnel sockets `tcp.tunnel_congestion_control`, and the apps' own
/// sockets keep the host's default. `reno` is nobody's default.
#[tokio::test]
async fn inpod_app_side_and_tunnel_sockets_use_their_configured_congestion_control() {
    if skip() {
        return;
    }
    let (host, tunnel, tcp) = host_congestion();
    let s =
        Scenario::start_with_both(5, |a| a.extra = tcp.clone(), |b| b.extra = tcp.clone()).await;
    s.enroll_both().await;
    // One app connection, held open after a round trip.
    let held = hold_connection(&s.pa, s.server()).await;
    let (pa, pb) = (&s.t.pa, &s.t.pb);
    // Pod A: the gateway's side of the captured connection, the app's
    // side, the tunnel dialed to pod B.
    assert_eq!(congestion_controls(pa, "sport = :15001"), ["reno"]);
    let local = held.local_addr().unwrap();
    assert_eq!(
        congestion_controls(pa, &format!("sport = :{}", local.port())),
        [host.as_str()]
    );
    assert_eq!(congestion_controls(pa, "dport = :15008"), [tunnel]);
    // Pod B: the tunnel accepted, the delivery to the app, the app's side.
    assert_eq!(congestion_controls(pb, "sport = :15008"), [tunnel]);
    assert_eq!(
        congestion_controls(pb, &format!("dport = :{ECHO_PORT}")),
        ["reno"]
    );
    assert_eq!(
        congestion_controls(pb, &format!("sport = :{ECHO_PORT}")),
        [host.as_str()]
    );
    drop(held);
}

/// Capture and mesh membership agree: `tidegate-cni` ADD of a pod outside
/// the mesh (here the workload file's `protocol: TCP`, in Kubernetes the
/// labels: `tidegate::workloads::membership`) succeeds and installs
/// nothing, so the pod keeps plain TCP of its own; a member is captured.
#[tokio::test]
async fn inpod_a_pod_outside_the_mesh_is_not_captured() {
    if skip() {
        return;
    }
    let s = Scenario::start(6).await;
    s.enroll_both().await;
    let out = s.a.cni("ADD", pc_pod(&s.t), s.t.pod_c().into()).await;
    ok("ADD pod C", &out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not a mesh member (the workload file's protocol): not captured"),
        "{err}"
    );
    assert_eq!(
        stdout_json(&out)["ips"][0]["address"],
        format!("{}/24", s.t.pod_c())
    );
    assert!(!captured(&s.t.pc), "pod C has no capture rule");
    assert!(captured(&s.t.pa), "pod A, a member, has its rules");
    let records = tidegate_netns::pod_records::PodRecord::read_all(&s.a.state);
    assert_eq!(records.len(), 1, "only pod A is recorded");
    let m = s.gw_a.metrics().await;
    for (result, n) in [("added", 1.0), ("not_member", 1.0)] {
        let series = format!(r#"tidegate_inpod_adds_total{{result="{result}"}}"#);
        assert_eq!(metric_or_zero(&m, &series), n, "{series}");
    }
    assert_eq!(tidegate_e2e::metric(&m, "tidegate_inpod_pods"), 1.0);
    // Pod C reaches pod B by itself (B's plaintext inbound delivers it),
    // never through gateway A.
    round_trip(&s.pc, s.server(), 1000, 9)
        .await
        .expect("pod C to pod B");
    assert_eq!(s.last_peer().ip(), IpAddr::from(s.t.pod_c()));
    let m = s.gw_a.metrics().await;
    assert_eq!(
        metric_or_zero(
            &m,
            r#"tidegate_connections_opened_total{direction="outbound"}"#
        ),
        0.0,
        "nothing of pod C went through gateway A"
    );
}

/// Listening sockets on `port` in namespace `ns` (`ss -ltnH`).
fn listeners(ns: &str, port: u16) -> usize {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-ltnH"])
        .arg(format!("sport = :{port}"))
        .output()
        .expect("run ss");
    assert!(out.status.success(), "ss in {ns}");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// Ten round trips from pod A to pod B, each through a new connection;
/// pod B's app sees pod A every time.
async fn ten_round_trips(s: &Scenario, seed: u64) {
    for i in 0..10 {
        round_trip(&s.pa, s.server(), 100, seed + i)
            .await
            .unwrap_or_else(|e| panic!("round trip {i}: {e}"));
        assert_eq!(s.last_peer().ip(), IpAddr::from(s.t.pod_a()));
    }
}

fn refusals(m: &str, reason: &str) -> f64 {
    metric_or_zero(
        m,
        &format!(r#"tidegate_inpod_refusals_total{{reason="{reason}"}}"#),
    )
}

/// An open descriptor of network namespace `ns`, as istio-cni hands one over.
fn netns_fd(ns: &str) -> std::os::fd::OwnedFd {
    std::os::fd::OwnedFd::from(std::fs::File::open(InpodTopology::netns_path(ns)).unwrap())
}

/// A pod of `demo` with `echo`'s service account, as ZDS names it.
fn zds_pod(uid: &str, name: &str) -> tidegate_e2e::zds_double::PodSpec {
    tidegate_e2e::zds_double::PodSpec {
        uid: uid.into(),
        name: name.into(),
        namespace: "demo".into(),
        service_account: "echo".into(),
    }
}

/// istio-cni's rules inside pod B (what its CNI plugin installs).
async fn install_pod_b_rules(s: &Scenario) {
    let pb_path = InpodTopology::netns_path(&s.t.pb);
    s.b.shell
        .run("istio-cni's rules in pod B", STEP, async move {
            tidegate_netns::capture::install(
                Path::new(&pb_path),
                tidegate_netns::capture::CapturePorts::default(),
            )
        })
        .await
        .expect("rules installed");
}

/// Node B's gateway connected to `double`: pod B handed over in the
/// snapshot (as `name`) and istio-cni's rules installed in it.
async fn zds_serve_pod_b(
    s: &Scenario,
    double: &tidegate_e2e::zds_double::ZdsDouble,
    name: &str,
) -> tidegate_e2e::zds_double::ZdsConn {
    let conn = tokio::time::timeout(STEP, double.accept())
        .await
        .expect("the gateway connects to the node agent")
        .expect("hello V1");
    conn.snapshot(vec![(zds_pod(SERVER_UID, name), netns_fd(&s.t.pb))], &[])
        .await
        .expect("snapshot acked");
    install_pod_b_rules(s).await;
    conn
}

/// Over ZDS: a second uid handed pod B's namespace is NACKed naming pod B,
/// the node's own namespace is NACKed, and past `capture.max_pods` (1 here)
/// a new pod is NACKed naming the limit; pod B keeps being served by one
/// set of listeners.
#[tokio::test]
async fn inpod_zds_refuses_a_taken_namespace_the_gateways_own_and_pods_past_the_limit() {
    use tidegate_e2e::zds_double::ZdsDouble;
    if skip() {
        return;
    }
    let zds_dir = tempfile::tempdir().unwrap();
    let socket = zds_dir.path().join("ztunnel.sock");
    let double = ZdsDouble::bind(&socket).unwrap();
    let s = Scenario::start_with(7, |b| {
        b.zds = Some(socket.clone());
        b.max_pods = Some(1);
    })
    .await;
    ok(
        "ADD pod A",
        &s.a.cni("ADD", pa_pod(&s.t), s.t.pod_a().into()).await,
    );
    let open = netns_fd;
    let pod = |uid: &str| zds_pod(uid, "echo");
    let conn = zds_serve_pod_b(&s, &double, "echo").await;
    ten_round_trips(&s, 20).await;
    // Pod B's namespace under another uid.
    let nack = conn.add(pod("intruder"), open(&s.t.pb)).await.unwrap();
    assert_eq!(
        nack,
        format!(
            "pod intruder refused: its network namespace (inode {}) is already pod {SERVER_UID}'s (demo/echo): one network namespace is one pod",
            std::fs::metadata(InpodTopology::netns_path(&s.t.pb)).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap()
        )
    );
    // Node B's own namespace, where the gateway runs.
    let nack = conn.add(pod("node"), open(&s.t.nb)).await.unwrap();
    assert!(
        nack.starts_with("pod node refused: ")
            && nack.ends_with("the gateway's own network namespace is never a pod"),
        "{nack}"
    );
    // A second pod in a namespace of its own: past capture.max_pods.
    let nack = conn.add(pod("second"), open(&s.t.pc)).await.unwrap();
    assert_eq!(
        nack,
        "pod second refused: pod limit reached (1 pods on this node; capture.max_pods is 1)"
    );
    // Pod B: one set of listeners, every connection served.
    assert_eq!(listeners(&s.t.pb, 15008), 1);
    assert_eq!(listeners(&s.t.pb, 15001), 1);
    assert_eq!(listeners(&s.t.pc, 15008), 0);
    ten_round_trips(&s, 40).await;
    let m = s.gw_b.metrics().await;
    assert_eq!(tidegate_e2e::metric(&m, "tidegate_inpod_pods"), 1.0, "{m}");
    assert_eq!(tidegate_e2e::metric(&m, "tidegate_inpod_max_pods"), 1.0);
    for reason in ["netns_taken", "gateway_netns", "pod_limit"] {
        assert_eq!(refusals(&m, reason), 1.0, "{reason}: {m}");
    }
    // The NACKed pods' uids are not served: deleting them changes nothing.
    tidegate_e2e::zds_double::expect_ack("del intruder", conn.del("intruder").await.unwrap())
        .unwrap();
    ten_round_trips(&s, 60).await;
    // Pod B again in its own namespace (a re-add, as after a reconnect):
    // acknowledged, nothing opened twice.
    tidegate_e2e::zds_double::expect_ack(
        "re-add pod B",
        conn.add(pod(SERVER_UID), open(&s.t.pb)).await.unwrap(),
    )
    .unwrap();
    assert_eq!(listeners(&s.t.pb, 15008), 1);
    // Pod B removed: its namespace is free for the next pod's uid.
    tidegate_e2e::zds_double::expect_ack("del pod B", conn.del(SERVER_UID).await.unwrap()).unwrap();
    assert_eq!(listeners(&s.t.pb, 15008), 0);
    tidegate_e2e::zds_double::expect_ack(
        "add the next pod in pod B's namespace",
        conn.add(pod("successor"), open(&s.t.pb)).await.unwrap(),
    )
    .unwrap();
    assert_eq!(listeners(&s.t.pb, 15008), 1);
    let m = s.gw_b.metrics().await;
    assert_eq!(tidegate_e2e::metric(&m, "tidegate_inpod_pods"), 1.0, "{m}");
    assert_eq!(refusals(&m, "netns_taken"), 1.0, "{m}");
}

/// Over the CNI socket: `tidegate-cni` ADD of another uid with pod B's
/// namespace, or with the node's own, fails naming why; pod B keeps being
/// served by one set of listeners and keeps its record.
#[tokio::test]
async fn inpod_cni_add_of_a_taken_namespace_or_the_nodes_own_fails_naming_why() {
    if skip() {
        return;
    }
    let s = Scenario::start(8).await;
    s.enroll_both().await;
    ten_round_trips(&s, 80).await;
    let intruder = CniPod {
        uid: "intruder-uid",
        name: "intruder",
        ..pb_pod(&s.t)
    };
    let out = s.b.cni("ADD", intruder, s.t.pod_b().into()).await;
    assert!(!out.status.success());
    let err = stdout_json(&out);
    assert_eq!(err["code"], 11, "{err}");
    let details = err["details"].as_str().unwrap();
    assert!(
        details.contains(&format!(
            "pod intruder-uid refused: its network namespace (inode {}) is already pod {SERVER_UID}'s (demo/echo): one network namespace is one pod",
            std::fs::metadata(InpodTopology::netns_path(&s.t.pb)).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap()
        )),
        "{err}"
    );
    let node = CniPod {
        uid: "node-uid",
        netns: InpodTopology::netns_path(&s.t.nb).leak(),
        ..pb_pod(&s.t)
    };
    let out = s.b.cni("ADD", node, s.t.pod_b().into()).await;
    let err = stdout_json(&out);
    assert_eq!(err["code"], 11, "{err}");
    assert!(
        err["details"]
            .as_str()
            .unwrap()
            .contains("the gateway's own network namespace is never a pod"),
        "{err}"
    );
    // Only pod B's record is left; one set of listeners serves it.
    let records = tidegate_netns::pod_records::PodRecord::read_all(&s.b.state);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].1.as_ref().unwrap().uid, SERVER_UID);
    assert_eq!(listeners(&s.t.pb, 15008), 1);
    assert_eq!(listeners(&s.t.pb, 15006), 1);
    ten_round_trips(&s, 100).await;
    let m = s.gw_b.metrics().await;
    assert_eq!(tidegate_e2e::metric(&m, "tidegate_inpod_pods"), 1.0, "{m}");
    assert_eq!(refusals(&m, "netns_taken"), 1.0, "{m}");
    assert_eq!(refusals(&m, "gateway_netns"), 1.0, "{m}");
}

const FDS_CHILD: &str = "TIDEGATE_TEST_INPOD_FDS_SHORT";

/// With too few descriptors left, a new pod is NACKed naming the
/// exhaustion before any of its listeners open, and the pod already served
/// keeps being served; once descriptors are back, the same pod is taken.
/// The open-file limit is the whole process's, so this runs in a child
/// process (this test binary again, running only this test).
#[tokio::test]
async fn inpod_zds_a_pod_is_refused_when_descriptors_run_short_and_served_pods_go_on() {
    if skip() {
        return;
    }
    if tidegate_e2e::rerun::is_child(FDS_CHILD) {
        return descriptors_short().await;
    }
    tidegate_e2e::rerun::alone(
        "inpod::inpod_zds_a_pod_is_refused_when_descriptors_run_short_and_served_pods_go_on",
        FDS_CHILD,
        "child: refused for descriptors",
    );
}

async fn descriptors_short() {
    use tidegate_e2e::zds_double::{expect_ack, ZdsDouble};
    let zds_dir = tempfile::tempdir().unwrap();
    let socket = zds_dir.path().join("ztunnel.sock");
    let double = ZdsDouble::bind(&socket).unwrap();
    let s = Scenario::start_with(9, |b| b.zds = Some(socket.clone())).await;
    ok(
        "ADD pod A",
        &s.a.cni("ADD", pa_pod(&s.t), s.t.pod_a().into()).await,
    );
    let open = netns_fd;
    let pod = |uid: &str| zds_pod(uid, uid);
    let conn = zds_serve_pod_b(&s, &double, SERVER_UID).await;
    ten_round_trips(&s, 120).await;
    // A quarter of what is open left free: far less than the inbound caps
    // (derived from the limit at start) may still claim.
    let in_use = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).unwrap();
    rlimit::setrlimit(rlimit::Resource::NOFILE, in_use + in_use / 4, hard).unwrap();
    let nack = conn.add(pod("second"), open(&s.t.pc)).await.unwrap();
    // The pod already served goes on with the descriptors left.
    let served = std::panic::AssertUnwindSafe(ten_round_trips(&s, 140));
    let served = futures::FutureExt::catch_unwind(served).await;
    rlimit::setrlimit(rlimit::Resource::NOFILE, soft, hard).unwrap();
    assert!(
        nack.starts_with("pod second refused: out of file descriptors (")
            && nack.contains("the inbound connection caps may still claim"),
        "{nack}"
    );
    assert!(
        served.is_ok(),
        "pod B was not served while short of descriptors"
    );
    assert_eq!(
        listeners(&s.t.pc, 15008),
        0,
        "no listener opened for the refused pod"
    );
    let m = s.gw_b.metrics().await;
    assert_eq!(refusals(&m, "descriptors"), 1.0, "{m}");
    // Descriptors back: the same pod is taken.
    expect_ack(
        "add second",
        conn.add(pod("second"), open(&s.t.pc)).await.unwrap(),
    )
    .unwrap();
    assert_eq!(listeners(&s.t.pc, 15008), 1);
    println!("child: refused for descriptors ({nack})");
}

const SHARE_CHILD: &str = "TIDEGATE_TEST_INPOD_DESCRIPTOR_SHARE";

/// With an open-file limit too low for `capture.max_pods` (1,024 here,
/// the control plane's budget raised to nearly half of it), node B's
/// gateway serves the pods its descriptor share holds, says so in
/// `tidegate_inpod_max_pods` and `/config_dump`, and refuses the next pod
/// over ZDS naming the share; the pods served go on. The limit is the
/// whole process's and set before the gateways start, so this runs in a
/// child process.
#[tokio::test]
async fn inpod_zds_a_pod_past_the_descriptor_share_is_refused_naming_it() {
    if skip() {
        return;
    }
    if tidegate_e2e::rerun::is_child(SHARE_CHILD) {
        return descriptor_share().await;
    }
    tidegate_e2e::rerun::alone(
        "inpod::inpod_zds_a_pod_past_the_descriptor_share_is_refused_naming_it",
        SHARE_CHILD,
        "child: refused past the descriptor share",
    );
}

async fn descriptor_share() {
    use tidegate_e2e::zds_double::{expect_ack, ZdsDouble};
    // Soft and hard: the gateway raises the soft limit to the hard one.
    rlimit::setrlimit(rlimit::Resource::NOFILE, 1_024, 1_024).unwrap();
    let zds_dir = tempfile::tempdir().unwrap();
    let socket = zds_dir.path().join("ztunnel.sock");
    let double = ZdsDouble::bind(&socket).unwrap();
    let s = Scenario::start_with(12, |b| {
        b.zds = Some(socket.clone());
        // 3 × 149 + 64 = 511 for the control plane: 513 left to the data path.
        b.extra = "control_plane:\n  max_connections: 149\n".into();
    })
    .await;
    ok(
        "ADD pod A",
        &s.a.cni("ADD", pa_pod(&s.t), s.t.pod_a().into()).await,
    );
    let dump = s.gw_b.admin_ok("GET", "/config_dump").await;
    let budget = &dump["descriptors"];
    assert_eq!(budget["limit"], 1_024, "{budget}");
    assert_eq!(budget["control_plane"], 511, "{budget}");
    let share = budget["max_pods"].as_u64().unwrap();
    let data_path = budget["data_path"].as_u64().unwrap();
    // Eight descriptors a pod, within half of the data path's with the DNS proxy's part.
    assert!(
        share > 1
            && share * 8
                + budget["dns_forwards"].as_u64().unwrap()
                + budget["dns_tcp"].as_u64().unwrap()
                <= data_path / 2,
        "{budget}"
    );
    let m = s.gw_b.metrics().await;
    assert_eq!(
        tidegate_e2e::metric(&m, "tidegate_inpod_max_pods"),
        share as f64,
        "{m}"
    );
    let open = netns_fd;
    let pod = |uid: String| zds_pod(&uid, &uid);
    let conn = zds_serve_pod_b(&s, &double, SERVER_UID).await;
    ten_round_trips(&s, 160).await;
    // Pods in namespaces of their own until the share is full, and one more.
    let mut guard = NetnsGuard::default();
    let names: Vec<String> = (0..share).map(|i| format!("{}x{i}", s.t.pb)).collect();
    for ns in &names {
        guard.push(ns);
        tidegate_e2e::netns::run(&format!("ip netns add {ns}"));
        tidegate_e2e::netns::run(&format!("ip -n {ns} link set lo up"));
    }
    for (i, ns) in names[..names.len() - 1].iter().enumerate() {
        expect_ack(
            &format!("add pod {i}"),
            conn.add(pod(format!("x{i}")), open(ns)).await.unwrap(),
        )
        .unwrap();
    }
    let nack = conn
        .add(pod("past".into()), open(names.last().unwrap()))
        .await
        .unwrap();
    assert_eq!(
        nack,
        format!(
            "pod past refused: the pods' descriptor share is used up: {share} pods hold {} descriptors, all it keeps for pods' listeners ({share} pods of 8; with the DNS proxy's {}, half of the {data_path} descriptors the control plane leaves of the open-file limit 1024; capture.max_pods asks more); raise the gateway's open-file limit (LimitNOFILE, ulimit -n)",
            share * 8,
            budget["dns_forwards"].as_u64().unwrap() + budget["dns_tcp"].as_u64().unwrap(),
        )
    );
    assert_eq!(listeners(names.last().unwrap(), 15008), 0);
    assert_eq!(listeners(&names[0], 15008), 1);
    // Pod B goes on; the refusal is counted.
    ten_round_trips(&s, 180).await;
    let m = s.gw_b.metrics().await;
    assert_eq!(
        tidegate_e2e::metric(&m, "tidegate_inpod_pods"),
        share as f64,
        "{m}"
    );
    assert_eq!(refusals(&m, "descriptor_share"), 1.0, "{m}");
    assert_eq!(refusals(&m, "descriptors"), 0.0, "{m}");
    // A served pod removed frees its place.
    expect_ack("del x0", conn.del("x0").await.unwrap()).unwrap();
    expect_ack(
        "add past",
        conn.add(pod("past".into()), open(names.last().unwrap()))
            .await
            .unwrap(),
    )
    .unwrap();
    drop(conn);
    drop(guard);
    println!("child: refused past the descriptor share ({nack})");
}
