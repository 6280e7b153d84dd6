//! Two nodes whose pods are captured *inside* their own network namespaces
//! (in-pod mode): namespaces created as a container runtime does (`ip netns
//! add`, a veth from the node), no capture rule anywhere until `tidegate-cni`
//! ADD installs them.
//!
//! ```text
//!  pa (meshed client)  10.X.1.2 ──veth── 10.X.1.1 ┐                        ┌ 10.X.2.1 ──veth── 10.X.2.2  pb (meshed server)
//!  pc (not meshed)     10.X.3.2 ──veth── 10.X.3.1 ┴ na 10.X.0.1 ── 10.X.0.2 nb
//! ```
//!
//! [`InpodTopology::add_ipv6`] makes it dual-stack: `fd00:X:S::H/64` beside
//! every `10.X.S.H/24`, with the same routes.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::netns::{run, veth, NetnsGuard, Topology};

pub struct InpodTopology {
    pub na: String,
    pub nb: String,
    pub pa: String,
    pub pb: String,
    /// A pod on node A outside the mesh.
    pub pc: String,
    pub x: u8,
}

impl InpodTopology {
    /// Scenario `k` of a test binary whose namespaces start with `tag`.
    pub fn new(tag: &str, k: u8) -> InpodTopology {
        let t = Topology::new(tag, k);
        InpodTopology {
            pc: format!("{tag}{}s{k}pc", std::process::id()),
            na: t.na,
            nb: t.nb,
            pa: t.pa,
            pb: t.pb,
            x: t.x,
        }
    }

    pub fn addr(&self, subnet: u8, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, self.x, subnet, host)
    }
    pub fn pod_a(&self) -> Ipv4Addr {
        self.addr(1, 2)
    }
    pub fn pod_b(&self) -> Ipv4Addr {
        self.addr(2, 2)
    }
    pub fn pod_c(&self) -> Ipv4Addr {
        self.addr(3, 2)
    }

    /// The IPv6 address beside [`InpodTopology::addr`]: `fd00:X:S::H`.
    pub fn addr6(&self, subnet: u8, host: u8) -> Ipv6Addr {
        Ipv6Addr::new(
            0xfd00,
            u16::from(self.x),
            u16::from(subnet),
            0,
            0,
            0,
            0,
            u16::from(host),
        )
    }

    /// After [`InpodTopology::build`]: an IPv6 address beside every IPv4
    /// one (`nodad`: usable at once), the same routes and forwarding.
    pub fn add_ipv6(&self) {
        let (na, nb) = (&self.na, &self.nb);
        let ends = [
            (na, "to-pa", 1, 1),
            (&self.pa, "eth0", 1, 2),
            (na, "to-pc", 3, 1),
            (&self.pc, "eth0", 3, 2),
            (nb, "to-pb", 2, 1),
            (&self.pb, "eth0", 2, 2),
            (na, "to-nb", 0, 1),
            (nb, "to-na", 0, 2),
        ];
        for (ns, dev, subnet, host) in ends {
            run(&format!(
                "ip -n {ns} -6 addr add {}/64 dev {dev} nodad",
                self.addr6(subnet, host)
            ));
        }
        for (pod, gw) in [(&self.pa, 1), (&self.pc, 3), (&self.pb, 2)] {
            run(&format!(
                "ip -n {pod} -6 route add default via {}",
                self.addr6(gw, 1)
            ));
        }
        run(&format!(
            "ip -n {na} -6 route add {}/64 via {}",
            self.addr6(2, 0),
            self.addr6(0, 2)
        ));
        for subnet in [1, 3] {
            run(&format!(
                "ip -n {nb} -6 route add {}/64 via {}",
                self.addr6(subnet, 0),
                self.addr6(0, 1)
            ));
        }
        for ns in [na, nb] {
            run(&format!(
                "ip netns exec {ns} sysctl -q -w net.ipv6.conf.all.forwarding=1"
            ));
        }
    }

    /// `/var/run/netns/<name>`: what a runtime passes as `CNI_NETNS`.
    pub fn netns_path(name: &str) -> String {
        format!("/var/run/netns/{name}")
    }

    /// Creates the namespaces, veths, addresses, routes and forwarding; no
    /// iptables rule. The guard is armed before the first namespace exists.
    pub fn build(&self) -> NetnsGuard {
        let guard = NetnsGuard::fresh(&[&self.na, &self.nb, &self.pa, &self.pb, &self.pc]);
        let (na, nb) = (&self.na, &self.nb);
        let pairs = [
            (na, "to-pa", self.addr(1, 1), &self.pa, "eth0", self.pod_a()),
            (na, "to-pc", self.addr(3, 1), &self.pc, "eth0", self.pod_c()),
            (nb, "to-pb", self.addr(2, 1), &self.pb, "eth0", self.pod_b()),
            (na, "to-nb", self.addr(0, 1), nb, "to-na", self.addr(0, 2)),
        ];
        for (ns1, if1, a1, ns2, if2, a2) in pairs {
            veth(ns1, if1, &format!("{a1}/24"), ns2, if2, &format!("{a2}/24"));
        }
        for (pod, gw) in [(&self.pa, 1), (&self.pc, 3), (&self.pb, 2)] {
            run(&format!(
                "ip -n {pod} route add default via {}",
                self.addr(gw, 1)
            ));
        }
        run(&format!(
            "ip -n {na} route add {}/24 via {}",
            self.addr(2, 0),
            self.addr(0, 2)
        ));
        for subnet in [1, 3] {
            run(&format!(
                "ip -n {nb} route add {}/24 via {}",
                self.addr(subnet, 0),
                self.addr(0, 1)
            ));
        }
        for ns in [na, nb] {
            run(&format!(
                "ip netns exec {ns} sysctl -q -w net.ipv4.ip_forward=1"
            ));
        }
        guard
    }
}
