use crate::__private::Slot;
use crate::bindings::tidegate::policy::types as wit;
use crate::*;

fn wit_workload(uid: &str) -> wit::WorkloadState {
    wit::WorkloadState {
        info: wit::WorkloadInfo {
            uid: uid.into(),
            name: "web-1".into(),
            namespace: "shop".into(),
            identity: "spiffe://cluster.local/ns/shop/sa/web".into(),
            labels: vec![("app".into(), "web".into())],
            annotations: vec![("tidegate.io/oci-drain".into(), "true".into())],
        },
        inbound_tunnels: 1,
        inbound_streams: 2,
        outbound_pooled_tunnels: 3,
        age_ms: 4,
    }
}

fn wit_peer() -> wit::PeerInfo {
    wit::PeerInfo {
        uid: "peer-1".into(),
        name: "db-0".into(),
        namespace: "data".into(),
        identity: "spiffe://cluster.local/ns/data/sa/db".into(),
        address: "10.0.0.9:15008".into(),
    }
}

#[test]
fn wit_event_fields_land_in_the_same_named_sdk_fields() {
    let Event::ShutdownStarted(s) =
        Event::from(wit::Event::ShutdownStarted(wit::ShutdownStarted {
            workload: wit_workload("u1"),
            grace_deadline_ms: 5,
            grace_remaining_ms: 6,
        }))
    else {
        panic!("wrong case");
    };
    let w = &s.workload;
    assert_eq!(
        (
            w.inbound_tunnels,
            w.inbound_streams,
            w.outbound_pooled_tunnels,
            w.age_ms
        ),
        (1, 2, 3, 4)
    );
    assert_eq!((s.grace_deadline_ms, s.grace_remaining_ms), (5, 6));
    assert_eq!(
        (&*w.info.uid, &*w.info.name, &*w.info.namespace),
        ("u1", "web-1", "shop")
    );
    assert_eq!(w.info.identity, "spiffe://cluster.local/ns/shop/sa/web");
    assert_eq!(w.info.label("app"), Some("web"));
    assert_eq!(w.info.annotation("tidegate.io/oci-drain"), Some("true"));
    assert_eq!(w.info.label("tidegate.io/oci-drain"), None);

    let Event::ConnectFailing(c) = Event::from(wit::Event::ConnectFailing(wit::ConnectFailing {
        destination: "10.0.0.9:15008".into(),
        peer: Some(wit_peer()),
        consecutive_failures: 7,
        last_error: "connection refused".into(),
        failing_for_ms: 8,
    })) else {
        panic!("wrong case");
    };
    assert_eq!((c.consecutive_failures, c.failing_for_ms), (7, 8));
    let p = c.peer.unwrap();
    assert_eq!(
        (&*p.uid, &*p.name, &*p.namespace),
        ("peer-1", "db-0", "data")
    );
    assert_eq!(
        (&*p.identity, &*p.address),
        ("spiffe://cluster.local/ns/data/sa/db", "10.0.0.9:15008")
    );
}

fn every_event() -> Vec<Event> {
    let w = WorkloadState::from(wit_workload("u1"));
    let peer = PeerState {
        peer: wit_peer().into(),
        pooled_tunnels: 2,
        active_streams: 9,
    };
    vec![
        Event::WorkloadAdded(w.clone()),
        Event::ShutdownStarted(ShutdownStarted {
            workload: w.clone(),
            grace_deadline_ms: 1,
            grace_remaining_ms: 2,
        }),
        Event::NetworkTeardown(NetworkTeardown {
            workload: w.clone(),
            since_shutdown_ms: Some(3),
            max_hold_ms: 4,
        }),
        Event::WorkloadDeleted(w.clone()),
        Event::PeerTerminating(peer.clone()),
        Event::PeerDeleted(peer),
        Event::ConnectFailing(ConnectFailing {
            destination: "d".into(),
            peer: None,
            consecutive_failures: 3,
            last_error: "e".into(),
            failing_for_ms: 5,
        }),
        Event::GatewayShutdown(GatewayShutdown {
            deadline_ms: 6,
            remaining_ms: 7,
            workloads: vec![w.clone(), WorkloadState::new(WorkloadInfo::new("u2"))],
        }),
        Event::TimerFired(TimerFired {
            subject: "u1".into(),
            tag: "t".into(),
            workload: Some(w),
        }),
    ]
}

