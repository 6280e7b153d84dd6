//! Forwarded answers kept for their TTL, one cache per pod (`dns.cache`).
//!
//! A name the store does not have is asked upstream once per TTL instead of
//! once per query: a pod resolving `api.example.com` on every request, and
//! the NXDOMAIN answers of its search expansions
//! (`api.example.com.shop.svc.cluster.local`, …), are answered here until
//! they expire. ztunnel does the same through hickory's resolver cache.
//!
//! **Whose cache.** One per pod, as ztunnel builds one resolver (and so one
//! cache) per pod's proxy. A forwarded query leaves from the pod's own
//! network namespace, so its answer is what the upstream server told that
//! pod: a server answering by source (views, split horizon) may tell pods
//! apart, and a process in the pod with `CAP_NET_RAW` (a default capability
//! of common container runtimes) can see the query and forge the reply in
//! its own namespace. A pod may fool itself, as it could without the proxy;
//! a cache shared by the node would serve that to every other pod. The
//! cache goes with the pod's listeners.
//!
//! **Key.** The question (the name without regard to case, type, class),
//! the query's RD, AD and CD bits, and its EDNS record (present or not,
//! version, DO and the other flags, the options byte for byte: a client
//! subnet or a cookie makes its own entry) — everything the upstream
//! server's answer depends on. The advertised UDP size is not: a truncated
//! answer is never kept, and a kept one is cut for each client's buffer as
//! a relayed one is ([`super::handler::relay`]). A query with anything else
//! in it (records in the answer or authority section, an additional record
//! that is not EDNS: TSIG, …) is not cached.
//!
//! **What is kept, and how long.**
//! - NOERROR with answers: the smallest TTL of its records (every section
//!   but EDNS), at most `dns.cache.max_ttl`.
//! - NXDOMAIN, and NOERROR without answers (NODATA): per RFC 2308 §5, the
//!   smaller of the authority SOA's TTL and its MINIMUM field (and of the
//!   other records' TTLs); without an SOA, not kept (RFC 2308 §5: a
//!   negative answer without one is not cached).
//! - Not kept: SERVFAIL, REFUSED and every other code; the proxy's own
//!   SERVFAIL when no server answered; a truncated answer; an answer
//!   larger than 1232 bytes (one UDP datagram without fragmentation, which
//!   bounds a pod's cache at `max_entries` × 1232 bytes); a TTL of 0; what
//!   does not parse. SERVFAIL is not kept even briefly (RFC 2308 §7.1
//!   allows five minutes): a server failing for a moment would fail the
//!   pod for as long, and the in-flight caps already bound a retry storm.
//!
//! A kept answer is returned with the asking query's id and question (its
//! letter case), every TTL less the whole seconds it was held. Past
//! `max_entries` the least recently used answer goes; an expired one goes
//! when next asked for.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::time::Instant;

use super::metrics::DnsMetrics;
use super::wire::{EDNS_PAYLOAD, HEADER_LEN};
use crate::config::DnsCacheConfig;
use tidegate_base::sync::Locked;

/// The largest answer kept.
pub const MAX_ENTRY_BYTES: usize = EDNS_PAYLOAD as usize;

const OPT: u16 = 41;
const SOA: u16 = 6;
const NOERROR: u8 = 0;
const NXDOMAIN: u8 = 3;

/// What a query is cached under ([`key`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key(Vec<u8>);

/// The cache key of `query` (its question ending at `question_end`), or
/// `None` when it is not one the cache answers.
pub fn key(query: &[u8], question_end: usize) -> Option<Key> {
    let count = |at: usize| u16::from_be_bytes([query[at], query[at + 1]]);
    if query.len() < question_end || question_end <= HEADER_LEN {
        return None;
    }
    let (answers, authority, additional) = (count(6), count(8), count(10));
    if answers != 0 || authority != 0 || additional > 1 {
        return None;
    }
    // RD; AD and CD.
    let mut k = vec![query[2] & 0x01, query[3] & 0x30];
    k.extend(
        query[HEADER_LEN..question_end]
            .iter()
            .map(u8::to_ascii_lowercase),
    );
    if additional == 1 {
        let [rr] = records(query, question_end, 1)?.try_into().ok()?;
        // EDNS: a root owner, its record the last thing in the query.
        if rr.kind != OPT || query[question_end] != 0 || rr.end != query.len() {
            return None;
        }
        k.push(b'E');
        // Extended RCODE, version, DO and the other flags; not the UDP size.
        k.extend_from_slice(&query[rr.ttl_at..rr.ttl_at + 4]);
        k.extend_from_slice(&query[rr.ttl_at + 6..rr.end]);
    } else if question_end != query.len() {
        return None;
    }
    Some(Key(k))
}

