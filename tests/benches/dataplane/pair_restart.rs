//! `--pair … --restart`: what a restart of node B's gateway costs pod A's
//! new connections, pair by pair on the same topology.
//!
//! Pod A opens a connection to pod B's echo server every 10 ms (a 1-byte
//! round trip each, 1 s at most). Half a second in, node B's gateway is
//! stopped — SIGTERM and its whole shutdown (`stop-and-start`), or SIGKILL
//! (`kill -9`) — and once every process of it is gone, the same command
//! starts it again; the ZDS double hands pod B over to the new process as
//! istio-cni does when its node agent reconnects (`AddWorkload`, then the
//! snapshot). The load runs 1.5 s more. Rounds interleave the pairs (each
//! round starting one pair later) and the variants; each round starts the
//! pair afresh.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tidegate_e2e::measure::{connection_every, median, Restart, ECHO};
use tidegate_e2e::zds_double::ZdsDouble;

use super::{
    first_round_trip, interleaved, node_agent, pod_spec, Env, NodeProc, PairSpec, UP_WITHIN,
};
use tidegate_e2e::inpod::InpodTopology;

const EVERY: Duration = Duration::from_millis(10);
/// Load before the stop, and after the new gateway started.
const BEFORE: Duration = Duration::from_millis(500);
const AFTER: Duration = Duration::from_millis(1500);
/// The old gateway's whole shutdown, at most (then SIGKILL).
const SHUTDOWN_WITHIN: Duration = Duration::from_secs(30);

#[derive(Clone, Copy)]
enum Variant {
    StopAndStart,
    Kill,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::StopAndStart => "stop-and-start (SIGTERM)",
            Variant::Kill => "kill -9",
        }
    }
    fn signal(self) -> i32 {
        match self {
            Variant::StopAndStart => libc::SIGTERM,
            Variant::Kill => libc::SIGKILL,
        }
    }
}

/// One restart's figures, and how long the old gateway took to go.
struct Measured {
    restart: Restart,
    shutdown: Duration,
    shut_down_by_itself: bool,
}

pub(super) async fn bench(env: &Env, pairs: &[PairSpec], rounds: usize) -> anyhow::Result<()> {
    println!(
        "node B's gateway restarted while pod A opens a connection to pod B every {} ms: {rounds} rounds, interleaved",
        EVERY.as_millis()
    );
    let variants = [Variant::StopAndStart, Variant::Kill];
    let results = interleaved(
        pairs,
        &variants,
        rounds,
        |v: Variant| v.name().to_owned(),
        async |pair, variant| once(env, pair, variant).await,
        |round, pair, variant, m: &Measured| {
            println!(
                "round {round}: {:<10} {:<25} {} of {} failed, gap {:.0} ms, old gone → served {:.0} ms (shutdown {:.0} ms{})",
                pair.name,
                variant.name(),
                m.restart.failed,
                m.restart.connections,
                ms(m.restart.gap),
                ms(m.restart.served_after),
                ms(m.shutdown),
                if m.shut_down_by_itself { "" } else { ", killed at the bound" }
            )
        },
    )
    .await?;
    println!("\n| pair | restart | failed of ~{} (median, range) | gap pod A saw (median) | old gateway gone → pod B served (median) | old gateway's shutdown (median) |", (BEFORE + AFTER).as_millis() / EVERY.as_millis());
    println!("|---|---|---|---|---|---|");
    for (i, p) in pairs.iter().enumerate() {
        for (v, variant) in variants.iter().enumerate() {
            let r = &results[i][v];
            let failed: Vec<usize> = r.iter().map(|m| m.restart.failed).collect();
            println!(
                "| {} | {} | {:.0} ({}–{}) | {:.0} ms | {:.0} ms | {:.0} ms |",
                p.name,
                variant.name(),
                median(r, |m| m.restart.failed as f64),
                failed.iter().min().unwrap_or(&0),
                failed.iter().max().unwrap_or(&0),
                median(r, |m| ms(m.restart.gap)),
                median(r, |m| ms(m.restart.served_after)),
                median(r, |m| ms(m.shutdown)),
            );
        }
    }
    if pairs.len() >= 2 {
        for (v, variant) in variants.iter().enumerate() {
            let served = |i: usize| median(&results[i][v], |m| ms(m.restart.served_after));
            println!(
                "{}: old gone → served, {} / {}: {:.2}×",
                variant.name(),
                pairs[1].name,
                pairs[0].name,
                served(1) / served(0).max(1e-3)
            );
        }
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One pair started afresh, node B's gateway restarted under the load.
async fn once(env: &Env, pair: &PairSpec, variant: Variant) -> anyhow::Result<Measured> {
    let zds_a = ZdsDouble::bind(&env.dir.join("node-a.sock"))?;
    let zds_b = ZdsDouble::bind(&env.dir.join("node-b.sock"))?;
    let a = NodeProc::start(env, pair, "node-a", &env.topo.na)?;
    let mut b = NodeProc::start(env, pair, "node-b", &env.topo.nb)?;
    let pod_b = || (pod_spec("server"), InpodTopology::netns_path(&env.topo.pb));
    let up = async {
        let (server, netns) = pod_b();
        let agents = tokio::try_join!(
            node_agent(
                &zds_a,
                vec![(pod_spec("client"), InpodTopology::netns_path(&env.topo.pa))]
            ),
            node_agent(&zds_b, vec![(server, netns)]),
        )?;
        first_round_trip(env).await?;
        Ok::<_, anyhow::Error>(agents)
    };
    let (_agent_a, agent_b) = match up.await {
        Ok(x) => x,
        Err(e) => bail!(
            "not up: {e:#}\n--- node-a log ---\n{}\n--- node-b log ---\n{}",
            a.log_tail(),
            b.log_tail()
        ),
    };
    let dst = std::net::SocketAddr::new(env.topo.pod_b().into(), ECHO);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let load = env
        .pod_a
        .handle
        .spawn(connection_every(dst, EVERY, stop_rx));
    // The load's pacing before the event (not a wait for one).
    tokio::time::sleep(BEFORE).await;
    let stopping = Instant::now();
    let (b, went) = tokio::task::spawn_blocking(move || {
        let went = b.stop(variant.signal(), SHUTDOWN_WITHIN);
        (b, went)
    })
    .await?;
    drop(b);
    let gone = Instant::now();
    drop(agent_b);
    let new_b = NodeProc::start(env, pair, "node-b", &env.topo.nb)?;
    let (server, netns) = pod_b();
    let readopted = node_agent(&zds_b, vec![(server, netns)]).await;
    if let Err(e) = readopted {
        bail!(
            "the new node-B gateway took no pod: {e:#}\n--- its log ---\n{}",
            new_b.log_tail()
        );
    }
    tokio::time::sleep(AFTER).await;
    let _ = stop_tx.send(true);
    let seen = tokio::time::timeout(UP_WITHIN, load)
        .await
        .context("the load did not stop")??;
    drop((a, new_b));
    Ok(Measured {
        restart: Restart::from_load(&seen, gone),
        shutdown: gone - stopping,
        shut_down_by_itself: went,
    })
}
