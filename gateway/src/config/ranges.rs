//! The accepted range of every number in the configuration: each duration,
//! size, count and port, in one table checked at load.
//!
//! Zero and absurd values used to pass and break the gateway at run time
//! (`hbone.connect_timeout: 0s` refused every client,
//! `workloads.reload_interval: 0s` panicked, `hbone.max_header_list_size: 0`
//! refused every CONNECT). A value outside its range is an error naming the
//! key and the range. A test walks the serialized default configuration, so
//! a new numeric key without a row here fails it.

use std::time::Duration;

use tidegate_base::range::{
    bytes, count, dur, millis, secs, KeyRange, Row, DAY, HOUR, KIB, MIB, MIN,
};
use tidegate_control::config::CONTROL_PLANE_MAX_CONNECTIONS;

use super::{CertificatesConfig, Config};

/// Every numeric key of `c` with its value and range, as
/// `docs/configuration.md` shows them (`cargo xtask config-reference`
/// writes them; a test compares).
pub fn key_ranges(c: &Config) -> Vec<KeyRange> {
    rows(c).iter().map(Row::key_range).collect()
}

const MS: Duration = Duration::from_millis(1);
/// About a billion: more descriptors than a process is given (`fs.nr_open` defaults to 2^20).
const MAX_INBOUND_CONNECTIONS: u64 = 1 << 30;

