//! Certificate issuance benchmark (issue 16): a program that prints
//! figures, not a timed test.
//!
//! ```text
//! cargo bench --workspace --profile dev --bench ca
//! ```
//!
//! Everything real but the Kubernetes API server (the wire-level double
//! answers TokenReview and the pod list): `tidegate-ca` over gRPC/TLS on
//! loopback, two gateways whose certificates come from it.
//!
//! - **Issuance latency**, client → certificate installed: a pod with a new
//!   identity appears on node-a (the workload file); from the moment the
//!   gateway knows it until its certificate is installed (key and CSR
//!   generated, CreateCertificate over TLS, the CA's TokenReview and node
//!   authorizer, signing, the chain checked and installed): 50 pods one at
//!   a time, then 100 in one change; p50 / p99.
//! - **First connection of a new identity vs a warm one**, same run: a pod
//!   with a new service account appears on node-a (the workload file);
//!   from the moment the gateway knows it, one application connection and
//!   a 1 KiB round trip to a pod on node-b (the certificate is fetched by
//!   the prefetch the new pod started, which the handshake waits for).
//!   Then from the same pod, its certificate held: a new tunnel (the pool
//!   evicted first), and the pooled tunnel. Beside raw loopback TCP to the
//!   same backend. 30 pods.

use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use tidegate_ca::server::start as start_ca;
use tidegate_e2e::ca::{ca_config, gateway_pod, until_known};
use tidegate_e2e::kube_api::{FakeApiServer, Kind};
use tidegate_e2e::{echo_server, gateway_config_with, ip, round_trip, write_atomically, Capture};
use tidegate_protocol::identity::SpiffeId;
use tokio::net::TcpStream;

const ISSUE_N: usize = 50;
const BURST: usize = 100;
const PODS: usize = 30;
const OCTET: u8 = 216;

