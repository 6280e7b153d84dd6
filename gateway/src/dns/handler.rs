//! One query from a pod, as bytes: answered from the store, handed to the
//! forwarder, refused as malformed, or dropped. No I/O here (the fuzz
//! target `dns` drives it).
//!
//! - Fewer than 12 bytes (no DNS header): dropped, counted `short`.
//! - A response (QR set): dropped, counted `not_a_query` — answering it
//!   could start a loop between two servers.
//! - A header followed by what does not parse, or not exactly one
//!   question: FORMERR. An opcode other than QUERY: NOTIMP.
//! - A/AAAA of a name the store has ([`super::answer`]): answered here,
//!   authoritative, TTL 30 s.
//! - Everything else: forwarded as it came (only its id changes).
//!
//! A UDP answer larger than the pod's buffer (512 bytes, or its EDNS size)
//! is sent truncated (TC set, the question only), so the pod asks again over
//! TCP, as a resolver does.

use hickory_proto::op::{Edns, Header, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::Record;
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

use super::answer::{Lookup, Names};
use super::cache::{self, Key};
use super::wire::{Transport, EDNS_PAYLOAD, HEADER_LEN};

/// What to do with a query.
#[derive(Debug)]
pub enum Action {
    /// Send these bytes back.
    Reply(Reply),
    /// Ask the upstream server.
    Forward(Forward),
    /// Send nothing; the reason is counted.
    Drop(&'static str),
}

#[derive(Debug)]
pub struct Reply {
    pub bytes: Vec<u8>,
    /// `store` or `invalid` (the metric label).
    pub source: &'static str,
    pub rcode: ResponseCode,
}

/// A query for the upstream server.
#[derive(Debug)]
pub struct Forward {
    /// As parsed (its id is the pod's).
    pub query: Message,
    /// As the pod sent it.
    pub bytes: Vec<u8>,
    /// Where its question ends: an upstream reply must carry the same bytes
    /// from the header's end to here.
    pub question_end: usize,
    /// What the pod's cache keeps its answer under (`None`: not cached).
    pub key: Option<Key>,
    /// How many times this query had been sent upstream by the proxy and
    /// come back (see [`super::forward`]: a loop, or a pod's query that drew
    /// the id of one in flight).
    pub returns: u8,
}

/// Handles `bytes`, a query from a pod of `namespace` over `transport`.
pub fn handle(names: &Names, namespace: &str, bytes: &[u8], transport: Transport) -> Action {
    if bytes.len() < HEADER_LEN {
        return Action::Drop("short");
    }
    let Ok(header) = Header::from_bytes(bytes) else {
        return Action::Drop("short");
    };
    if header.message_type != MessageType::Query {
        return Action::Drop("not_a_query");
    }
    let refuse = |rcode| Action::Reply(error_reply(header.id, header.op_code, rcode));
    let query = match Message::from_vec(bytes) {
        Ok(m) => m,
        Err(_) => return refuse(ResponseCode::FormErr),
    };
    if query.metadata.op_code != OpCode::Query {
        return refuse(ResponseCode::NotImp);
    }
    let [question] = query.queries.as_slice() else {
        return refuse(ResponseCode::FormErr);
    };
    match names.lookup(namespace, question) {
        Lookup::Answer(records) => Action::Reply(answer(&query, records, transport)),
        Lookup::NotOurs => {
            let mut d = BinDecoder::new(bytes);
            let question_end = match Header::read(&mut d).and_then(|_| Query::read(&mut d)) {
                Ok(_) => d.index(),
                Err(_) => return refuse(ResponseCode::FormErr),
            };
            Action::Forward(Forward {
                query,
                bytes: bytes.to_vec(),
                question_end,
                key: cache::key(bytes, question_end),
                returns: 0,
            })
        }
    }
}

/// The store's answer to `query`.
fn answer(query: &Message, records: Vec<Record>, transport: Transport) -> Reply {
    let mut m = response_to(query, ResponseCode::NoError);
    m.metadata.authoritative = true;
    m.answers = records;
    Reply {
        bytes: encode(m, query, transport),
        source: "store",
        rcode: ResponseCode::NoError,
    }
}

/// A response to `query` with `rcode` and no records: the question, the
/// flags a resolver sets, EDNS when the query had it.
pub fn response_to(query: &Message, rcode: ResponseCode) -> Message {
    let mut m = Message::response(query.metadata.id, query.metadata.op_code);
    m.metadata.recursion_desired = query.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.metadata.checking_disabled = query.metadata.checking_disabled;
    m.metadata.response_code = rcode;
    m.queries = query.queries.clone();
    if query.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        m.set_edns(edns);
    }
    m
}

/// `rcode` for `query` (the proxy's own answer: REFUSED, SERVFAIL), as bytes.
pub fn error_to(query: &Message, rcode: ResponseCode) -> Vec<u8> {
    encode(response_to(query, rcode), query, Transport::Tcp)
}

/// A header-only response: for a query that did not parse.
fn error_reply(id: u16, op_code: OpCode, rcode: ResponseCode) -> Reply {
    let m = Message::error_msg(id, op_code, rcode);
    Reply {
        // A header alone always encodes.
        bytes: m.to_vec().unwrap_or_default(),
        source: "invalid",
        rcode,
    }
}

/// `m` as bytes, truncated when it is larger than a UDP client takes; a
/// message that cannot be encoded (a name past 255 bytes) is SERVFAIL.
fn encode(m: Message, query: &Message, transport: Transport) -> Vec<u8> {
    let bytes = match m.to_vec() {
        Ok(b) => b,
        Err(_) => {
            return response_to(query, ResponseCode::ServFail)
                .to_vec()
                .unwrap_or_else(|_| header_only(query, ResponseCode::ServFail));
        }
    };
    if transport == Transport::Udp && bytes.len() > usize::from(query.max_payload()) {
        return m
            .truncate()
            .to_vec()
            .unwrap_or_else(|_| header_only(query, ResponseCode::ServFail));
    }
    bytes
}

/// `rcode` for `query` without its question: a header always encodes.
fn header_only(query: &Message, rcode: ResponseCode) -> Vec<u8> {
    error_reply(query.metadata.id, query.metadata.op_code, rcode).bytes
}

/// Whether `bytes` (an encoded response) has TC set.
pub fn is_truncated(bytes: &[u8]) -> bool {
    Header::from_bytes(bytes).is_ok_and(|h| h.truncation)
}

/// The upstream server's `reply` to the pod's `query`, its id the pod's;
/// over UDP, a reply larger than the pod's buffer becomes its truncated
/// form. The flag says it was cut.
pub fn relay(mut reply: Vec<u8>, query: &Message, transport: Transport) -> (Vec<u8>, bool) {
    let id = query.metadata.id.to_be_bytes();
    if reply.len() >= 2 {
        reply[..2].copy_from_slice(&id);
    }
    if transport == Transport::Tcp || reply.len() <= usize::from(query.max_payload()) {
        return (reply, false);
    }
    let Ok(header) = Header::from_bytes(&reply) else {
        return (error_to(query, ResponseCode::ServFail), false);
    };
    let mut m = response_to(query, header.response_code);
    m.metadata = header.metadata;
    m.metadata.id = query.metadata.id;
    m.metadata.truncation = true;
    let bytes = m
        .to_vec()
        .unwrap_or_else(|_| header_only(query, ResponseCode::ServFail));
    (bytes, true)
}

/// The response code of an encoded response (its low four bits).
pub fn rcode_of(bytes: &[u8]) -> ResponseCode {
    Header::from_bytes(bytes).map_or(ResponseCode::ServFail, |h| h.response_code)
}

/// A bounded metric label for `rcode`.
pub fn rcode_label(rcode: ResponseCode) -> &'static str {
    match rcode {
        ResponseCode::NoError => "noerror",
        ResponseCode::FormErr => "formerr",
        ResponseCode::ServFail => "servfail",
        ResponseCode::NXDomain => "nxdomain",
        ResponseCode::NotImp => "notimp",
        ResponseCode::Refused => "refused",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use hickory_proto::rr::{Name, RData, RecordType};

    use super::*;
    use crate::dns::answer::tests::service;
    use crate::workloads::WholeSet;
    use crate::workloads::WorkloadStore;

    fn names() -> Names {
        let store = WorkloadStore::new("cluster.local", "n");
        let many: Vec<String> = (1..=60).map(|i| format!("10.134.0.{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        store.publish(WholeSet::new(vec![]).services(vec![
            service("web", "shop", &["10.134.0.1"]),
            service("many", "shop", &many),
        ]));
        Names::new(Arc::clone(&store), "cluster.local")
    }

    fn query(name: &str, t: RecordType) -> Message {
        let mut m = Message::query();
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m
    }

    fn reply(a: Action) -> Message {
        match a {
            Action::Reply(r) => Message::from_vec(&r.bytes).unwrap(),
            other => panic!("not answered here: {other:?}"),
        }
    }

    #[test]
    fn a_store_name_is_answered_authoritatively_with_the_query_id() {
        let q = query("web.", RecordType::A);
        let m = reply(handle(
            &names(),
            "shop",
            &q.to_vec().unwrap(),
            Transport::Udp,
        ));
        assert_eq!(m.metadata.id, q.metadata.id);
        assert_eq!(m.metadata.message_type, MessageType::Response);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.metadata.authoritative && m.metadata.recursion_desired);
        assert_eq!(m.queries, q.queries);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(
            &m.answers[0].data,
            &RData::A(std::net::Ipv4Addr::new(10, 134, 0, 1).into())
        );
        assert!(m.edns.is_none(), "no EDNS asked, none answered");
        // AAAA of the same name: it exists, no IPv6 address.
        let q = query("web.", RecordType::AAAA);
        let m = reply(handle(
            &names(),
            "shop",
            &q.to_vec().unwrap(),
            Transport::Udp,
        ));
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.answers.is_empty());
    }

    #[test]
    fn unknown_names_and_types_are_forwarded_as_they_came() {
        for (name, t) in [
            ("example.com.", RecordType::A),
            ("web.shop.svc.cluster.local.", RecordType::MX),
        ] {
            let q = query(name, t);
            let bytes = q.to_vec().unwrap();
            let Action::Forward(f) = handle(&names(), "shop", &bytes, Transport::Udp) else {
                panic!("{name} {t} not forwarded");
            };
            assert_eq!(f.bytes, bytes);
            assert_eq!(f.query.queries, q.queries);
            // Header, the name's labels and root, type and class.
            assert_eq!(f.question_end, 12 + name.len() + 1 + 4, "{name}");
        }
    }

    #[test]
    fn malformed_queries_get_formerr_and_garbage_is_dropped() {
        let n = names();
        let good = query("web.", RecordType::A).to_vec().unwrap();
        // Short of a header: dropped.
        for short in [&[][..], &good[..11]] {
            assert!(matches!(
                handle(&n, "shop", short, Transport::Udp),
                Action::Drop("short")
            ));
        }
        // A header claiming a question that is cut off: FORMERR with its id.
        let cut = &good[..good.len() - 3];
        let Action::Reply(r) = handle(&n, "shop", cut, Transport::Udp) else {
            panic!("cut query not answered");
        };
        assert_eq!((r.source, r.rcode), ("invalid", ResponseCode::FormErr));
        assert_eq!(r.bytes[..2], good[..2], "the query's id");
        // Two questions: FORMERR.
        let mut two = query("web.", RecordType::A);
        two.add_query(Query::query(Name::from_ascii("x.").unwrap(), RecordType::A));
        let m = reply(handle(&n, "shop", &two.to_vec().unwrap(), Transport::Udp));
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
        // No question: FORMERR.
        let none = Message::query().to_vec().unwrap();
        let m = reply(handle(&n, "shop", &none, Transport::Udp));
        assert_eq!(m.metadata.response_code, ResponseCode::FormErr);
        // Another opcode: NOTIMP.
        let mut status = query("web.", RecordType::A);
        status.metadata.op_code = OpCode::Status;
        let m = reply(handle(
            &n,
            "shop",
            &status.to_vec().unwrap(),
            Transport::Udp,
        ));
        assert_eq!(m.metadata.response_code, ResponseCode::NotImp);
        // A response is not a query: dropped.
        let mut resp = query("web.", RecordType::A);
        resp.metadata.message_type = MessageType::Response;
        assert!(matches!(
            handle(&n, "shop", &resp.to_vec().unwrap(), Transport::Udp),
            Action::Drop("not_a_query")
        ));
    }

    #[test]
    fn a_udp_answer_past_the_clients_buffer_is_truncated_and_whole_over_tcp() {
        let n = names();
        let q = query("many.", RecordType::A);
        let bytes = q.to_vec().unwrap();
        // 60 A records: past 512 bytes.
        let m = reply(handle(&n, "shop", &bytes, Transport::Udp));
        assert!(m.metadata.truncation);
        assert!(m.answers.is_empty());
        assert_eq!(m.queries, q.queries);
        let m = reply(handle(&n, "shop", &bytes, Transport::Tcp));
        assert!(!m.metadata.truncation);
        assert_eq!(m.answers.len(), 60);
        // With EDNS (1232 bytes) they fit over UDP, and EDNS is answered.
        let mut q = q;
        let mut edns = Edns::new();
        edns.set_max_payload(1232);
        q.set_edns(edns);
        let m = reply(handle(&n, "shop", &q.to_vec().unwrap(), Transport::Udp));
        assert!(!m.metadata.truncation);
        assert_eq!(m.answers.len(), 60);
        assert_eq!(m.edns.map(|e| e.max_payload()), Some(EDNS_PAYLOAD));
    }

    #[test]
    fn an_upstream_reply_is_relayed_with_the_pods_id_and_cut_for_its_buffer() {
        let q = query("example.com.", RecordType::A);
        let mut big = response_to(&q, ResponseCode::NoError);
        big.metadata.id = 999;
        for i in 0..60u8 {
            big.add_answer(Record::from_rdata(
                Name::from_ascii("example.com.").unwrap(),
                5,
                RData::A(std::net::Ipv4Addr::new(10, 135, 0, i).into()),
            ));
        }
        let bytes = big.to_vec().unwrap();
        let (out, cut) = relay(bytes.clone(), &q, Transport::Tcp);
        assert!(!cut);
        assert_eq!(out[..2], q.metadata.id.to_be_bytes());
        assert_eq!(out[2..], bytes[2..]);
        let (out, cut) = relay(bytes, &q, Transport::Udp);
        assert!(cut);
        let m = Message::from_vec(&out).unwrap();
        assert_eq!(m.metadata.id, q.metadata.id);
        assert!(m.metadata.truncation && m.answers.is_empty());
        assert_eq!(m.queries, q.queries);
    }
}
