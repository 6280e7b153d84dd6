//! Services benchmark (issue 15): a program that prints figures, not a timed
//! test.
//!
//! ```text
//! cargo bench --workspace --profile dev --bench services
//! ```
//!
//! - **Endpoint choice**: nanoseconds per pick for a Service of 10 and of
//!   1,000 endpoints, `p2c` (two at random, fewer open streams) and
//!   `random`, every endpoint usable (each pick still checks each one's
//!   conditions, GOAWAY record and backoff).
//! - **Balance, `p2c` vs `random`**: a Service of three endpoints, one of
//!   them slow (it answers 20 ms late), 16 clients each opening a
//!   connection, one 1 KiB round trip, closing, for 3 s per choice: the
//!   slow endpoint's share of connections, and the connection time p50 /
//!   p99 (what "keep the better" is decided on).
//! - **New connections per second through a VIP vs straight to a pod IP**:
//!   both gateways in this process (the harness's `TwoNodes`), 8 concurrent
//!   clients each opening a connection, one 1 KiB round trip, closing;
//!   3 rounds of 3 s in rotating order, medians, and the ratios, beside
//!   raw TCP from the same client address.
//! - **A crashed endpoint** (`services/crash.rs`): three endpoints, a new
//!   connection every 5 ms (200/s); one endpoint's application is killed
//!   (no termination event) and its workload deleted 2 s later. Failed
//!   connections, and the time from the first to the last, for each choice
//!   with the defaults, with `outbound.connect_attempts: 1` (no retry on
//!   another endpoint), and with `failing_skip: 0` as well (failures never
//!   skip: the baseline from the same run). `-- --crash` runs this
//!   section alone (the others leave tens of thousands of TIME_WAIT
//!   sockets behind).
//! - **A termination signal → the last new connection to that pod**
//!   (`services/signal.rs`, `-- --signal` alone): the client's discovery
//!   marks one of three endpoints terminating under a new connection every
//!   5 ms, 20 times; from the store's publish to the last connection its
//!   application accepted.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidegate::workloads::WholeSet;

use tidegate::config::{EndpointChoice, PoolConfig};
use tidegate::proxy::endpoints::{EndpointMetrics, EndpointPicker, Skips};
use tidegate::proxy::pool::Pool;
use tidegate::workloads::WorkloadStore;
use tidegate_e2e::{counting_echo, ip, round_trip, Capture, Options, TwoNodes};
use tidegate_protocol::tls::{DevCa, TlsContext, TlsMetrics};
use tokio::io::AsyncWriteExt;

#[path = "services/crash.rs"]
mod crash;
#[path = "services/signal.rs"]
mod signal;

const PICK_TIME: Duration = Duration::from_secs(1);
const CONN_TIME: Duration = Duration::from_secs(3);
const CONCURRENCY: usize = 8;

/// A store with one Service (VIP 10.96.0.1:80) over `n` endpoints.
fn store(n: usize) -> Arc<WorkloadStore> {
    let store = WorkloadStore::new("cluster.local", "node-a");
    let mut yaml = String::from("workloads:\n");
    for i in 0..n {
        yaml += &format!(
            "- {{uid: e{i}, name: e{i}, namespace: demo, service_account: e, ips: [10.1.{}.{}], node: node-b, services: [svc]}}\n",
            i / 250,
            i % 250 + 1
        );
    }
    yaml += "services:\n- {name: svc, namespace: demo, vips: [10.96.0.1], ports: [{port: 80, target_port: 8080}]}\n";
    let parsed = tidegate::workloads::parse_file(&yaml).expect("bench workload file");
    store.publish(WholeSet::new(parsed.workloads).services(parsed.services));
    store
}

