//! `-- --ipv6`: the same in-process gateway pair (the harness's
//! `TwoNodes`) on IPv4 addresses and on IPv6 ones, in one run and one
//! private network namespace (`unshare(CLONE_NEWNET)`: its loopback gets
//! `fd00:b::2..5/128`), each beside the raw TCP baseline of its family:
//! single-stream throughput through A → HBONE → B, and new connections per
//! second (each a new CONNECT stream on the pooled tunnel, and each a new
//! tunnel: TCP + TLS + h2 + CONNECT). Prints IPv6 / IPv4 ratios. Needs root.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tidegate_e2e::{ip, Options, TwoNodes};
use tokio::net::TcpListener;

use super::{
    blast, connect_from, echo_backend, in_new_netns, rate, run as run_cmd, sink_backend, Dialer,
    Rate, Target, Throughput, RATE_CONCURRENCY,
};

/// One family's figures.
struct Family {
    name: &'static str,
    tp_raw: Throughput,
    tp_tg: Throughput,
    rate_raw: Rate,
    streams: Rate,
    tunnels: Rate,
}

fn v6(host: u16) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xb, 0, 0, 0, 0, 0, host))
}

/// The gateway pair on `ips` (echo, client, other, locked) and its figures.
async fn measure(name: &'static str, ips: [IpAddr; 4]) -> anyhow::Result<Family> {
    let nodes = TwoNodes::with_ips(ips, Options::default()).await;
    let echo_ip = ips[0];
    let sink_l = TcpListener::bind(SocketAddr::new(echo_ip, 0)).await?;
    let sink = sink_l.local_addr()?;
    let mut sink_rx = sink_backend(sink_l);
    let echo_l = TcpListener::bind(SocketAddr::new(echo_ip, 0)).await?;
    let echo = echo_l.local_addr()?;
    tokio::spawn(echo_backend(echo_l));
    let listen = SocketAddr::new(nodes.capture.addr.ip(), 0);
    let to_sink =
        tidegate_e2e::Capture::start_at(nodes.client.outbound.clone(), sink, listen).await;
    let to_echo =
        tidegate_e2e::Capture::start_at(nodes.client.outbound.clone(), echo, listen).await;
    // Warm the pooled tunnel (the first CONNECT dials it).
    let mut warm = to_echo.connect(nodes.client_ip).await;
    super::round_trip(&mut warm, b"x", &mut [0u8; 1]).await?;
    drop(warm);

    let best = |a: Throughput, b: Throughput| if a.mbps() >= b.mbps() { a } else { b };
    let mut tp_raw = Throughput::default();
    let mut tp_tg = Throughput::default();
    for _ in 0..2 {
        tp_raw = best(
            tp_raw,
            blast(connect_from(None, sink).await?, &mut sink_rx).await?,
        );
        tp_tg = best(
            tp_tg,
            blast(to_sink.connect(nodes.client_ip).await, &mut sink_rx).await?,
        );
    }
    let rate_raw = rate(Arc::new(Target::Raw(echo)), RATE_CONCURRENCY).await;
    let streams = rate(
        Arc::new(Target::Captured {
            capture: to_echo,
            src: nodes.client_ip,
        }),
        RATE_CONCURRENCY,
    )
    .await;
    let dialer = Dialer::client_to_echo(&nodes, echo_ip, echo);
    let tunnels = rate(Arc::new(Target::Tunnel(Box::new(dialer))), RATE_CONCURRENCY).await;
    Ok(Family {
        name,
        tp_raw,
        tp_tg,
        rate_raw,
        streams,
        tunnels,
    })
}

fn print(f: &Family) {
    println!(
        "    {}  throughput  raw TCP {:>7.0} MB/s   tidegate {:>7.0} MB/s ({:.1} % of raw)",
        f.name,
        f.tp_raw.mbps(),
        f.tp_tg.mbps(),
        100.0 * f.tp_tg.mbps() / f.tp_raw.mbps()
    );
    println!("    {}  new TCP connections        {}", f.name, f.rate_raw);
    println!("    {}  new streams, pooled tunnel {}", f.name, f.streams);
    println!("    {}  new tunnels                {}", f.name, f.tunnels);
}

pub fn run() -> anyhow::Result<()> {
    println!(
        "\n[v6] IPv6 beside IPv4: the in-process gateway pair on each family, same run, \
         private network namespace; {RATE_CONCURRENCY} concurrent for the rates"
    );
    let (v4, v6f) = in_new_netns(|| {
        run_cmd("ip", &["link", "set", "lo", "up"])?;
        for host in 2..=5 {
            let a = format!("{}/128", v6(host));
            run_cmd("ip", &["addr", "add", &a, "dev", "lo", "nodad"])?;
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let r = rt.block_on(async {
            let v4 = measure("IPv4", [2, 3, 4, 5].map(|h| ip(213, h))).await?;
            let v6f = measure("IPv6", [2, 3, 4, 5].map(v6)).await?;
            anyhow::Ok((v4, v6f))
        });
        rt.shutdown_timeout(Duration::from_secs(2));
        r
    })?;
    print(&v4);
    print(&v6f);
    let ratio = |a: f64, b: f64| a / b.max(1e-9);
    println!(
        "    IPv6 / IPv4: throughput {:.2} (raw TCP {:.2}); new streams/s {:.2}; new tunnels/s {:.2} (raw TCP {:.2})",
        ratio(v6f.tp_tg.mbps(), v4.tp_tg.mbps()),
        ratio(v6f.tp_raw.mbps(), v4.tp_raw.mbps()),
        ratio(v6f.streams.per_sec(), v4.streams.per_sec()),
        ratio(v6f.tunnels.per_sec(), v4.tunnels.per_sec()),
        ratio(v6f.rate_raw.per_sec(), v4.rate_raw.per_sec()),
    );
    Ok(())
}
