//! One pod's DNS proxy: its UDP and TCP loops on 15053, until the pod's
//! listeners close.
//!
//! Store answers and malformed queries are answered inline. A forwarded
//! query first takes a place among the pod's (`dns.max_in_flight_per_pod`),
//! then among the gateway's (`dns.max_in_flight`); with none free it is
//! answered REFUSED at once and counted, so a pod flooding names that time
//! out upstream holds at most its own share: the store's answers, and
//! other pods' queries, go on. A UDP forward runs as a task of its own
//! (the loop keeps reading); a TCP connection handles its queries in turn.
//! A pod keeps at most `dns.max_tcp_connections_per_pod` TCP connections
//! open, and all pods together `dns.max_tcp_connections` (each holds a
//! descriptor out of the pods' share, `descriptor_budget.rs`), each closed
//! after `dns.timeout` without a query; one past either is closed at
//! accept, counted (`pod_tcp`, `gateway_tcp`) and logged naming the pod (at
//! most ten lines a second). A failed accept (EMFILE) pauses the loop
//! instead of spinning on it.
//! A query to forward is first looked for in the pod's cache, and
//! checked for a loop ([`DnsProxy::answer_here`]); each step of a TCP
//! connection is bounded by `dns.timeout` ([`super::tcp`]).

use std::sync::Arc;

use hickory_proto::op::ResponseCode;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, debug_span, info, Instrument as _};

use super::cache::Cache;
use super::forward::Place;
use super::handler::{self, Action, Forward};
use super::wire::Transport;
use super::{tcp, DnsProxy};
use tidegate_base::shutdown::ShutdownWatch;

/// The DNS proxy of one pod.
pub struct PodDns {
    proxy: Arc<DnsProxy>,
    uid: String,
    namespace: String,
    place: Place,
    /// Forwarded queries in flight from this pod.
    in_flight: Arc<Semaphore>,
    /// TCP connections open from this pod.
    tcp: Arc<Semaphore>,
    /// Its forwarded answers.
    cache: Cache,
}

