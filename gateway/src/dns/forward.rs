//! Queries the store does not answer go to the upstream servers
//! (`dns.upstream`, or the `nameserver` lines of the gateway's
//! `resolv.conf`), as a stub resolver sends them:
//!
//! - from the pod's own network namespace, on a socket carrying the mesh
//!   mark, so the pod's capture rules (istio-cni's port 53 redirect among
//!   them) let it through and the upstream server sees the pod as the
//!   client — as ztunnel forwards;
//! - one new socket and a fresh random id per attempt; a reply counts only
//!   from the server asked, with that id and the question asked, byte for
//!   byte (anything else on the socket is ignored);
//! - UDP for a UDP query; a truncated reply is asked again over TCP (if
//!   that fails the pod gets the truncated reply and asks over TCP
//!   itself); TCP for a TCP query;
//! - the servers in order, the time left shared between those not tried
//!   yet; past `dns.timeout` in all, SERVFAIL.
//!
//! The reply is relayed as it came, only its id changed back.
//!
//! **Loops.** The id and question of every query on its way upstream are
//! remembered until its attempt ends, for all pods of the gateway
//! ([`Forwarder::came_back`]). A query arriving on any pod's 15053 with
//! the id and question of one of them is, most likely, this proxy's own
//! query come back: the upstream server, or what it forwards to, leads back
//! to a captured pod's port 53 or to the proxy itself. But a pod's own
//! query for the same name draws the same id 1 time in 65,536 for each
//! such query in flight (a pod asking one name 16 at a time would meet it
//! every 4,000 queries), so the first return is forwarded once more,
//! marked; if that one comes back too, it is a loop, answered SERVFAIL at
//! once instead of being forwarded again. A loop ends after two rounds,
//! where it used to go on until the pod's in-flight cap (65 forwards a
//! name); a pod's query is failed only if two ids in a row collide. A
//! resolver on the way that asks again with an id of its own is not
//! recognised this way; its loop still ends at the in-flight caps and
//! `dns.timeout`.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Header, MessageType};
use hickory_proto::serialize::binary::BinDecodable;
use ring::rand::{SecureRandom, SystemRandom};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::{timeout_at, Instant};
use tracing::warn;

use super::handler::{is_truncated, Forward};
use super::wire::{Transport, HEADER_LEN};
use crate::inpod::netns::{DialOpts, NetnsSockets};
use tidegate_base::sync::Locked;
use tidegate_netns::namespace::{PodNetns, MESH_MARK};

/// How often a forwarding loop is logged at most.
const LOOP_WARNING_EVERY: Duration = Duration::from_secs(60);

/// Where the sockets of forwarded queries are made.
#[derive(Clone)]
pub enum Place {
    /// Inside the pod's namespace, with the mesh mark.
    Pod {
        netns: Arc<PodNetns>,
        sockets: NetnsSockets,
    },
    /// In the calling thread's namespace, unmarked (tests, and nothing else).
    Here,
}

impl Place {
    fn udp(&self, upstream: SocketAddr) -> io::Result<UdpSocket> {
        let any = SocketAddr::new(unspecified(upstream.ip()), 0);
        match self {
            Place::Pod { netns, sockets } => sockets
                .udp_bind(netns, any, MESH_MARK, false)
                .map_err(io::Error::other),
            Place::Here => {
                let s = std::net::UdpSocket::bind(any)?;
                s.set_nonblocking(true)?;
                UdpSocket::from_std(s)
            }
        }
    }

    async fn tcp(&self, upstream: SocketAddr) -> io::Result<TcpStream> {
        match self {
            Place::Pod { netns, sockets } => {
                let opts = DialOpts {
                    mark: MESH_MARK,
                    source: None,
                    transparent: false,
                };
                let s = sockets
                    .dial_socket(netns, upstream.ip(), opts)
                    .map_err(io::Error::other)?;
                s.connect(upstream).await
            }
            Place::Here => TcpStream::connect(upstream).await,
        }
    }
}

fn unspecified(like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("no upstream DNS server answered within dns.timeout ({0:?})")]
    Timeout(Duration),
    #[error("no upstream DNS server: set dns.upstream, or a nameserver line in dns.resolv_conf")]
    NoUpstream,
    #[error("upstream DNS server {upstream}: {source}")]
    Network {
        upstream: SocketAddr,
        source: io::Error,
    },
}

