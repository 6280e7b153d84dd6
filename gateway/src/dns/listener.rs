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
//! A pod keeps at most `dns.max_in_flight_per_pod` TCP connections open,
//! each closed after `dns.timeout` without a query; one past that is
//! closed at once.

use std::sync::Arc;

use hickory_proto::op::ResponseCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{debug, debug_span, Instrument as _};

use super::forward::Place;
use super::handler::{self, Action, Forward, Transport};
use super::DnsProxy;
use crate::shutdown::ShutdownWatch;

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
}

/// The places a forwarded query holds until it is answered.
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
        Arc::new(PodDns {
            proxy,
            uid: uid.to_owned(),
            namespace: namespace.to_owned(),
            place,
            in_flight: Arc::new(Semaphore::new(per_pod)),
            tcp: Arc::new(Semaphore::new(per_pod)),
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
            Action::Forward(f) => {
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
        let mut buf = vec![0u8; 65_535];
        loop {
            let (n, from) = tokio::select! {
                _ = stop.signaled() => return,
                r = socket.recv_from(&mut buf) => match r {
                    Ok(r) => r,
                    Err(e) => {
                        // An ICMP error for an earlier reply, a full buffer:
                        // the next datagram is read as usual.
                        debug!(pod = %self.uid, error = %e, "DNS: receive on 15053/udp");
                        continue;
                    }
                },
            };
            match self.start(&buf[..n], Transport::Udp) {
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
                        continue;
                    }
                },
            };
            let Ok(permit) = self.tcp.clone().try_acquire_owned() else {
                self.proxy.metrics.refused("pod_tcp");
                continue;
            };
            let (me, stop) = (self.clone(), stop.clone());
            tokio::spawn(async move {
                me.connection(stream, stop).await;
                drop(permit);
            });
        }
    }

    /// One TCP connection: length-prefixed queries, answered in turn.
    async fn connection(&self, mut stream: TcpStream, mut stop: ShutdownWatch) {
        let idle = self.proxy.idle;
        loop {
            let read = async {
                let len = stream.read_u16().await?;
                let mut query = vec![0u8; usize::from(len)];
                stream.read_exact(&mut query).await?;
                Ok::<_, std::io::Error>(query)
            };
            let query = tokio::select! {
                _ = stop.signaled() => return,
                r = tokio::time::timeout(idle, read) => match r {
                    Ok(Ok(q)) => q,
                    // Closed, reset, or quiet for dns.timeout.
                    _ => return,
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
            let Ok(len) = u16::try_from(reply.len()) else {
                return;
            };
            let mut framed = Vec::with_capacity(reply.len() + 2);
            framed.extend_from_slice(&len.to_be_bytes());
            framed.extend_from_slice(&reply);
            if stream.write_all(&framed).await.is_err() {
                return;
            }
        }
    }
}
