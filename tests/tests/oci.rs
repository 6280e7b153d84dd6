//! OCI load-balancer backend draining end to end (issue 6): the real gateway
//! (`app::build`, the workload file, the drain engine, the `oci-drain`
//! plugin from target/plugins) against the OCI Load Balancing API double
//! over HTTPS with verified request signatures.
//!
//! Pods here have addresses in 10.1.0.0/24 that only exist as data in the
//! double's backend sets: nothing connects to them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tidegate::app::App;
use tidegate::config::Config;
use tidegate_e2e::oci_double::{public_key_der, DoubleConfig, OciDouble};
use tidegate_e2e::{eventually, gateway_config_with, init_tracing, metric, plugin};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LB1: &str = "ocid1.loadbalancer.oc1..one";
const LB2: &str = "ocid1.loadbalancer.oc1..two";
const KEY_ID: &str = "ocid1.tenancy.oc1..t/ocid1.user.oc1..u/c6:92:57";
const WITHIN: Duration = Duration::from_secs(10);

// The pods (node-a is this gateway's node).
const A: &str = "10.1.0.5";
const B: &str = "10.1.0.6";
/// Not opted in.
const C: &str = "10.1.0.7";
/// Opted in by `oci.opt_in` (namespace shop, app=api), not by annotation.
const API: &str = "10.1.0.8";
/// A node IP behind a NodePort: serves many pods.
const NODE: &str = "10.0.0.1";
/// A host-network pod has its node's IP: a node backend too.
const HOSTNET: &str = "10.0.0.2";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../oci/tests/fixtures")
        .join(name)
}

/// The workload file: `terminating` pods are in shutdown, `gone` are absent.
fn write_pods(path: &Path, terminating: &[&str], gone: &[&str]) {
    let pods = [
        ("a", A, "web", "true"),
        ("b", B, "web", "true"),
        ("c", C, "web", "false"),
        ("api", API, "shop", "false"),
        ("host", HOSTNET, "web", "true"),
    ];
    let mut yaml = String::from("workloads:\n");
    for (name, ip, ns, opted) in pods {
        if gone.contains(&name) {
            continue;
        }
        let state = if terminating.contains(&name) {
            "terminating"
        } else {
            "running"
        };
        yaml.push_str(&format!(
            "- {{uid: uid-{name}, name: {name}, namespace: {ns}, ips: [{ip}], node: node-a, state: {state}, labels: {{app: {name}}}, oci_backend_draining: {opted}}}\n"
        ));
    }
    // Atomic replace: the watcher never reads half a file.
    tidegate_e2e::write_atomically(path, &yaml);
}

struct Rig {
    dir: tempfile::TempDir,
    double: OciDouble,
    app: App,
}

struct Opts {
    at_capacity: &'static str,
    capacity_limit: usize,
    key: &'static str,
    max_attempts: u32,
    reassert_interval: &'static str,
    /// Sign with OKE workload identity, this service-account token in the token file.
    workload_identity: Option<&'static str>,
    double: DoubleConfig,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            at_capacity: "keep",
            capacity_limit: 512,
            key: "api_key.pem",
            max_attempts: 8,
            reassert_interval: "100ms",
            workload_identity: None,
            double: DoubleConfig::default(),
        }
    }
}