/// The workload file of the in-process runs: the client at .3 on node A,
/// endpoints `e{i}` at .(10+i) on node B, Service `echo` at VIP .100.
fn workloads(octet: u8, port: u16, endpoints: usize) -> String {
    let mut y = format!(
        "workloads:\n- {{uid: client-uid, name: client, namespace: demo, service_account: client, ips: [{}], node: node-a}}\n",
        ip(octet, 3)
    );
    for i in 0..endpoints {
        y += &format!(
            "- {{uid: e{i}, name: e{i}, namespace: demo, service_account: echo, ips: [{}], node: node-b, services: [echo]}}\n",
            ip(octet, 10 + i as u8)
        );
    }
    y + &format!(
        "services:\n- {{name: echo, namespace: demo, vips: [{}], ports: [{{port: 80, target_port: {port}}}]}}\n",
        ip(octet, 100)
    )
}

/// Two gateways in this process over `workloads`, with `client_yaml`, and
/// a capture of the Service VIP (.100:80).
async fn vip_nodes(octet: u8, workloads: String, client_yaml: String) -> (TwoNodes, Arc<Capture>) {
    let nodes = TwoNodes::with(
        octet,
        Options {
            workloads: Some(workloads),
            client_yaml,
            ..Default::default()
        },
    )
    .await;
    let vip = SocketAddr::new(ip(octet, 100), 80);
    let cap = Arc::new(Capture::start(nodes.client.outbound.clone(), vip).await);
    (nodes, cap)
}

