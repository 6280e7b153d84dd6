use tidegate_sdk::trace::Trace;
use tidegate_sdk::{
    ConnectFailing, PeerInfo, PeerState, ShutdownStarted, WorkloadInfo, WorkloadState,
};

use super::*;

fn web() -> WorkloadInfo {
    WorkloadInfo::new("web-uid").named("shop", "web-1")
}

fn shutdown(info: WorkloadInfo) -> Event {
    Event::ShutdownStarted(ShutdownStarted {
        workload: WorkloadState::new(info).with_inbound(2, 2),
        grace_deadline_ms: 30_000,
        grace_remaining_ms: 30_000,
    })
}

fn teardown(tunnels: u32) -> Event {
    Event::NetworkTeardown(NetworkTeardown {
        workload: WorkloadState::new(web()).with_inbound(tunnels, 7),
        since_shutdown_ms: Some(25_000),
        max_hold_ms: 60_000,
    })
}

fn peer() -> PeerState {
    PeerState {
        peer: PeerInfo::new("db-uid"),
        pooled_tunnels: 1,
        active_streams: 0,
    }
}

#[test]
fn shutdown_start_drains_oci_only_when_opted_in_and_sends_no_goaway() {
    let mut p = Recommended::init("").unwrap();
    assert!(p.decide(&shutdown(web())).is_empty());
    let opted = web().with_annotation("tidegate.io/oci-drain", "true");
    assert_eq!(
        p.decide(&shutdown(opted)),
        vec![Action::oci_drain("web-uid").into()]
    );

    let mut always =
        Recommended::init(r#"{"oci-drain": "always", "oci-at-capacity": "remove-early"}"#).unwrap();
    assert_eq!(
        always.decide(&shutdown(web())),
        vec![Action::oci_drain("web-uid")
            .at_capacity(AtCapacity::RemoveEarly)
            .into()]
    );
    let mut never = Recommended::init(r#"{"oci-drain": "never"}"#).unwrap();
    let opted = web().with_annotation("tidegate.io/oci-drain", "true");
    assert!(never.decide(&shutdown(opted)).is_empty());
}

#[test]
fn teardown_logs_drains_and_holds() {
    let mut p = Recommended::init(r#"{"hold-ms": 4000}"#).unwrap();
    assert_eq!(
        p.decide(&teardown(3)),
        vec![
            Action::log(
                LogLevel::Info,
                "draining 3 inbound tunnels (7 streams) of shop/web-1, holding teardown up to 4000 ms"
            ),
            Action::goaway_inbound("web-uid").hard_deadline_ms(4_000).close_notify(true).into(),
            Action::hold_teardown("web-uid", 4_000),
        ]
    );
    assert!(p.decide(&teardown(0)).is_empty());
}

#[test]
fn peers_are_evicted_and_failing_destinations_backed_off() {
    let mut p =
        Recommended::init(r#"{"on-peer-terminating": "evict-when-idle", "failure-threshold": 1}"#)
            .unwrap();
    assert_eq!(
        p.decide(&Event::PeerTerminating(peer())),
        vec![Action::evict_when_idle("db-uid")]
    );
    assert_eq!(
        p.decide(&Event::PeerDeleted(peer())),
        vec![Action::evict_now("db-uid")]
    );
    let failing = Event::ConnectFailing(ConnectFailing {
        destination: "10.0.0.1:15008".into(),
        consecutive_failures: 1,
        ..ConnectFailing::default()
    });
    assert_eq!(
        p.decide(&failing),
        vec![Action::backoff("10.0.0.1:15008").into()]
    );
}

#[test]
fn bad_config_names_the_key() {
    for (config, key) in [
        (r#"{"oci-drain": "sometimes"}"#, "`oci-drain`"),
        (r#"{"goaway-mode": 1}"#, "`goaway-mode`"),
        (
            r#"{"backoff-initial-ms": 900, "backoff-max-ms": 800}"#,
            "`backoff-max-ms`",
        ),
        (r#"{"hold_ms": 1}"#, "`hold_ms`"),
        ("[]", "JSON object"),
    ] {
        let e = Recommended::init(config).unwrap_err();
        assert!(e.contains(key), "{config}: {e}");
    }
}

#[test]
fn trace_passes() {
    Trace::from_yaml(include_str!("../trace.yaml"))
        .unwrap()
        .run::<Recommended>()
        .unwrap();
}

#[test]
fn init_error_trace_passes() {
    Trace::from_yaml(include_str!("../trace-bad-config.yaml"))
        .unwrap()
        .run::<Recommended>()
        .unwrap();
}