impl Rig {
    async fn start(opts: Opts) -> Rig {
        init_tracing();
        let mut dcfg = opts.double;
        let public = public_key_der(&std::fs::read(fixture("api_key.pem")).unwrap()).unwrap();
        dcfg.keys = HashMap::from([(KEY_ID.to_owned(), public)]);
        let double = OciDouble::start(dcfg).await;
        double.add_load_balancer(LB1);
        double.add_load_balancer(LB2);
        for ip in [A, B, C, API] {
            double.add_backend(LB1, "web", ip, 8080).unwrap();
        }
        double.add_backend(LB1, "web", NODE, 30080).unwrap();
        double.add_backend(LB1, "web", HOSTNET, 30081).unwrap();
        double.add_backend(LB1, "tls", A, 8443).unwrap();
        double.add_backend(LB2, "web", A, 8080).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let workloads = dir.path().join("workloads.yaml");
        write_pods(&workloads, &[], &[]);
        let auth = match opts.workload_identity {
            Some(token) => {
                let file = dir.path().join("sa-token");
                std::fs::write(&file, token).unwrap();
                format!(
                    "{{mode: workload-identity, proxymux_endpoint: {}, token_file: {}, ca_file: {}}}",
                    double.endpoint(),
                    file.display(),
                    double.ca_file().display()
                )
            }
            None => format!(
                "{{mode: api-key, tenancy: ocid1.tenancy.oc1..t, user: ocid1.user.oc1..u, fingerprint: \"c6:92:57\", key_file: {}}}",
                fixture(opts.key).display()
            ),
        };
        let extra = format!(
            r#"policies:
  # Generous bounds: the tests run in parallel on 2 cores, and a decision
  # cut by its deadline would fall back to a policy without oci-drain.
  call_deadline: 500ms
  init_deadline: 5s
  default: p
  plugins:
    p:
      file: {plugin}
      config: '{{"require-opt-in": false, "at-capacity": "{at_capacity}"}}'
oci:
  enabled: true
  endpoint: {endpoint}
  ca_file: {ca}
  load_balancers: [{LB1}, {LB2}]
  auth: {auth}
  opt_in: [{{namespace: shop, selector: {{app: api}}}}]
  node_networks: [10.0.0.0/24]
  capacity_limit: {capacity_limit}
  max_attempts: {max_attempts}
  reassert_interval: {reassert_interval}
  backoff_base: 5ms
  backoff_max: 40ms
  work_request_poll: 10ms
"#,
            plugin = plugin("oci-drain").display(),
            at_capacity = opts.at_capacity,
            endpoint = double.endpoint(),
            ca = double.ca_file().display(),
            capacity_limit = opts.capacity_limit,
            max_attempts = opts.max_attempts,
            reassert_interval = opts.reassert_interval,
        );
        let config = gateway_config_with("node-a", "{source: dev-ca}", &workloads, 15008, &extra);
        let app = tidegate::app::build(config).await.unwrap();
        Rig { dir, double, app }
    }

    fn pods(&self, terminating: &[&str], gone: &[&str]) {
        write_pods(&self.dir.path().join("workloads.yaml"), terminating, gone);
    }

    fn drain_of(&self, lb: &str, set: &str, ip: &str, port: u16) -> bool {
        self.double
            .backend(lb, set, &format!("{ip}:{port}"))
            .unwrap_or_else(|| panic!("backend {ip}:{port} missing from {lb}/{set}"))
            .drain
    }

    /// The `oci` part of the workload's entry in `GET /drains` (real HTTP).
    async fn oci_status(&self, uid: &str) -> serde_json::Value {
        let body = admin_get(self.app.addrs.admin, "/drains").await;
        body["drains"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["uid"] == uid)
            .map(|d| d["oci"].clone())
            .unwrap_or(serde_json::Value::Null)
    }

    async fn wait_state(&self, uid: &str, state: &str) -> serde_json::Value {
        self.wait_for(uid, state, |s| s["state"] == state).await
    }

    /// Polls `GET /drains` until the workload's OCI status satisfies `check`.
    async fn wait_for(
        &self,
        uid: &str,
        what: &str,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let what = format!("{uid}: OCI drain to reach {what}");
        let check = &check;
        tidegate_e2e::wait_for(&what, WITHIN, move || async move {
            let s = self.oci_status(uid).await;
            check(&s).then_some(s)
        })
        .await
    }
}