/// An echo application that records when it accepts; aborting its task
/// closes its listener (the gateway in front gets "connection refused").
async fn app(
    addr: SocketAddr,
) -> (
    SocketAddr,
    tokio::task::JoinHandle<()>,
    Arc<std::sync::Mutex<Vec<Instant>>>,
) {
    use tokio::io::AsyncReadExt;
    let l = tokio::net::TcpListener::bind(addr).await.unwrap();
    let bound = l.local_addr().unwrap();
    let accepts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = accepts.clone();
    let task = tokio::spawn(async move {
        while let Ok((mut tcp, _)) = l.accept().await {
            seen.lock().unwrap().push(Instant::now());
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = tcp.read(&mut buf).await {
                    if n == 0 || tcp.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (bound, task, accepts)
}

fn pick_ns(n: usize, choice: EndpointChoice) -> f64 {
    let mut registry = prometheus_client::registry::Registry::default();
    let ca = DevCa::new(Duration::from_secs(3600)).unwrap();
    let tls = Arc::new(TlsContext::new(
        Arc::new(ca),
        "cluster.local",
        TlsMetrics::register(&mut registry),
    ));
    let pool = Pool::new(
        tls,
        Default::default(),
        PoolConfig::default(),
        Default::default(),
        None,
        &mut registry,
    );
    let picker = EndpointPicker::new(
        pool,
        15008,
        choice,
        Skips {
            goaway: Duration::from_secs(10),
            failing: Duration::from_secs(5),
        },
        EndpointMetrics::register(&mut registry),
    );
    let store = store(n);
    let snap = store.snapshot();
    let svc = snap
        .service_by_vip("10.96.0.1".parse().unwrap(), 80)
        .expect("the Service")
        .clone();
    let started = Instant::now();
    let mut picks = 0u64;
    let mut sink = 0usize;
    while started.elapsed() < PICK_TIME {
        for _ in 0..1000 {
            sink ^= picker.pick(&svc, 80).expect("an endpoint").target_port as usize;
        }
        picks += 1000;
    }
    std::hint::black_box(sink);
    started.elapsed().as_nanos() as f64 / picks as f64
}

/// New connections per second to `dst` through the client gateway, or
/// straight to `dst` in raw TCP when `raw`.
async fn conns_per_sec(nodes: &Arc<TwoNodes>, dst: SocketAddr, raw: bool) -> f64 {
    let cap = Arc::new(Capture::start(nodes.client.outbound.clone(), dst).await);
    let deadline = Instant::now() + CONN_TIME;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let (cap, nodes) = (cap.clone(), nodes.clone());
        tasks.spawn(async move {
            let msg = vec![7u8; 1024];
            let mut n = 0usize;
            while Instant::now() < deadline {
                let mut tcp = if raw {
                    let s = tokio::net::TcpSocket::new_v4().unwrap();
                    s.set_reuseaddr(true).unwrap();
                    s.bind(SocketAddr::new(nodes.client_ip, 0)).unwrap();
                    s.connect(dst).await.unwrap()
                } else {
                    cap.connect(nodes.client_ip).await
                };
                assert_eq!(round_trip(&mut tcp, &msg).await.unwrap(), msg);
                let _ = tcp.shutdown().await;
                n += 1;
            }
            n
        });
    }
    let started = Instant::now();
    let mut total = 0;
    while let Some(n) = tasks.join_next().await {
        total += n.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// One choice under load: (slow endpoint's share, p50 ms, p99 ms, conns/s).
async fn balance(octet: u8, choice: &str) -> (f64, f64, f64, f64) {
    const CLIENTS: usize = 16;
    let delays = [Duration::ZERO, Duration::ZERO, Duration::from_millis(20)];
    let mut counts = Vec::new();
    let mut port = 0;
    for (i, delay) in delays.iter().enumerate() {
        let host = ip(octet, 10 + i as u8);
        let (addr, count) = counting_echo(SocketAddr::new(host, port), *delay).await;
        port = addr.port();
        counts.push(count);
    }
    let yaml = workloads(octet, port, delays.len());
    let client_yaml = format!("outbound:\n  endpoint_choice: {choice}\n");
    let (nodes, cap) = vip_nodes(octet, yaml, client_yaml).await;
    let deadline = Instant::now() + CONN_TIME;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (cap, src) = (cap.clone(), nodes.client_ip);
        tasks.spawn(async move {
            let msg = vec![7u8; 1024];
            let mut times = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let mut tcp = cap.connect(src).await;
                assert_eq!(round_trip(&mut tcp, &msg).await.unwrap(), msg);
                let _ = tcp.shutdown().await;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            times
        });
    }
    let started = Instant::now();
    let mut times = Vec::new();
    while let Some(t) = tasks.join_next().await {
        times.extend(t.unwrap());
    }
    let rate = times.len() as f64 / started.elapsed().as_secs_f64();
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    let total: usize = counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    let slow = counts[2].load(Ordering::Relaxed) as f64 / total as f64;
    (slow, at(0.5), at(0.99), rate)
}

/// The termination-signal section.
async fn signals() {
    const ROUNDS: usize = 20;
    let (lags, accepted) = signal::run(220, ROUNDS).await;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "\na termination signal ({ROUNDS} times, a new connection every 5 ms): from the store's publish to the last connection the endpoint accepted: p50 {:.2} ms, max (p99 of {ROUNDS}) {:.2} ms; it accepted {accepted} connections while running",
        ms(lags[ROUNDS / 2]),
        ms(lags[ROUNDS - 1])
    );
}

/// The crashed-endpoint section.
async fn crashes() {
    println!(
        "\na crashed endpoint: 3 endpoints, a new connection every 5 ms; one application killed at 1 s, its workload deleted 2 s later:"
    );
    println!("| choice | outbound.failing_skip | outbound.connect_attempts | connections | failed | first → last failure |\n|---|---|---|---|---|---|");
    // The defaults, then without the retry, then without the skip either
    // (the baseline of the same run).
    let configs = [("5s", 2), ("5s", 1), ("0s", 1)];
    for (octet, choice) in [(222, "p2c"), (225, "random")] {
        let mut failed = Vec::new();
        for (k, (skip, attempts)) in configs.into_iter().enumerate() {
            let c = crash::run(octet + k as u8, choice, skip, attempts).await;
            let span = c
                .failing_for
                .map_or("–".into(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3));
            println!(
                "| {choice} | {skip} | {attempts} | {} | {} | {span} |",
                c.connections, c.failed
            );
            failed.push(c.failed);
        }
        println!(
            "{choice}: failed with the defaults {}, without the retry {}, without the skip either {}",
            failed[0], failed[1], failed[2]
        );
    }
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if std::env::args().any(|a| a == "--signal") {
        println!("Services benchmark: a termination signal");
        rt.block_on(signals());
        return Ok(());
    }
    if std::env::args().any(|a| a == "--crash") {
        println!("Services benchmark: a crashed endpoint");
        rt.block_on(crashes());
        return Ok(());
    }
    println!("Services benchmark\n\nendpoint choice, ns per pick (every endpoint usable):");
    println!("| endpoints | p2c | random |\n|---|---|---|");
    for n in [10, 1000] {
        println!(
            "| {n} | {:.0} | {:.0} |",
            pick_ns(n, EndpointChoice::P2c),
            pick_ns(n, EndpointChoice::Random)
        );
    }
    rt.block_on(async {
        signals().await;
        crashes().await;
        println!(
            "\nbalance: 3 endpoints, one answering 20 ms late; 16 clients, a new connection and one 1 KiB round trip each, {CONN_TIME:?} per choice:"
        );
        println!("| choice | slow endpoint's share of connections | connection time p50 / p99 ms | conns/s |\n|---|---|---|---|");
        let mut rows = Vec::new();
        for (octet, choice) in [(214, "p2c"), (215, "random")] {
            let (share, p50, p99, rate) = balance(octet, choice).await;
            println!("| {choice} | {:.1} % | {p50:.2} / {p99:.2} | {rate:.0} |", share * 100.0);
            rows.push((p50, p99, rate));
        }
        println!(
            "p2c / random: p50 {:.2}×, p99 {:.2}×, conns/s {:.2}×",
            rows[0].0 / rows[1].0,
            rows[0].1 / rows[1].1,
            rows[0].2 / rows[1].2
        );
        let octet = 213;
        let echo = tidegate_e2e::echo_server(ip(octet, 2)).await;
        let yaml = format!(
            "workloads:\n\
             - {{uid: echo-uid, name: echo, namespace: demo, service_account: echo, ips: [{e}], node: node-b, services: [echo]}}\n\
             - {{uid: client-uid, name: client, namespace: demo, service_account: client, ips: [{c}], node: node-a}}\n\
             services:\n- {{name: echo, namespace: demo, vips: [{vip}], ports: [{{port: 80, target_port: {port}}}]}}\n",
            e = ip(octet, 2),
            c = ip(octet, 3),
            vip = ip(octet, 100),
            port = echo.port(),
        );
        let nodes = Arc::new(
            TwoNodes::with(
                octet,
                Options {
                    workloads: Some(yaml),
                    ..Default::default()
                },
            )
            .await,
        );
        let vip = SocketAddr::new(ip(octet, 100), 80);
        let (mut raw, mut direct, mut via_vip) = (Vec::new(), Vec::new(), Vec::new());
        // The order rotates every round: each run leaves thousands of
        // TIME_WAIT sockets from the same client address, which slow the
        // next run's binds, so no path may always come last.
        for round in 0..3 {
            for k in 0..3 {
                match (round + k) % 3 {
                    0 => raw.push(conns_per_sec(&nodes, echo, true).await),
                    1 => direct.push(conns_per_sec(&nodes, echo, false).await),
                    _ => via_vip.push(conns_per_sec(&nodes, vip, false).await),
                }
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let (r, d, v) = (median(&mut raw), median(&mut direct), median(&mut via_vip));
        println!(
            "\nnew connections/s ({CONCURRENCY} concurrent, 1 KiB round trip each; medians of 3 interleaved rounds of {CONN_TIME:?}):\n  raw TCP to the echo backend: {r:.0}\n  through the gateways, straight to the pod IP: {d:.0} ({:.2}× raw)\n  through the gateways, to the Service VIP: {v:.0} ({:.2}× raw, {:.2}× pod IP)",
            d / r,
            v / r,
            v / d
        );
    });
    Ok(())
}
