//! The event's wire form in contract 0.3.0: one `list<u8>` in place of
//! the typed `event` variant, because wasmtime lowers a typed record field
//! by field (each store looks the instance's memory up again) and a string
//! at a time (one call into the guest's allocator each), which made the
//! event most of a decision's cost. One buffer is one allocation and one
//! copy into the sandbox. (proxy-wasm hands header maps to its plugins
//! serialized into one buffer for the same reason.)
//!
//! The layout follows the WIT type `event` of `tidegate:policy/types`
//! exactly, so that type stays the schema (`sdk/wit/policy.wit` states
//! these rules next to it):
//!
//! - `u32`, `u64`: 4 and 8 bytes, little-endian;
//! - `string`: its byte length as a `u32`, then the UTF-8 bytes;
//! - `option<T>`: one byte, 0 (none) or 1 followed by `T`;
//! - `list<T>`: the element count as a `u32`, then the elements;
//! - `tuple` and `record`: the fields in WIT order, nothing between them;
//! - `variant`: the case's index in WIT order as one byte, then its payload.
//!
//! The buffer holds exactly one `event`; anything after it is an error.
//! The host encodes ([`encode_event`], handing over only the declared
//! labels and annotations) and the SDK decodes ([`decode_event_into`]) on the
//! guest side; both live here so they cannot drift apart, and the round
//! trip is tested natively.

use std::collections::BTreeMap;
use std::fmt;

use crate::event::{
    ConnectFailing, Event, GatewayShutdown, NetworkTeardown, PeerInfo, PeerState, ShutdownStarted,
    TimerFired, WorkloadState,
};
use crate::reads::{Keys, MetadataReads};

/// Why a buffer is not an encoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    /// Byte offset where decoding stopped.
    pub at: usize,
    /// What was wrong there.
    pub what: WireProblem,
}

/// What a [`WireError`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireProblem {
    /// The buffer ends inside a value.
    Truncated,
    /// A string is not UTF-8.
    NotUtf8,
    /// A variant or option byte names no case.
    UnknownCase(u8),
    /// Bytes left after the event.
    Trailing(usize),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.what {
            WireProblem::Truncated => write!(f, "event truncated at byte {}", self.at),
            WireProblem::NotUtf8 => write!(f, "string at byte {} is not UTF-8", self.at),
            WireProblem::UnknownCase(c) => write!(f, "unknown case {c} at byte {}", self.at),
            WireProblem::Trailing(n) => write!(f, "{n} bytes after the event at byte {}", self.at),
        }
    }
}

impl std::error::Error for WireError {}

// ---- encoding (host side) -------------------------------------------------

/// Appends `event` to `out` in its wire form, with only the labels and
/// annotations `reads` declares. `out` can be reused across calls.
pub fn encode_event(event: &Event, reads: &MetadataReads, out: &mut Vec<u8>) {
    let mut w = Writer { out, reads };
    match event {
        Event::WorkloadAdded(s) => {
            w.case(0);
            w.workload(s);
        }
        Event::ShutdownStarted(e) => {
            w.case(1);
            w.workload(&e.workload);
            w.u64(e.grace_deadline_ms);
            w.u64(e.grace_remaining_ms);
        }
        Event::NetworkTeardown(e) => {
            w.case(2);
            w.workload(&e.workload);
            w.option(e.since_shutdown_ms.as_ref(), |w, v| w.u64(*v));
            w.u64(e.max_hold_ms);
        }
        Event::WorkloadDeleted(s) => {
            w.case(3);
            w.workload(s);
        }
        Event::PeerTerminating(p) => {
            w.case(4);
            w.peer_state(p);
        }
        Event::PeerDeleted(p) => {
            w.case(5);
            w.peer_state(p);
        }
        Event::ConnectFailing(e) => {
            w.case(6);
            w.string(&e.destination);
            w.option(e.peer.as_ref(), Writer::peer);
            w.u32(e.consecutive_failures);
            w.string(&e.last_error);
            w.u64(e.failing_for_ms);
        }
        Event::GatewayShutdown(e) => {
            w.case(7);
            w.u64(e.deadline_ms);
            w.u64(e.remaining_ms);
            w.len(e.workloads.len());
            for s in &e.workloads {
                w.workload(s);
            }
        }
        Event::TimerFired(e) => {
            w.case(8);
            w.string(&e.subject);
            w.string(&e.tag);
            w.option(e.workload.as_ref(), Writer::workload);
        }
    }
}

