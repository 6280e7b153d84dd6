//! The lab's command line: load, lifecycle timings, which scenario, which
//! policies.

use std::time::Duration;

/// The reference policies of `plugins/`, in the order the table lists them.
pub const REFERENCE_POLICIES: &[&str] = &[
    "goaway-on-term-start",
    "drain-at-teardown",
    "evict-on-delete",
    "keepalive-only",
    "oci-drain",
    "recommended",
];

/// What happens to the old server pod (or its node) while the load runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Shutdown starts, the app drains and exits, CNI DEL, deletion.
    Termination,
    /// Termination, then a new pod gets the old pod's IP.
    IpReuse,
    /// No pod terminates: one gateway is replaced by a new process.
    GatewayRestart,
    /// Termination with the old pod's gateway SIGSTOPped during CNI DEL.
    CniHung,
    /// The old pod's app is killed (SIGKILL: no SIGTERM, no termination
    /// event) and the pod deleted 2 s later; the load goes through the
    /// Service VIP in front of both server pods.
    Crash,
    /// A rolling restart of `--replicas` server pods on node B behind the
    /// Service VIP, one at a time in a Deployment's default order: the new
    /// pod starts and is ready, then the old one terminates (SIGTERM, its
    /// endpoint terminating `--endpoint-lag` later, the app drains and
    /// exits, CNI DEL, deleted).
    Rollout,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Termination => "termination",
            Scenario::IpReuse => "ip-reuse",
            Scenario::GatewayRestart => "gateway-restart",
            Scenario::CniHung => "cni-hung",
            Scenario::Crash => "crash",
            Scenario::Rollout => "rollout",
        }
    }
}

/// How application traffic reaches the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Capture {
    /// iptables REDIRECT on the node to the gateway's node-level listeners.
    Node,
    /// Listeners inside each pod's namespace (issue 14; not available yet).
    PerPod,
}

/// Where the gateways learn the pods from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// A workload file per node, reloaded every 10 ms.
    File,
    /// `workloads.source: istio` against an istiod double (delta ADS over
    /// gRPC/TLS) on node A's address: the lab's pods and `--background`.
    Istio,
}

/// Which gateway `gateway-restart` replaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Node {
    /// The client's node (its pool is what restarts).
    A,
    /// The old server pod's node.
    B,
}

/// Parameters of one lab run.
#[derive(Clone, Debug, clap::Args)]
pub struct Params {
    /// New short connections per second from the client pod.
    #[arg(long, default_value_t = 200)]
    pub rate: u32,
    /// Long-lived keep-alive connections (a request every ~100 ms each).
    #[arg(long, default_value_t = 5)]
    pub long_streams: u32,
    /// How long the server app keeps serving after SIGTERM (then it exits when idle).
    #[arg(long, default_value = "7s", value_parser = parse_duration)]
    pub app_drain: Duration,
    /// The pod's termination grace period (deadline of shutdown-started; the app is killed at its end).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Give the replacement pod a different service account than the old one.
    #[arg(long)]
    pub different_sa: bool,
    /// How long after the termination starts the client still picks the old
    /// pod for new connections (EndpointSlice propagation; 0: at once). In
    /// `rollout`, how long after SIGTERM the gateways learn the pod is
    /// terminating.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub endpoint_lag: Duration,
    /// Capture mode.
    #[arg(long, value_enum, default_value_t = Capture::Node)]
    pub capture: Capture,
    /// Policies to run, comma-separated (default: every reference policy).
    #[arg(long, value_delimiter = ',', default_values_t = REFERENCE_POLICIES.iter().map(|s| s.to_string()))]
    pub policies: Vec<String>,
    /// What happens during the run.
    #[arg(long, value_enum, default_value_t = Scenario::Termination)]
    pub scenario: Scenario,
    /// `gateway-restart`: which node's gateway is replaced.
    #[arg(long, value_enum, default_value_t = Node::B)]
    pub restart_node: Node,
    /// `gateway-restart`: the old gateway is killed (SIGKILL: a crash, no
    /// drain) instead of stopped with SIGTERM.
    #[arg(long)]
    pub kill_old: bool,
    /// `timeout_ms` of the tidegate-cni network config (the bound of CNI DEL).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub cni_timeout: Duration,
    /// `rollout`: server pods behind the Service (1 to 9).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=9))]
    pub replicas: u8,
    /// Where the gateways learn the pods from (`istio`: `rollout` only).
    #[arg(long, value_enum, default_value_t = Source::File)]
    pub source: Source,
    /// `--source istio`: synthetic workloads of a large cluster held beside
    /// the lab's pods (a fifth as many Services; none on the lab's nodes).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=200_000))]
    pub background: u32,
    /// `--source istio`: single-pod updates of the background pushed per
    /// second during the run (needs `--background`).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub churn: u32,
    /// Longest wait, after deletion, for the client's tunnels to the old pod to go.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub settle: Duration,
    /// IPv6 only: every address of the lab (pods, nodes, the Service VIP,
    /// istiod) is IPv6 (`fd00:X:S::H/64` where the IPv4 lab has
    /// `10.X.S.H/24`), captured with `ip6tables`.
    #[arg(long)]
    pub ipv6: bool,
    /// Replace the table of `docs/drain-lab.md` with this run's.
    #[arg(long)]
    pub write_doc: bool,
    /// Exit non-zero unless every run has 0 failed requests, no client
    /// tunnel to the old pod at the end and a CNI DEL that returned (the
    /// smoke stage of `cargo xtask test`; counts only, never timings).
    #[arg(long)]
    pub check: bool,
}

/// `7s`, `1500ms`, `2m` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 7s, 1500ms, 2m)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s or m)")),
    };
    if !(0.0..=3600.0).contains(&secs) {
        return Err(format!("{s:?} is out of range (0 to 1 h)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("7s"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("7h").is_err());
        assert!(parse_duration("x").is_err());
    }
}
