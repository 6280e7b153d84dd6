//! The data path's sections: `listeners:`, `hbone:`, `tcp:`, `pool:` and `outbound:`.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Cidr;
use tidegate_base::{duration, size};

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Listeners {
    /// Transparent outbound capture (iptables REDIRECT target). `[::]`
    /// takes both families (IPv4 alone where the node has no IPv6).
    pub outbound: SocketAddr,
    /// HBONE inbound (mTLS + HTTP/2 CONNECT).
    pub inbound: SocketAddr,
    /// Admin API; keep it on localhost.
    pub admin: SocketAddr,
    /// Prometheus `/metrics`.
    pub metrics: SocketAddr,
    /// `/healthz/ready`.
    pub readiness: SocketAddr,
    /// `tidegate run --take-over`: a flag of the command line, not a key.
    /// Take the admin, metrics and readiness ports over from the gateway
    /// holding them (`app/control_ports.rs`) instead of refusing to start.
    #[serde(skip)]
    pub take_over: bool,
}

impl Default for Listeners {
    fn default() -> Self {
        // `[::]`: both families on one dual-stack socket, `0.0.0.0` where
        // the node has no IPv6 (`proxy/listener.rs`).
        let any = |port| SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
        Listeners {
            outbound: any(15001),
            inbound: any(15008),
            admin: ([127, 0, 0, 1], 15000).into(),
            metrics: any(15020),
            readiness: any(15021),
            take_over: false,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HboneConfig {
    /// Port dialed on peer workloads for HBONE.
    pub port: u16,
    #[serde(deserialize_with = "size::deserialize_u32")]
    pub stream_window: u32,
    #[serde(deserialize_with = "size::deserialize_u32")]
    pub connection_window: u32,
    #[serde(deserialize_with = "size::deserialize_u32")]
    pub max_frame_size: u32,
    /// Streams a peer may open concurrently on one inbound tunnel.
    pub max_concurrent_streams: u32,
    #[serde(deserialize_with = "size::deserialize_u32")]
    pub max_header_list_size: u32,
    #[serde(with = "duration")]
    pub keepalive_interval: Duration,
    #[serde(with = "duration")]
    pub keepalive_timeout: Duration,
    /// Bound on TCP connect + TLS + HTTP/2 handshakes, and on dialing upstreams.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// Upstream dials one inbound tunnel may have in flight (rapid-reset bound).
    pub max_dials_in_flight_per_tunnel: usize,
    /// Upstream dials one inbound tunnel may start per second, whatever they
    /// carry; 0 (the default): no such cap. Healthy short connections are
    /// many; the rapid-reset bound is the next key.
    pub max_dials_per_second_per_tunnel: u32,
    /// Wasted upstream dials one inbound tunnel may make per second, on
    /// average (ten seconds' worth at once): dials whose stream the peer reset
    /// before the dial completed, or that carried no byte from the peer (the
    /// rapid-reset bound; see `proxy/inbound/pace.rs`).
    pub max_wasted_dials_per_second_per_tunnel: u32,
    /// Inbound connections held at once — tunnels, and the connections
    /// their streams opened to workloads; tunnels alone at most half of it.
    /// 0 (the default): the inbound share of the descriptor budget, three
    /// quarters of what the control plane and the pods' share leave of the
    /// open-file limit (see `descriptor_budget.rs`); a larger value is
    /// lowered to it. 1 is refused at load: a stream holds two (its tunnel
    /// and its upstream connection).
    pub max_connections: u32,
    /// The same for one peer identity; 0 (the default): a quarter of
    /// `max_connections`. 1, or 0 with a quarter below 2, is refused at load.
    pub max_connections_per_identity: u32,
}

impl Default for HboneConfig {
    fn default() -> Self {
        let tunnel = tidegate_protocol::hbone::Settings::default();
        HboneConfig {
            port: 15008,
            stream_window: tunnel.stream_window,
            connection_window: tunnel.connection_window,
            max_frame_size: tunnel.max_frame_size,
            max_concurrent_streams: tunnel.max_concurrent_streams,
            max_header_list_size: tunnel.max_header_list_size,
            keepalive_interval: tunnel.keepalive_interval,
            keepalive_timeout: tunnel.keepalive_timeout,
            connect_timeout: tunnel.connect_timeout,
            // A well-behaved peer keeps at most 100 streams on one tunnel
            // (our pool and ztunnel's), so it never has more dials in flight.
            max_dials_in_flight_per_tunnel: 100,
            // No cap on healthy dials: ztunnel serves thousands a second
            // over one tunnel, and so must we.
            max_dials_per_second_per_tunnel: 0,
            // A reset loop gets at most this many connections to the
            // workload a second; a client whose streams carry bytes never
            // spends any.
            max_wasted_dials_per_second_per_tunnel: 100,
            max_connections: 0,
            max_connections_per_identity: 0,
        }
    }
}

/// The inbound connections one stream holds, under `hbone.max_connections`
/// and under its peer identity's cap alike: its tunnel and its connection
/// to the workload (`proxy/inbound/limits.rs`: a tunnel takes one of each
/// cap, and each of its streams' dials one more).
pub const CONNECTIONS_PER_STREAM: u32 = 2;

impl HboneConfig {
    /// The connection caps that could never carry a stream, refused at
    /// load as (key, why): each takes 0 (derived) or at least
    /// [`CONNECTIONS_PER_STREAM`], and a derived per-identity cap (a
    /// quarter of `max_connections`) must come to that much too.
    pub fn check_connection_caps(&self) -> Result<(), (&'static str, String)> {
        let need = CONNECTIONS_PER_STREAM;
        let because = "because a stream holds two inbound connections: its tunnel and its connection to the workload";
        let below = |key: &'static str, what: &str, n: u32| {
            let message = format!(
                "{n} can carry no stream: {what} must be 0 or at least {need} ({because}; \
                 with fewer every CONNECT is refused)"
            );
            Err((key, message))
        };
        if (1..need).contains(&self.max_connections) {
            let what = "the inbound connection cap (0: derived from the open-file limit)";
            return below("hbone.max_connections", what, self.max_connections);
        }
        let per_identity = self.max_connections_per_identity;
        if (1..need).contains(&per_identity) {
            let what = "the cap of one peer identity (0: a quarter of hbone.max_connections)";
            return below("hbone.max_connections_per_identity", what, per_identity);
        }
        let quarter = self.max_connections / 4;
        if per_identity == 0 && self.max_connections != 0 && quarter < need {
            return Err((
                "hbone.max_connections_per_identity",
                format!(
                    "0 takes a quarter of hbone.max_connections ({}): {quarter}, which can carry \
                     no stream ({because}; with fewer every CONNECT is refused): set it to at \
                     least {need}, or hbone.max_connections to at least {}",
                    self.max_connections,
                    need * 4
                ),
            ));
        }
        Ok(())
    }

    /// What each tunnel is built with (the protocol layer's share of this
    /// section).
    pub fn settings(&self) -> tidegate_protocol::hbone::Settings {
        tidegate_protocol::hbone::Settings {
            stream_window: self.stream_window,
            connection_window: self.connection_window,
            max_frame_size: self.max_frame_size,
            max_concurrent_streams: self.max_concurrent_streams,
            max_header_list_size: self.max_header_list_size,
            keepalive_interval: self.keepalive_interval,
            keepalive_timeout: self.keepalive_timeout,
            connect_timeout: self.connect_timeout,
        }
    }
}

/// `tcp`: congestion control of the data path's sockets (see
/// `proxy/congestion.rs`); an empty name keeps the host's default.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TcpConfig {
    /// Connections to and from this node's workloads: they never leave the
    /// node, so pacing them (BBR without `fq`) costs CPU and buys nothing.
    pub app_congestion_control: String,
    /// HBONE tunnels between nodes: the host's default unless named.
    pub tunnel_congestion_control: String,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            app_congestion_control: "cubic".into(),
            tunnel_congestion_control: String::new(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// A pooled tunnel carries at most this many streams; ztunnel uses 100.
    pub max_streams_per_tunnel: usize,
    /// A tunnel without streams for this long is closed.
    #[serde(with = "duration")]
    pub idle_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_streams_per_tunnel: 100,
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// How a Service's endpoint is chosen among the usable ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndpointChoice {
    /// Two endpoints at random, the one with fewer open streams from here.
    #[default]
    P2c,
    /// One endpoint at random.
    Random,
}

/// What becomes of a connection to an address inside the cluster's ranges
/// that is no known workload or Service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnknownInCluster {
    /// Reset, counted (`reason="unknown_in_cluster"`): never plaintext.
    #[default]
    Refuse,
    /// Plain TCP, as for any address outside the cluster.
    Passthrough,
}

/// `outbound`: routing of captured connections.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboundConfig {
    /// The cluster's pod and Service ranges (`10.0.0.0/8`): a destination
    /// inside them that is no known workload or Service is handled by
    /// `unknown_in_cluster`. Empty: every unknown address is passed through.
    pub cluster_cidrs: Vec<Cidr>,
    /// Kubernetes discovery adds the ranges it learns to `cluster_cidrs`:
    /// every Node's `spec.podCIDRs` and the `networking.k8s.io/v1`
    /// ServiceCIDRs (needs get/list/watch on nodes and servicecidrs).
    pub learn_cluster_ranges: bool,
    pub unknown_in_cluster: UnknownInCluster,
    /// How long a connection to an unknown address inside the cluster's
    /// ranges waits for discovery to learn it (a pod just started, an IP
    /// reused) before `unknown_in_cluster` applies.
    #[serde(with = "duration")]
    pub unknown_in_cluster_wait: Duration,
    pub endpoint_choice: EndpointChoice,
    /// How long a GOAWAY received from a tunnel to an endpoint keeps it out
    /// of the choice (a new tunnel to it ends it sooner).
    #[serde(with = "duration")]
    pub goaway_skip: Duration,
    /// How long a failed connect to an endpoint (its tunnel's dial, or a
    /// CONNECT its gateway refused: 5xx, a reset, no answer) keeps it out
    /// of the choice, doubled for each failure in a row (at most 16 ×); a
    /// connect to it that succeeds ends it. 0: failures never skip (`p2c`
    /// still counts them).
    #[serde(with = "duration")]
    pub failing_skip: Duration,
    /// Tries per connection to a Service: when an endpoint's connect fails
    /// (its tunnel's dial, or a CONNECT its gateway refused: 5xx, a reset,
    /// no answer) another endpoint is chosen, the failed one now skipped.
    /// Nothing of the application's has been sent by then. 1: never again.
    pub connect_attempts: u32,
}

