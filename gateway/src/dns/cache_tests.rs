//! The cache on its own, its clock passed in: what is kept and for how
//! long, what a kept answer looks like, the bound.

use std::net::Ipv4Addr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::opt::EdnsOption;
use hickory_proto::rr::rdata::{A, SOA, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use super::*;
use crate::dns::metrics::ReasonLabel;

fn name(n: &str) -> Name {
    Name::from_ascii(n).unwrap()
}

fn query(n: &str, id: u16) -> Message {
    let mut m = Message::query();
    m.metadata.id = id;
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(name(n), RecordType::A));
    m
}

/// The bytes of `q` and where its question ends.
fn wire(q: &Message) -> (Vec<u8>, usize) {
    let bytes = q.to_vec().unwrap();
    let end = 12 + q.queries[0].name().len() + 1 + 4;
    (bytes, end)
}

fn response(q: &Message, rcode: ResponseCode) -> Message {
    let mut m = Message::response(999, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.metadata.recursion_available = true;
    m.metadata.response_code = rcode;
    m.add_query(q.queries[0].clone());
    m
}

fn a(n: &str, ttl: u32, last: u8) -> Record {
    Record::from_rdata(name(n), ttl, RData::A(A(Ipv4Addr::new(10, 135, 0, last))))
}

fn soa(ttl: u32, minimum: u32) -> Record {
    let rdata = SOA::new(
        name("ns.example."),
        name("admin.example."),
        1,
        3600,
        600,
        86400,
        minimum,
    );
    Record::from_rdata(name("example."), ttl, RData::SOA(rdata))
}

fn cache(max_entries: u32) -> (Cache, DnsMetrics) {
    let metrics = DnsMetrics::default();
    let config = DnsCacheConfig {
        max_entries,
        max_ttl: Duration::from_secs(3600),
    };
    (Cache::new(&config, &metrics), metrics)
}

/// Stores `reply` as the answer to `q` at `at`.
fn store(c: &Cache, q: &Message, reply: &Message, at: Instant) {
    let (bytes, end) = wire(q);
    c.store(key(&bytes, end).as_ref(), &reply.to_vec().unwrap(), end, at);
}

fn ask(c: &Cache, q: &Message, at: Instant) -> Option<Message> {
    let (bytes, end) = wire(q);
    c.answer(key(&bytes, end).as_ref(), &bytes, end, at)
        .map(|b| Message::from_vec(&b).unwrap())
}

fn ttls(m: &Message) -> Vec<u32> {
    m.answers
        .iter()
        .chain(&m.authorities)
        .map(|r| r.ttl)
        .collect()
}

fn not_stored(m: &DnsMetrics, reason: &'static str) -> u64 {
    m.cache_not_stored
        .get_or_create(&ReasonLabel { reason })
        .get()
}

fn evicted(m: &DnsMetrics, reason: &'static str) -> u64 {
    m.cache_evictions
        .get_or_create(&ReasonLabel { reason })
        .get()
}

#[test]
fn a_kept_answer_has_the_askers_id_and_case_and_its_ttls_less_the_time_held() {
    let (c, m) = cache(16);
    let t0 = Instant::now();
    let q = query("outside.example.", 1);
    let mut reply = response(&q, ResponseCode::NoError);
    reply.add_answer(a("outside.example.", 60, 7));
    reply.add_answer(a("outside.example.", 30, 8));
    store(&c, &q, &reply, t0);
    assert_eq!(m.cache_entries.get(), 1);

    // Another query, another id, the name in other letters.
    let again = query("OUTSIDE.Example.", 77);
    let got = ask(&c, &again, t0 + Duration::from_millis(10_900)).expect("kept");
    assert_eq!(got.metadata.id, 77);
    assert_eq!(got.metadata.message_type, MessageType::Response);
    assert_eq!(got.queries[0].name().to_ascii(), "OUTSIDE.Example.");
    assert_eq!(ttls(&got), [50, 20], "10 whole seconds held");
    assert_eq!(
        got.answers[0].data,
        RData::A(A(Ipv4Addr::new(10, 135, 0, 7)))
    );
    assert_eq!(m.cache_hits.get(), 1);

    // Kept for the smallest TTL: at 30 s it is gone.
    assert!(ask(&c, &again, t0 + Duration::from_millis(29_999)).is_some());
    assert!(ask(&c, &again, t0 + Duration::from_secs(30)).is_none());
    assert_eq!(evicted(&m, "expired"), 1);
    assert_eq!((m.cache_hits.get(), m.cache_misses.get()), (2, 1));
    assert_eq!(m.cache_entries.get(), 0);
    assert!(c.is_empty());
}

#[test]
fn negative_answers_are_kept_for_the_soa_minimum_and_without_an_soa_not_at_all() {
    let (c, m) = cache(16);
    let t0 = Instant::now();
    // NXDOMAIN: SOA TTL 300, MINIMUM 60 → 60 s (RFC 2308 §5).
    let q = query("nope.example.", 1);
    let mut nx = response(&q, ResponseCode::NXDomain);
    nx.add_authority(soa(300, 60));
    store(&c, &q, &nx, t0);
    let got = ask(&c, &q, t0 + Duration::from_secs(59)).expect("kept");
    assert_eq!(got.metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(ttls(&got), [241], "the SOA's own TTL, less 59 s");
    assert!(ask(&c, &q, t0 + Duration::from_secs(60)).is_none());

    // NODATA (NOERROR, no answer): SOA TTL 20, MINIMUM 600 → 20 s.
    let q = query("v4only.example.", 2);
    let mut nodata = response(&q, ResponseCode::NoError);
    nodata.add_authority(soa(20, 600));
    store(&c, &q, &nodata, t0);
    assert!(ask(&c, &q, t0 + Duration::from_secs(19)).is_some());
    assert!(ask(&c, &q, t0 + Duration::from_secs(20)).is_none());

    // NXDOMAIN without an SOA: not kept.
    let q = query("bare.example.", 3);
    store(&c, &q, &response(&q, ResponseCode::NXDomain), t0);
    assert!(ask(&c, &q, t0).is_none());
    assert_eq!(not_stored(&m, "no_soa"), 1);
}

#[test]
fn servfail_truncated_zero_ttl_oversized_and_malformed_answers_are_not_kept() {
    let (c, m) = cache(16);
    let t0 = Instant::now();
    let q = query("outside.example.", 1);
    let (bytes, end) = wire(&q);
    let k = key(&bytes, end);
    let mut servfail = response(&q, ResponseCode::ServFail);
    servfail.add_authority(soa(300, 60));
    let mut refused = response(&q, ResponseCode::Refused);
    refused.add_answer(a("outside.example.", 60, 7));
    let mut truncated = response(&q, ResponseCode::NoError);
    truncated.metadata.truncation = true;
    truncated.add_answer(a("outside.example.", 60, 7));
    let mut zero = response(&q, ResponseCode::NoError);
    zero.add_answer(a("outside.example.", 60, 7));
    zero.add_answer(a("outside.example.", 0, 8));
    let mut large = response(&q, ResponseCode::NoError);
    large.add_answer(Record::from_rdata(
        name("outside.example."),
        60,
        RData::TXT(TXT::new(vec!["x".repeat(250); 6])),
    ));
    for (reply, reason) in [
        (&servfail, "rcode"),
        (&refused, "rcode"),
        (&truncated, "truncated"),
        (&zero, "zero_ttl"),
        (&large, "too_large"),
    ] {
        store(&c, &q, reply, t0);
        assert!(ask(&c, &q, t0).is_none(), "{reason}");
        assert!(not_stored(&m, reason) > 0, "{reason}");
    }
    // An answer whose record runs past its end.
    let mut good = response(&q, ResponseCode::NoError);
    good.add_answer(a("outside.example.", 60, 7));
    let good = good.to_vec().unwrap();
    c.store(k.as_ref(), &good[..good.len() - 2], end, t0);
    assert_eq!(not_stored(&m, "malformed"), 1);
    // A TTL with the top bit set is 0 (RFC 2181 §8).
    let mut top = good.clone();
    let at = good.len() - 4 - 2 - 4;
    top[at] |= 0x80;
    c.store(k.as_ref(), &top, end, t0);
    assert_eq!(not_stored(&m, "zero_ttl"), 2);
    assert!(c.is_empty());
    assert_eq!(m.cache_entries.get(), 0);
}

#[test]
fn past_max_entries_the_least_recently_used_answer_goes() {
    let (c, m) = cache(2);
    let t0 = Instant::now();
    let qs: Vec<Message> = ["a.example.", "b.example.", "c.example."]
        .iter()
        .map(|n| query(n, 1))
        .collect();
    let reply = |q: &Message| {
        let mut r = response(q, ResponseCode::NoError);
        r.add_answer(a(&q.queries[0].name().to_ascii(), 60, 1));
        r
    };
    store(&c, &qs[0], &reply(&qs[0]), t0);
    store(&c, &qs[1], &reply(&qs[1]), t0);
    // a is used after b: b is the least recent when c comes.
    assert!(ask(&c, &qs[0], t0).is_some());
    store(&c, &qs[2], &reply(&qs[2]), t0);
    assert_eq!(c.len(), 2);
    assert!(ask(&c, &qs[1], t0).is_none(), "b went");
    assert!(ask(&c, &qs[0], t0).is_some());
    assert!(ask(&c, &qs[2], t0).is_some());
    assert_eq!(evicted(&m, "capacity"), 1);
    assert_eq!(m.cache_entries.get(), 2);
    // A new answer for a kept question replaces it, evicting nothing.
    store(&c, &qs[2], &reply(&qs[2]), t0 + Duration::from_secs(5));
    assert_eq!((c.len(), evicted(&m, "capacity")), (2, 1));
    let got = ask(&c, &qs[2], t0 + Duration::from_secs(5)).unwrap();
    assert_eq!(ttls(&got), [60]);
    // The pod goes: its share of the gauge with it.
    drop(c);
    assert_eq!(m.cache_entries.get(), 0);
}

#[test]
fn max_ttl_caps_how_long_an_answer_is_kept() {
    let metrics = DnsMetrics::default();
    let config = DnsCacheConfig {
        max_entries: 4,
        max_ttl: Duration::from_secs(60),
    };
    let c = Cache::new(&config, &metrics);
    let t0 = Instant::now();
    let q = query("long.example.", 1);
    let mut r = response(&q, ResponseCode::NoError);
    r.add_answer(a("long.example.", 86_400, 1));
    store(&c, &q, &r, t0);
    let got = ask(&c, &q, t0 + Duration::from_secs(59)).unwrap();
    assert_eq!(
        ttls(&got),
        [86_341],
        "the record's own TTL, less the time held"
    );
    assert!(ask(&c, &q, t0 + Duration::from_secs(60)).is_none());
}

#[test]
fn max_entries_0_turns_the_cache_off() {
    let (c, m) = cache(0);
    let t0 = Instant::now();
    let q = query("outside.example.", 1);
    let mut r = response(&q, ResponseCode::NoError);
    r.add_answer(a("outside.example.", 60, 7));
    store(&c, &q, &r, t0);
    assert!(ask(&c, &q, t0).is_none());
    assert!(c.is_empty());
    assert_eq!((m.cache_hits.get(), m.cache_misses.get()), (0, 0));
}

#[test]
fn the_key_is_what_the_answer_depends_on() {
    let k = |q: &Message| {
        let (bytes, end) = wire(q);
        key(&bytes, end)
    };
    let edns = |q: &mut Message, f: &dyn Fn(&mut Edns)| {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        f(&mut e);
        q.set_edns(e);
    };
    let plain = query("Outside.Example.", 1);
    let base = k(&plain).expect("a plain query is keyed");
    // Not the id, not the case.
    assert_eq!(k(&query("outside.example.", 2)), Some(base.clone()));
    // The type, the RD and CD bits.
    let mut aaaa = plain.clone();
    aaaa.queries[0].set_query_type(RecordType::AAAA);
    let mut no_rd = plain.clone();
    no_rd.metadata.recursion_desired = false;
    let mut cd = plain.clone();
    cd.metadata.checking_disabled = true;
    // EDNS: present, DO, an option; not the UDP size.
    let mut with_edns = plain.clone();
    edns(&mut with_edns, &|_| {});
    let mut bigger = plain.clone();
    edns(&mut bigger, &|e| {
        e.set_max_payload(4096);
    });
    let mut dnssec = plain.clone();
    edns(&mut dnssec, &|e| {
        e.set_dnssec_ok(true);
    });
    let mut cookie = plain.clone();
    edns(&mut cookie, &|e| {
        e.options_mut()
            .insert(EdnsOption::Unknown(10, vec![1, 2, 3, 4, 5, 6, 7, 8]))
    });
    let keys: Vec<Key> = [&aaaa, &no_rd, &cd, &with_edns, &dnssec, &cookie]
        .iter()
        .map(|q| k(q).unwrap())
        .collect();
    for (i, a) in keys.iter().enumerate() {
        assert_ne!(a, &base, "{i}");
        for b in &keys[i + 1..] {
            assert_ne!(a, b);
        }
    }
    assert_eq!(k(&bigger), k(&with_edns), "the UDP size is not in the key");
    // A query with a record beside its question is not cached.
    let mut extra = plain.clone();
    extra.add_additional(a("x.example.", 1, 1));
    assert_eq!(k(&extra), None);
    let mut answer = plain.clone();
    answer.add_answer(a("x.example.", 1, 1));
    assert_eq!(k(&answer), None);
    // Trailing bytes after the question: not cached.
    let (mut bytes, end) = wire(&plain);
    bytes.push(0);
    assert_eq!(key(&bytes, end), None);
}

#[test]
fn a_compression_pointer_loop_in_an_answer_ends_the_walk() {
    let (c, m) = cache(4);
    let t0 = Instant::now();
    let q = query("outside.example.", 1);
    let (bytes, end) = wire(&q);
    let mut reply = response(&q, ResponseCode::NoError).to_vec().unwrap();
    reply[7] = 1; // one answer
                  // Its owner a pointer to itself, then a record's fixed part.
    let at = reply.len() as u16;
    reply.extend_from_slice(&(0xc000 | at).to_be_bytes());
    reply.extend_from_slice(&[0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 0, 0, 1]);
    c.store(key(&bytes, end).as_ref(), &reply, end, t0);
    // Pointers are not followed: the record is walked, and kept.
    assert!(c
        .answer(key(&bytes, end).as_ref(), &bytes, end, t0)
        .is_some());
    // A name of labels running off the end is not.
    let mut cut = response(&q, ResponseCode::NoError).to_vec().unwrap();
    cut[7] = 1;
    cut.extend_from_slice(&[63, b'a', b'b']);
    let (c2, m2) = cache(4);
    c2.store(key(&bytes, end).as_ref(), &cut, end, t0);
    assert_eq!(not_stored(&m2, "malformed"), 1);
    assert_eq!(m.cache_hits.get(), 1);
}
