//! A fake upstream DNS server for the DNS proxy's end-to-end tests: UDP
//! and TCP on one address, answering A queries from a fixed table (TTL 5;
//! names under `nocache.` TTL 0, which no cache keeps), never answering
//! names under `blackhole.` (a server that went quiet), and reporting every
//! query it got — who asked, and what. [`relay`] is a resolver that sends
//! every query on, id and all.
//!
//! Bind it from a thread inside the namespace it serves in
//! ([`crate::netns::NsThread`]).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::mpsc;

/// One query the double received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub from: SocketAddr,
    pub name: String,
    pub tcp: bool,
}

/// The names it knows (lowercase, with the trailing dot) → their addresses.
pub type Table = HashMap<String, Vec<Ipv4Addr>>;

/// Serves `table` on `addr` (UDP and TCP) until the runtime it was spawned
/// on stops; every query is sent on the returned channel.
pub async fn serve(addr: SocketAddr, table: Table) -> mpsc::UnboundedReceiver<Seen> {
    let udp = UdpSocket::bind(addr).await.expect("DNS double: bind UDP");
    let tcp = TcpListener::bind(addr).await.expect("DNS double: bind TCP");
    let (tx, rx) = mpsc::unbounded_channel();
    let table = std::sync::Arc::new(table);
    let (utx, utable) = (tx.clone(), table.clone());
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let Some((name, reply)) = answer(&utable, &buf[..n]) else {
                continue;
            };
            let _ = utx.send(Seen {
                from,
                name,
                tcp: false,
            });
            if let Some(reply) = reply {
                let _ = udp.send_to(&reply, from).await;
            }
        }
    });
    tokio::spawn(async move {
        while let Ok((mut s, from)) = tcp.accept().await {
            let (tx, table) = (tx.clone(), table.clone());
            tokio::spawn(async move {
                loop {
                    let Ok(len) = s.read_u16().await else { return };
                    let mut q = vec![0u8; len.into()];
                    if s.read_exact(&mut q).await.is_err() {
                        return;
                    }
                    let Some((name, reply)) = answer(&table, &q) else {
                        return;
                    };
                    let _ = tx.send(Seen {
                        from,
                        name,
                        tcp: true,
                    });
                    let Some(reply) = reply else {
                        // Never answered: hold the connection.
                        std::future::pending::<()>().await;
                        return;
                    };
                    let mut framed = (reply.len() as u16).to_be_bytes().to_vec();
                    framed.extend_from_slice(&reply);
                    if s.write_all(&framed).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    rx
}

/// A resolver on `addr` (UDP) that sends each query it gets, unchanged
/// (its id too), to `to` from a socket of its own and returns what comes
/// back. Every query's name is sent on the returned channel before it is
/// sent on. Bind it from a thread inside the namespace it serves in.
pub async fn relay(addr: SocketAddr, to: SocketAddr) -> mpsc::UnboundedReceiver<String> {
    let udp = std::sync::Arc::new(UdpSocket::bind(addr).await.expect("DNS relay: bind UDP"));
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65_535];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let query = buf[..n].to_vec();
            let Some(question) = Message::from_vec(&query)
                .ok()
                .and_then(|q| q.queries.first().cloned())
            else {
                continue;
            };
            let _ = tx.send(question.name().to_ascii().to_ascii_lowercase());
            let udp = udp.clone();
            tokio::spawn(async move {
                let any: SocketAddr = "0.0.0.0:0".parse().unwrap();
                let Ok(s) = UdpSocket::bind(any).await else {
                    return;
                };
                if s.send_to(&query, to).await.is_err() {
                    return;
                }
                let mut reply = vec![0u8; 65_535];
                if let Ok((n, _)) = s.recv_from(&mut reply).await {
                    let _ = udp.send_to(&reply[..n], from).await;
                }
            });
        }
    });
    rx
}

/// The name asked and the reply (`None`: a black-holed name); `None` for
/// what is not a query.
fn answer(table: &Table, query: &[u8]) -> Option<(String, Option<Vec<u8>>)> {
    let q = Message::from_vec(query).ok()?;
    let question = q.queries.first()?.clone();
    let name = question.name().to_ascii().to_ascii_lowercase();
    if name.ends_with("blackhole.") {
        return Some((name, None));
    }
    let mut m = Message::response(q.metadata.id, q.metadata.op_code);
    m.metadata.recursion_desired = q.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.add_query(question.clone());
    match table.get(&name) {
        Some(ips) if question.query_type() == RecordType::A => {
            let ttl = if name.ends_with("nocache.") { 0 } else { 5 };
            for ip in ips {
                m.add_answer(Record::from_rdata(
                    question.name().clone(),
                    ttl,
                    RData::A(A(*ip)),
                ));
            }
        }
        Some(_) => {}
        None => m.metadata.response_code = ResponseCode::NXDomain,
    }
    Some((name, m.to_vec().ok()))
}

/// An A query for `name` (with the trailing dot), recursion desired.
pub fn query(name: &str) -> Message {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(hickory_proto::op::Query::query(
        Name::from_ascii(name).expect("a DNS name"),
        RecordType::A,
    ));
    m
}

/// The A addresses of `m`'s answers.
pub fn addresses(m: &Message) -> Vec<Ipv4Addr> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

/// Asks `server` `q` over UDP from the calling thread's namespace; the
/// reply with the query's id. A reply from another address than `server`
/// is an error: a resolver (glibc's connected socket, musl's check) drops it.
pub async fn ask_udp(server: SocketAddr, q: &Message) -> Result<Message, String> {
    let any: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let c = UdpSocket::bind(any).await.map_err(|e| e.to_string())?;
    c.send_to(&q.to_vec().map_err(|e| e.to_string())?, server)
        .await
        .map_err(|e| format!("send to {server}: {e}"))?;
    let mut buf = vec![0u8; 65_535];
    loop {
        let (n, from) = c
            .recv_from(&mut buf)
            .await
            .map_err(|e| format!("receive from {server}: {e}"))?;
        if from != server {
            return Err(format!(
                "reply from {from}, not from {server}: a resolver would drop it"
            ));
        }
        let m = Message::from_vec(&buf[..n]).map_err(|e| e.to_string())?;
        if m.metadata.id == q.metadata.id {
            return Ok(m);
        }
    }
}

/// Asks `server` `q` over a new TCP connection.
pub async fn ask_tcp(server: SocketAddr, q: &Message) -> Result<Message, String> {
    let mut s = tokio::net::TcpStream::connect(server)
        .await
        .map_err(|e| format!("connect {server}: {e}"))?;
    let b = q.to_vec().map_err(|e| e.to_string())?;
    let mut framed = (b.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&b);
    s.write_all(&framed).await.map_err(|e| e.to_string())?;
    let len = s.read_u16().await.map_err(|e| e.to_string())?;
    let mut r = vec![0u8; len.into()];
    s.read_exact(&mut r).await.map_err(|e| e.to_string())?;
    Message::from_vec(&r).map_err(|e| e.to_string())
}