impl ForwardError {
    /// A bounded metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            ForwardError::Timeout(_) => "timeout",
            ForwardError::NoUpstream => "no_upstream",
            ForwardError::Network { .. } => "network",
        }
    }
}

enum Attempt {
    TimedOut,
    Failed(io::Error),
}

/// A query on its way upstream: its id and question bytes.
type SentKey = ([u8; 2], Box<[u8]>);

/// Sends queries to the upstream servers.
pub struct Forwarder {
    upstreams: Vec<SocketAddr>,
    timeout: Duration,
    rng: SystemRandom,
    /// Queries sent and not yet answered → the server asked, the
    /// query's [`Forward::returns`], and how many share the key.
    sent: Mutex<HashMap<SentKey, (SocketAddr, u8, usize)>>,
    /// When a loop was last logged.
    loop_logged: Mutex<Option<Instant>>,
}

/// A query remembered as sent until dropped.
struct Sent<'a> {
    forwarder: &'a Forwarder,
    key: SentKey,
}

impl Drop for Sent<'_> {
    fn drop(&mut self) {
        let mut sent = self.forwarder.sent.locked();
        if let Some((_, _, n)) = sent.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                sent.remove(&self.key);
            }
        }
    }
}

impl Forwarder {
    pub fn new(upstreams: Vec<SocketAddr>, timeout: Duration) -> Forwarder {
        Forwarder {
            upstreams,
            timeout,
            rng: SystemRandom::new(),
            sent: Mutex::new(HashMap::new()),
            loop_logged: Mutex::new(None),
        }
    }

    /// When a query with these bytes (its question ending at
    /// `question_end`) has the id and question of one this proxy sent and
    /// is still waiting for: the server it was sent to, and how many times
    /// that one had already come back ([`Forward::returns`]).
    pub fn came_back(&self, query: &[u8], question_end: usize) -> Option<(SocketAddr, u8)> {
        let question = query.get(HEADER_LEN..question_end)?;
        let key: SentKey = ([query[0], query[1]], question.into());
        self.sent
            .locked()
            .get(&key)
            .map(|&(upstream, returns, _)| (upstream, returns))
    }

    /// Logs a loop through `upstream`, once a minute at most.
    pub fn warn_loop(&self, upstream: SocketAddr, pod: &str) {
        let now = Instant::now();
        {
            let mut last = self.loop_logged.locked();
            if last.is_some_and(|at| now < at + LOOP_WARNING_EVERY) {
                return;
            }
            *last = Some(now);
        }
        warn!(%upstream, pod,
            "DNS forwarding loop: a query the proxy sent to this upstream server came back to it (answered SERVFAIL); dns.upstream, or the nameserver of dns.resolv_conf, leads back to a captured pod's port 53 or to 15053 (logged once a minute; tidegate_dns_forward_failures_total{{reason=\"loop\"}} counts them)");
    }