struct Writer<'a> {
    out: &'a mut Vec<u8>,
    reads: &'a MetadataReads,
}

impl Writer<'_> {
    fn case(&mut self, c: u8) {
        self.out.push(c);
    }

    fn u32(&mut self, v: u32) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    fn u64(&mut self, v: u64) {
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    /// A length as the `u32` the layout uses. Every length the gateway
    /// encodes is far below 4 GiB (the sandbox's memory is capped lower).
    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).expect("wire: a length above u32::MAX"));
    }

    fn string(&mut self, s: &str) {
        self.len(s.len());
        self.out.extend_from_slice(s.as_bytes());
    }

    fn option<T>(&mut self, v: Option<&T>, some: impl FnOnce(&mut Self, &T)) {
        match v {
            None => self.out.push(0),
            Some(v) => {
                self.out.push(1);
                some(self, v);
            }
        }
    }

    /// The pairs of `map` that `keys` keeps, as `list<tuple<string, string>>`,
    /// in key order (the guest's decoder overwrites the previous event's
    /// values in place when the keys come as they did then).
    fn pairs(&mut self, map: &BTreeMap<String, String>, keys: &Keys) {
        let count_at = self.out.len();
        self.u32(0);
        let mut n = 0u32;
        let mut pair = |w: &mut Self, k: &str, v: &str| {
            w.string(k);
            w.string(v);
            n += 1;
        };
        match keys {
            // Most policies declare a key or two, or none, and a pod
            // carries a dozen or more: looking the declared keys up is
            // cheaper than walking the map. Ascending keys (no duplicates)
            // come out in key order; others take the walk.
            Keys::Only(only) if only.len() < map.len() && only.is_sorted_by(|a, b| a < b) => {
                for k in only {
                    if let Some(v) = map.get(k) {
                        pair(self, k, v);
                    }
                }
            }
            _ => {
                for (k, v) in map.iter().filter(|(k, _)| keys.keeps(k)) {
                    pair(self, k, v);
                }
            }
        }
        self.out[count_at..count_at + 4].copy_from_slice(&n.to_le_bytes());
    }

    fn workload(&mut self, s: &WorkloadState) {
        let i = &s.info;
        self.string(&i.uid);
        self.string(&i.name);
        self.string(&i.namespace);
        self.string(&i.identity);
        self.pairs(&i.labels, &self.reads.labels);
        self.pairs(&i.annotations, &self.reads.annotations);
        self.u32(s.inbound_tunnels);
        self.u32(s.inbound_streams);
        self.u32(s.outbound_pooled_tunnels);
        self.u64(s.age_ms);
    }

    fn peer(&mut self, p: &PeerInfo) {
        self.string(&p.uid);
        self.string(&p.name);
        self.string(&p.namespace);
        self.string(&p.identity);
        self.string(&p.address);
    }

    fn peer_state(&mut self, p: &PeerState) {
        self.peer(&p.peer);
        self.u32(p.pooled_tunnels);
        self.u32(p.active_streams);
    }
}

// ---- decoding (guest side) ------------------------------------------------

/// The event a buffer encodes (see the module documentation).
pub fn decode_event(bytes: &[u8]) -> Result<Event, WireError> {
    let mut event = Event::WorkloadAdded(WorkloadState::default());
    decode_event_into(bytes, &mut event)?;
    Ok(event)
}

