//! The pod's cache in the data path: counted at the upstream double.

use super::*;
use crate::config::DnsCacheConfig;

#[tokio::test]
async fn a_repeated_forwarded_name_is_asked_upstream_once_per_pod() {
    let up = upstream().await;
    let p = proxy(DnsConfig::default(), up.addr);
    let pods = serve(&p, 2).await;
    let pod = pods[0].0;
    let first = ask_udp(pod, &query("outside.example.")).await;
    assert_eq!(ips(&first), ["10.135.0.7"]);
    assert_eq!(first.answers[0].ttl, 30);
    // Again over UDP with another id and letter case, and over TCP: from
    // the cache, the upstream not asked.
    let again = ask_udp(pod, &query("Outside.EXAMPLE.")).await;
    assert_eq!(ips(&again), ["10.135.0.7"]);
    assert_eq!(again.queries[0].name().to_ascii(), "Outside.EXAMPLE.");
    assert!(again.answers[0].ttl <= 30);
    let tcp = ask_tcp(pod, &query("outside.example.")).await;
    assert_eq!(ips(&tcp), ["10.135.0.7"]);
    assert_eq!(up.asked("outside.example."), 1);
    assert_eq!(
        (p.metrics.cache_hits.get(), p.metrics.cache_misses.get()),
        (2, 1)
    );
    assert_eq!(p.metrics.cache_entries.get(), 1);
    assert_eq!(answered(&p, "forwarded", "noerror", "udp"), 2);
    assert_eq!(answered(&p, "forwarded", "noerror", "tcp"), 1);
    // Another pod has a cache of its own.
    assert_eq!(
        ips(&ask_udp(pods[1].0, &query("outside.example.")).await),
        ["10.135.0.7"]
    );
    assert_eq!(up.asked("outside.example."), 2);
    assert_eq!(p.metrics.cache_entries.get(), 2);
    // A pod's listeners close: its entries go with it.
    pods[1].1.start(Duration::ZERO);
    eventually("pod 1's cache dropped", || {
        p.metrics.cache_entries.get() == 1
    })
    .await;
}

#[tokio::test]
async fn nxdomain_with_an_soa_is_kept_and_servfail_is_not() {
    let up = upstream().await;
    let p = proxy(DnsConfig::default(), up.addr);
    let pod = serve(&p, 1).await[0].0;
    for _ in 0..2 {
        let m = ask_udp(pod, &query("gone.example.")).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        let m = ask_udp(pod, &query("fail.example.")).await;
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
        let m = ask_udp(pod, &query("bare.example.")).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    }
    assert_eq!(up.asked("gone.example."), 1, "kept for its SOA minimum");
    assert_eq!(up.asked("fail.example."), 2, "SERVFAIL is never kept");
    assert_eq!(up.asked("bare.example."), 2, "no SOA: not kept");
    assert_eq!(by_reason(&p.metrics.cache_not_stored, "rcode"), 2);
    assert_eq!(by_reason(&p.metrics.cache_not_stored, "no_soa"), 2);
}

#[tokio::test]
async fn a_kept_answer_is_cut_for_a_udp_clients_buffer() {
    // 60 addresses: about 1 KiB, past a 512-byte client.
    let up = upstream_with(Arc::new(|q: &Message| {
        let mut m = usual_answer(q);
        m.metadata.response_code = ResponseCode::NoError;
        m.add_answers((0..60).map(|i| {
            Record::from_rdata(
                q.queries[0].name().clone(),
                30,
                RData::A(A(Ipv4Addr::new(10, 135, 1, i))),
            )
        }));
        Some(m)
    }))
    .await;
    let p = proxy(DnsConfig::default(), up.addr);
    let pod = serve(&p, 1).await[0].0;
    // Fetched with EDNS over TCP (a 4 KiB buffer): kept whole.
    let m = ask_tcp(pod, &with_edns(query("big.example."))).await;
    assert_eq!(m.answers.len(), 60);
    // The same query over UDP with a 4 KiB buffer: whole, from the cache.
    let m = ask_udp(pod, &with_edns(query("big.example."))).await;
    assert_eq!(m.answers.len(), 60);
    assert_eq!(p.metrics.truncated.get(), 0);
    // With a 512-byte EDNS buffer (the same key): cut, so it asks over TCP.
    let mut small = with_edns(query("big.example."));
    if let Some(e) = small.edns.as_mut() {
        e.set_max_payload(512);
    }
    let m = ask_udp(pod, &small).await;
    assert!(m.metadata.truncation && m.answers.is_empty());
    assert_eq!(m.queries, small.queries);
    assert_eq!(p.metrics.truncated.get(), 1);
    assert_eq!(up.asked("big.example."), 1);
    assert_eq!(p.metrics.cache_hits.get(), 2);
}

#[tokio::test]
async fn max_entries_0_asks_upstream_every_time() {
    let up = upstream().await;
    let config = DnsConfig {
        cache: DnsCacheConfig {
            max_entries: 0,
            ..Default::default()
        },
        ..Default::default()
    };
    let p = proxy(config, up.addr);
    let pod = serve(&p, 1).await[0].0;
    for _ in 0..3 {
        assert_eq!(
            ips(&ask_udp(pod, &query("outside.example.")).await),
            ["10.135.0.7"]
        );
    }
    assert_eq!(up.asked("outside.example."), 3);
    assert_eq!(
        (p.metrics.cache_hits.get(), p.metrics.cache_misses.get()),
        (0, 0)
    );
    assert_eq!(p.metrics.cache_entries.get(), 0);
}
