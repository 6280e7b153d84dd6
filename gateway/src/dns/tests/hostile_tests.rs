//! Hostile messages and TCP clients: each gets its own outcome, counted,
//! and the other clients keep being answered.

use super::*;

fn short_timeout() -> DnsConfig {
    DnsConfig {
        timeout: Duration::from_millis(300),
        ..Default::default()
    }
}

/// A store name and a forwarded one, over UDP and TCP: still answered.
async fn still_answered(pod: SocketAddr) {
    assert_eq!(ips(&ask_udp(pod, &query("web.")).await), ["10.134.0.1"]);
    assert_eq!(ips(&ask_tcp(pod, &query("web.")).await), ["10.134.0.1"]);
    let m = ask_udp(pod, &query("outside.example.")).await;
    assert_eq!(ips(&m), ["10.135.0.7"]);
}

/// `query` with its question count set to `n`.
fn claiming(n: u16) -> Vec<u8> {
    let mut b = query("web.").to_vec().unwrap();
    b[4..6].copy_from_slice(&n.to_be_bytes());
    b
}

/// A header claiming one question whose name is a pointer to itself.
fn pointer_loop() -> Vec<u8> {
    let mut b = query("web.").to_vec().unwrap();
    b.truncate(12);
    b.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
    b
}

fn fifty_questions() -> Vec<u8> {
    let mut m = query("web.");
    for i in 1..50 {
        m.add_query(Query::query(
            Name::from_ascii(format!("q{i}.example.")).unwrap(),
            RecordType::A,
        ));
    }
    m.to_vec().unwrap()
}

#[tokio::test]
async fn malformed_messages_get_formerr_over_udp_and_tcp() {
    let up = upstream().await;
    let p = proxy(DnsConfig::default(), up.addr);
    let pod = serve(&p, 1).await[0].0;
    let hostile = [
        ("a compression pointer loop", pointer_loop()),
        ("50 questions", fifty_questions()),
        ("QDCOUNT 50, one question", claiming(50)),
        ("QDCOUNT 0, a question after the header", claiming(0)),
        ("QDCOUNT 65535", claiming(u16::MAX)),
    ];
    let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut t = TcpStream::connect(pod).await.unwrap();
    for (what, bytes) in &hostile {
        c.send_to(bytes, pod).await.unwrap();
        let mut buf = vec![0u8; 65_535];
        let n = tokio::time::timeout(Duration::from_secs(10), c.recv(&mut buf))
            .await
            .expect(what)
            .unwrap();
        let m = Message::from_vec(&buf[..n]).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr, "{what}");
        assert_eq!(buf[..2], bytes[..2], "{what}: the query's id");
        // Over one TCP connection, which stays open.
        send_framed(&mut t, bytes).await;
        let m = recv_framed(&mut t).await;
        assert_eq!(
            m.metadata.response_code,
            ResponseCode::FormErr,
            "{what} over TCP"
        );
    }
    let n = hostile.len() as u64;
    assert_eq!(answered(&p, "invalid", "formerr", "udp"), n);
    assert_eq!(answered(&p, "invalid", "formerr", "tcp"), n);
    send_framed(&mut t, &query("web.").to_vec().unwrap()).await;
    assert_eq!(ips(&recv_framed(&mut t).await), ["10.134.0.1"]);
    assert_eq!(up.asked.locked().len(), 0, "nothing forwarded");
    still_answered(pod).await;
}

/// Reads `s` until the proxy closes it (what it sent before is dropped).
async fn until_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(10), async {
        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await
    .expect("the proxy closes the connection");
}

#[tokio::test]
async fn tcp_clients_that_stall_or_lie_about_the_length_are_closed_and_counted() {
    let up = upstream().await;
    let p = proxy(short_timeout(), up.addr);
    let pod = serve(&p, 1).await[0].0;
    let closed = |reason| by_reason(&p.metrics.tcp_closed, reason);
    // A length past 4096: closed at once, before the timeout.
    let mut s = TcpStream::connect(pod).await.unwrap();
    s.write_all(&[0xff, 0xff, 0, 0, 0]).await.unwrap();
    until_closed(&mut s).await;
    assert_eq!(closed("oversized"), 1);
    // Half a length prefix, then nothing.
    let mut half = TcpStream::connect(pod).await.unwrap();
    half.write_all(&[0]).await.unwrap();
    // A length of 100 and 10 bytes, then nothing.
    let mut part = TcpStream::connect(pod).await.unwrap();
    part.write_all(&[0, 100]).await.unwrap();
    part.write_all(&[0; 10]).await.unwrap();
    // Nothing at all.
    let mut quiet = TcpStream::connect(pod).await.unwrap();
    // Meanwhile everyone else is answered.
    still_answered(pod).await;
    for s in [&mut half, &mut part, &mut quiet] {
        until_closed(s).await;
    }
    assert_eq!(closed("stalled"), 2);
    assert_eq!(closed("idle"), 1);
    // A length of 100, 10 bytes, then the client closes.
    let mut gone = TcpStream::connect(pod).await.unwrap();
    gone.write_all(&[0, 100, 1, 2, 3]).await.unwrap();
    gone.shutdown().await.unwrap();
    until_closed(&mut gone).await;
    eventually("the incomplete message counted", || {
        closed("incomplete") == 1
    })
    .await;
    still_answered(pod).await;
}

#[tokio::test]
async fn a_tcp_client_that_never_reads_its_answers_is_closed_and_holds_no_one_up() {
    let up = upstream().await;
    let p = proxy(short_timeout(), up.addr);
    let pod = serve(&p, 1).await[0].0;
    // A small receive buffer, and answers of about 1 KiB asked for
    // without end: the proxy's writes soon wait on the client.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let s = sock.connect(pod).await.unwrap();
    let (_read_half, mut write_half) = s.into_split();
    let q = query("many.").to_vec().unwrap();
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    let flood = tokio::spawn(async move {
        // Ends when the proxy closes (a write fails) or stops reading.
        while write_half.write_all(&framed).await.is_ok() {}
    });
    // While its answers pile up, others are answered.
    still_answered(pod).await;
    eventually("the slow reader closed", || {
        by_reason(&p.metrics.tcp_closed, "slow_reader") == 1
    })
    .await;
    flood.abort();
    still_answered(pod).await;
}