/// One resource record, as offsets into its message.
struct Rr {
    kind: u16,
    ttl_at: usize,
    rdata_at: usize,
    end: usize,
}

/// The offset past the name at `at` (labels up to a root or a pointer; a
/// pointer is not followed, so a loop of them cannot hold the walk).
fn skip_name(bytes: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *bytes.get(at)?;
        match len & 0xc0 {
            0x00 if len == 0 => return Some(at + 1),
            0x00 => at += 1 + usize::from(len),
            0xc0 => return (at + 2 <= bytes.len()).then_some(at + 2),
            _ => return None,
        }
    }
}

/// `n` records from `at`.
fn records(bytes: &[u8], mut at: usize, n: usize) -> Option<Vec<Rr>> {
    let mut out = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let fixed = skip_name(bytes, at)?;
        let head = bytes.get(fixed..fixed + 10)?;
        let rdlength = usize::from(u16::from_be_bytes([head[8], head[9]]));
        let end = fixed + 10 + rdlength;
        if end > bytes.len() {
            return None;
        }
        out.push(Rr {
            kind: u16::from_be_bytes([head[0], head[1]]),
            ttl_at: fixed + 4,
            rdata_at: fixed + 10,
            end,
        });
        at = end;
    }
    Some(out)
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// A TTL as RFC 2181 §8 reads it: one with the top bit set is 0.
fn ttl_value(raw: u32) -> u32 {
    if raw > i32::MAX as u32 {
        0
    } else {
        raw
    }
}

/// What of `reply` (to a query whose question ends at `question_end`) is
/// kept: the offsets of its TTLs and how long, or why not (a metric label).
fn analyze(
    reply: &[u8],
    question_end: usize,
    max_ttl: Duration,
) -> Result<(Vec<u16>, Duration), &'static str> {
    if reply.len() > MAX_ENTRY_BYTES {
        return Err("too_large");
    }
    if reply.len() < question_end || question_end <= HEADER_LEN {
        return Err("malformed");
    }
    if reply[2] & 0x02 != 0 {
        return Err("truncated");
    }
    let rcode = reply[3] & 0x0f;
    if rcode != NOERROR && rcode != NXDOMAIN {
        return Err("rcode");
    }
    let count = |at: usize| usize::from(u16::from_be_bytes([reply[at], reply[at + 1]]));
    let (answers, authority, additional) = (count(6), count(8), count(10));
    let rrs = records(reply, question_end, answers + authority + additional).ok_or("malformed")?;
    let negative = rcode == NXDOMAIN || answers == 0;
    let mut ttl = u32::MAX;
    let mut soa_minimum = None;
    let mut offsets = Vec::with_capacity(rrs.len());
    for (i, rr) in rrs.iter().enumerate() {
        if rr.kind == OPT {
            // Its "TTL" is the extended RCODE and flags.
            continue;
        }
        ttl = ttl.min(ttl_value(read_u32(reply, rr.ttl_at)));
        offsets.push(u16::try_from(rr.ttl_at).map_err(|_| "too_large")?);
        let in_authority = (answers..answers + authority).contains(&i);
        // MINIMUM closes an SOA's data: MNAME, RNAME, then five numbers.
        if in_authority && rr.kind == SOA && rr.end - rr.rdata_at >= 22 {
            soa_minimum = Some(ttl_value(read_u32(reply, rr.end - 4)));
        }
    }
    if negative {
        ttl = ttl.min(soa_minimum.ok_or("no_soa")?);
    }
    let held = Duration::from_secs(ttl.into()).min(max_ttl);
    if held.is_zero() {
        return Err("zero_ttl");
    }
    Ok((offsets, held))
}

/// A kept answer.
struct Entry {
    /// As the upstream server sent it.
    reply: Box<[u8]>,
    /// Where its TTLs are.
    ttls: Box<[u16]>,
    question_end: usize,
    stored: Instant,
    expires: Instant,
    /// Its place in the use order.
    used: u64,
}

#[derive(Default)]
struct Lru {
    entries: HashMap<Key, Entry>,
    /// Use tick → key, least recent first.
    order: BTreeMap<u64, Key>,
    tick: u64,
}