fn pod(name: &str, sa: &str, node: &str, pod_ip: IpAddr) -> serde_json::Value {
    json!({
        "metadata": {"name": name, "namespace": "demo", "uid": format!("{name}-uid")},
        "spec": {"nodeName": node, "serviceAccountName": sa, "containers": [{"name": "app", "image": "app:1"}]},
        "status": {"phase": "Running", "podIP": pod_ip.to_string()},
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn summary(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (percentile(&v, 0.5), percentile(&v, 0.99))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn workload(name: &str, sa: &str, at: IpAddr, node: &str) -> String {
    format!("- {{uid: {name}-uid, name: {name}, namespace: demo, service_account: {sa}, ips: [{at}], node: {node}}}\n")
}

fn cold_ip(i: usize) -> IpAddr {
    ip(OCTET, 10 + i as u8)
}

/// Pods of the issuance rows: 127.<OCTET+1>.x.y.
fn issue_ip(i: usize) -> IpAddr {
    IpAddr::from([127, OCTET + 1, (i / 250) as u8, (i % 250 + 1) as u8])
}

fn issue_workload(i: usize) -> String {
    workload(
        &format!("i{i}"),
        &format!("issue-{i}"),
        issue_ip(i),
        "node-a",
    )
}

fn issue_id(i: usize) -> SpiffeId {
    SpiffeId::new("cluster.local", "demo", &format!("issue-{i}"))
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    tidegate_e2e::raise_fd_limit();
    let api = FakeApiServer::start().await;
    let dir = tempfile::tempdir()?;
    let (tok_a, tok_b) = ("token-a", "token-b");
    gateway_pod(&api, "tidegate-node-a", "node-a", tok_a);
    gateway_pod(&api, "tidegate-node-b", "node-b", tok_b);
    api.apply(Kind::Pod, pod("echo", "echo", "node-b", ip(OCTET, 2)));
    for i in 0..ISSUE_N + BURST {
        api.apply(
            Kind::Pod,
            pod(
                &format!("i{i}"),
                &format!("issue-{i}"),
                "node-a",
                issue_ip(i),
            ),
        );
    }
    for i in 0..PODS {
        api.apply(
            Kind::Pod,
            pod(&format!("c{i}"), &format!("cold-{i}"), "node-a", cold_ip(i)),
        );
    }
    let (_trigger, drain) = tidegate_base::shutdown::channel();
    let ca = start_ca(
        ca_config(&api, "127.0.0.1:0".parse()?, Duration::from_secs(3600)),
        drain,
    )
    .await?;
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let roots = write("root-cert.pem", &ca.root_pem);
    let certs = |token: &Path| {
        format!(
            "{{source: istio-ca, address: 'https://{}', roots: {}, token: {}, validity: 1h}}",
            ca.addr,
            roots.display(),
            token.display()
        )
    };
    let base = format!(
        "workloads:\n{}",
        workload("echo", "echo", ip(OCTET, 2), "node-b")
    );
    let wl = write("workloads.yaml", &base);
    let backend = echo_server(ip(OCTET, 2)).await;
    let server = tidegate::app::build(gateway_config_with(
        "node-b",
        &certs(&write("tok-b", tok_b)),
        &wl,
        15008,
        "",
    ))
    .await?;
    let client = tidegate::app::build(gateway_config_with(
        "node-a",
        &certs(&write("tok-a", tok_a)),
        &wl,
        server.addrs.inbound.expect("node listeners").port(),
        "",
    ))
    .await?;
    let source = client.tls.source().clone();

    println!(
        "Certificate issuance benchmark (tidegate-ca over gRPC/TLS on loopback, the API double)\n"
    );
    let mut text = base.clone();
    // Issuance, one pod at a time: from the moment the gateway knows the
    // pod to its certificate installed.
    let mut serial = Vec::new();
    for i in 0..ISSUE_N {
        text += &issue_workload(i);
        write_atomically(&wl, &text);
        until_known(&client, issue_ip(i)).await;
        let t = Instant::now();
        source.fetch(&issue_id(i)).await?;
        serial.push(ms(t.elapsed()));
    }
    // A burst: BURST pods in one change.
    for i in ISSUE_N..ISSUE_N + BURST {
        text += &issue_workload(i);
    }
    write_atomically(&wl, &text);
    let last = issue_ip(ISSUE_N + BURST - 1);
    until_known(&client, last).await;
    let t_all = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in ISSUE_N..ISSUE_N + BURST {
        let source = source.clone();
        set.spawn(async move {
            source
                .fetch(&issue_id(i))
                .await
                .map(|_| ms(t_all.elapsed()))
        });
    }
    let mut burst = Vec::new();
    while let Some(r) = set.join_next().await {
        burst.push(r??);
    }
    let rate = BURST as f64 / t_all.elapsed().as_secs_f64();
    let (s50, s99) = summary(serial);
    let (b50, b99) = summary(burst);
    println!("issuance, from the gateway knowing the pod to its certificate installed:");
    println!("| pods | p50 ms | p99 ms |\n|---|---|---|");
    println!("| one at a time ({ISSUE_N}) | {s50:.2} | {s99:.2} |");
    println!("| {BURST} in one change | {b50:.2} | {b99:.2} | ({rate:.0} certificates/s)");

    // First connection of a new identity, then warm.
    let capture = Capture::start(client.outbound.clone(), backend).await;
    let payload = vec![7u8; 1024];
    let (mut cold, mut warm_new, mut pooled, mut raw) = (vec![], vec![], vec![], vec![]);
    for i in 0..PODS {
        text += &workload(&format!("c{i}"), &format!("cold-{i}"), cold_ip(i), "node-a");
        write_atomically(&wl, &text);
        until_known(&client, cold_ip(i)).await;
        let t = Instant::now();
        let mut conn = capture.connect(cold_ip(i)).await;
        round_trip(&mut conn, &payload).await?;
        cold.push(ms(t.elapsed()));
        drop(conn);

        client.pool.evict_all();
        let t = Instant::now();
        let mut conn = capture.connect(cold_ip(i)).await;
        round_trip(&mut conn, &payload).await?;
        warm_new.push(ms(t.elapsed()));
        drop(conn);

        let t = Instant::now();
        let mut conn = capture.connect(cold_ip(i)).await;
        round_trip(&mut conn, &payload).await?;
        pooled.push(ms(t.elapsed()));
        drop(conn);

        let t = Instant::now();
        let mut conn = TcpStream::connect(backend).await?;
        conn.set_nodelay(true)?;
        round_trip(&mut conn, &payload).await?;
        raw.push(ms(t.elapsed()));
    }
    let rows = [
        ("new identity (certificate fetched)", summary(cold)),
        ("warm identity, new tunnel", summary(warm_new)),
        ("warm identity, pooled tunnel", summary(pooled)),
        ("raw loopback TCP", summary(raw)),
    ];
    println!("\nfirst connection + 1 KiB round trip, from the moment the gateway knows the pod ({PODS} pods):");
    println!("| connection | p50 ms | p99 ms | p50 / warm new tunnel |\n|---|---|---|---|");
    let warm50 = rows[1].1 .0;
    for (what, (p50, p99)) in rows {
        println!("| {what} | {p50:.2} | {p99:.2} | {:.2}× |", p50 / warm50);
    }
    let held = source.dump()["identities"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0);
    println!("\nidentities held by node-a: {held}");
    client.shutdown().await;
    server.shutdown().await;
    Ok(())
}
