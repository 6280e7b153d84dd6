//! The lab's network: three node namespaces and their pods, joined by veth
//! pairs, with iptables REDIRECT on the nodes (as `netns.rs` builds for the
//! tests, plus a third node).
//!
//! ```text
//!  pa client 10.X.1.2 ── na (node A, 10.X.0.1 / 10.X.4.1) ──┬── nb (node B, 10.X.0.2) ── pb old 10.X.2.2
//!                                                           │                         └─ pd ip-reuse 10.X.2.2
//!                                                           └── nc (node C, 10.X.4.2) ── pc replacement 10.X.3.2
//! ```
//!
//! `rollout` puts its replicas on node B instead: replica `i` of generation
//! `g` is `10.X.(10 + 10g + i).2`, each subnet routed from node A to node B.
//!
//! `--ipv6`: the same network with IPv6 only, `fd00:X:S::H/64` for every
//! `10.X.S.H/24` (`nodad`: usable at once), `ip6tables` for the capture.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;

use super::LabError;
use crate::netns::{HBONE_PORT, OUTBOUND_PORT};

/// Every namespace of the lab starts with this, then the pid.
pub const PREFIX: &str = "tgl";

/// A pod's namespace name suffix, its node's, and its veth's subnet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pod {
    Client,
    Old,
    Replacement,
    /// The pod that gets the old pod's IP in `ip-reuse`.
    Reuse,
    /// Replica `index` of a `rollout`'s generation `gen` (0: the pods
    /// rolled out, 1: their replacements), on node B.
    Replica {
        gen: u8,
        index: u8,
    },
}

/// Replicas per generation at most (their subnets stay below 30).
pub const MAX_REPLICAS: u8 = 9;

impl Pod {
    fn suffix(self) -> String {
        match self {
            Pod::Client => "pa".into(),
            Pod::Old => "pb".into(),
            Pod::Replacement => "pc".into(),
            Pod::Reuse => "pd".into(),
            Pod::Replica { gen, index } => format!("r{gen}{index}"),
        }
    }
    /// (node namespace suffix, subnet of the node–pod link).
    fn placement(self) -> (&'static str, u8) {
        match self {
            Pod::Client => ("na", 1),
            Pod::Old | Pod::Reuse => ("nb", 2),
            Pod::Replacement => ("nc", 3),
            Pod::Replica { gen, index } => ("nb", 10 + 10 * gen + index),
        }
    }
}

/// Names and addresses of one run (`run` numbers the policies of a lab).
pub struct Topology {
    prefix: String,
    /// Second octet of every address: 10.X.*.* (`fd00:X:*::*` with IPv6).
    pub x: u8,
    /// IPv6 only (`--ipv6`).
    pub ipv6: bool,
    /// Namespaces created so far, deleted on drop.
    created: Vec<String>,
}

impl Topology {
    pub fn new(run: usize, ipv6: bool) -> Topology {
        let pid = std::process::id();
        Topology {
            prefix: format!("{PREFIX}{pid}r{run}"),
            x: 200 + (pid % 50) as u8,
            ipv6,
            created: Vec::new(),
        }
    }

