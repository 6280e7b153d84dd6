//! A forwarding loop: the upstream server relays every query, as it came,
//! back to the pod's 15053.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// A relay on 127.0.0.1 (UDP and TCP on one port) that sends each query it
/// gets, unchanged, to `to` over UDP and returns what comes back; counts
/// the queries.
struct Relay {
    addr: SocketAddr,
    got: Arc<AtomicUsize>,
}

async fn relay_to(to: Arc<Mutex<Option<SocketAddr>>>) -> Relay {
    let (tcp, udp) = bind_pair().await;
    let addr = tcp.local_addr().unwrap();
    let got = Arc::new(AtomicUsize::new(0));
    let ask = {
        let got = got.clone();
        move |q: Vec<u8>| {
            let (got, to) = (got.clone(), to.clone());
            async move {
                got.fetch_add(1, Ordering::SeqCst);
                let to = (*to.locked())?;
                let s = UdpSocket::bind("127.0.0.1:0").await.ok()?;
                s.send_to(&q, to).await.ok()?;
                let mut buf = vec![0u8; 65_535];
                let n = s.recv(&mut buf).await.ok()?;
                buf.truncate(n);
                Some(buf)
            }
        }
    };
    let udp = Arc::new(udp);
    let udp_ask = ask.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let (udp, q, ask) = (udp.clone(), buf[..n].to_vec(), udp_ask.clone());
            tokio::spawn(async move {
                if let Some(reply) = ask(q).await {
                    let _ = udp.send_to(&reply, from).await;
                }
            });
        }
    });
    tokio::spawn(async move {
        while let Ok((mut s, _)) = tcp.accept().await {
            let ask = ask.clone();
            tokio::spawn(async move {
                let Ok(len) = s.read_u16().await else { return };
                let mut q = vec![0u8; len.into()];
                if s.read_exact(&mut q).await.is_err() {
                    return;
                }
                if let Some(reply) = ask(q).await {
                    send_framed(&mut s, &reply).await;
                }
            });
        }
    });
    Relay { addr, got }
}

#[tokio::test]
async fn a_query_the_proxy_sent_that_comes_back_twice_is_servfail_at_once() {
    let target = Arc::new(Mutex::new(None));
    let relay = relay_to(target.clone()).await;
    let p = proxy(DnsConfig::default(), relay.addr);
    let pods = serve(&p, 2).await;
    // The relay sends what it gets to pod 0's 15053.
    *target.locked() = Some(pods[0].0);
    for (n, tcp) in [(1, false), (2, true)] {
        let q = query("outside.example.");
        let m = if tcp {
            ask_tcp(pods[0].0, &q).await
        } else {
            ask_udp(pods[0].0, &q).await
        };
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
        // Once, once more marked (it might have been a pod's query), no more.
        assert_eq!(relay.got.load(Ordering::SeqCst), 2 * n, "two rounds");
        assert_eq!(by_reason(&p.metrics.forward_failures, "loop"), n as u64);
    }
    // Through another pod's 15053: the gateway's queries are one set.
    *target.locked() = Some(pods[1].0);
    let m = ask_udp(pods[0].0, &query("outside.example.")).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(relay.got.load(Ordering::SeqCst), 6);
    assert_eq!(by_reason(&p.metrics.forward_failures, "loop"), 3);
    eventually("no forward left in flight", || {
        p.metrics.in_flight.get() == 0
    })
    .await;
    // SERVFAIL is not kept; the store still answers.
    assert_eq!(p.metrics.cache_entries.get(), 0);
    assert_eq!(
        ips(&ask_udp(pods[0].0, &query("web.")).await),
        ["10.134.0.1"]
    );
}

#[tokio::test]
async fn a_pods_query_that_draws_the_id_of_one_in_flight_is_forwarded() {
    // The upstream holds every query under `blackhole.`.
    let up = upstream_with(Arc::new(|q: &Message| {
        let name = q.queries[0].name().to_ascii();
        (!name.ends_with("blackhole.")).then(|| usual_answer(q))
    }))
    .await;
    let config = DnsConfig {
        timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let p = proxy(config, up.addr);
    let pods = serve(&p, 2).await;
    let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    c.send_to(&query("x.blackhole.").to_vec().unwrap(), pods[0].0)
        .await
        .unwrap();
    eventually("pod 0's query upstream", || up.asked("x.blackhole.") == 1).await;
    // Pod 1 asks the same name with the very id the proxy sent upstream.
    let mut same = query("x.blackhole.");
    same.metadata.id = up.ids("x.blackhole.")[0];
    c.send_to(&same.to_vec().unwrap(), pods[1].0).await.unwrap();
    eventually("pod 1's query upstream", || up.asked("x.blackhole.") == 2).await;
    assert_eq!(by_reason(&p.metrics.forward_failures, "loop"), 0);
    assert_eq!(p.metrics.in_flight.get(), 2);
    // And a third, with the id the proxy gave pod 1's: two in a row.
    let mut third = query("x.blackhole.");
    third.metadata.id = up.ids("x.blackhole.")[1];
    let m = ask_udp(pods[0].0, &third).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert_eq!(by_reason(&p.metrics.forward_failures, "loop"), 1);
}
