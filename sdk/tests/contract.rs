//! The event codec checked field by field against the WIT it implements.
//!
//! `sdk/wit/policy.wit` is the contract: the `event` variant is the schema
//! of the buffer `decide` takes, and `tidegate_sdk::wire` writes it by hand
//! (the host encodes with it, the SDK decodes with it). These tests read the
//! WIT with `wit-parser`, decode what the codec wrote by walking the WIT's
//! types alone, and check that every value lands in the field of its name:
//! each event is built with every string set to its own WIT path and every
//! number to a hash of its path, so a case number, a field order, a missing
//! or an extra field the codec disagrees on with the WIT fails here.

use std::collections::BTreeSet;
use std::path::Path;

use tidegate_sdk::wire::encode_event;
use tidegate_sdk::{
    ConnectFailing, Event, GatewayShutdown, MetadataReads, NetworkTeardown, PeerInfo, PeerState,
    ShutdownStarted, TimerFired, WorkloadInfo, WorkloadState, EVENT_KINDS,
};
use wit_parser::{Resolve, Type, TypeDefKind, TypeId};

/// A value read from the buffer at a WIT path.
#[derive(Debug, PartialEq)]
enum Leaf {
    Case(String),
    U32(u32),
    U64(u64),
    Text(String),
    Absent,
}

/// The WIT's `event` type, with the resolve that holds it.
fn event_schema() -> (Resolve, TypeId) {
    let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("wit/policy.wit");
    let mut resolve = Resolve::default();
    resolve
        .push_file(&wit)
        .unwrap_or_else(|e| panic!("{}: {e:#}", wit.display()));
    let types = resolve
        .interfaces
        .iter()
        .find(|(_, i)| i.name.as_deref() == Some("types"))
        .map(|(_, i)| i)
        .expect("interface types");
    let event = *types.types.get("event").expect("type event");
    (resolve, event)
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// Reads the buffer by the WIT's types and the layout rules the WIT states
/// next to `event`, recording each leaf with its path.
struct Walk<'a> {
    resolve: &'a Resolve,
    buf: &'a [u8],
    at: usize,
    leaves: Vec<(String, Leaf)>,
}

impl Walk<'_> {
    fn take(&mut self, n: usize, path: &str) -> &[u8] {
        let Some(bytes) = self.buf.get(self.at..self.at + n) else {
            panic!(
                "{path}: the buffer ends at {} inside a value",
                self.buf.len()
            );
        };
        self.at += n;
        bytes
    }

    fn u32(&mut self, path: &str) -> u32 {
        u32::from_le_bytes(self.take(4, path).try_into().unwrap())
    }

    fn ty(&mut self, ty: &Type, path: &str) {
        match ty {
            Type::U32 => {
                let v = self.u32(path);
                self.leaves.push((path.to_owned(), Leaf::U32(v)));
            }
            Type::U64 => {
                let v = u64::from_le_bytes(self.take(8, path).try_into().unwrap());
                self.leaves.push((path.to_owned(), Leaf::U64(v)));
            }
            Type::String => {
                let len = self.u32(path) as usize;
                let text = String::from_utf8(self.take(len, path).to_vec())
                    .unwrap_or_else(|e| panic!("{path}: {e}"));
                self.leaves.push((path.to_owned(), Leaf::Text(text)));
            }
            Type::Id(id) => self.def(*id, path),
            other => panic!("{path}: {other:?} has no wire rule; state one in the WIT first"),
        }
    }

    fn def(&mut self, id: TypeId, path: &str) {
        match &self.resolve.types[id].kind {
            TypeDefKind::Type(t) => self.ty(t, path),
            TypeDefKind::Record(r) => {
                for f in &r.fields {
                    self.ty(&f.ty, &join(path, &f.name));
                }
            }
            TypeDefKind::Tuple(t) => {
                for (i, t) in t.types.iter().enumerate() {
                    self.ty(t, &join(path, &i.to_string()));
                }
            }
            TypeDefKind::Option(t) => match self.take(1, path)[0] {
                0 => self.leaves.push((path.to_owned(), Leaf::Absent)),
                1 => self.ty(t, path),
                b => panic!("{path}: option byte {b}"),
            },
            TypeDefKind::List(t) => {
                for i in 0..self.u32(path) {
                    self.ty(t, &format!("{path}[{i}]"));
                }
            }
            TypeDefKind::Variant(v) => {
                let index = self.take(1, path)[0];
                let Some(case) = v.cases.get(usize::from(index)) else {
                    panic!("{path}: case {index}, the WIT has {}", v.cases.len());
                };
                self.leaves
                    .push((path.to_owned(), Leaf::Case(case.name.clone())));
                if let Some(t) = &case.ty {
                    self.ty(t, &join(path, &case.name));
                }
            }
            other => panic!("{path}: a {} has no wire rule", other.as_str()),
        }
    }
}