fn every_action() -> Vec<Action> {
    let w = WorkloadInfo::new("u1");
    vec![
        Action::goaway_inbound(&w)
            .immediate()
            .delay_ms(5)
            .hard_deadline_ms(9)
            .close_notify(true)
            .into(),
        Action::goaway_outbound("peer-1").into(),
        Action::goaway_both(&w).into(),
        Action::evict_now("peer-1"),
        Action::evict_when_idle("peer-1"),
        Action::backoff("10.0.0.9:15008")
            .initial_ms(1)
            .max_ms(2)
            .multiplier(1.5)
            .jitter(0.1)
            .into(),
        Action::oci_drain(&w)
            .at_capacity(AtCapacity::RemoveEarly)
            .into(),
        Action::oci_drain(&w).undrain().into(),
        Action::hold_teardown(&w, 3000),
        Action::set_timer(&w, "recheck", 250),
        Action::log(LogLevel::Error, "x"),
    ]
}

#[test]
fn events_and_actions_survive_a_round_trip_through_the_bindings() {
    for e in every_event() {
        assert_eq!(Event::from(wit::Event::from(e.clone())), e);
    }
    for a in every_action() {
        assert_eq!(Action::from(wit::Action::from(a.clone())), a);
    }
}

#[test]
fn builders_set_what_they_say() {
    let w = WorkloadInfo::new("u1");
    let Action::Goaway(g) = Action::goaway_inbound(&w)
        .immediate()
        .delay_ms(5)
        .hard_deadline_ms(9)
        .close_notify(true)
        .into()
    else {
        panic!("not a goaway");
    };
    assert_eq!(
        g,
        Goaway {
            workload: "u1".into(),
            target: GoawayTarget::Inbound,
            delay_ms: 5,
            mode: GoawayMode::Immediate,
            hard_deadline_ms: Some(9),
            close_notify: true,
        }
    );
    let g = Action::goaway_outbound(&PeerInfo::new("p"))
        .immediate()
        .graceful();
    assert_eq!(
        (g.target, g.mode, g.hard_deadline_ms),
        (GoawayTarget::Outbound, GoawayMode::Graceful, None)
    );
    let o = Action::oci_drain(&w);
    assert!(o.drain && o.at_capacity == AtCapacity::Keep);
    assert!(!o.undrain().drain);
    let b = Action::backoff("d");
    assert_eq!(
        (b.initial_ms, b.max_ms, b.multiplier, b.jitter),
        (100, 10_000, 2.0, 0.2)
    );
}

#[test]
fn every_action_names_its_subject_except_log() {
    let subjects: Vec<Option<&str>> = every_action()
        .iter()
        .map(|a| {
            a.subject().map(|s| match s {
                "u1" => "u1",
                "peer-1" => "peer-1",
                "10.0.0.9:15008" => "dest",
                other => panic!("unexpected subject {other}"),
            })
        })
        .collect();
    assert_eq!(
        subjects,
        vec![
            Some("u1"),
            Some("peer-1"),
            Some("u1"),
            Some("peer-1"),
            Some("peer-1"),
            Some("dest"),
            Some("u1"),
            Some("u1"),
            Some("u1"),
            Some("u1"),
            None,
        ]
    );
}