/// Every number of `c` with its range. The minimums are the smallest values
/// that still work (tests use short intervals); the maximums the largest that
/// are not a typo.
pub(super) fn rows(c: &Config) -> Vec<Row> {
    let h = &c.hbone;
    let p = &c.policies;
    let d = &c.drains;
    let o = &c.oci;
    let w = &c.workloads;
    let cp = &c.control_plane;
    let mut rows = vec![
        count("hbone.port", h.port.into(), 1, 65_535)
            .because("the port dialed on peers; listener ports may be 0"),
        bytes(
            "hbone.stream_window",
            h.stream_window,
            65_535,
            i32::MAX as u64,
        )
        .because("RFC 9113 §6.9.1"),
        bytes(
            "hbone.connection_window",
            h.connection_window,
            65_535,
            i32::MAX as u64,
        )
        .because("RFC 9113 §6.9.1"),
        bytes(
            "hbone.max_frame_size",
            h.max_frame_size,
            16 * KIB,
            16 * MIB - 1,
        )
        .because("RFC 9113 §4.2"),
        count(
            "hbone.max_concurrent_streams",
            h.max_concurrent_streams.into(),
            1,
            10_000,
        ),
        count(
            "hbone.max_dials_in_flight_per_tunnel",
            h.max_dials_in_flight_per_tunnel as u64,
            1,
            1_000_000,
        ),
        count(
            "hbone.max_dials_per_second_per_tunnel",
            h.max_dials_per_second_per_tunnel.into(),
            0,
            1_000_000,
        )
        .because("0: no cap on dials that carry bytes"),
        count(
            "hbone.max_wasted_dials_per_second_per_tunnel",
            h.max_wasted_dials_per_second_per_tunnel.into(),
            1,
            1_000_000,
        ),
        count(
            "hbone.max_connections",
            h.max_connections.into(),
            0,
            MAX_INBOUND_CONNECTIONS,
        )
        .because("0: three quarters of what the control plane and the pods' share leave; a larger value is lowered to that; 1 is refused, a stream holds 2"),
        count(
            "hbone.max_connections_per_identity",
            h.max_connections_per_identity.into(),
            0,
            MAX_INBOUND_CONNECTIONS,
        )
        .because("0: a quarter of hbone.max_connections; 1 is refused, a stream holds 2"),
        bytes(
            "hbone.max_header_list_size",
            h.max_header_list_size,
            KIB,
            MIB,
        )
        .because("a CONNECT's headers must fit"),
        dur(
            "hbone.keepalive_interval",
            h.keepalive_interval,
            millis(10),
            HOUR,
        ),
        dur(
            "hbone.keepalive_timeout",
            h.keepalive_timeout,
            millis(10),
            HOUR,
        ),
        dur(
            "hbone.connect_timeout",
            h.connect_timeout,
            millis(100),
            5 * MIN,
        ),
        count(
            "pool.max_streams_per_tunnel",
            c.pool.max_streams_per_tunnel as u64,
            1,
            10_000,
        ),
        dur("pool.idle_timeout", c.pool.idle_timeout, millis(10), DAY),
        dur(
            "workloads.reload_interval",
            w.reload_interval,
            millis(10),
            HOUR,
        ),
        dur(
            "workloads.kubernetes.debounce",
            w.kubernetes.debounce,
            Duration::ZERO,
            MIN,
        ),
        dur(
            "workloads.istio.connect_timeout",
            w.istio.connect_timeout,
            millis(100),
            MIN,
        )
        .because("0 would fail every connection to istiod"),
        bytes(
            "workloads.istio.max_message_size",
            w.istio.max_message_size,
            64 * KIB,
            1 << 30,
        )
        .because("a mesh's first answer is one message; the bound is memory"),
        bytes(
            "workloads.istio.max_resource_size",
            w.istio.max_resource_size,
            4 * KIB,
            64 * MIB,
        )
        .because("a resource is converted from one Kubernetes object"),
        dur("shutdown.deadline", c.shutdown.deadline, millis(100), HOUR)
            .because("0 would cut every stream at SIGTERM"),
        dur("policies.call_deadline", p.call_deadline, MS, secs(10))
            .because("a decision holds up a drain"),
        dur("policies.init_deadline", p.init_deadline, MS, MIN),
        bytes("policies.memory_limit", p.memory_limit, 64 * KIB, 1 << 30)
            .because("one WebAssembly page to 1GiB"),
        count(
            "policies.quarantine_failures",
            p.quarantine_failures as u64,
            1,
            10_000,
        ),
        dur(
            "policies.quarantine_window",
            p.quarantine_window,
            secs(1),
            DAY,
        ),
        count("policies.max_actions", p.max_actions as u64, 1, 1_024),
        dur("policies.max_delay", p.max_delay, Duration::ZERO, HOUR),
        dur("policies.max_deadline", p.max_deadline, Duration::ZERO, DAY),
        dur("policies.max_hold", p.max_hold, Duration::ZERO, HOUR),
        dur("policies.max_backoff", p.max_backoff, Duration::ZERO, HOUR),
        dur("policies.max_timer", p.max_timer, millis(100), DAY)
            .because("a timer calls the policy again"),
        dur(
            "policies.reload_interval",
            p.reload_interval,
            millis(10),
            HOUR,
        ),
        dur("drains.max_hold", d.max_hold, Duration::ZERO, 10 * MIN),
        dur(
            "capture.membership_wait",
            c.capture.membership_wait,
            Duration::ZERO,
            MIN,
        )
        .because("tidegate-cni's timeout_ms, at most 2m, must outlast it"),
        dur("drains.default_grace", d.default_grace, Duration::ZERO, DAY),
        dur(
            "outbound.goaway_skip",
            c.outbound.goaway_skip,
            Duration::ZERO,
            HOUR,
        )
        .because("0: a GOAWAY alone never takes an endpoint out of the choice"),
        dur(
            "outbound.failing_skip",
            c.outbound.failing_skip,
            Duration::ZERO,
            10 * MIN,
        )
        .because("0: a failed connect never takes an endpoint out of the choice; it doubles up to 16 times"),
        count(
            "outbound.connect_attempts",
            u64::from(c.outbound.connect_attempts),
            1,
            5,
        )
        .because("1: a failed connect to a Service's endpoint is never tried on another"),
        dur(
            "outbound.unknown_in_cluster_wait",
            c.outbound.unknown_in_cluster_wait,
            Duration::ZERO,
            secs(10),
        )
        .because("the application's connect waits as long"),
        dur(
            "drains.default_goaway_deadline",
            d.default_goaway_deadline,
            Duration::ZERO,
            DAY,
        ),
        count(
            "oci.capacity_limit",
            o.capacity_limit as u64,
            1,
            super::OCI_BACKEND_LIMIT as u64,
        )
        .because("OCI's backends per backend set"),
        dur(
            "oci.reassert_interval",
            o.reassert_interval,
            millis(10),
            HOUR,
        ),
        dur(
            "oci.request_timeout",
            o.request_timeout,
            millis(100),
            5 * MIN,
        ),
        count("oci.max_attempts", o.max_attempts.into(), 1, 100),
        dur("oci.backoff_base", o.backoff_base, MS, MIN),
        dur("oci.backoff_max", o.backoff_max, MS, HOUR),
        dur(
            "oci.work_request_poll",
            o.work_request_poll,
            millis(10),
            MIN,
        ),
        dur(
            "oci.work_request_timeout",
            o.work_request_timeout,
            secs(1),
            DAY,
        ),
        dur(
            "control_plane.header_read_timeout",
            cp.header_read_timeout,
            millis(10),
            MIN,
        ),
        count(
            "control_plane.max_connections",
            cp.max_connections.into(),
            1,
            CONTROL_PLANE_MAX_CONNECTIONS,
        )
        .because("per listener; the data path keeps the rest of the descriptors"),
        dur(
            "control_plane.cni_read_timeout",
            cp.cni_read_timeout,
            millis(10),
            MIN,
        ),
        count(
            "capture.max_pods",
            c.capture.max_pods.into(),
            1,
            super::MAX_PODS_LIMIT,
        )
        .because("each pod holds eight descriptors (four without the DNS proxy), counted in the pods' share of the open-file limit"),
        dur("dns.timeout", c.dns.timeout, millis(10), MIN)
            .because("a pod's stub resolver waits 5s a try (glibc's default), then asks again"),
        count(
            "dns.max_in_flight",
            c.dns.max_in_flight.into(),
            1,
            1_000_000,
        )
        .because("each forwarded query in flight holds a socket out of the pods' share"),
        count(
            "dns.max_in_flight_per_pod",
            c.dns.max_in_flight_per_pod.into(),
            1,
            1_000_000,
        )
        .because("one pod's flood must not take every other pod's share"),
        count(
            "dns.max_tcp_connections",
            c.dns.max_tcp_connections.into(),
            1,
            1_000_000,
        )
        .because("each holds a descriptor out of the pods' share, beside every pod's listeners"),
        count(
            "dns.max_tcp_connections_per_pod",
            c.dns.max_tcp_connections_per_pod.into(),
            1,
            1_000_000,
        )
        .because("one pod's idle connections must not take every other pod's"),
        count(
            "dns.cache.max_entries",
            c.dns.cache.max_entries.into(),
            0,
            100_000,
        )
        .because("per pod; each answer kept is at most 1232 bytes"),
        dur("dns.cache.max_ttl", c.dns.cache.max_ttl, secs(1), DAY)
            .because("the cap of common resolvers (Unbound, hickory): a day"),
        count(
            "control_plane.cni_max_connections",
            cp.cni_max_connections.into(),
            1,
            CONTROL_PLANE_MAX_CONNECTIONS,
        )
        .because("the data path keeps the rest of the descriptors"),
    ];
    match &c.certificates {
        CertificatesConfig::DevCa { validity, .. } => rows.push(
            dur("certificates.validity", *validity, MIN, 30 * DAY)
                .because("development certificates are short-lived"),
        ),
        CertificatesConfig::Dir {
            reload_interval, ..
        } => rows.push(dur(
            "certificates.reload_interval",
            *reload_interval,
            millis(10),
            HOUR,
        )),
        CertificatesConfig::IstioCa(ca) => rows.extend([
            dur("certificates.validity", ca.validity, MIN, 365 * DAY)
                .because("renewal happens at half-life; the CA may shorten it"),
            dur(
                "certificates.first_use_wait",
                ca.first_use_wait,
                millis(10),
                MIN,
            )
            .because("a handshake waits this long for a new identity's certificate"),
            dur("certificates.timeout", ca.timeout, millis(100), MIN),
            dur(
                "certificates.reload_interval",
                ca.reload_interval,
                millis(10),
                HOUR,
            ),
        ]),
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_yaml::Value;

    fn err(sets: &[&str]) -> String {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Config::load(None, Vec::new(), &sets)
            .map(|_| ())
            .expect_err("out of range")
            .to_string()
    }

    #[test]
    fn zero_where_zero_breaks_the_gateway_is_refused_with_the_range() {
        for (set, key, range) in [
            (
                "hbone.connect_timeout=0s",
                "hbone.connect_timeout",
                "100ms and 5m",
            ),
            (
                "workloads.reload_interval=0s",
                "workloads.reload_interval",
                "10ms and 1h",
            ),
            (
                "hbone.max_header_list_size=0",
                "hbone.max_header_list_size",
                "1KiB and 1MiB",
            ),
            ("shutdown.deadline=0s", "shutdown.deadline", "100ms and 1h"),
            ("hbone.port=0", "hbone.port", "1 and 65535"),
            (
                "policies.call_deadline=0s",
                "policies.call_deadline",
                "1ms and 10s",
            ),
            (
                "control_plane.max_connections=0",
                "control_plane.max_connections",
                "1 and ",
            ),
            ("capture.max_pods=0", "capture.max_pods", "1 and 100000"),
        ] {
            let e = err(&[set]);
            assert!(
                e.contains(&format!("`{key}`")) && e.contains(range) && e.contains("out of range"),
                "{set}: {e}"
            );
        }
    }

    #[test]
    fn huge_values_the_parser_accepts_are_refused_with_the_range() {
        for (set, key, range) in [
            (
                "policies.call_deadline=8784h",
                "policies.call_deadline",
                "1ms and 10s",
            ),
            (
                "hbone.connect_timeout=1000h",
                "hbone.connect_timeout",
                "100ms and 5m",
            ),
            (
                "policies.memory_limit=4000MiB",
                "policies.memory_limit",
                "64KiB and 1GiB",
            ),
            (
                "pool.max_streams_per_tunnel=99999999",
                "pool.max_streams_per_tunnel",
                "1 and 10000",
            ),
            (
                "control_plane.cni_max_connections=1000000",
                "control_plane.cni_max_connections",
                "1 and ",
            ),
            (
                "capture.max_pods=1000000",
                "capture.max_pods",
                "1 and 100000",
            ),
        ] {
            let e = err(&[set]);
            assert!(
                e.contains(&format!("`{key}`")) && e.contains(range),
                "{set}: {e}"
            );
        }
        let e = err(&["certificates.source=dev-ca", "certificates.validity=8784h"]);
        assert!(
            e.contains("`certificates.validity`") && e.contains("1m and 720h"),
            "{e}"
        );
        // The parser's own cap still answers first, with its range.
        let e = err(&["drains.max_hold=9999h"]);
        assert!(
            e.contains("`drains.max_hold`") && e.contains("8784h"),
            "{e}"
        );
        // In range: edges are accepted, listener ports may be 0 (tests bind ephemeral ports).
        let ok = Config::load(
            None,
            Vec::new(),
            &[
                "policies.call_deadline=10s".to_string(),
                "hbone.max_header_list_size=1KiB".to_string(),
                "listeners.metrics=127.0.0.1:0".to_string(),
                "workloads.kubernetes.debounce=0s".to_string(),
            ],
        );
        assert!(ok.is_ok(), "{:?}", ok.err());
    }

    /// Every numeric leaf (a number, or a duration serialized as `<n>ms`) of
    /// the serialized configuration, with its dotted key.
    fn numeric_keys(v: &Value, prefix: &str, out: &mut Vec<String>) {
        match v {
            Value::Mapping(m) => {
                for (k, v) in m {
                    let k = k.as_str().expect("string keys");
                    let key = if prefix.is_empty() {
                        k.to_owned()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    numeric_keys(v, &key, out);
                }
            }
            Value::Number(_) => out.push(prefix.to_owned()),
            Value::String(s)
                if s.strip_suffix("ms")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) =>
            {
                out.push(prefix.to_owned())
            }
            _ => {}
        }
    }

    /// A key added to the config without a row in the table fails here.
    #[test]
    fn every_numeric_key_of_the_config_has_a_range() {
        let default = Config::default();
        let mut dir = Config::default();
        dir.certificates = CertificatesConfig::Dir {
            dir: "d".into(),
            trust_bundle: "b".into(),
            reload_interval: Duration::from_secs(2),
        };
        for cfg in [default, dir] {
            let mut keys = Vec::new();
            numeric_keys(&serde_yaml::to_value(&cfg).unwrap(), "", &mut keys);
            // `certificates` is an internally tagged enum: its fields sit under the section.
            let table: Vec<&str> = rows(&cfg).iter().map(|r| r.key).collect();
            for k in &keys {
                assert!(
                    table.contains(&k.as_str()),
                    "config key `{k}` is a number without a range in config/ranges.rs"
                );
            }
            for t in &table {
                assert!(
                    keys.iter().any(|k| k == t),
                    "ranges.rs names `{t}`, which is not a numeric key of the config"
                );
            }
            // And the defaults are inside their own ranges.
            for r in rows(&cfg) {
                assert_eq!(r.check(), None, "default of `{}`", r.key);
            }
        }
    }
}