impl Default for OutboundConfig {
    fn default() -> Self {
        OutboundConfig {
            cluster_cidrs: Vec::new(),
            learn_cluster_ranges: true,
            unknown_in_cluster: UnknownInCluster::Refuse,
            unknown_in_cluster_wait: Duration::from_millis(200),
            endpoint_choice: EndpointChoice::P2c,
            goaway_skip: Duration::from_secs(10),
            failing_skip: Duration::from_secs(5),
            connect_attempts: 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn load(sets: &[&str]) -> Result<Config, String> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        Config::load(None, Vec::new(), &sets).map_err(|e| e.to_string())
    }

    /// A cap that cannot hold a stream's two connections (its tunnel and
    /// its upstream connection) is refused naming its key and why.
    #[test]
    fn connection_caps_that_carry_no_stream_are_refused_naming_the_key() {
        for (sets, key, says) in [
            (
                &["hbone.max_connections=1"][..],
                "hbone.max_connections",
                "1 can carry no stream",
            ),
            (
                &[
                    "hbone.max_connections=100",
                    "hbone.max_connections_per_identity=1",
                ],
                "hbone.max_connections_per_identity",
                "1 can carry no stream",
            ),
            // The derived per-identity cap: a quarter of 7 is 1.
            (
                &["hbone.max_connections=7"],
                "hbone.max_connections_per_identity",
                "a quarter of hbone.max_connections (7): 1",
            ),
            (
                &["hbone.max_connections=2"],
                "hbone.max_connections_per_identity",
                "hbone.max_connections to at least 8",
            ),
        ] {
            let e = load(sets).expect_err("refused");
            assert!(
                e.starts_with(&format!("config key `{key}`: ")),
                "{sets:?}: {e}"
            );
            assert!(e.contains(says), "{sets:?}: {e}");
            assert!(
                e.contains("its tunnel and its connection to the workload"),
                "{sets:?}: {e}"
            );
        }
    }

    #[test]
    fn the_smallest_caps_that_carry_a_stream_are_accepted() {
        for sets in [
            &[][..],
            &[
                "hbone.max_connections=2",
                "hbone.max_connections_per_identity=2",
            ][..],
            &["hbone.max_connections=8"][..],
            &["hbone.max_connections_per_identity=2"][..],
            // Per identity above the whole cap: the whole cap binds first.
            &[
                "hbone.max_connections=2",
                "hbone.max_connections_per_identity=50",
            ][..],
        ] {
            let c = load(sets).unwrap_or_else(|e| panic!("{sets:?}: {e}"));
            let caps = crate::proxy::inbound::limits::Caps::derive(&c.hbone, Some(1_000));
            // One stream fits: a tunnel and a dial under every cap.
            assert!(
                caps.tunnels >= 1 && caps.connections >= 2 && caps.per_identity >= 2,
                "{sets:?}: {caps:?}"
            );
        }
    }
}