#[test]
fn event_subjects_follow_the_wit_rules() {
    let events = every_event();
    let subjects: Vec<Vec<&str>> = events.iter().map(Event::subjects).collect();
    assert_eq!(
        subjects,
        vec![
            vec!["u1"],
            vec!["u1"],
            vec!["u1"],
            vec!["u1"],
            vec!["peer-1"],
            vec!["peer-1"],
            vec!["d"],
            vec!["u1", "u2"],
            vec!["u1"],
        ]
    );
    let with_peer = Event::ConnectFailing(ConnectFailing {
        destination: "d".into(),
        peer: Some(PeerInfo::new("p")),
        consecutive_failures: 1,
        last_error: String::new(),
        failing_for_ms: 0,
    });
    assert_eq!(with_peer.subjects(), vec!["d", "p"]);
    // has_subject (what the host checks) says yes to exactly these.
    for event in events.iter().chain([&with_peer]) {
        for s in event.subjects() {
            assert!(event.has_subject(s), "{} has subject {s}", event.kind());
        }
        for other in ["", "u", "u12", "peer-2", "dest", "nobody"] {
            assert_eq!(
                event.has_subject(other),
                event.subjects().contains(&other),
                "{} and {other:?}",
                event.kind()
            );
        }
    }
    let kinds: Vec<&str> = every_event().iter().map(Event::kind).collect();
    assert_eq!(kinds, EVENT_KINDS);
}

#[test]
fn contract_version_matches_the_wit_package() {
    let wit = include_str!("../wit/policy.wit");
    let line = wit
        .lines()
        .find(|l| l.starts_with("package "))
        .expect("package line");
    assert_eq!(line, format!("package tidegate:policy@{CONTRACT_VERSION};"));
}

/// Counts events and echoes a goaway; refuses the config "bad".
struct Echo {
    seen: u32,
}

impl Policy for Echo {
    fn init(config: &str) -> Result<Self, String> {
        if config == "bad" {
            return Err("config key `x`: bad".into());
        }
        Ok(Self { seen: 0 })
    }
    fn decide(&mut self, event: &Event) -> Vec<Action> {
        self.seen += 1;
        let Some(w) = event.workload() else {
            return vec![];
        };
        vec![Action::goaway_inbound(w)
            .delay_ms(u64::from(self.seen))
            .into()]
    }
}

/// `Slot::decide` takes the event in its wire form, as the host sends it.
fn wire(event: wit::Event) -> Vec<u8> {
    let mut out = Vec::new();
    crate::wire::encode_event(
        &Event::from(event),
        &crate::MetadataReads::everything(),
        &mut out,
    );
    out
}

#[test]
fn export_glue_keeps_state_between_calls_and_converts_both_ways() {
    let slot = Slot::<Echo>::new();
    slot.init("").unwrap();
    let event = wire(wit::Event::WorkloadAdded(wit_workload("u1")));
    slot.decide(&event);
    let out = slot.decide(&event);
    let [wit::Action::Goaway(g)] = out.as_slice() else {
        panic!("expected one goaway, got {out:?}");
    };
    assert_eq!((g.workload.as_str(), g.delay_ms), ("u1", 2));
    // A fresh init starts over.
    slot.init("").unwrap();
    let out = slot.decide(&wire(wit::Event::WorkloadAdded(wit_workload("u1"))));
    assert!(matches!(out.as_slice(), [wit::Action::Goaway(g)] if g.delay_ms == 1));
}

#[test]
fn a_buffer_that_is_no_event_traps() {
    let slot = Slot::<Echo>::new();
    slot.init("").unwrap();
    let mut event = wire(wit::Event::WorkloadAdded(wit_workload("u1")));
    event.push(0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| slot.decide(&event)));
    let msg = *r
        .expect_err("a bad buffer must trap")
        .downcast::<String>()
        .unwrap();
    assert!(msg.contains("1 bytes after the event"), "{msg}");
}

#[test]
fn failed_init_returns_the_error_and_leaves_no_policy() {
    let slot = Slot::<Echo>::new();
    slot.init("").unwrap();
    assert_eq!(slot.init("bad"), Err("config key `x`: bad".to_owned()));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        slot.decide(&wire(wit::Event::WorkloadAdded(wit_workload("u"))))
    }));
    assert!(r.is_err(), "decide after a failed init must trap");
}

#[cfg(feature = "trace")]
mod trace_format {
    use super::*;
    use crate::trace::{diff_actions, parse_yaml, to_yaml, Trace};