/// Decodes into `event`, reusing its strings' memory (and its workload's,
/// whatever the case): a warm plugin decodes an event without allocating
/// for its uid, name, namespace and identity. Every field is overwritten;
/// on error `event` holds a mix of old and new fields and must not be used.
pub fn decode_event_into(bytes: &[u8], event: &mut Event) -> Result<(), WireError> {
    let mut r = Reader { bytes, at: 0 };
    let case = r.u8()?;
    match case {
        0 | 3 => {
            let mut w = take_workload(event);
            r.workload(&mut w)?;
            *event = if case == 0 {
                Event::WorkloadAdded(w)
            } else {
                Event::WorkloadDeleted(w)
            };
        }
        1 => {
            if !matches!(event, Event::ShutdownStarted(_)) {
                let workload = take_workload(event);
                *event = Event::ShutdownStarted(ShutdownStarted {
                    workload,
                    ..ShutdownStarted::default()
                });
            }
            let Event::ShutdownStarted(e) = event else {
                unreachable!("set above")
            };
            r.workload(&mut e.workload)?;
            e.grace_deadline_ms = r.u64()?;
            e.grace_remaining_ms = r.u64()?;
        }
        2 => {
            if !matches!(event, Event::NetworkTeardown(_)) {
                let workload = take_workload(event);
                *event = Event::NetworkTeardown(NetworkTeardown {
                    workload,
                    ..NetworkTeardown::default()
                });
            }
            let Event::NetworkTeardown(e) = event else {
                unreachable!("set above")
            };
            r.workload(&mut e.workload)?;
            e.since_shutdown_ms = r.option(None, |r, _| r.u64())?;
            e.max_hold_ms = r.u64()?;
        }
        4 | 5 => {
            let mut p = match std::mem::replace(event, Event::WorkloadAdded(Default::default())) {
                Event::PeerTerminating(p) | Event::PeerDeleted(p) => p,
                _ => PeerState::default(),
            };
            r.peer(&mut p.peer)?;
            p.pooled_tunnels = r.u32()?;
            p.active_streams = r.u32()?;
            *event = if case == 4 {
                Event::PeerTerminating(p)
            } else {
                Event::PeerDeleted(p)
            };
        }
        6 => {
            if !matches!(event, Event::ConnectFailing(_)) {
                *event = Event::ConnectFailing(ConnectFailing::default());
            }
            let Event::ConnectFailing(e) = event else {
                unreachable!("set above")
            };
            r.string(&mut e.destination)?;
            let old = e.peer.take();
            e.peer = r.option(old, |r, mut p: PeerInfo| r.peer(&mut p).map(|()| p))?;
            e.consecutive_failures = r.u32()?;
            r.string(&mut e.last_error)?;
            e.failing_for_ms = r.u64()?;
        }
        7 => {
            if !matches!(event, Event::GatewayShutdown(_)) {
                *event = Event::GatewayShutdown(GatewayShutdown::default());
            }
            let Event::GatewayShutdown(e) = event else {
                unreachable!("set above")
            };
            e.deadline_ms = r.u64()?;
            e.remaining_ms = r.u64()?;
            let n = r.u32()? as usize;
            // Grown one decoded workload at a time: a bad count must not
            // allocate.
            for i in 0..n {
                if i == e.workloads.len() {
                    e.workloads.push(WorkloadState::default());
                }
                r.workload(&mut e.workloads[i])?;
            }
            e.workloads.truncate(n);
        }
        8 => {
            if !matches!(event, Event::TimerFired(_)) {
                let workload = Some(take_workload(event));
                *event = Event::TimerFired(TimerFired {
                    workload,
                    ..TimerFired::default()
                });
            }
            let Event::TimerFired(e) = event else {
                unreachable!("set above")
            };
            r.string(&mut e.subject)?;
            r.string(&mut e.tag)?;
            let old = e.workload.take();
            e.workload = r.option(old, |r, mut w: WorkloadState| {
                r.workload(&mut w).map(|()| w)
            })?;
        }
        c => return Err(r.error_at(0, WireProblem::UnknownCase(c))),
    }
    let left = r.bytes.len() - r.at;
    if left > 0 {
        return Err(r.error_at(r.at, WireProblem::Trailing(left)));
    }
    Ok(())
}

