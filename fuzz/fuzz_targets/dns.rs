//! The DNS proxy's query handler (`dns::handler`): any bytes from a pod are
//! answered, forwarded or dropped, never a panic; an answer is a response
//! to the very query (its id, QR set), a forward carries the bytes as they
//! came, and only what has no DNS header is dropped unanswered.
//!
//! A forwarded query's bytes, QR set, are then fed to a pod's cache as the
//! upstream server's answer to itself (`dns::cache`: its record walk, the
//! RFC 2308 SOA rule, compression pointers that loop or run off the end):
//! never a panic, and a kept answer comes back the length it went in, with
//! the query's id and question.
#![no_main]

use std::sync::{Arc, OnceLock};

use hickory_proto::op::{Header, Message, MessageType};
use hickory_proto::serialize::binary::BinDecodable;
use libfuzzer_sys::fuzz_target;
use tidegate::config::{DnsCacheConfig, DnsConfig};
use tidegate::dns::{cache, Action, Cache, DnsMetrics, DnsProxy, Transport};
use tidegate::workloads::{parse_file, WorkloadStore};

const WORKLOADS: &str = "workloads:
  - {uid: web-0, name: web-0, namespace: shop, ips: [10.0.0.3, 'fd00::3'], node: node-a, services: [web]}
  - {uid: blog-0, name: blog-0, namespace: blog, ips: [10.0.0.4], node: node-a, services: [web]}
services:
  - {name: web, namespace: shop, vips: [10.96.0.1, 'fd00::1'], ports: [{port: 80}]}
  - {name: web, namespace: blog, vips: [10.96.0.2], ports: [{port: 80}]}
";

fn proxy() -> &'static Arc<DnsProxy> {
    static P: OnceLock<Arc<DnsProxy>> = OnceLock::new();
    P.get_or_init(|| {
        let store = WorkloadStore::new("cluster.local", "node-a");
        store.publish(parse_file(WORKLOADS).unwrap());
        // No upstream: the handler never does I/O.
        DnsProxy::with(&DnsConfig::default(), vec![], store, DnsMetrics::default())
    })
}

fuzz_target!(|data: &[u8]| {
    // Byte 0 picks the transport and the pod's namespace; the rest is the query.
    let Some((&pick, query)) = data.split_first() else {
        return;
    };
    let transport = if pick & 1 == 0 {
        Transport::Udp
    } else {
        Transport::Tcp
    };
    let namespace = ["shop", "blog", ""][usize::from(pick >> 1) % 3];
    match proxy().handle(namespace, query, transport) {
        Action::Reply(r) => {
            let header = Header::from_bytes(&r.bytes).expect("an answer has a header");
            assert_eq!(header.message_type, MessageType::Response);
            assert_eq!(header.id.to_be_bytes(), query[..2], "the query's id");
            if transport == Transport::Udp {
                assert!(r.bytes.len() <= 65_535);
            }
            if r.source == "store" {
                let m = Message::from_vec(&r.bytes).expect("the store's answer parses");
                assert_eq!(m.queries.len(), 1);
            }
        }
        Action::Forward(f) => {
            assert_eq!(f.bytes, query, "forwarded as it came");
            assert!(f.question_end > 12 && f.question_end <= query.len());
            // The question alone asks; the whole input, QR set, answers.
            let mut asked = query[..f.question_end].to_vec();
            asked[6..12].fill(0);
            let key = cache::key(&asked, f.question_end);
            assert!(key.is_some(), "a lone question is keyed");
            let mut reply = query.to_vec();
            reply[2] |= 0x80;
            let c = Cache::new(&DnsCacheConfig::default(), &DnsMetrics::default());
            let now = tokio::time::Instant::now();
            c.store(key.as_ref(), &reply, f.question_end, now);
            let later = now + std::time::Duration::from_secs(u64::from(pick));
            if let Some(kept) = c.answer(key.as_ref(), &asked, f.question_end, later) {
                assert_eq!(kept.len(), reply.len());
                assert_eq!(kept[..2], asked[..2], "the asker's id");
                assert_eq!(kept[12..f.question_end], asked[12..]);
            }
        }
        Action::Drop(reason) => {
            let header = Header::from_bytes(query);
            assert!(
                query.len() < 12 || header.is_ok_and(|h| h.message_type == MessageType::Response),
                "dropped ({reason}) a query with a header"
            );
        }
    }
});
