//! A crashed endpoint under load (issue 42): its application is killed —
//! no termination event, its pod still listed — and its workload deleted
//! 2 s later, as when a container dies and its pod object goes after.
//! Node B's gateway answers every CONNECT to it 503 meanwhile.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tidegate_e2e::{ip, round_trip, write_atomically};

use crate::{app, vip_nodes, workloads};
use tokio::io::AsyncWriteExt;

/// A new connection this often: 200 per second.
const EVERY: Duration = Duration::from_millis(5);
const WARM: Duration = Duration::from_secs(1);
/// From the crash to the deletion.
const DELETED_AFTER: Duration = Duration::from_secs(2);
const AFTER: Duration = Duration::from_secs(1);

/// What one run saw.
pub struct Crash {
    pub connections: usize,
    /// Connections that failed (all of them to the crashed endpoint).
    pub failed: usize,
    /// From the first failed connection's start to the last one's.
    pub failing_for: Option<Duration>,
}

/// One run: three endpoints, e2 crashes after [`WARM`].
pub async fn run(octet: u8, choice: &str, failing_skip: &str, connect_attempts: u32) -> Crash {
    let mut port = 0;
    let mut apps = Vec::new();
    for i in 0..3 {
        let (addr, task, _) = app(SocketAddr::new(ip(octet, 10 + i), port)).await;
        port = addr.port();
        apps.push(task);
    }
    let client_yaml = format!(
        "outbound:\n  endpoint_choice: {choice}\n  failing_skip: {failing_skip}\n  connect_attempts: {connect_attempts}\n"
    );
    let (nodes, cap) = vip_nodes(octet, workloads(octet, port, 3), client_yaml).await;
    let started = Instant::now();
    let end = WARM + DELETED_AFTER + AFTER;
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut conns = tokio::task::JoinSet::new();
    let (mut crashed, mut deleted) = (false, false);
    while started.elapsed() < end {
        tick.tick().await;
        if !crashed && started.elapsed() >= WARM {
            let e2 = apps.pop().unwrap();
            e2.abort();
            let _ = e2.await;
            crashed = true;
        }
        if !deleted && started.elapsed() >= WARM + DELETED_AFTER {
            // The pod object goes: the client's discovery drops e2.
            let file = nodes.dir.path().join("client-workloads.yaml");
            write_atomically(&file, &workloads(octet, port, 2));
            deleted = true;
        }
        let (cap, src) = (cap.clone(), nodes.client_ip);
        conns.spawn(async move {
            let at = Instant::now();
            let ok = tokio::time::timeout(Duration::from_secs(2), async {
                let mut tcp = cap.try_connect(src).await?;
                let back = round_trip(&mut tcp, b"ping").await?;
                tcp.shutdown().await?;
                std::io::Result::Ok(back == b"ping")
            })
            .await;
            (at, matches!(ok, Ok(Ok(true))))
        });
    }
    let mut failures = Vec::new();
    let mut connections = 0;
    while let Some(r) = conns.join_next().await {
        let (at, ok) = r.unwrap();
        connections += 1;
        if !ok {
            failures.push(at);
        }
    }
    failures.sort();
    Crash {
        connections,
        failed: failures.len(),
        failing_for: match (failures.first(), failures.last()) {
            (Some(a), Some(b)) => Some(*b - *a),
            _ => None,
        },
    }
}
