//! From a termination signal to the last new connection sent to that pod:
//! the client's discovery marks an endpoint terminating (what an
//! EndpointSlice's `terminating`, istiod's UNHEALTHY or a deletionTimestamp
//! become in the store) while a new connection leaves every 5 ms; the lag
//! is from the store's publish to the last connection the endpoint's
//! application accepted (connections already on their way count).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tidegate::workloads::LifecycleState;
use tidegate_e2e::{ip, round_trip, write_atomically};
use tokio::io::AsyncWriteExt;

use crate::{app, vip_nodes, workloads};

const EVERY: Duration = Duration::from_millis(5);
/// How long after each change the accepts are watched.
const WATCH: Duration = Duration::from_millis(300);

/// `rounds` times: e2 terminating, then running again; each round's lag
/// from the publish to e2's last accept (zero when none came after it),
/// and how many connections e2 accepted in all (it is chosen while
/// running: a zero lag is not an idle endpoint's).
pub async fn run(octet: u8, rounds: usize) -> (Vec<Duration>, usize) {
    let mut port = 0;
    let mut accepts = Vec::new();
    for i in 0..3 {
        let (addr, _, a) = app(SocketAddr::new(ip(octet, 10 + i), port)).await;
        port = addr.port();
        accepts.push(a);
    }
    let (nodes, cap) = vip_nodes(octet, workloads(octet, port, 3), String::new()).await;
    let (stop_tx, mut stop) = tokio::sync::watch::channel(false);
    let load = {
        let (cap, src) = (cap.clone(), nodes.client_ip);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stop.changed() => return,
                }
                let cap = cap.clone();
                tokio::spawn(async move {
                    if let Ok(mut tcp) = cap.try_connect(src).await {
                        let _ = round_trip(&mut tcp, b"ping").await;
                        let _ = tcp.shutdown().await;
                    }
                });
            }
        })
    };
    let file = nodes.dir.path().join("client-workloads.yaml");
    let e2_is = |state: LifecycleState| {
        let snap = nodes.client.workloads.snapshot();
        snap.by_uid("e2").is_some_and(|w| w.spec.state == state)
    };
    let mut lags = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        tokio::time::sleep(WATCH).await;
        let mut published = nodes.client.workloads.subscribe();
        let terminating = workloads(octet, port, 3).replace(
            "uid: e2, name: e2,",
            "uid: e2, name: e2, state: terminating,",
        );
        write_atomically(&file, &terminating);
        // The publish that makes it terminating: when the choice changes.
        let at = loop {
            published.changed().await.expect("the store publishes");
            if e2_is(LifecycleState::Terminating) {
                break Instant::now();
            }
        };
        tokio::time::sleep(WATCH).await;
        let last = accepts[2]
            .lock()
            .unwrap()
            .iter()
            .copied()
            .filter(|t| *t >= at)
            .max();
        lags.push(last.map_or(Duration::ZERO, |t| t - at));
        write_atomically(&file, &workloads(octet, port, 3));
        while !e2_is(LifecycleState::Running) {
            published.changed().await.expect("the store publishes");
        }
    }
    let _ = stop_tx.send(true);
    let _ = load.await;
    lags.sort();
    let accepted = accepts[2].lock().unwrap().len();
    (lags, accepted)
}