/// The places a forwarded query holds until it is answered, or a TCP
/// connection until it closes: the pod's, the gateway's, and its count in
/// `gauge`.
struct Permits {
    _pod: OwnedSemaphorePermit,
    _gateway: OwnedSemaphorePermit,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Drop for Permits {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// A failed accept on 15053/tcp waits this long before the next.
const ACCEPT_ERROR_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// The first step of a query.
enum Step {
    /// Send this (nothing: dropped).
    Done(Option<Vec<u8>>),
    /// Ask upstream, holding these places.
    Forward(Box<Forward>, Permits),
}

impl PodDns {
    pub(super) fn new(proxy: Arc<DnsProxy>, uid: &str, namespace: &str, place: Place) -> Arc<Self> {
        let per_pod = proxy.per_pod;
        let cache = proxy.cache();
        Arc::new(PodDns {
            uid: uid.to_owned(),
            namespace: namespace.to_owned(),
            place,
            in_flight: Arc::new(Semaphore::new(per_pod)),
            tcp: Arc::new(Semaphore::new(proxy.tcp_per_pod)),
            cache,
            proxy,
        })
    }

    /// Answers what can be answered at once; takes the places of a forward.
    fn start(&self, bytes: &[u8], t: Transport) -> Step {
        let m = &self.proxy.metrics;
        match self.proxy.handle(&self.namespace, bytes, t) {
            Action::Drop(reason) => {
                m.dropped(reason);
                debug!(pod = %self.uid, reason, protocol = t.label(), "DNS message dropped");
                Step::Done(None)
            }
            Action::Reply(r) => {
                m.answered(r.source, handler::rcode_label(r.rcode), t);
                Step::Done(Some(r.bytes))
            }
            Action::Forward(mut f) => {
                if let Some(bytes) = self.proxy.answer_here(&self.uid, &self.cache, &mut f, t) {
                    return Step::Done(Some(bytes));
                }
                let limit = match self.in_flight.clone().try_acquire_owned() {
                    Err(_) => "pod",
                    Ok(pod) => match self.proxy.in_flight.clone().try_acquire_owned() {
                        Err(_) => "gateway",
                        Ok(gateway) => {
                            m.in_flight.inc();
                            let permits = Permits {
                                _pod: pod,
                                _gateway: gateway,
                                gauge: m.in_flight.clone(),
                            };
                            return Step::Forward(Box::new(f), permits);
                        }
                    },
                };
                m.refused(limit);
                m.answered("forwarded", "refused", t);
                debug!(pod = %self.uid, limit, "DNS query refused: forwarded queries in flight at their cap");
                Step::Done(Some(handler::error_to(&f.query, ResponseCode::Refused)))
            }
        }
    }

    /// Asks upstream; the answer for the pod (SERVFAIL when none came).
    async fn finish(&self, f: Box<Forward>, permits: Permits, t: Transport) -> Vec<u8> {
        let m = &self.proxy.metrics;
        let result = self.proxy.forwarder.forward(&f, &self.place, t).await;
        drop(permits);
        match result {
            Ok(reply) => {
                let now = tokio::time::Instant::now();
                self.cache
                    .store(f.key.as_ref(), &reply, f.question_end, now);
                let (bytes, truncated) = handler::relay(reply, &f.query, t);
                if truncated {
                    m.truncated.inc();
                }
                let rcode = handler::rcode_label(handler::rcode_of(&bytes));
                m.answered("forwarded", rcode, t);
                debug!(rcode, truncated, "DNS query answered upstream");
                bytes
            }
            Err(e) => {
                m.forward_failed(e.reason());
                m.answered("forwarded", "servfail", t);
                debug!(error = %e, "DNS query not answered upstream; SERVFAIL");
                handler::error_to(&f.query, ResponseCode::ServFail)
            }
        }
    }

    fn span(&self, f: &Forward, t: Transport) -> tracing::Span {
        let (name, qtype) = f
            .query
            .queries
            .first()
            .map(|q| (q.name().to_string(), q.query_type().to_string()))
            .unwrap_or_default();
        debug_span!("dns_forward", pod = %self.uid, namespace = %self.namespace, name, qtype, protocol = t.label())
    }

    /// Serves `socket` until `stop`.
    pub async fn serve_udp(self: Arc<Self>, socket: UdpSocket, mut stop: ShutdownWatch) {
        let socket = Arc::new(socket);
        loop {
            tokio::select! {
                _ = stop.signaled() => return,
                r = socket.readable() => if let Err(e) = r {
                    debug!(pod = %self.uid, error = %e, "DNS: 15053/udp not readable");
                    continue;
                },
            }
            // Room for the largest datagram only while datagrams wait: an
            // idle pod holds no buffer (one of 64 KiB a listener was most
            // of an idle pod's memory); never zeroed, the kernel writes
            // what arrives.
            let mut buf: Vec<u8> = Vec::with_capacity(65_535);
            loop {
                buf.clear();
                let (n, from) = match socket.try_recv_buf_from(&mut buf) {
                    Ok(r) => r,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        // An ICMP error for an earlier reply: the next
                        // datagram is read as usual.
                        debug!(pod = %self.uid, error = %e, "DNS: receive on 15053/udp");
                        continue;
                    }
                };
                self.udp_query(&socket, &buf[..n], from, &stop);
            }
        }
    }

    /// One datagram: answered at once, or forwarded on a task of its own.
    fn udp_query(
        self: &Arc<Self>,
        socket: &Arc<UdpSocket>,
        bytes: &[u8],
        from: std::net::SocketAddr,
        stop: &ShutdownWatch,
    ) {
        match self.start(bytes, Transport::Udp) {
            Step::Done(None) => {}
            Step::Done(Some(reply)) => {
                let _ = socket.try_send_to(&reply, from);
            }
            Step::Forward(f, permits) => {
                let (me, socket, mut stop) = (self.clone(), socket.clone(), stop.clone());
                let span = self.span(&f, Transport::Udp);
                tokio::spawn(
                    async move {
                        tokio::select! {
                            _ = stop.signaled() => {}
                            reply = me.finish(f, permits, Transport::Udp) => {
                                let _ = socket.send_to(&reply, from).await;
                            }
                        }
                    }
                    .instrument(span),
                );
            }
        }
    }

    /// Accepts on `listener` until `stop`.
    pub async fn serve_tcp(self: Arc<Self>, listener: TcpListener, mut stop: ShutdownWatch) {
        loop {
            let stream = tokio::select! {
                _ = stop.signaled() => return,
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(e) => {
                        debug!(pod = %self.uid, error = %e, "DNS: accept on 15053/tcp");
                        // EMFILE does not clear by retrying at once.
                        tokio::select! {
                            _ = stop.signaled() => return,
                            _ = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => continue,
                        }
                    }
                },
            };
            let Some(permits) = self.admit_tcp() else {
                continue;
            };
            let (me, stop) = (self.clone(), stop.clone());
            tokio::spawn(async move {
                me.connection(stream, stop).await;
                drop(permits);
            });
        }
    }

