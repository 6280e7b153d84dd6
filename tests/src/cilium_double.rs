//! A Cilium agent double: what the agent serves ztunnel, built from the
//! ZDS, xDS and CA doubles, as `docs/cilium.md` describes the agent.
//!
//! - ZDS ([`CiliumAgent::node`]: one `SOCK_SEQPACKET` socket a node):
//!   [`snapshot`] sends one `Add` per pod with its namespace, then
//!   `SnapshotSent` — never a keep — each request waiting for one ack and
//!   bounded to 1,024 bytes; on every reconnect the whole snapshot again.
//! - Workload discovery: the xDS double in plaintext on a Unix socket a
//!   node (`XDS_ADDRESS=unix://…`), Workloads only, keyed by pod UID, `node`
//!   the host IP, no trust domain, an empty Authorization stream; the
//!   same resources on TLS with the bootstrap certificate (Cilium 1.19)
//!   are not served here.
//! - The CA: [`CaDouble::start_cilium`] (TLS with the bootstrap
//!   certificate; RSA root; leaves without key usage or EKU, 30 days).
//! - The in-pod rules the agent installs before `Add`
//!   ([`install_rules`]): chains `CILIUM_PREROUTING` / `CILIUM_OUTPUT`.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use prost::Message as _;
use tidegate_xds::client::ADDRESS;
use tidegate_xds::workload::{address, Address, TunnelProtocol, Workload};

use crate::ca_double::CaDouble;
use crate::xds_double::XdsDouble;
use crate::zds_double::{encode_request, expect_ack, PodSpec, Request, ZdsConn, ZdsDouble};

/// The agent's bound on a ZDS message, both ways.
pub const MAX_ZDS_MESSAGE: usize = 1024;

/// One agent's servers, shared by the nodes of a test (each node gets
/// its own sockets from [`CiliumAgent::node`]).
pub struct CiliumAgent {
    pub xds: XdsDouble,
    pub ca: CaDouble,
    /// The bootstrap certificate, as the chart mounts it
    /// (`XDS_ROOT_CA`, `CA_ROOT_CA`).
    pub bootstrap_root: PathBuf,
    dir: PathBuf,
}

/// A node's sockets: ZDS and the xDS server's.
pub struct CiliumNode {
    pub zds: ZdsDouble,
    pub xds_socket: PathBuf,
}

/// A pod as the agent knows it.
#[derive(Clone, Debug)]
pub struct CiliumPod {
    /// The Kubernetes pod UID: the ZDS uid and the xDS resource name.
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    pub ip: Ipv4Addr,
    /// The node's host IP (the workloads' `node`, ztunnel's `NODE_NAME`).
    pub host_ip: Ipv4Addr,
}

impl CiliumPod {
    pub fn spec(&self) -> PodSpec {
        PodSpec {
            uid: self.uid.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            service_account: self.service_account.clone(),
        }
    }

    /// The Workload the agent sends: no trust domain, network, cluster,
    /// services, waypoint or canonical names.
    pub fn workload(&self) -> bytes::Bytes {
        Address {
            r#type: Some(address::Type::Workload(Workload {
                uid: self.uid.clone(),
                name: self.name.clone(),
                namespace: self.namespace.clone(),
                service_account: self.service_account.clone(),
                addresses: vec![self.ip.octets().to_vec().into()],
                tunnel_protocol: TunnelProtocol::Hbone as i32,
                node: self.host_ip.to_string(),
                ..Default::default()
            })),
        }
        .encode_to_vec()
        .into()
    }
}

impl CiliumAgent {
    /// The xDS and CA servers on `ip` (TLS, ephemeral ports) in the
    /// caller's namespace; files under `dir`.
    pub async fn start(dir: &Path, ip: IpAddr) -> CiliumAgent {
        let xds = XdsDouble::start_on(ip).await;
        let ca = CaDouble::start_cilium(ip).await;
        let bootstrap_root = dir.join("bootstrap-root.crt");
        std::fs::write(&bootstrap_root, ca.bootstrap_pem.as_deref().unwrap()).unwrap();
        CiliumAgent {
            xds,
            ca,
            bootstrap_root,
            dir: dir.to_owned(),
        }
    }

    /// `node`'s ZDS socket and xDS socket (both under the agent's dir).
    pub fn node(&self, node: &str) -> CiliumNode {
        let zds = ZdsDouble::bind(&self.dir.join(format!("{node}-ztunnel.sock"))).unwrap();
        let xds_socket = self.dir.join(format!("{node}-xds.sock"));
        self.xds.serve_unix(&xds_socket).unwrap();
        CiliumNode { zds, xds_socket }
    }

    /// Holds `pod`'s Workload, pushed to every stream.
    pub fn set_pod(&self, pod: &CiliumPod) {
        self.xds.set(ADDRESS, &pod.uid, pod.workload());
    }