    fn remember(&self, id: [u8; 2], f: &Forward, upstream: SocketAddr) -> Sent<'_> {
        let key: SentKey = (id, f.bytes[HEADER_LEN..f.question_end].into());
        self.sent
            .locked()
            .entry(key.clone())
            .or_insert((upstream, f.returns, 0))
            .2 += 1;
        Sent {
            forwarder: self,
            key,
        }
    }

    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    /// The upstream reply to `f` (its id still the one sent upstream).
    pub async fn forward(
        &self,
        f: &Forward,
        place: &Place,
        transport: Transport,
    ) -> Result<Vec<u8>, ForwardError> {
        if self.upstreams.is_empty() {
            return Err(ForwardError::NoUpstream);
        }
        let deadline = Instant::now() + self.timeout;
        let mut failed = None;
        let n = self.upstreams.len();
        for (i, upstream) in self.upstreams.iter().enumerate() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            // An even share of what is left for each server not tried yet.
            let share = (deadline - now) / u32::try_from(n - i).unwrap_or(u32::MAX);
            match self
                .attempt(f, place, *upstream, transport, now + share)
                .await
            {
                Ok(reply) => return Ok(reply),
                Err(Attempt::TimedOut) => {}
                Err(Attempt::Failed(source)) => {
                    failed = Some(ForwardError::Network {
                        upstream: *upstream,
                        source,
                    })
                }
            }
        }
        Err(failed.unwrap_or(ForwardError::Timeout(self.timeout)))
    }

    async fn attempt(
        &self,
        f: &Forward,
        place: &Place,
        upstream: SocketAddr,
        transport: Transport,
        deadline: Instant,
    ) -> Result<Vec<u8>, Attempt> {
        if transport == Transport::Tcp {
            return within(deadline, self.tcp(f, place, upstream)).await;
        }
        let reply = within(deadline, self.udp(f, place, upstream)).await?;
        if !is_truncated(&reply) {
            return Ok(reply);
        }
        Ok(within(deadline, self.tcp(f, place, upstream))
            .await
            .unwrap_or(reply))
    }

    /// `f` with a fresh random id.
    fn with_new_id(&self, f: &Forward) -> io::Result<(Vec<u8>, [u8; 2])> {
        let mut id = [0u8; 2];
        self.rng
            .fill(&mut id)
            .map_err(|_| io::Error::other("no random bytes for a query id"))?;
        let mut bytes = f.bytes.clone();
        bytes[..2].copy_from_slice(&id);
        Ok((bytes, id))
    }

    async fn udp(&self, f: &Forward, place: &Place, upstream: SocketAddr) -> io::Result<Vec<u8>> {
        let (bytes, id) = self.with_new_id(f)?;
        let _sent = self.remember(id, f, upstream);
        let socket = place.udp(upstream)?;
        // Connected: the kernel drops datagrams from anyone else.
        socket.connect(upstream).await?;
        socket.send(&bytes).await?;
        let mut buf = vec![0u8; 65_535];
        loop {
            let n = socket.recv(&mut buf).await?;
            if answers(&buf[..n], id, f) {
                buf.truncate(n);
                return Ok(buf);
            }
        }
    }

    async fn tcp(&self, f: &Forward, place: &Place, upstream: SocketAddr) -> io::Result<Vec<u8>> {
        let (bytes, id) = self.with_new_id(f)?;
        let _sent = self.remember(id, f, upstream);
        let mut stream = place.tcp(upstream).await?;
        let len = u16::try_from(bytes.len()).map_err(io::Error::other)?;
        let mut framed = Vec::with_capacity(bytes.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&bytes);
        stream.write_all(&framed).await?;
        let len = stream.read_u16().await?;
        let mut reply = vec![0u8; usize::from(len)];
        stream.read_exact(&mut reply).await?;
        if !answers(&reply, id, f) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the reply is not an answer to the query sent",
            ));
        }
        Ok(reply)
    }
}

/// `fut` until `deadline`.
async fn within(
    deadline: Instant,
    fut: impl std::future::Future<Output = io::Result<Vec<u8>>>,
) -> Result<Vec<u8>, Attempt> {
    match timeout_at(deadline, fut).await {
        Ok(r) => r.map_err(Attempt::Failed),
        Err(_) => Err(Attempt::TimedOut),
    }
}

/// Whether `reply` answers the query `f` sent with `id`: a response, that
/// id, one question, the same question bytes.
fn answers(reply: &[u8], id: [u8; 2], f: &Forward) -> bool {
    let question = &f.bytes[HEADER_LEN..f.question_end];
    let Some(echoed) = reply.get(HEADER_LEN..f.question_end) else {
        return false;
    };
    let Ok(header) = Header::from_bytes(reply) else {
        return false;
    };
    reply[..2] == id
        && header.message_type == MessageType::Response
        && header.counts.queries == 1
        && echoed == question
}

/// The `nameserver` addresses of a `resolv.conf`, port 53.
pub fn nameservers(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == "nameserver").then_some(())?;
            let ip: IpAddr = words.next()?.parse().ok()?;
            Some(SocketAddr::new(ip, 53))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nameservers_are_read_from_resolv_conf() {
        let conf = "# generated\nsearch istio-system.svc.cluster.local svc.cluster.local\n\
                    nameserver 10.96.0.10\nnameserver fd00::a\nnameserver fe80::1%eth0\n\
                    options ndots:5\n nameserver 10.0.0.2\n";
        assert_eq!(
            nameservers(conf),
            [
                "10.96.0.10:53".parse::<SocketAddr>().unwrap(),
                "[fd00::a]:53".parse().unwrap(),
                "10.0.0.2:53".parse().unwrap(),
            ]
        );
        assert!(nameservers("").is_empty());
    }
}