/// Reads one `event` from `buf` by the WIT's types.
fn walk<'a>(resolve: &'a Resolve, event: TypeId, buf: &'a [u8]) -> Walk<'a> {
    let mut walk = Walk {
        resolve,
        buf,
        at: 0,
        leaves: Vec::new(),
    };
    walk.def(event, "");
    walk
}

/// FNV-1a of the path: a number that says which field it was written for.
fn n64(path: &str) -> u64 {
    path.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn n32(path: &str) -> u32 {
    n64(path) as u32
}

fn info(p: &str) -> WorkloadInfo {
    let pair = |m: &str| {
        [(format!("{p}.{m}[0].0"), format!("{p}.{m}[0].1"))]
            .into_iter()
            .collect()
    };
    WorkloadInfo {
        uid: format!("{p}.uid"),
        name: format!("{p}.name"),
        namespace: format!("{p}.namespace"),
        identity: format!("{p}.identity"),
        labels: pair("labels"),
        annotations: pair("annotations"),
    }
}

fn workload(p: &str) -> WorkloadState {
    WorkloadState {
        info: info(&format!("{p}.info")),
        inbound_tunnels: n32(&format!("{p}.inbound-tunnels")),
        inbound_streams: n32(&format!("{p}.inbound-streams")),
        outbound_pooled_tunnels: n32(&format!("{p}.outbound-pooled-tunnels")),
        age_ms: n64(&format!("{p}.age-ms")),
    }
}

fn peer(p: &str) -> PeerInfo {
    PeerInfo {
        uid: format!("{p}.uid"),
        name: format!("{p}.name"),
        namespace: format!("{p}.namespace"),
        identity: format!("{p}.identity"),
        address: format!("{p}.address"),
    }
}

fn peer_state(p: &str) -> PeerState {
    PeerState {
        peer: peer(&format!("{p}.peer")),
        pooled_tunnels: n32(&format!("{p}.pooled-tunnels")),
        active_streams: n32(&format!("{p}.active-streams")),
    }
}

/// One event of every case, every optional value present, every list one
/// element long, each value named after its WIT path.
fn every_case() -> Vec<Event> {
    vec![
        Event::WorkloadAdded(workload("workload-added")),
        Event::ShutdownStarted(ShutdownStarted {
            workload: workload("shutdown-started.workload"),
            grace_deadline_ms: n64("shutdown-started.grace-deadline-ms"),
            grace_remaining_ms: n64("shutdown-started.grace-remaining-ms"),
        }),
        Event::NetworkTeardown(NetworkTeardown {
            workload: workload("network-teardown.workload"),
            since_shutdown_ms: Some(n64("network-teardown.since-shutdown-ms")),
            max_hold_ms: n64("network-teardown.max-hold-ms"),
        }),
        Event::WorkloadDeleted(workload("workload-deleted")),
        Event::PeerTerminating(peer_state("peer-terminating")),
        Event::PeerDeleted(peer_state("peer-deleted")),
        Event::ConnectFailing(ConnectFailing {
            destination: "connect-failing.destination".into(),
            peer: Some(peer("connect-failing.peer")),
            consecutive_failures: n32("connect-failing.consecutive-failures"),
            last_error: "connect-failing.last-error".into(),
            failing_for_ms: n64("connect-failing.failing-for-ms"),
        }),
        Event::GatewayShutdown(GatewayShutdown {
            deadline_ms: n64("gateway-shutdown.deadline-ms"),
            remaining_ms: n64("gateway-shutdown.remaining-ms"),
            workloads: vec![workload("gateway-shutdown.workloads[0]")],
        }),
        Event::TimerFired(TimerFired {
            subject: "timer-fired.subject".into(),
            tag: "timer-fired.tag".into(),
            workload: Some(workload("timer-fired.workload")),
        }),
    ]
}

/// Every case's number is its place in the WIT, and every field sits
/// where the WIT puts it, with nothing missing or added.
#[test]
fn the_codec_writes_every_field_where_the_wit_puts_it() {
    let (resolve, event) = event_schema();
    let mut cases = BTreeSet::new();
    for e in every_case() {
        let mut buf = Vec::new();
        encode_event(&e, &MetadataReads::everything(), &mut buf);
        let walk = walk(&resolve, event, &buf);
        assert_eq!(walk.at, buf.len(), "{}: bytes after the event", e.kind());
        let (first, rest) = walk.leaves.split_first().expect("a case");
        assert_eq!(first, &(String::new(), Leaf::Case(e.kind().into())));
        cases.insert(e.kind());
        for (path, leaf) in rest {
            match leaf {
                Leaf::Text(t) => assert_eq!(t, path, "the string read at {path}"),
                Leaf::U32(v) => assert_eq!(*v, n32(path), "the u32 read at {path}"),
                Leaf::U64(v) => assert_eq!(*v, n64(path), "the u64 read at {path}"),
                other => panic!("{path}: {other:?} where a value was written"),
            }
        }
    }
    assert_eq!(cases.len(), EVENT_KINDS.len(), "{cases:?}");
}

/// The SDK's list of event kinds is the WIT's list of cases, in order:
/// the case numbers the codec writes and reads.
#[test]
fn the_event_kinds_are_the_wit_cases_in_order() {
    let (resolve, event) = event_schema();
    let TypeDefKind::Variant(v) = &resolve.types[event].kind else {
        panic!("event is not a variant");
    };
    let wit: Vec<&str> = v.cases.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(wit, EVENT_KINDS);
}

/// The walk itself catches a codec that disagrees: a buffer whose two
/// u32 fields are swapped reads the wrong value at each.
#[test]
fn a_swapped_field_is_caught() {
    let (resolve, event) = event_schema();
    let e = Event::WorkloadAdded(workload("workload-added"));
    let mut buf = Vec::new();
    encode_event(&e, &MetadataReads::everything(), &mut buf);
    let tunnels = n32("workload-added.inbound-tunnels").to_le_bytes();
    let streams = n32("workload-added.inbound-streams").to_le_bytes();
    let at = buf
        .windows(8)
        .position(|w| w[..4] == tunnels && w[4..] == streams)
        .expect("the two counts, in WIT order");
    buf[at..at + 4].copy_from_slice(&streams);
    buf[at + 4..at + 8].copy_from_slice(&tunnels);
    let walk = walk(&resolve, event, &buf);
    let wrong: Vec<&str> = walk
        .leaves
        .iter()
        .filter(|(p, l)| matches!(l, Leaf::U32(v) if *v != n32(p)))
        .map(|(p, _)| p.as_str())
        .collect();
    assert_eq!(
        wrong,
        [
            "workload-added.inbound-tunnels",
            "workload-added.inbound-streams"
        ]
    );
}