    /// ztunnel's environment as Cilium's DaemonSet sets it for `node`
    /// (Cilium 1.20: xDS on the Unix socket).
    pub fn env(&self, node: &CiliumNode, host_ip: Ipv4Addr) -> Vec<(String, String)> {
        let root = self.bootstrap_root.display().to_string();
        [
            (
                "XDS_ADDRESS",
                format!("unix://{}", node.xds_socket.display()),
            ),
            ("XDS_ROOT_CA", root.clone()),
            ("CA_ADDRESS", format!("https://{}", self.ca.addr)),
            ("CA_ROOT_CA", root),
            ("INPOD_UDS", node.zds.path.display().to_string()),
            ("ISTIO_META_DNS_CAPTURE", "false".into()),
            ("NODE_NAME", host_ip.to_string()),
            ("INSTANCE_IP", host_ip.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

/// One request as the agent sends it: bounded to [`MAX_ZDS_MESSAGE`]
/// bytes (a longer one is the test's misbehaviour, sent raw).
pub async fn request(conn: &ZdsConn, r: Request, fds: Vec<OwnedFd>) -> anyhow::Result<String> {
    let len = encode_request(&r).len();
    if len > MAX_ZDS_MESSAGE && !matches!(r, Request::Raw(_)) {
        anyhow::bail!("a {len}-byte request: Cilium's agent sends at most {MAX_ZDS_MESSAGE}");
    }
    conn.request(r, fds).await
}

/// Cilium's snapshot on a (new) connection: one `Add` per pod with its
/// namespace, then `SnapshotSent`; no keep. Fails on the first NACK.
pub async fn snapshot(conn: &ZdsConn, pods: Vec<(PodSpec, OwnedFd)>) -> anyhow::Result<()> {
    for (pod, netns) in pods {
        let uid = pod.uid.clone();
        expect_ack(
            &format!("add {uid}"),
            request(conn, Request::Add(pod), vec![netns]).await?,
        )?;
    }
    expect_ack(
        "snapshot_sent",
        request(conn, Request::SnapshotSent, vec![]).await?,
    )
}

/// Cilium's in-pod rules (IPv4), as iptables-restore reads them: istio-cni's
/// REDIRECT mode in chains of its own, without the probe SNAT and without DNS.
pub fn rules() -> String {
    let m = "0x539/0xfff";
    let t = "0x111/0xfff";
    format!(
        "*mangle\n\
         :CILIUM_PREROUTING - [0:0]\n\
         :CILIUM_OUTPUT - [0:0]\n\
         -A PREROUTING -j CILIUM_PREROUTING\n\
         -A OUTPUT -j CILIUM_OUTPUT\n\
         -A CILIUM_PREROUTING -m mark --mark {m} -j CONNMARK --set-xmark {t}\n\
         -A CILIUM_OUTPUT -m connmark --mark {t} -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff\n\
         COMMIT\n\
         *nat\n\
         :CILIUM_PREROUTING - [0:0]\n\
         :CILIUM_OUTPUT - [0:0]\n\
         -A PREROUTING -j CILIUM_PREROUTING\n\
         -A OUTPUT -j CILIUM_OUTPUT\n\
         -A CILIUM_PREROUTING ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark {m} -j REDIRECT --to-ports 15006\n\
         -A CILIUM_OUTPUT -p tcp -m mark --mark {t} -j ACCEPT\n\
         -A CILIUM_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT\n\
         -A CILIUM_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark {m} -j REDIRECT --to-ports 15001\n\
         COMMIT\n"
    )
}

/// Installs [`rules`] and the routing in the named network namespace `ns`,
/// as the agent does before its `Add`.
pub fn install_rules(ns: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "iptables-restore", "--noflush"])
        .stdin(std::process::Stdio::piped())
        .spawn()?;
    child.stdin.take().unwrap().write_all(rules().as_bytes())?;
    let status = child.wait()?;
    anyhow::ensure!(status.success(), "iptables-restore in {ns}: {status}");
    for cmd in [
        format!("ip -n {ns} rule add priority 32764 fwmark 0x111/0xfff lookup 100"),
        format!("ip -n {ns} route add local 0.0.0.0/0 dev lo table 100"),
    ] {
        let status = std::process::Command::new("sh")
            .args(["-c", &cmd])
            .status()?;
        anyhow::ensure!(status.success(), "{cmd}: {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_requests_fit_its_bound() {
        let pod = PodSpec {
            uid: "0b5e6c4e-8a8f-4b8e-9f3a-4f1f2c3d4e5f".into(),
            name: "a".repeat(253),
            namespace: "n".repeat(63),
            service_account: "s".repeat(253),
        };
        assert!(encode_request(&Request::Add(pod)).len() <= MAX_ZDS_MESSAGE);
    }

    #[test]
    fn the_rules_use_ciliums_chains_and_no_dns_or_probe_rule() {
        let r = rules();
        assert!(r.contains("-A PREROUTING -j CILIUM_PREROUTING"));
        assert!(r.contains("-A OUTPUT -j CILIUM_OUTPUT"));
        assert!(!r.contains("ISTIO_"));
        assert!(!r.contains("--dport 53") && !r.contains("169.254.7.127"));
    }
}