    pub fn node_ns(&self, node: char) -> String {
        format!("{}n{node}", self.prefix)
    }
    pub fn pod_ns(&self, pod: Pod) -> String {
        format!("{}{}", self.prefix, pod.suffix())
    }
    pub fn addr(&self, subnet: u8, host: u8) -> IpAddr {
        match self.ipv6 {
            false => Ipv4Addr::new(10, self.x, subnet, host).into(),
            true => Ipv6Addr::new(
                0xfd00,
                u16::from(self.x),
                u16::from(subnet),
                0,
                0,
                0,
                0,
                u16::from(host),
            )
            .into(),
        }
    }
    pub fn pod_ip(&self, pod: Pod) -> IpAddr {
        self.addr(pod.placement().1, 2)
    }
    /// The network of `subnet`: `10.X.S.0/24` or `fd00:X:S::/64`.
    fn net(&self, subnet: u8) -> String {
        format!("{}/{}", self.addr(subnet, 0), self.prefix_len())
    }
    fn prefix_len(&self) -> u8 {
        if self.ipv6 {
            64
        } else {
            24
        }
    }
    /// `ip` for the family (`ip -6` with IPv6).
    fn ip(&self) -> &'static str {
        if self.ipv6 {
            "ip -6"
        } else {
            "ip"
        }
    }
    fn iptables(&self) -> &'static str {
        if self.ipv6 {
            "ip6tables"
        } else {
            "iptables"
        }
    }

    /// Nodes, the links between them, routes, forwarding and capture rules.
    pub fn build_nodes(&mut self) -> Result<(), LabError> {
        for n in ['a', 'b', 'c'] {
            self.add_ns(&self.node_ns(n))?;
        }
        let (na, nb, nc) = (self.node_ns('a'), self.node_ns('b'), self.node_ns('c'));
        self.veth(&na, "to-nb", self.addr(0, 1), &nb, "to-na", self.addr(0, 2))?;
        self.veth(&na, "to-nc", self.addr(4, 1), &nc, "to-na", self.addr(4, 2))?;
        let ip = self.ip();
        for (ns, subnet, via) in [
            (&na, 2, self.addr(0, 2)),
            (&na, 3, self.addr(4, 2)),
            (&nb, 1, self.addr(0, 1)),
            (&nc, 1, self.addr(4, 1)),
            // Node C reaches node A's 10.X.0.1 (`--source istio`: the
            // istiod double listens there).
            (&nc, 0, self.addr(4, 1)),
        ] {
            run(&format!(
                "{ip} -n {ns} route add {} via {via}",
                self.net(subnet)
            ))?;
        }
        let forwarding = match self.ipv6 {
            false => "net.ipv4.ip_forward=1",
            true => "net.ipv6.conf.all.forwarding=1",
        };
        for ns in [&na, &nb, &nc] {
            run(&format!("ip netns exec {ns} sysctl -q -w {forwarding}"))?;
        }
        let iptables = self.iptables();
        // Outbound capture: every TCP connection from the client pod lands on gateway A.
        run(&format!(
            "ip netns exec {na} {iptables} -t nat -A PREROUTING -i to-pa -p tcp \
             -j REDIRECT --to-ports {OUTBOUND_PORT}"
        ))?;
        // HBONE to any pod of nodes B and C lands on that node's gateway.
        for ns in [&nb, &nc] {
            run(&format!(
                "ip netns exec {ns} {iptables} -t nat -A PREROUTING -i to-na -p tcp \
                 --dport {HBONE_PORT} -j REDIRECT --to-ports {HBONE_PORT}"
            ))?;
        }
        Ok(())
    }

    /// A pod namespace on its node, with its IP and default route.
    pub fn add_pod(&mut self, pod: Pod) -> Result<(), LabError> {
        let (node, subnet) = pod.placement();
        let ns = self.pod_ns(pod);
        let node_ns = format!("{}{node}", self.prefix);
        self.add_ns(&ns)?;
        let link = format!("to-{}", pod.suffix());
        self.veth(
            &node_ns,
            &link,
            self.addr(subnet, 1),
            &ns,
            "eth0",
            self.addr(subnet, 2),
        )?;
        let ip = self.ip();
        run(&format!(
            "{ip} -n {ns} route add default via {}",
            self.addr(subnet, 1)
        ))?;
        if let Pod::Replica { .. } = pod {
            // Node A reaches it through node B.
            run(&format!(
                "{ip} -n {} route add {} via {}",
                self.node_ns('a'),
                self.net(subnet),
                self.addr(0, 2)
            ))?;
        }
        Ok(())
    }

    /// Deletes a pod's namespace (its veth goes with it), as the runtime
    /// does after CNI DEL.
    pub fn delete_pod(&mut self, pod: Pod) -> Result<(), LabError> {
        let ns = self.pod_ns(pod);
        self.created.retain(|n| *n != ns);
        run(&format!("ip netns del {ns}"))
    }

    fn add_ns(&mut self, ns: &str) -> Result<(), LabError> {
        run(&format!("ip netns add {ns}"))?;
        self.created.push(ns.to_owned());
        run(&format!("ip -n {ns} link set lo up"))
    }

    /// A veth pair created inside `ns1` with its peer placed in `ns2`.
    fn veth(
        &self,
        ns1: &str,
        if1: &str,
        a1: IpAddr,
        ns2: &str,
        if2: &str,
        a2: IpAddr,
    ) -> Result<(), LabError> {
        run(&format!(
            "ip -n {ns1} link add {if1} type veth peer name {if2} netns {ns2}"
        ))?;
        let len = self.prefix_len();
        let nodad = if self.ipv6 { " nodad" } else { "" };
        run(&format!("ip -n {ns1} addr add {a1}/{len} dev {if1}{nodad}"))?;
        run(&format!("ip -n {ns2} addr add {a2}/{len} dev {if2}{nodad}"))?;
        run(&format!("ip -n {ns1} link set {if1} up"))?;
        run(&format!("ip -n {ns2} link set {if2} up"))
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in self.created.iter().rev() {
            if let Err(e) = run(&format!("ip netns del {ns}")) {
                eprintln!("drain-lab cleanup: {e}");
            }
        }
    }
}

/// Deletes namespaces left by lab processes that no longer exist (killed
/// with SIGKILL, so their cleanup never ran).
pub fn remove_leftovers() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if pid.is_empty() || alive(&pid) {
            continue;
        }
        let _ = Command::new("ip").args(["netns", "del", name]).output();
    }
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesised command name.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    state != Some("Z")
}

/// Runs a command line (arguments separated by whitespace).
pub fn run(cmdline: &str) -> Result<(), LabError> {
    let args: Vec<&str> = cmdline.split_whitespace().collect();
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| LabError::Setup(format!("cannot run `{cmdline}`: {e}")))?;
    if !out.status.success() {
        return Err(LabError::Setup(format!(
            "`{cmdline}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_addresses_mirror_the_ipv4_ones() {
        let (v4, v6) = (Topology::new(0, false), Topology::new(0, true));
        let x = v4.x;
        assert_eq!(v4.pod_ip(Pod::Old).to_string(), format!("10.{x}.2.2"));
        assert_eq!(v6.pod_ip(Pod::Old).to_string(), format!("fd00:{x:x}:2::2"));
        let replica = Pod::Replica { gen: 1, index: 2 };
        assert_eq!(v6.pod_ip(replica).to_string(), format!("fd00:{x:x}:16::2"));
        assert_eq!(v4.net(22), format!("10.{x}.22.0/24"));
        assert_eq!(v6.net(22), format!("fd00:{x:x}:16::/64"));
        assert_eq!(v6.addr(0, 1).to_string(), format!("fd00:{x:x}::1"));
    }
}