async fn admin_get(addr: SocketAddr, path: &str) -> serde_json::Value {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("GET {path}: {e}: {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_exactly_the_pods_backends_and_only_opted_in_pods() {
    let rig = Rig::start(Opts::default()).await;
    // Fields other than drain must survive: set them as an operator would.
    rig.double.with(|s| {
        s.other_writer(LB1, "web", "10.1.0.5:8080", |b| {
            b.weight = 5;
            b.max_connections = Some(100);
        })
    });
    let t0 = std::time::Instant::now();
    rig.pods(&["a", "c", "api", "host"], &[]);
    eventually("pod a's three backends drained", WITHIN, || {
        rig.drain_of(LB1, "web", A, 8080)
            && rig.drain_of(LB1, "tls", A, 8443)
            && rig.drain_of(LB2, "web", A, 8080)
    })
    .await;
    let elapsed = t0.elapsed();
    let keys = [
        format!("{LB1}/web/10.1.0.5:8080"),
        format!("{LB1}/tls/10.1.0.5:8443"),
        format!("{LB2}/web/10.1.0.5:8080"),
    ];
    let a = rig
        .wait_for("uid-a", "three backends drained", |s| {
            keys.iter().all(|k| s["backends"][k] == "drained")
        })
        .await;
    assert_eq!(a["state"], "running", "re-asserting while terminating: {a}");
    rig.wait_for("uid-api", "drained", |s| {
        s["backends"][format!("{LB1}/web/10.1.0.8:8080")] == "drained"
    })
    .await;
    assert!(rig.drain_of(LB1, "web", API, 8080));

    let web_a = rig.double.backend(LB1, "web", "10.1.0.5:8080").unwrap();
    assert_eq!((web_a.weight, web_a.max_connections), (5, Some(100)));
    assert!(!web_a.backup && !web_a.offline);
    // Untouched: another pod, the pod without opt-in, node backends.
    for (ip, port) in [(B, 8080), (C, 8080), (NODE, 30080), (HOSTNET, 30081)] {
        assert!(!rig.drain_of(LB1, "web", ip, port), "{ip}:{port} drained");
        assert_eq!(
            rig.double.mutations_of(&format!("{ip}:{port}")),
            0,
            "{ip}:{port} was written to"
        );
    }
    let host = rig.wait_state("uid-host", "done").await;
    assert!(
        host["backends"].as_object().is_none_or(|b| b.is_empty()),
        "{host}"
    );
    let c = rig.wait_state("uid-c", "not-opted-in").await;
    assert!(c["backends"].as_object().is_none_or(|b| b.is_empty()));

    // GET /drains shows the outcome per backend, with its latency.
    for key in &keys {
        assert!(a["latency_ms"][key].is_u64(), "{a}");
    }
    let m = rig.app.metrics_text();
    let count = metric(&m, "tidegate_oci_drain_latency_seconds_count");
    let sum = metric(&m, "tidegate_oci_drain_latency_seconds_sum");
    assert_eq!(count, 4.0, "{m}");
    assert!(
        metric(
            &m,
            "tidegate_oci_calls_total{operation=\"UpdateBackend\",status=\"204\"}"
        ) >= 4.0
    );
    assert!(metric(&m, "tidegate_oci_backends_total{result=\"drained\"}") >= 4.0);
    let wr_count = metric(&m, "tidegate_oci_work_request_seconds_count");
    let wr_sum = metric(&m, "tidegate_oci_work_request_seconds_sum");
    let d = DoubleConfig::default();
    println!(
        "event → drain SUCCEEDED per backend of pod a (serialized per load balancer): {}; \
         mean over {count} backends {:.1} ms; work request accepted → SUCCEEDED seen: mean {:.1} ms \
         (the double takes {:?}+{:?}, polled every 10 ms); file write → pod a's three backends drained: {elapsed:?}",
        a["latency_ms"],
        sum / count * 1e3,
        wr_sum / wr_count * 1e3,
        d.accepted_delay,
        d.progress_delay,
    );

    // The pod is gone: the re-assert loop stops.
    rig.pods(&[], &["a"]);
    rig.wait_state("uid-a", "done").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_on_one_load_balancer_are_serialized_with_fresh_etags() {
    let rig = Rig::start(Opts {
        double: DoubleConfig {
            accepted_delay: Duration::from_millis(30),
            progress_delay: Duration::from_millis(60),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let etag_before = rig.double.etag(LB1);
    rig.pods(&["a", "b"], &[]);
    eventually("pods a and b drained", WITHIN, || {
        rig.drain_of(LB1, "web", A, 8080)
            && rig.drain_of(LB1, "tls", A, 8443)
            && rig.drain_of(LB1, "web", B, 8080)
    })
    .await;
    // One work request at a time (the double answers 409 IncorrectState to
    // a mutation while another runs) and never a stale ETag (412).
    assert_eq!(rig.double.count("UpdateBackend", 409), 0);
    assert_eq!(rig.double.count("UpdateBackend", 412), 0);
    let lb1_updates = rig
        .double
        .calls()
        .iter()
        .filter(|c| c.operation == "UpdateBackend" && c.path.contains(LB1))
        .count();
    assert_eq!(lb1_updates, 3);
    // Each accepted mutation bumps the ETag twice (accepted, completed).
    assert!(rig.double.etag(LB1) >= etag_before + 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_412_race_converges_without_overwriting_the_other_writer() {
    let rig = Rig::start(Opts::default()).await;
    // Between tidegate's read and its write, another writer changes the
    // backend's weight, backup and offline flags.
    rig.double.before_next_update(|s| {
        s.other_writer(LB1, "web", "10.1.0.6:8080", |b| {
            b.weight = 7;
            b.backup = true;
            b.offline = true;
        });
    });
    rig.pods(&["b"], &[]);
    eventually("pod b drained", WITHIN, || {
        rig.drain_of(LB1, "web", B, 8080)
    })
    .await;
    let b = rig.double.backend(LB1, "web", "10.1.0.6:8080").unwrap();
    assert_eq!((b.weight, b.backup, b.offline), (7, true, true), "{b:?}");
    assert_eq!(rig.double.count("UpdateBackend", 412), 1);
    let m = rig.app.metrics_text();
    assert_eq!(
        metric(&m, "tidegate_oci_retries_total{reason=\"etag\"}"),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_storm_converges_within_the_bound_and_a_longer_one_gives_up() {
    let rig = Rig::start(Opts {
        max_attempts: 6,
        ..Default::default()
    })
    .await;
    rig.double
        .inject("GetLoadBalancer", 429, "TooManyRequests", 2);
    rig.double
        .inject("UpdateBackend", 429, "TooManyRequests", 4);
    rig.pods(&["b"], &[]);
    eventually("pod b drained through the storm", WITHIN, || {
        rig.drain_of(LB1, "web", B, 8080)
    })
    .await;
    assert_eq!(rig.double.count("UpdateBackend", 429), 4);
    assert_eq!(
        metric(
            &rig.app.metrics_text(),
            "tidegate_oci_retries_total{reason=\"throttled\"}"
        ),
        6.0
    );

    // 409 IncorrectState, a 503 and a FAILED work request are retried too.
    rig.double.inject("UpdateBackend", 409, "IncorrectState", 1);
    rig.double
        .inject("UpdateBackend", 503, "ServiceUnavailable", 1);
    rig.double.with(|s| s.fail_work_requests = 1);
    rig.pods(&["b", "api"], &[]);
    eventually("api drained through the faults", WITHIN, || {
        rig.drain_of(LB1, "web", API, 8080)
    })
    .await;
    let m = rig.app.metrics_text();
    for reason in ["conflict", "server", "work_request_failed"] {
        let series = format!("tidegate_oci_retries_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&m, &series), 1.0, "{series}");
    }

    // More 429s than attempts: the drain stops with a clear error, bounded.
    rig.double
        .inject("UpdateBackend", 429, "TooManyRequests", 50);
    rig.pods(&["b", "api", "a"], &[]);
    let s = rig.wait_state("uid-a", "failed").await;
    let error = s["error"].as_str().unwrap();
    assert!(
        error.contains("gave up after 6 attempts") && error.contains("429"),
        "{error}"
    );
    // Both load balancers of pod a are worked on at once; each gave up after 6.
    eventually("both load balancers gave up", WITHIN, || {
        rig.double.count("UpdateBackend", 429) == 4 + 2 * 6
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_by_the_foreign_controller_is_reasserted() {
    let rig = Rig::start(Opts::default()).await;
    rig.pods(&["b"], &[]);
    eventually("pod b drained", WITHIN, || {
        rig.drain_of(LB1, "web", B, 8080)
    })
    .await;
    let updates = rig.double.mutations_of("10.1.0.6:8080");
    // The replacement pod joins; OCI's own controller rewrites the set with drain=false.
    rig.double.set_foreign_controller(true);
    rig.double
        .add_backend(LB1, "web", "10.1.0.9", 8080)
        .unwrap();
    assert!(!rig.drain_of(LB1, "web", B, 8080), "the reset happened");
    eventually("drain re-asserted", WITHIN, || {
        rig.drain_of(LB1, "web", B, 8080)
    })
    .await;
    assert_eq!(rig.double.mutations_of("10.1.0.6:8080"), updates + 1);
    let s = rig
        .wait_for("uid-b", "one re-assertion", |s| s["reasserted"] == 1)
        .await;
    assert_eq!(s["state"], "running", "{s}");
    assert!(
        metric(
            &rig.app.metrics_text(),
            "tidegate_oci_drains_reasserted_total"
        ) >= 1.0
    );
    // The replacement (not terminating) is never drained.
    assert!(!rig.drain_of(LB1, "web", "10.1.0.9", 8080));

    // The gateway shuts down: the re-assert loop ends with it.
    let drains = rig.app.drains.clone();
    rig.app.shutdown().await;
    eventually("re-asserting stopped", WITHIN, || {
        drains
            .list()
            .iter()
            .any(|d| d.uid == "uid-b" && d.oci.as_ref().is_some_and(|o| o.state == "stopped"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_churn_does_not_speed_up_rechecks_and_a_gone_pod_stops_them_at_once() {
    let rig = Rig::start(Opts {
        reassert_interval: "1h",
        ..Default::default()
    })
    .await;
    rig.pods(&["b"], &[]);
    rig.wait_for("uid-b", "drained", |s| {
        s["backends"][format!("{LB1}/web/10.1.0.6:8080")] == "drained"
    })
    .await;
    let looks = rig.double.count("GetLoadBalancer", 200);
    assert_eq!(looks, 2, "one look at each load balancer");
    // Other workloads come and go: each change wakes the drain's wait, which
    // goes back to sleep while pod b is still there.
    for gone in [&["c"][..], &[], &["c", "api"], &[]] {
        let generation = rig.app.workloads.snapshot().generation;
        rig.pods(&["b"], gone);
        eventually("the store changed", WITHIN, || {
            rig.app.workloads.snapshot().generation > generation
        })
        .await;
    }
    // Pod b is gone: the loop ends now, not in an hour.
    rig.pods(&[], &["b"]);
    rig.wait_state("uid-b", "done").await;
    assert_eq!(rig.double.count("GetLoadBalancer", 200), looks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_capacity_the_policy_choice_is_honoured() {
    // The "web" set of LB1 holds 6 backends: a limit of 6 makes it full.
    let remove = Rig::start(Opts {
        at_capacity: "remove-early",
        capacity_limit: 6,
        ..Default::default()
    })
    .await;
    remove.pods(&["b"], &[]);
    eventually("pod b's backend removed to make room", WITHIN, || {
        remove.double.backend(LB1, "web", "10.1.0.6:8080").is_none()
    })
    .await;
    assert_eq!(remove.double.count("DeleteBackend", 204), 1);
    assert_eq!(remove.double.count("UpdateBackend", 204), 0);
    let s = remove.wait_state("uid-b", "done").await;
    assert!(
        s["capacity"][0]
            .as_str()
            .unwrap()
            .contains("(limit 6): remove-early"),
        "{s}"
    );
    let m = remove.app.metrics_text();
    assert_eq!(
        metric(
            &m,
            "tidegate_oci_capacity_events_total{choice=\"remove-early\"}"
        ),
        1.0
    );
    // The replacement now fits.
    remove
        .double
        .add_backend(LB1, "web", "10.1.0.9", 8080)
        .unwrap();

    let keep = Rig::start(Opts {
        at_capacity: "keep",
        capacity_limit: 6,
        ..Default::default()
    })
    .await;
    keep.pods(&["b"], &[]);
    eventually("pod b drained and kept", WITHIN, || {
        keep.drain_of(LB1, "web", B, 8080)
    })
    .await;
    assert_eq!(keep.double.count("DeleteBackend", 204), 0);
    let m = keep.app.metrics_text();
    assert_eq!(
        metric(&m, "tidegate_oci_capacity_events_total{choice=\"keep\"}"),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_are_a_clear_error_and_never_retried() {
    // Signed with a key the double does not know for this key id.
    let rig = Rig::start(Opts {
        key: "other_key.pem",
        ..Default::default()
    })
    .await;
    rig.pods(&["a"], &[]);
    let s = rig.wait_state("uid-a", "failed").await;
    let error = s["error"].as_str().unwrap();
    assert!(
        error.contains("GetLoadBalancer: HTTP 401 NotAuthenticated"),
        "{error}"
    );
    // The task ended on the first 401 of each load balancer (both are
    // looked at together): two calls, and no more afterwards.
    assert_eq!(rig.double.count("GetLoadBalancer", 401), 2);
    assert_eq!(rig.double.calls().len(), 2);
    rig.pods(&["a", "b"], &[]);
    rig.wait_state("uid-b", "failed").await;
    assert_eq!(rig.double.calls().len(), 4);
    assert!(!rig.drain_of(LB1, "web", A, 8080));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_identity_signs_with_the_session_key() {
    let rig = Rig::start(Opts {
        workload_identity: Some("sa-token-of-tidegate"),
        double: DoubleConfig {
            service_account_tokens: vec!["sa-token-of-tidegate".into()],
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    rig.pods(&["b"], &[]);
    eventually("pod b drained", WITHIN, || {
        rig.drain_of(LB1, "web", B, 8080)
    })
    .await;
    // One exchange; every API call after it was signed under `ST$<token>`
    // with the ephemeral key (the double verifies each against that key).
    assert_eq!(rig.double.count("ResourcePrincipalSessionToken", 200), 1);
    assert_eq!(rig.double.count("UpdateBackend", 204), 1);
    assert!(rig.double.calls().iter().all(|c| c.status != 401));

    // The session is revoked: the next call gets 401, the session is renewed
    // (a new key and token) and the re-assert loop carries on.
    rig.double
        .with(|s| s.cfg.keys.retain(|k, _| !k.starts_with("ST$")));
    eventually("a second session after the 401", WITHIN, || {
        rig.double.count("ResourcePrincipalSessionToken", 200) == 2
    })
    .await;
    let after = rig.double.calls().len();
    eventually("signed calls accepted again", WITHIN, || {
        rig.double.calls()[after..]
            .iter()
            .any(|c| c.operation == "GetLoadBalancer" && c.status == 200)
    })
    .await;
    assert_eq!(
        rig.wait_state("uid-b", "running").await["error"],
        serde_json::Value::Null
    );

    // Sessions are renewed before they expire (a fifth of the lifetime
    // ahead), without a single 401.
    let short = Rig::start(Opts {
        workload_identity: Some("sa-token-of-tidegate"),
        double: DoubleConfig {
            service_account_tokens: vec!["sa-token-of-tidegate".into()],
            session_lifetime: Duration::from_secs(2),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    short.pods(&["b"], &[]);
    eventually("a renewed session", WITHIN, || {
        short.double.count("ResourcePrincipalSessionToken", 200) >= 2
    })
    .await;
    assert!(short.double.calls().iter().all(|c| c.status != 401));

    // A token the proxymux refuses: a clear error, no API call.
    let refused = Rig::start(Opts {
        workload_identity: Some("stolen-token"),
        double: DoubleConfig {
            service_account_tokens: vec!["sa-token-of-tidegate".into()],
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    refused.pods(&["b"], &[]);
    let s = refused.wait_state("uid-b", "failed").await;
    let error = s["error"].as_str().unwrap();
    assert!(
        error.contains("token exchange") && error.contains("HTTP 401"),
        "{error}"
    );
    // One refused exchange per load balancer looked at, no API call.
    assert_eq!(
        refused.double.count("ResourcePrincipalSessionToken", 401),
        2
    );
    assert_eq!(refused.double.calls().len(), 2);
}

#[test]
fn enabling_oci_without_credentials_names_the_key() {
    let e = Config::from_yaml("oci: {enabled: true, region: r, load_balancers: [x]}").unwrap_err();
    assert!(e.to_string().contains("`oci.auth`"), "{e}");
    let e = Config::from_yaml(
        "oci: {enabled: true, region: r, auth: {mode: api-key, tenancy: t, user: u, fingerprint: f, key_file: /k}}",
    )
    .unwrap_err();
    assert!(e.to_string().contains("`oci.load_balancers`"), "{e}");
}

#[tokio::test]
async fn an_unreadable_key_file_fails_the_build_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let workloads = dir.path().join("w.yaml");
    write_pods(&workloads, &[], &[]);
    let extra = "oci: {enabled: true, region: r, load_balancers: [x], auth: {mode: api-key, tenancy: t, user: u, fingerprint: f, key_file: /nonexistent/key.pem}}";
    let config = gateway_config_with("node-a", "{source: dev-ca}", &workloads, 15008, extra);
    let e = tidegate::app::build(config).await.err().unwrap();
    assert!(
        format!("{e:#}").contains("oci.auth.key_file /nonexistent/key.pem"),
        "{e:#}"
    );
}

/// One signed request to the double, with a chosen date and key.
async fn raw(
    double: &OciDouble,
    key: &str,
    date: std::time::SystemTime,
    method: &str,
    path: &str,
    body: Option<&str>,
    if_match: Option<&str>,
) -> tidegate_oci::transport::RawResponse {
    use tidegate_oci::sign::{parse_private_key, Signer, ToSign};
    let ca = std::fs::read(double.ca_file()).unwrap();
    let endpoint = tidegate_oci::transport::Endpoint::new(&double.endpoint(), &ca, true).unwrap();
    let signer = Signer::new(
        KEY_ID.into(),
        parse_private_key(&std::fs::read(fixture(key)).unwrap()).unwrap(),
    );
    let date = httpdate::fmt_http_date(date);
    let target = format!("/20170115{path}");
    let signed = signer
        .sign(&ToSign {
            method,
            target: &target,
            host: endpoint.authority(),
            date: &date,
            body: body.map(str::as_bytes),
        })
        .unwrap();
    let mut headers = vec![("date", date), ("authorization", signed.authorization)];
    if let Some(sha) = signed.content_sha256 {
        headers.push(("content-type", "application/json".into()));
        headers.push(("content-length", body.unwrap().len().to_string()));
        headers.push(("x-content-sha256", sha));
    }
    if let Some(e) = if_match {
        headers.push(("if-match", e.into()));
    }
    let body = body.unwrap_or("").as_bytes().to_vec();
    endpoint
        .send(method, &target, &headers, body)
        .await
        .unwrap()
}

fn code(r: &tidegate_oci::transport::RawResponse) -> (u16, String) {
    assert!(
        r.header("opc-request-id").is_some(),
        "every answer has an opc-request-id"
    );
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
    (r.status, v["code"].as_str().unwrap_or("").to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_double_follows_the_published_api() {
    let public = public_key_der(&std::fs::read(fixture("api_key.pem")).unwrap()).unwrap();
    let double = OciDouble::start(DoubleConfig {
        keys: HashMap::from([(KEY_ID.to_owned(), public)]),
        backend_limit: 2,
        ..Default::default()
    })
    .await;
    double.add_load_balancer(LB1);
    double.add_backend(LB1, "web", A, 8080).unwrap();
    double.add_backend(LB1, "web", B, 8080).unwrap();
    assert!(double.add_backend(LB1, "web", C, 8080).is_err(), "limit 2");
    let now = std::time::SystemTime::now;
    let lb_path = format!("/loadBalancers/{LB1}");
    let a_path = format!("{lb_path}/backendSets/web/backends/10.1.0.5:8080");

    let r = raw(&double, "api_key.pem", now(), "GET", &lb_path, None, None).await;
    assert_eq!(r.status, 200);
    let etag = r.header("etag").unwrap();
    // Clock skew over 5 minutes, or another key: 401 NotAuthenticated.
    let stale = now() - Duration::from_secs(360);
    let r = raw(&double, "api_key.pem", stale, "GET", &lb_path, None, None).await;
    assert_eq!(code(&r), (401, "NotAuthenticated".into()));
    let r = raw(&double, "other_key.pem", now(), "GET", &lb_path, None, None).await;
    assert_eq!(code(&r), (401, "NotAuthenticated".into()));
    // Missing required fields: 400.
    let partial = r#"{"weight":1,"backup":false,"drain":true}"#;
    let r = raw(
        &double,
        "api_key.pem",
        now(),
        "PUT",
        &a_path,
        Some(partial),
        Some(&etag),
    )
    .await;
    assert_eq!(code(&r), (400, "MissingParameter".into()));
    assert!(String::from_utf8_lossy(&r.body).contains("offline"));
    // A stale If-Match: 412.
    let full = r#"{"weight":1,"backup":false,"drain":true,"offline":false}"#;
    let r = raw(
        &double,
        "api_key.pem",
        now(),
        "PUT",
        &a_path,
        Some(full),
        Some("0"),
    )
    .await;
    assert_eq!(code(&r), (412, "NoEtagMatch".into()));
    // Accepted: a work request; the change shows only when it is done.
    let r = raw(
        &double,
        "api_key.pem",
        now(),
        "PUT",
        &a_path,
        Some(full),
        Some(&etag),
    )
    .await;
    assert_eq!(r.status, 204);
    let wr = r.header("opc-work-request-id").unwrap();
    assert!(!double.backend(LB1, "web", "10.1.0.5:8080").unwrap().drain);
    let etag2 = double.etag(LB1).to_string();
    assert_ne!(etag2, etag, "an accepted mutation moves the ETag");
    // Another mutation while it runs: 409 IncorrectState.
    let r = raw(
        &double,
        "api_key.pem",
        now(),
        "PUT",
        &a_path,
        Some(full),
        Some(&etag2),
    )
    .await;
    assert_eq!(code(&r), (409, "IncorrectState".into()));
    let wr_path = format!("/loadBalancerWorkRequests/{wr}");
    let states = std::cell::RefCell::new(Vec::new());
    let (states_ref, double_ref, wr_path_ref) = (&states, &double, &wr_path);
    tidegate_e2e::wait_for("the work request to succeed", WITHIN, move || async move {
        let r = raw(
            double_ref,
            "api_key.pem",
            now(),
            "GET",
            wr_path_ref,
            None,
            None,
        )
        .await;
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        let state = v["lifecycleState"].as_str().unwrap().to_owned();
        let mut states = states_ref.borrow_mut();
        if states.last() != Some(&state) {
            states.push(state.clone());
        }
        (state == "SUCCEEDED").then_some(())
    })
    .await;
    let states = states.into_inner();
    assert_eq!(states.last().unwrap(), "SUCCEEDED");
    assert!(states
        .iter()
        .all(|s| ["ACCEPTED", "IN_PROGRESS", "SUCCEEDED"].contains(&s.as_str())));
    assert!(double.backend(LB1, "web", "10.1.0.5:8080").unwrap().drain);
    // The gateway's client reads what the double serves, ETag included.
    let client = tidegate_oci::OciClient::new(
        &double.endpoint(),
        &std::fs::read(double.ca_file()).unwrap(),
        "ca.pem",
        tidegate_oci::auth::Credentials::Static(
            tidegate_oci::auth::api_key(
                "ocid1.tenancy.oc1..t",
                "ocid1.user.oc1..u",
                "c6:92:57",
                &fixture("api_key.pem"),
            )
            .unwrap(),
        ),
        Duration::from_secs(5),
        tidegate_oci::CallMetrics::register(&mut Default::default()),
    )
    .unwrap();
    let (set, etag) = client.get_backend_set(LB1, "web").await.unwrap();
    assert_eq!(etag, double.etag(LB1).to_string());
    assert_eq!(set.backends.len(), 2);
    assert!(set.backends[0].drain && !set.backends[1].drain);
    let (lb, _) = client.get_load_balancer(LB1).await.unwrap();
    assert_eq!(lb.backend_sets["web"], set);
    let e = client
        .get_backend(LB1, "web", "10.9.9.9:1")
        .await
        .unwrap_err();
    assert_eq!(
        (e.status(), e.code()),
        (Some(404), "NotAuthorizedOrNotFound")
    );

    // Backend limit on CreateBackend.
    let create = r#"{"ipAddress":"10.1.0.7","port":8080,"weight":1,"backup":false,"drain":false,"offline":false}"#;
    let path = format!("{lb_path}/backendSets/web/backends");
    let r = raw(
        &double,
        "api_key.pem",
        now(),
        "POST",
        &path,
        Some(create),
        None,
    )
    .await;
    assert_eq!(code(&r), (400, "LimitExceeded".into()));
}

/// docs/oci.md runs the double with `--ca-out` and points the gateway at that
/// file: the banner must name it, not the double's temporary copy.
#[test]
fn the_double_program_names_the_ca_out_file() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let ca_out = dir.path().join("oci-ca.pem");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_oci-double"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--key-id",
            "t/u/f",
            "--public-key",
        ])
        .arg(fixture("api_key.pub.pem"))
        .arg("--ca-out")
        .arg(&ca_out)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut banner)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        banner.contains(&format!("(CA {})", ca_out.display())),
        "{banner}"
    );
    assert!(ca_out.exists());
}
