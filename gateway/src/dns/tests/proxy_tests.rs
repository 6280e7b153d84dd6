//! The DNS proxy served on 127.0.0.1 (`Place::Here`) against upstream
//! doubles that count what they are asked: the cache ([`cache`]), loop
//! detection ([`loops`]), and hostile messages and TCP clients
//! ([`hostile`], beside the bad-input tests of `handler.rs` and
//! `listener.rs`).

#[path = "cache_tests.rs"]
mod cache;
#[path = "hostile_tests.rs"]
mod hostile;
#[path = "loops_tests.rs"]
mod loops;

use crate::workloads::WholeSet;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Edns, Message, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use super::metrics::{QueryLabels, ReasonLabel};
use super::{DnsMetrics, DnsProxy, Place};
use crate::config::DnsConfig;
use crate::workloads::WorkloadStore;
use tidegate_base::shutdown::{self, ShutdownTrigger};
use tidegate_base::sync::Locked;

/// How an upstream double answers a query (`None`: never).
type Answerer = Arc<dyn Fn(&Message) -> Option<Message> + Send + Sync>;

/// A fake upstream server on 127.0.0.1, UDP and TCP on one port, keeping
/// the ids of the queries it got by name (lowercase).
struct Upstream {
    addr: SocketAddr,
    asked: Arc<Mutex<HashMap<String, Vec<u16>>>>,
}

impl Upstream {
    fn asked(&self, name: &str) -> usize {
        self.ids(name).len()
    }

    fn ids(&self, name: &str) -> Vec<u16> {
        self.asked.locked().get(name).cloned().unwrap_or_default()
    }
}

/// UDP and TCP listeners on one free port of 127.0.0.1.
async fn bind_pair() -> (TcpListener, UdpSocket) {
    loop {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        if let Ok(udp) = UdpSocket::bind(tcp.local_addr().unwrap()).await {
            return (tcp, udp);
        }
    }
}

/// An upstream double answering with `answer`.
async fn upstream_with(answer: Answerer) -> Upstream {
    let (tcp, udp) = bind_pair().await;
    let addr = tcp.local_addr().unwrap();
    let asked: Arc<Mutex<HashMap<String, Vec<u16>>>> = Arc::default();
    let count = {
        let asked = asked.clone();
        move |q: &Message| {
            let name = q.queries[0].name().to_ascii().to_ascii_lowercase();
            asked.locked().entry(name).or_default().push(q.metadata.id);
        }
    };
    let (udp_answer, udp_count) = (answer.clone(), count.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            udp_count(&q);
            if let Some(m) = udp_answer(&q) {
                let _ = udp.send_to(&m.to_vec().unwrap(), from).await;
            }
        }
    });
    tokio::spawn(async move {
        while let Ok((mut s, _)) = tcp.accept().await {
            let (answer, count) = (answer.clone(), count.clone());
            tokio::spawn(async move {
                while let Ok(len) = s.read_u16().await {
                    let mut q = vec![0u8; len.into()];
                    if s.read_exact(&mut q).await.is_err() {
                        return;
                    }
                    let Ok(q) = Message::from_vec(&q) else { return };
                    count(&q);
                    let Some(m) = answer(&q) else {
                        std::future::pending::<()>().await;
                        return;
                    };
                    let b = m.to_vec().unwrap();
                    s.write_u16(b.len() as u16).await.unwrap();
                    s.write_all(&b).await.unwrap();
                }
            });
        }
    });
    Upstream { addr, asked }
}

/// The usual double: `outside.example.` is 10.135.0.7 (TTL 30);
/// `fail.example.` is SERVFAIL; `gone.example.` NXDOMAIN with an SOA (TTL
/// 300, MINIMUM 60); anything else NXDOMAIN without one.
async fn upstream() -> Upstream {
    upstream_with(Arc::new(|q: &Message| Some(usual_answer(q)))).await
}