    /// A place for a TCP connection just accepted, under the pod's bound
    /// and the gateway's; `None` (counted, logged): the caller closes it.
    fn admit_tcp(&self) -> Option<Permits> {
        let limit = match self.tcp.clone().try_acquire_owned() {
            Err(_) => "pod_tcp",
            Ok(pod) => match self.proxy.tcp.clone().try_acquire_owned() {
                Err(_) => "gateway_tcp",
                Ok(gateway) => {
                    let gauge = self.proxy.metrics.tcp_open.clone();
                    gauge.inc();
                    return Some(Permits {
                        _pod: pod,
                        _gateway: gateway,
                        gauge,
                    });
                }
            },
        };
        self.proxy.metrics.refused(limit);
        if let Some(left_out) = self.proxy.tcp_refusals_log.admit() {
            info!(pod = %self.uid, namespace = %self.namespace, limit, left_out,
                "DNS TCP connection closed at accept: TCP connections to 15053 at their cap (dns.max_tcp_connections_per_pod, dns.max_tcp_connections)");
        }
        None
    }

    /// One TCP connection: length-prefixed queries, answered in turn.
    async fn connection(&self, mut stream: TcpStream, mut stop: ShutdownWatch) {
        let idle = self.proxy.idle;
        let closed = |reason| {
            self.proxy.metrics.tcp_closed(reason);
            debug!(pod = %self.uid, reason, "DNS: TCP connection to 15053 closed");
        };
        loop {
            let query = tokio::select! {
                _ = stop.signaled() => return,
                r = tcp::read_query(&mut stream, idle) => match r {
                    Ok(Some(q)) => q,
                    Ok(None) => return,
                    Err(reason) => return closed(reason),
                },
            };
            let reply = match self.start(&query, Transport::Tcp) {
                Step::Done(None) => continue,
                Step::Done(Some(reply)) => reply,
                Step::Forward(f, permits) => {
                    let span = self.span(&f, Transport::Tcp);
                    tokio::select! {
                        _ = stop.signaled() => return,
                        reply = self.finish(f, permits, Transport::Tcp).instrument(span) => reply,
                    }
                }
            };
            match tcp::write_answer(&mut stream, &reply, idle).await {
                Ok(()) => {}
                Err(Some(reason)) => return closed(reason),
                Err(None) => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;

    use hickory_proto::op::{Edns, Message, Query};
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, RData, Record, RecordType};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    use super::*;
    use crate::config::DnsConfig;
    use crate::dns::metrics::{LimitLabel, QueryLabels, ReasonLabel};
    use crate::dns::DnsMetrics;
    use crate::workloads::WholeSet;
    use crate::workloads::WorkloadStore;
    use tidegate_base::shutdown::{self, ShutdownTrigger};

    /// A fake upstream server on 127.0.0.1, UDP and TCP on one port:
    /// `outside.example.` is 10.135.0.7; `big.example.` has 60 addresses
    /// (over UDP: truncated); names under `blackhole.` are never answered,
    /// each reported on `seen`.
    struct Upstream {
        addr: SocketAddr,
        seen: mpsc::UnboundedReceiver<String>,
        tcp_queries: Arc<std::sync::atomic::AtomicUsize>,
    }

    fn upstream_answer(query: &Message, over_tcp: bool) -> Option<Message> {
        let q = query.queries.first()?;
        let name = q.name().to_ascii();
        if name.ends_with("blackhole.") {
            return None;
        }
        let mut m = Message::response(query.metadata.id, query.metadata.op_code);
        m.metadata.recursion_available = true;
        m.add_query(q.clone());
        let a = |i: u8| {
            Record::from_rdata(
                q.name().clone(),
                5,
                RData::A(A(Ipv4Addr::new(10, 135, 0, i))),
            )
        };
        match name.as_str() {
            "outside.example." => {
                m.add_answer(a(7));
            }
            "big.example." if over_tcp => {
                m.add_answers((0..60).map(a));
            }
            "big.example." => m.metadata.truncation = true,
            _ => m.metadata.response_code = ResponseCode::NXDomain,
        }
        Some(m)
    }

    async fn upstream() -> Upstream {
        let (tcp, udp) = loop {
            let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            if let Ok(udp) = UdpSocket::bind(tcp.local_addr().unwrap()).await {
                break (tcp, udp);
            }
        };
        let addr = tcp.local_addr().unwrap();
        let (tx, seen) = mpsc::unbounded_channel();
        let tcp_queries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let udp_tx = tx.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65_535];
            while let Ok((n, from)) = udp.recv_from(&mut buf).await {
                let q = Message::from_vec(&buf[..n]).unwrap();
                match upstream_answer(&q, false) {
                    Some(m) => {
                        udp.send_to(&m.to_vec().unwrap(), from).await.unwrap();
                    }
                    None => {
                        let _ = udp_tx.send(q.queries[0].name().to_ascii());
                    }
                }
            }
        });
        let counted = tcp_queries.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = tcp.accept().await {
                let (tx, counted) = (tx.clone(), counted.clone());
                tokio::spawn(async move {
                    let len = s.read_u16().await.unwrap();
                    let mut q = vec![0u8; len.into()];
                    s.read_exact(&mut q).await.unwrap();
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let q = Message::from_vec(&q).unwrap();
                    match upstream_answer(&q, true) {
                        Some(m) => {
                            let b = m.to_vec().unwrap();
                            s.write_u16(b.len() as u16).await.unwrap();
                            s.write_all(&b).await.unwrap();
                        }
                        None => {
                            let _ = tx.send(q.queries[0].name().to_ascii());
                            std::future::pending::<()>().await;
                        }
                    }
                });
            }
        });
        Upstream {
            addr,
            seen,
            tcp_queries,
        }
    }

    /// A pod of namespace `shop` served on 127.0.0.1 (UDP and TCP on one
    /// port); the store has `web.shop` (10.134.0.1).
    struct Served {
        proxy: Arc<DnsProxy>,
        pods: Vec<(SocketAddr, ShutdownTrigger)>,
    }

    fn proxy(config: DnsConfig, upstream: SocketAddr) -> Arc<DnsProxy> {
        let store = WorkloadStore::new("cluster.local", "n");
        store.publish(
            WholeSet::new(vec![]).services(vec![crate::dns::answer::tests::service(
                "web",
                "shop",
                &["10.134.0.1"],
            )]),
        );
        DnsProxy::with(&config, vec![upstream], store, DnsMetrics::default())
    }

    async fn serve(proxy: &Arc<DnsProxy>, pods: usize) -> Served {
        let mut out = Vec::new();
        for i in 0..pods {
            let (tcp, udp) = loop {
                let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
                if let Ok(udp) = UdpSocket::bind(tcp.local_addr().unwrap()).await {
                    break (tcp, udp);
                }
            };
            let addr = tcp.local_addr().unwrap();
            let pod = proxy.pod(&format!("pod-{i}"), "shop", Place::Here);
            let (stop, watch) = shutdown::channel();
            tokio::spawn(pod.clone().serve_udp(udp, watch.clone()));
            tokio::spawn(pod.serve_tcp(tcp, watch));
            out.push((addr, stop));
        }
        Served {
            proxy: proxy.clone(),
            pods: out,
        }
    }

    fn query(name: &str, edns: bool) -> Message {
        let mut m = Message::query();
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        if edns {
            let mut e = Edns::new();
            e.set_max_payload(4096);
            m.set_edns(e);
        }
        m
    }

    /// A client socket that sent `q` to `to`.
    async fn send_udp(to: SocketAddr, q: &Message) -> UdpSocket {
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        c.send_to(&q.to_vec().unwrap(), to).await.unwrap();
        c
    }

    async fn recv_udp(c: &UdpSocket) -> Message {
        let mut buf = vec![0u8; 65_535];
        let n = tokio::time::timeout(Duration::from_secs(10), c.recv(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        Message::from_vec(&buf[..n]).unwrap()
    }

    async fn ask_udp(to: SocketAddr, q: &Message) -> Message {
        let c = send_udp(to, q).await;
        let m = recv_udp(&c).await;
        assert_eq!(m.metadata.id, q.metadata.id);
        m
    }

    async fn ask_tcp(s: &mut TcpStream, q: &Message) -> Message {
        let b = q.to_vec().unwrap();
        s.write_u16(b.len() as u16).await.unwrap();
        s.write_all(&b).await.unwrap();
        let len = s.read_u16().await.unwrap();
        let mut r = vec![0u8; len.into()];
        s.read_exact(&mut r).await.unwrap();
        let m = Message::from_vec(&r).unwrap();
        assert_eq!(m.metadata.id, q.metadata.id);
        m
    }

    fn ips(m: &Message) -> Vec<String> {
        m.answers.iter().map(|r| r.data.to_string()).collect()
    }

    fn count(
        p: &DnsProxy,
        source: &'static str,
        rcode: &'static str,
        protocol: &'static str,
    ) -> u64 {
        p.metrics
            .queries
            .get_or_create(&QueryLabels {
                source,
                rcode,
                protocol,
            })
            .get()
    }

    #[tokio::test]
    async fn store_names_are_answered_here_and_others_upstream_over_udp_and_tcp() {
        let up = upstream().await;
        let s = serve(&proxy(DnsConfig::default(), up.addr), 1).await;
        let pod = s.pods[0].0;
        let m = ask_udp(pod, &query("web.", false)).await;
        assert_eq!(ips(&m), ["10.134.0.1"]);
        assert!(m.metadata.authoritative);
        let m = ask_udp(pod, &query("outside.example.", false)).await;
        assert_eq!(ips(&m), ["10.135.0.7"]);
        assert!(!m.metadata.authoritative, "relayed as the upstream said");
        let m = ask_udp(pod, &query("nope.example.", false)).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        // Both over one TCP connection, in turn.
        let mut c = TcpStream::connect(pod).await.unwrap();
        let m = ask_tcp(&mut c, &query("web.shop.svc.cluster.local.", false)).await;
        assert_eq!(ips(&m), ["10.134.0.1"]);
        let m = ask_tcp(&mut c, &query("outside.example.", false)).await;
        assert_eq!(ips(&m), ["10.135.0.7"]);
        let p = &s.proxy;
        assert_eq!(count(p, "store", "noerror", "udp"), 1);
        assert_eq!(count(p, "forwarded", "noerror", "udp"), 1);
        assert_eq!(count(p, "forwarded", "nxdomain", "udp"), 1);
        assert_eq!(count(p, "store", "noerror", "tcp"), 1);
        assert_eq!(count(p, "forwarded", "noerror", "tcp"), 1);
        assert_eq!(p.metrics.in_flight.get(), 0);
    }

    #[tokio::test]
    async fn a_truncated_upstream_answer_is_asked_again_over_tcp() {
        let up = upstream().await;
        let s = serve(&proxy(DnsConfig::default(), up.addr), 1).await;
        let pod = s.pods[0].0;
        // With a 4 KiB buffer the whole answer, fetched over TCP, fits.
        let m = ask_udp(pod, &query("big.example.", true)).await;
        assert!(!m.metadata.truncation);
        assert_eq!(m.answers.len(), 60);
        assert_eq!(up.tcp_queries.load(std::sync::atomic::Ordering::SeqCst), 1);
        // Without EDNS (512 bytes) it is cut: the pod asks over TCP.
        let m = ask_udp(pod, &query("big.example.", false)).await;
        assert!(m.metadata.truncation && m.answers.is_empty());
        assert_eq!(s.proxy.metrics.truncated.get(), 1);
        let mut c = TcpStream::connect(pod).await.unwrap();
        let m = ask_tcp(&mut c, &query("big.example.", false)).await;
        assert_eq!(m.answers.len(), 60);
    }

    #[tokio::test]
    async fn an_unanswered_forward_is_servfail_after_the_timeout() {
        let mut up = upstream().await;
        let config = DnsConfig {
            timeout: Duration::from_millis(100),
            ..Default::default()
        };
        let s = serve(&proxy(config, up.addr), 1).await;
        let m = ask_udp(s.pods[0].0, &query("x.blackhole.", false)).await;
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
        assert_eq!(up.seen.recv().await.unwrap(), "x.blackhole.");
        let failures = s
            .proxy
            .metrics
            .forward_failures
            .get_or_create(&ReasonLabel { reason: "timeout" })
            .get();
        assert_eq!(failures, 1);
        assert_eq!(count(&s.proxy, "forwarded", "servfail", "udp"), 1);
        assert_eq!(s.proxy.metrics.in_flight.get(), 0);
    }

    #[tokio::test]
    async fn a_flooding_pod_is_refused_past_its_share_and_the_rest_is_answered() {
        let mut up = upstream().await;
        let config = DnsConfig {
            timeout: Duration::from_secs(60),
            max_in_flight: 3,
            max_in_flight_per_pod: 2,
            ..Default::default()
        };
        let s = serve(&proxy(config, up.addr), 3).await;
        let (flooder, other, third) = (s.pods[0].0, s.pods[1].0, s.pods[2].0);
        // Two names that never come back take the flooding pod's share.
        let mut held = Vec::new();
        for i in 0..2 {
            held.push(send_udp(flooder, &query(&format!("f{i}.blackhole."), false)).await);
        }
        for _ in 0..2 {
            up.seen.recv().await.unwrap();
        }
        assert_eq!(s.proxy.metrics.in_flight.get(), 2);
        // The third is refused at once.
        let m = ask_udp(flooder, &query("f2.blackhole.", false)).await;
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        let refused = |limit| {
            s.proxy
                .metrics
                .refused
                .get_or_create(&LimitLabel { limit })
                .get()
        };
        assert_eq!(refused("pod"), 1);
        // The store still answers the flooding pod; another pod's
        // forwarded names are answered upstream.
        assert_eq!(
            ips(&ask_udp(flooder, &query("web.", false)).await),
            ["10.134.0.1"]
        );
        assert_eq!(
            ips(&ask_udp(other, &query("outside.example.", false)).await),
            ["10.135.0.7"]
        );
        // The other pod's own unanswered name takes the gateway's last
        // place: a third pod is refused by the gateway's cap.
        held.push(send_udp(other, &query("o.blackhole.", false)).await);
        up.seen.recv().await.unwrap();
        let m = ask_udp(third, &query("outside.example.", false)).await;
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        assert_eq!(refused("gateway"), 1);
        assert_eq!(s.proxy.metrics.in_flight.get(), 3);
        // The pods' listeners close: their forwards end with them.
        for (_, stop) in &s.pods {
            stop.start(Duration::ZERO);
        }
        let gauge = s.proxy.metrics.in_flight.clone();
        tokio::time::timeout(Duration::from_secs(10), async {
            while gauge.get() != 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the forwards in flight ended with the listeners");
    }

    /// Whether the proxy closed `c` (EOF or reset) within 10 s.
    async fn closed_by_proxy(c: &mut TcpStream) -> bool {
        let mut b = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(10), c.read(&mut b)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn idle_tcp_connections_are_closed_at_accept_past_the_pods_bound_and_the_gateways() {
        let up = upstream().await;
        let config = DnsConfig {
            timeout: Duration::from_secs(60),
            max_tcp_connections: 3,
            max_tcp_connections_per_pod: 2,
            ..Default::default()
        };
        let s = serve(&proxy(config, up.addr), 2).await;
        let (first, second) = (s.pods[0].0, s.pods[1].0);
        let refused = |limit| {
            s.proxy
                .metrics
                .refused
                .get_or_create(&LimitLabel { limit })
                .get()
        };
        // The first pod holds its two; a third of its own is closed.
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut c = TcpStream::connect(first).await.unwrap();
            ask_tcp(&mut c, &query("web.", false)).await;
            held.push(c);
        }
        let mut over = TcpStream::connect(first).await.unwrap();
        assert!(closed_by_proxy(&mut over).await);
        assert_eq!(refused("pod_tcp"), 1);
        // The second pod takes the gateway's last place; its next is
        // closed by the gateway's bound, not its own.
        let mut c = TcpStream::connect(second).await.unwrap();
        ask_tcp(&mut c, &query("web.", false)).await;
        held.push(c);
        assert_eq!(s.proxy.metrics.tcp_open.get(), 3);
        let mut over = TcpStream::connect(second).await.unwrap();
        assert!(closed_by_proxy(&mut over).await);
        assert_eq!(refused("gateway_tcp"), 1);
        // UDP is answered all along.
        assert_eq!(
            ips(&ask_udp(second, &query("web.", false)).await),
            ["10.134.0.1"]
        );
        // A connection closed gives its places back.
        drop(held.remove(0));
        let gauge = s.proxy.metrics.tcp_open.clone();
        tokio::time::timeout(Duration::from_secs(10), async {
            while gauge.get() != 2 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the closed connection's places are given back");
        let mut c = TcpStream::connect(second).await.unwrap();
        assert_eq!(
            ips(&ask_tcp(&mut c, &query("web.", false)).await),
            ["10.134.0.1"]
        );
    }

    #[tokio::test]
    async fn garbage_is_dropped_and_counted_and_the_listener_goes_on() {
        let up = upstream().await;
        let s = serve(&proxy(DnsConfig::default(), up.addr), 1).await;
        let pod = s.pods[0].0;
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        c.send_to(b"hello", pod).await.unwrap();
        // A header and a question cut short: FORMERR.
        let good = query("web.", false).to_vec().unwrap();
        c.send_to(&good[..good.len() - 2], pod).await.unwrap();
        let m = recv_udp(&c).await;
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
        assert_eq!(
            ips(&ask_udp(pod, &query("web.", false)).await),
            ["10.134.0.1"]
        );
        let dropped = s
            .proxy
            .metrics
            .dropped
            .get_or_create(&ReasonLabel { reason: "short" })
            .get();
        assert_eq!(dropped, 1);
        assert_eq!(count(&s.proxy, "invalid", "formerr", "udp"), 1);
        // Over TCP too: garbage, then a good query on the same connection.
        let mut t = TcpStream::connect(pod).await.unwrap();
        t.write_all(&[0, 3, 1, 2, 3]).await.unwrap();
        let m = ask_tcp(&mut t, &query("web.", false)).await;
        assert_eq!(ips(&m), ["10.134.0.1"]);
    }
}