    const TRACE: &str = r#"
config: ""
now-ms: 1000
steps:
  - name: first
    event:
      workload-added:
        info: {uid: u1, labels: {app: web}}
        inbound-tunnels: 2
    expect:
      - goaway: {workload: u1, target: inbound, delay-ms: 1, mode: graceful, close-notify: false}
  - now-ms: 2000
    event:
      peer-deleted:
        peer: {uid: p1}
    expect: []
"#;

    #[test]
    fn a_trace_parses_with_defaults_and_its_clock() {
        let t = Trace::from_yaml(TRACE).unwrap();
        assert_eq!(t.steps.len(), 2);
        assert_eq!(t.clock(), vec![1000, 2000]);
        let Event::WorkloadAdded(w) = &t.steps[0].event else {
            panic!("wrong event");
        };
        assert_eq!((w.inbound_tunnels, w.inbound_streams), (2, 0));
        assert_eq!(w.info.label("app"), Some("web"));
        assert_eq!(
            t.steps[0].expect,
            vec![Action::goaway_inbound("u1").delay_ms(1).into()]
        );
        t.run::<Echo>().unwrap();
    }

    #[test]
    fn a_mismatch_fails_with_a_diff_naming_the_step() {
        let wrong = TRACE.replace("delay-ms: 1", "delay-ms: 7");
        let err = Trace::from_yaml(&wrong).unwrap().run::<Echo>().unwrap_err();
        assert!(err.contains("step 1 (workload-added, \"first\")"), "{err}");
        assert!(
            err.contains("- [0] {\"goaway\":") && err.contains("\"delay-ms\":7"),
            "{err}"
        );
        assert!(
            err.contains("+ [0] {\"goaway\":") && err.contains("\"delay-ms\":1"),
            "{err}"
        );
    }

    #[test]
    fn init_error_expectations_are_checked() {
        let t = Trace::from_yaml("config: bad\ninit-error: \"`x`\"\n").unwrap();
        t.run::<Echo>().unwrap();
        let t = Trace::from_yaml("config: bad\ninit-error: \"`y`\"\n").unwrap();
        assert!(t.run::<Echo>().unwrap_err().contains("does not contain"));
        let t = Trace::from_yaml("config: fine\ninit-error: \"`x`\"\n").unwrap();
        assert!(t.run::<Echo>().unwrap_err().contains("init succeeded"));
    }

    #[test]
    fn malformed_traces_are_refused() {
        let typo = TRACE.replace("inbound-tunnels", "inbound-tunels");
        assert!(Trace::from_yaml(&typo)
            .unwrap_err()
            .contains("inbound-tunels"));
        let back = TRACE.replace("now-ms: 2000", "now-ms: 10");
        assert!(Trace::from_yaml(&back)
            .unwrap_err()
            .contains("before the previous"));
        let both = format!("{TRACE}init-error: x\n");
        assert!(Trace::from_yaml(&both)
            .unwrap_err()
            .contains("exclude each other"));
        let no_expect = "steps:\n  - event: {peer-deleted: {peer: {uid: p}}}\n";
        assert!(Trace::from_yaml(no_expect).unwrap_err().contains("expect"));
    }

    #[test]
    fn every_event_and_action_survives_yaml() {
        for e in every_event() {
            let y = to_yaml(&e).unwrap();
            assert!(!y.contains('!'), "no YAML tags: {y}");
            assert_eq!(parse_yaml::<Event>(&y).unwrap(), e, "{y}");
        }
        for a in every_action() {
            let y = to_yaml(&a).unwrap();
            assert!(!y.contains('!'), "no YAML tags: {y}");
            assert_eq!(parse_yaml::<Action>(&y).unwrap(), a, "{y}");
        }
    }

    #[test]
    fn equal_lists_have_no_diff_and_missing_actions_show() {
        let a = every_action();
        assert_eq!(diff_actions(&a, &a), None);
        let d = diff_actions(&a[..1], &a[..2]).unwrap();
        assert!(
            d.contains("= [0] goaway") && d.contains("+ [1]") && !d.contains("- [1]"),
            "{d}"
        );
    }
}