fn usual_answer(q: &Message) -> Message {
    let question = q.queries[0].clone();
    let mut m = Message::response(q.metadata.id, OpCode::Query);
    m.metadata.recursion_desired = q.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    let name = question.name().to_ascii().to_ascii_lowercase();
    m.add_query(question.clone());
    match name.as_str() {
        "outside.example." => {
            m.add_answer(Record::from_rdata(
                question.name().clone(),
                30,
                RData::A(A(Ipv4Addr::new(10, 135, 0, 7))),
            ));
        }
        "fail.example." => m.metadata.response_code = ResponseCode::ServFail,
        "gone.example." => {
            m.metadata.response_code = ResponseCode::NXDomain;
            let soa = SOA::new(
                Name::from_ascii("ns.example.").unwrap(),
                Name::from_ascii("admin.example.").unwrap(),
                1,
                3600,
                600,
                86_400,
                60,
            );
            m.add_authority(Record::from_rdata(
                Name::from_ascii("example.").unwrap(),
                300,
                RData::SOA(soa),
            ));
        }
        _ => m.metadata.response_code = ResponseCode::NXDomain,
    }
    m
}

/// A proxy whose store has `web.shop` (10.134.0.1) and `many.shop` (60
/// addresses: an answer of about 1 KiB).
fn proxy(config: DnsConfig, upstream: SocketAddr) -> Arc<DnsProxy> {
    let store = WorkloadStore::new("cluster.local", "n");
    let many: Vec<String> = (1..=60).map(|i| format!("10.134.1.{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    store.publish(WholeSet::new(vec![]).services(vec![
        crate::dns::answer::tests::service("web", "shop", &["10.134.0.1"]),
        crate::dns::answer::tests::service("many", "shop", &many),
    ]));
    DnsProxy::with(&config, vec![upstream], store, DnsMetrics::default())
}

/// Pods of namespace `shop`, each served on 127.0.0.1 (UDP and TCP on one
/// port): their addresses, and what stops them.
async fn serve(proxy: &Arc<DnsProxy>, pods: usize) -> Vec<(SocketAddr, ShutdownTrigger)> {
    let mut out = Vec::new();
    for i in 0..pods {
        let (tcp, udp) = bind_pair().await;
        let addr = tcp.local_addr().unwrap();
        let pod = proxy.pod(&format!("pod-{i}"), "shop", Place::Here);
        let (stop, watch) = shutdown::channel();
        tokio::spawn(pod.clone().serve_udp(udp, watch.clone()));
        tokio::spawn(pod.serve_tcp(tcp, watch));
        out.push((addr, stop));
    }
    out
}

fn query(name: &str) -> Message {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    m
}

fn with_edns(mut m: Message) -> Message {
    let mut e = Edns::new();
    e.set_max_payload(4096);
    m.set_edns(e);
    m
}

async fn ask_udp(to: SocketAddr, q: &Message) -> Message {
    let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    c.send_to(&q.to_vec().unwrap(), to).await.unwrap();
    let mut buf = vec![0u8; 65_535];
    let n = tokio::time::timeout(Duration::from_secs(10), c.recv(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    let m = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(m.metadata.id, q.metadata.id);
    m
}

/// Sends `bytes` framed on `s`.
async fn send_framed(s: &mut TcpStream, bytes: &[u8]) {
    s.write_u16(bytes.len() as u16).await.unwrap();
    s.write_all(bytes).await.unwrap();
}

async fn recv_framed(s: &mut TcpStream) -> Message {
    let read = async {
        let len = s.read_u16().await.unwrap();
        let mut r = vec![0u8; len.into()];
        s.read_exact(&mut r).await.unwrap();
        Message::from_vec(&r).unwrap()
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("an answer over TCP")
}

async fn ask_tcp(to: SocketAddr, q: &Message) -> Message {
    let mut s = TcpStream::connect(to).await.unwrap();
    send_framed(&mut s, &q.to_vec().unwrap()).await;
    let m = recv_framed(&mut s).await;
    assert_eq!(m.metadata.id, q.metadata.id);
    m
}

fn ips(m: &Message) -> Vec<String> {
    m.answers.iter().map(|r| r.data.to_string()).collect()
}

fn answered(
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

fn by_reason(
    family: &prometheus_client::metrics::family::Family<
        ReasonLabel,
        prometheus_client::metrics::counter::Counter,
    >,
    reason: &'static str,
) -> u64 {
    family.get_or_create(&ReasonLabel { reason }).get()
}

/// Polls `check` every few milliseconds until it holds; panics after 10 s.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for: {what}"));
}