/// The workload `event` carries (to reuse its memory), or a new one.
fn take_workload(event: &mut Event) -> WorkloadState {
    match event {
        Event::WorkloadAdded(w) | Event::WorkloadDeleted(w) => std::mem::take(w),
        Event::ShutdownStarted(e) => std::mem::take(&mut e.workload),
        Event::NetworkTeardown(e) => std::mem::take(&mut e.workload),
        Event::TimerFired(e) => e.workload.take().unwrap_or_default(),
        Event::GatewayShutdown(e) => e.workloads.pop().unwrap_or_default(),
        Event::PeerTerminating(_) | Event::PeerDeleted(_) | Event::ConnectFailing(_) => {
            WorkloadState::default()
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// `a == b`, eight bytes at a time. On wasm32 a slice comparison is a call
/// to the guest's `memcmp`, a byte loop that took ~500 instructions to
/// compare one 21-byte annotation key (callgrind, `recommended`): a
/// fifth of the event's decoding.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a.len() < 8 {
        return a.iter().zip(b).all(|(x, y)| x == y);
    }
    // The last word overlaps the chunks when the length is no multiple of 8.
    let last = a.len() - 8;
    a.chunks_exact(8)
        .zip(b.chunks_exact(8))
        .all(|(x, y)| word(x) == word(y))
        && word(&a[last..]) == word(&b[last..])
}

fn word(b: &[u8]) -> u64 {
    u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

impl Reader<'_> {
    fn error_at(&self, at: usize, what: WireProblem) -> WireError {
        WireError { at, what }
    }

    fn take(&mut self, n: usize) -> Result<&[u8], WireError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| self.error_at(self.at, WireProblem::Truncated))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// Overwrites `into`, keeping its memory.
    fn string(&mut self, into: &mut String) -> Result<(), WireError> {
        let n = self.u32()? as usize;
        let at = self.at;
        let bytes = self.take(n)?;
        let s = std::str::from_utf8(bytes).map_err(|_| WireError {
            at,
            what: WireProblem::NotUtf8,
        })?;
        into.clear();
        into.push_str(s);
        Ok(())
    }

    /// An `option<T>`; when present, `some` decodes it into `old` (or a
    /// new `T`).
    fn option<T: Default>(
        &mut self,
        old: Option<T>,
        some: impl FnOnce(&mut Self, T) -> Result<T, WireError>,
    ) -> Result<Option<T>, WireError> {
        let at = self.at;
        match self.u8()? {
            0 => Ok(None),
            1 => some(self, old.unwrap_or_default()).map(Some),
            c => Err(self.error_at(at, WireProblem::UnknownCase(c))),
        }
    }

    /// The string's bytes, borrowed from the buffer (not yet checked).
    fn bytes(&mut self) -> Result<&[u8], WireError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// Overwrites `map`. When the pairs have the keys `map` already holds,
    /// in its order (the same workload again; the host encodes a map in
    /// key order), only the values are overwritten, in their memory.
    fn pairs(&mut self, map: &mut BTreeMap<String, String>) -> Result<(), WireError> {
        let n = self.u32()?;
        if map.len() == n as usize {
            let start = self.at;
            let mut same = true;
            for (k, v) in map.iter_mut() {
                if !same_bytes(self.bytes()?, k.as_bytes()) {
                    same = false;
                    break;
                }
                self.string(v)?;
            }
            if same {
                return Ok(());
            }
            self.at = start;
        }
        map.clear();
        for _ in 0..n {
            let (mut k, mut v) = (String::new(), String::new());
            self.string(&mut k)?;
            self.string(&mut v)?;
            map.insert(k, v);
        }
        Ok(())
    }

    fn workload(&mut self, w: &mut WorkloadState) -> Result<(), WireError> {
        let i = &mut w.info;
        self.string(&mut i.uid)?;
        self.string(&mut i.name)?;
        self.string(&mut i.namespace)?;
        self.string(&mut i.identity)?;
        self.pairs(&mut i.labels)?;
        self.pairs(&mut i.annotations)?;
        w.inbound_tunnels = self.u32()?;
        w.inbound_streams = self.u32()?;
        w.outbound_pooled_tunnels = self.u32()?;
        w.age_ms = self.u64()?;
        Ok(())
    }

    fn peer(&mut self, p: &mut PeerInfo) -> Result<(), WireError> {
        self.string(&mut p.uid)?;
        self.string(&mut p.name)?;
        self.string(&mut p.namespace)?;
        self.string(&mut p.identity)?;
        self.string(&mut p.address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::WorkloadInfo;

    fn workload(uid: &str) -> WorkloadState {
        WorkloadState {
            info: WorkloadInfo::new(uid)
                .named("shop", "web-0")
                .with_label("app", "web")
                .with_label("tier", "front")
                .with_annotation("tidegate.io/oci-drain", "true")
                .with_annotation("kubectl.kubernetes.io/last-applied", "{}"),
            inbound_tunnels: 2,
            inbound_streams: 7,
            outbound_pooled_tunnels: 1,
            age_ms: 86_400_000,
        }
    }

    fn peer(uid: &str) -> PeerInfo {
        PeerInfo {
            uid: uid.into(),
            name: "db-1".into(),
            namespace: "data".into(),
            identity: "spiffe://cluster.local/ns/data/sa/db".into(),
            address: "10.0.3.7:15008".into(),
        }
    }

    /// One event of every case, with every optional field both ways.
    fn every_event() -> Vec<Event> {
        let mut w = workload("w-1");
        w.info.identity = "spiffe://cluster.local/ns/shop/sa/web".into();
        vec![
            Event::WorkloadAdded(w.clone()),
            Event::ShutdownStarted(ShutdownStarted {
                workload: w.clone(),
                grace_deadline_ms: 1_700_000_030_000,
                grace_remaining_ms: 30_000,
            }),
            Event::NetworkTeardown(NetworkTeardown {
                workload: w.clone(),
                since_shutdown_ms: Some(12_345),
                max_hold_ms: 10_000,
            }),
            Event::NetworkTeardown(NetworkTeardown {
                workload: w.clone(),
                since_shutdown_ms: None,
                max_hold_ms: u64::MAX,
            }),
            Event::WorkloadDeleted(w.clone()),
            Event::PeerTerminating(PeerState {
                peer: peer("p-1"),
                pooled_tunnels: 3,
                active_streams: u32::MAX,
            }),
            Event::PeerDeleted(PeerState {
                peer: peer("p-2"),
                pooled_tunnels: 0,
                active_streams: 0,
            }),
            Event::ConnectFailing(ConnectFailing {
                destination: "10.0.3.7:15008".into(),
                peer: Some(peer("p-3")),
                consecutive_failures: 4,
                last_error: "connection refused (os error 111) — ünïcode".into(),
                failing_for_ms: 2_500,
            }),
            Event::ConnectFailing(ConnectFailing {
                destination: "[fd00::7]:15008".into(),
                peer: None,
                consecutive_failures: 1,
                last_error: String::new(),
                failing_for_ms: 0,
            }),
            Event::GatewayShutdown(GatewayShutdown {
                deadline_ms: 1_700_000_005_000,
                remaining_ms: 5_000,
                workloads: vec![w.clone(), workload("w-2"), workload("w-3")],
            }),
            Event::GatewayShutdown(GatewayShutdown::default()),
            Event::TimerFired(TimerFired {
                subject: "w-1".into(),
                tag: "recheck".into(),
                workload: Some(w),
            }),
            Event::TimerFired(TimerFired {
                subject: "gone".into(),
                tag: String::new(),
                workload: None,
            }),
        ]
    }

    fn encoded(event: &Event, reads: &MetadataReads) -> Vec<u8> {
        let mut out = Vec::new();
        encode_event(event, reads, &mut out);
        out
    }

    #[test]
    fn every_event_round_trips() {
        for event in every_event() {
            let bytes = encoded(&event, &MetadataReads::everything());
            assert_eq!(decode_event(&bytes), Ok(event.clone()), "{event:?}");
        }
    }

    #[test]
    fn only_declared_keys_cross() {
        let reads = MetadataReads::none()
            .label("tier")
            .annotation("tidegate.io/oci-drain");
        for event in every_event() {
            let mut expected = event.clone();
            reads.filter(&mut expected);
            let bytes = encoded(&event, &reads);
            assert_eq!(decode_event(&bytes), Ok(expected), "{event:?}");
            // Nothing undeclared is even in the buffer.
            let text = String::from_utf8_lossy(&bytes);
            assert!(!text.contains("last-applied"), "{event:?}");
            assert!(!text.contains("app"), "{event:?}");
        }
    }

    /// However the keys are declared (in order or not, repeated, absent
    /// from the pod, more of them than the pod has), the buffer is the one
    /// the declared pairs alone give: each kept pair once, in key order.
    #[test]
    fn declared_keys_cross_once_in_key_order() {
        let mut event = Event::WorkloadAdded(workload("w-1"));
        if let Event::WorkloadAdded(w) = &mut event {
            for (k, v) in [("zone", "b"), ("version", "3"), ("team", "shop")] {
                w.info.labels.insert(k.into(), v.into());
            }
        }
        let declarations: [&[&str]; 6] = [
            &["tier", "zone"],
            &["zone", "tier"],
            &["zone", "tier", "zone"],
            &["absent", "zone", "tier"],
            &["app", "team", "tier", "version", "zone", "x", "y"],
            &[],
        ];
        for labels in declarations {
            let reads = labels.iter().fold(MetadataReads::none(), |r, k| r.label(k));
            let mut kept = event.clone();
            reads.filter(&mut kept);
            let expected = encoded(&kept, &MetadataReads::everything());
            assert_eq!(encoded(&event, &reads), expected, "{labels:?}");
            // As the host keeps them: sorted, each once, the same buffer.
            let ordered = reads.in_key_order();
            let Keys::Only(keys) = &ordered.labels else {
                panic!("{labels:?} became every key");
            };
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
            assert!(labels.iter().all(|l| keys.iter().any(|k| k == l)));
            assert_eq!(encoded(&event, &ordered), expected, "{labels:?}");
        }
    }

    /// The layout is the documented one, byte for byte (the WIT comment
    /// states the same rules for authors of other languages).
    #[test]
    fn layout_is_the_documented_one() {
        let event = Event::NetworkTeardown(NetworkTeardown {
            workload: WorkloadState {
                info: WorkloadInfo::new("u").with_label("a", "b"),
                inbound_tunnels: 1,
                inbound_streams: 2,
                outbound_pooled_tunnels: 3,
                age_ms: 4,
            },
            since_shutdown_ms: Some(5),
            max_hold_ms: 6,
        });
        let mut want = vec![2u8]; // case network-teardown
        want.extend([1, 0, 0, 0, b'u']); // uid
        want.extend([0u8; 12]); // name, namespace, identity: empty
        want.extend([1, 0, 0, 0, 1, 0, 0, 0, b'a', 1, 0, 0, 0, b'b']); // labels
        want.extend([0, 0, 0, 0]); // annotations
        want.extend([1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0]); // counters
        want.extend(4u64.to_le_bytes()); // age-ms
        want.push(1); // since-shutdown-ms: some
        want.extend(5u64.to_le_bytes());
        want.extend(6u64.to_le_bytes()); // max-hold-ms
        assert_eq!(encoded(&event, &MetadataReads::everything()), want);
    }

    #[test]
    fn every_cut_of_a_buffer_is_a_truncation_error() {
        for event in every_event() {
            let bytes = encoded(&event, &MetadataReads::everything());
            for cut in 0..bytes.len() {
                let err = decode_event(&bytes[..cut]).unwrap_err();
                assert_eq!(err.what, WireProblem::Truncated, "{event:?} cut at {cut}");
                assert!(err.at <= cut);
            }
        }
    }

    #[test]
    fn bad_buffers_say_what_and_where() {
        let good = encoded(
            &Event::WorkloadAdded(WorkloadState::new(WorkloadInfo::new("ab"))),
            &MetadataReads::everything(),
        );
        let mut trailing = good.clone();
        trailing.extend([0, 0]);
        let err = decode_event(&trailing).unwrap_err();
        assert_eq!((err.at, err.what), (good.len(), WireProblem::Trailing(2)));

        assert_eq!(
            decode_event(&[9]).unwrap_err().what,
            WireProblem::UnknownCase(9)
        );

        let mut not_utf8 = good.clone();
        not_utf8[5] = 0xff; // the uid's first byte
        let err = decode_event(&not_utf8).unwrap_err();
        assert_eq!((err.at, err.what.clone()), (5, WireProblem::NotUtf8));
        assert_eq!(err.to_string(), "string at byte 5 is not UTF-8");

        // A huge length is a truncation, not an allocation.
        let mut huge = vec![0u8];
        huge.extend(u32::MAX.to_le_bytes());
        assert_eq!(
            decode_event(&huge).unwrap_err().what,
            WireProblem::Truncated
        );
        let mut many = vec![7u8];
        many.extend([0u8; 16]);
        many.extend(u32::MAX.to_le_bytes());
        assert_eq!(
            decode_event(&many).unwrap_err().what,
            WireProblem::Truncated
        );

        let mut bad_option = encoded(
            &Event::TimerFired(TimerFired::default()),
            &MetadataReads::everything(),
        );
        *bad_option.last_mut().unwrap() = 2;
        assert_eq!(
            decode_event(&bad_option).unwrap_err().what,
            WireProblem::UnknownCase(2)
        );
    }

    /// Decoding into an event that held any other event gives exactly
    /// what decoding afresh gives: no field of the earlier one survives.
    #[test]
    fn decoding_into_a_used_event_leaves_nothing_of_it() {
        let reads = MetadataReads::none().label("app");
        let events = every_event();
        for before in &events {
            for after in &events {
                let mut scratch = before.clone();
                let bytes = encoded(after, &reads);
                decode_event_into(&bytes, &mut scratch).unwrap();
                let mut expected = after.clone();
                reads.filter(&mut expected);
                assert_eq!(scratch, expected, "{before:?} then {after:?}");
            }
        }
    }

    /// The same workload again with new values, or with other keys of
    /// the same count, decodes as afresh (values overwritten in place,
    /// keys replaced).
    #[test]
    fn labels_decoded_in_place_are_the_new_ones() {
        let with = |labels: &[(&str, &str)]| {
            let mut w = WorkloadState::new(WorkloadInfo::new("u"));
            for (k, v) in labels {
                w.info.labels.insert((*k).into(), (*v).into());
            }
            Event::WorkloadAdded(w)
        };
        let first = with(&[("app", "web"), ("tier", "front")]);
        let seconds = [
            with(&[("app", "api"), ("tier", "back-end-longer-than-before")]),
            with(&[("app", "web"), ("zone", "a")]),
            with(&[("team", "x"), ("tier", "front")]),
            with(&[("app", "web")]),
            with(&[]),
        ];
        for second in seconds {
            let mut scratch = decode_event(&encoded(&first, &MetadataReads::everything())).unwrap();
            let bytes = encoded(&second, &MetadataReads::everything());
            decode_event_into(&bytes, &mut scratch).unwrap();
            assert_eq!(scratch, second);
        }
    }

    /// The word-wise comparison the in-place decoder uses for keys: every
    /// length from 0 to 3 words, every position of a difference (in a full
    /// word, in the overlapping last word, in a short slice).
    #[test]
    fn keys_compare_equal_only_when_every_byte_is() {
        for n in 0..=24u8 {
            let a: Vec<u8> = (0..n).map(|i| b'a' + i).collect();
            assert!(same_bytes(&a, &a.clone()), "{n} bytes");
            for at in 0..a.len() {
                let mut b = a.clone();
                b[at] ^= 0x20;
                assert!(!same_bytes(&a, &b), "{n} bytes, differing at {at}");
            }
            let mut longer = a.clone();
            longer.push(b'z');
            assert!(!same_bytes(&a, &longer), "{n} bytes against {}", n + 1);
        }
    }

    /// Strings that are not ASCII decode as they were encoded.
    #[test]
    fn strings_beyond_ascii_round_trip() {
        let mut info = WorkloadInfo::new("uid-ü");
        info.namespace = "ns-名前".into();
        info.labels.insert("app".into(), "wéb".into());
        let event = Event::WorkloadAdded(WorkloadState::new(info));
        let bytes = encoded(&event, &MetadataReads::everything());
        assert_eq!(decode_event(&bytes).as_ref(), Ok(&event));
    }

    #[test]
    fn a_reused_buffer_holds_only_the_last_event_after_clear() {
        let mut out = Vec::new();
        let events = every_event();
        for event in &events {
            out.clear();
            encode_event(event, &MetadataReads::everything(), &mut out);
            assert_eq!(decode_event(&out).as_ref(), Ok(event));
        }
    }
}