impl Lru {
    fn touch(&mut self, key: &Key) {
        self.tick += 1;
        if let Some(e) = self.entries.get_mut(key) {
            self.order.remove(&e.used);
            e.used = self.tick;
            self.order.insert(self.tick, key.clone());
        }
    }

    fn remove(&mut self, key: &Key) -> bool {
        match self.entries.remove(key) {
            Some(e) => {
                self.order.remove(&e.used);
                true
            }
            None => false,
        }
    }

    fn pop_least_recent(&mut self) -> bool {
        match self.order.pop_first() {
            Some((_, key)) => self.entries.remove(&key).is_some(),
            None => false,
        }
    }
}

/// One pod's cache of forwarded answers.
pub struct Cache {
    max_entries: usize,
    max_ttl: Duration,
    metrics: DnsMetrics,
    /// `tidegate_dns_cache_entries`, the sum over pods: this cache's share
    /// is taken off when it goes.
    entries: Gauge,
    lru: Mutex<Lru>,
}

impl Cache {
    pub fn new(config: &DnsCacheConfig, metrics: &DnsMetrics) -> Cache {
        Cache {
            max_entries: config.max_entries as usize,
            max_ttl: config.max_ttl,
            metrics: metrics.clone(),
            entries: metrics.cache_entries.clone(),
            lru: Mutex::new(Lru::default()),
        }
    }

    /// The kept answer to `query` (the query's bytes, its question ending at
    /// `question_end`, cached under `key`) at `now`: the query's id and
    /// question, the TTLs less the time held. Not cut for a UDP buffer.
    pub fn answer(
        &self,
        key: Option<&Key>,
        query: &[u8],
        question_end: usize,
        now: Instant,
    ) -> Option<Vec<u8>> {
        if self.max_entries == 0 {
            return None;
        }
        let found = key.and_then(|key| self.lookup(key, query, question_end, now));
        match found {
            Some(_) => self.metrics.cache_hits.inc(),
            None => self.metrics.cache_misses.inc(),
        };
        found
    }

    fn lookup(
        &self,
        key: &Key,
        query: &[u8],
        question_end: usize,
        now: Instant,
    ) -> Option<Vec<u8>> {
        let mut lru = self.lru.locked();
        let e = lru.entries.get(key)?;
        if now >= e.expires {
            lru.remove(key);
            self.entries.dec();
            self.metrics.cache_evicted("expired");
            return None;
        }
        if e.question_end != question_end {
            return None;
        }
        let held =
            u32::try_from(now.saturating_duration_since(e.stored).as_secs()).unwrap_or(u32::MAX);
        let mut out = e.reply.to_vec();
        out[..2].copy_from_slice(&query[..2]);
        out[HEADER_LEN..question_end].copy_from_slice(&query[HEADER_LEN..question_end]);
        for &at in e.ttls.iter() {
            let at = usize::from(at);
            let ttl = read_u32(&out, at).saturating_sub(held);
            out[at..at + 4].copy_from_slice(&ttl.to_be_bytes());
        }
        lru.touch(key);
        Some(out)
    }

    /// Keeps `reply`, the upstream server's answer to the query cached
    /// under `key` (its question ending at `question_end`), received at
    /// `now`, if it is one to keep.
    pub fn store(&self, key: Option<&Key>, reply: &[u8], question_end: usize, now: Instant) {
        if self.max_entries == 0 {
            return;
        }
        let Some(key) = key else {
            self.metrics.cache_not_stored("query");
            return;
        };
        let (ttls, held) = match analyze(reply, question_end, self.max_ttl) {
            Ok(kept) => kept,
            Err(reason) => {
                self.metrics.cache_not_stored(reason);
                return;
            }
        };
        let mut lru = self.lru.locked();
        if lru.remove(key) {
            self.entries.dec();
        }
        while lru.entries.len() >= self.max_entries && lru.pop_least_recent() {
            self.entries.dec();
            self.metrics.cache_evicted("capacity");
        }
        lru.tick += 1;
        let used = lru.tick;
        lru.entries.insert(
            key.clone(),
            Entry {
                reply: reply.into(),
                ttls: ttls.into(),
                question_end,
                stored: now,
                expires: now + held,
                used,
            },
        );
        lru.order.insert(used, key.clone());
        self.entries.inc();
    }

    /// Answers held (expired ones not yet dropped among them).
    pub fn len(&self) -> usize {
        self.lru.locked().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        let held = self.lru.get_mut().map_or(0, |l| l.entries.len());
        self.entries.dec_by(i64::try_from(held).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
