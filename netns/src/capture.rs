//! The capture rules inside a pod's network namespace — istio-cni's in-pod
//! rule set, so a pod captured by tidegate looks to the node exactly like
//! one captured for ztunnel:
//!
//! - mangle: a packet with the gateway's mark (0x539) tags its connection
//!   (connmark 0x111), restored on the app's replies;
//! - nat: inbound TCP except to 15008 → 15006 (plaintext inbound), outbound
//!   TCP except marked, loopback and the pod's own IP → 15001; kubelet
//!   probes (SNATed by the node to 169.254.7.127) pass untouched;
//! - routing: replies marked 0x111 look up table 100, whose local default
//!   route hands them back to the gateway's transparent socket.
//!
//! iptables (`iptables-restore --noflush`, one atomic commit per table
//! batch) rather than nftables: it is what istio-cni uses by default, so
//! rules, counters and `iptables-save` output match what operators of
//! Istio ambient already read; the kernel's nft backend runs either way.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::namespace::MESH_MARK;

/// The connmark of connections the gateway made (istio-cni's `InpodTProxyMark`).
pub const TPROXY_MARK: u32 = 0x111;
/// The routing table of marked replies.
pub const ROUTE_TABLE: u32 = 100;
/// The address the node SNATs kubelet probes to.
pub const PROBE_SNAT: &str = "169.254.7.127";

/// The ports the rules send traffic to.
#[derive(Clone, Copy, Debug)]
pub struct CapturePorts {
    pub outbound: u16,
    pub inbound_plaintext: u16,
    pub hbone: u16,
}

impl Default for CapturePorts {
    fn default() -> Self {
        CapturePorts {
            outbound: 15001,
            inbound_plaintext: 15006,
            hbone: 15008,
        }
    }
}

/// The `iptables-restore --noflush` input for the pod.
pub fn rules(p: CapturePorts) -> String {
    let m = format!("0x{MESH_MARK:x}/0xfff");
    let t = format!("0x{TPROXY_MARK:x}/0xfff");
    format!(
        "*mangle\n\
         :ISTIO_PRERT - [0:0]\n\
         :ISTIO_OUTPUT - [0:0]\n\
         -A PREROUTING -j ISTIO_PRERT\n\
         -A OUTPUT -j ISTIO_OUTPUT\n\
         -A ISTIO_PRERT -m mark --mark {m} -j CONNMARK --set-xmark {t}\n\
         -A ISTIO_OUTPUT -m connmark --mark {t} -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff\n\
         COMMIT\n\
         *nat\n\
         :ISTIO_PRERT - [0:0]\n\
         :ISTIO_OUTPUT - [0:0]\n\
         -A PREROUTING -j ISTIO_PRERT\n\
         -A OUTPUT -j ISTIO_OUTPUT\n\
         -A ISTIO_PRERT -s {PROBE_SNAT}/32 -p tcp -m tcp -j ACCEPT\n\
         -A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport {hbone} -m mark ! --mark {m} -j REDIRECT --to-ports {inbound}\n\
         -A ISTIO_OUTPUT -d {PROBE_SNAT}/32 -p tcp -m tcp -j ACCEPT\n\
         -A ISTIO_OUTPUT -p tcp -m mark --mark {t} -j ACCEPT\n\
         -A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT\n\
         -A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark {m} -j REDIRECT --to-ports {outbound}\n\
         COMMIT\n",
        hbone = p.hbone,
        inbound = p.inbound_plaintext,
        outbound = p.outbound,
    )
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("cannot open the pod's network namespace {path}: {source}")]
    Netns {
        path: String,
        source: crate::namespace::NetnsError,
    },
    #[error("cannot enter the pod's network namespace: {0} (needs CAP_SYS_ADMIN)")]
    Enter(std::io::Error),
    #[error("`{command}` failed in the pod's network namespace: {detail}")]
    Command { command: String, detail: String },
}

/// Installs the rules and the reply route inside the namespace at `netns`
/// (a `CNI_NETNS` path); idempotent (a retried ADD changes nothing). The commands run as children of a thread that
/// entered the namespace (a child is born in its parent thread's
/// namespace); that thread ends afterwards, never serving anything else.
pub fn install(netns: &Path, p: CapturePorts) -> Result<(), CaptureError> {
    let ns = crate::namespace::PodNetns::open(netns).map_err(|source| CaptureError::Netns {
        path: netns.display().to_string(),
        source,
    })?;
    let rules = rules(p);
    std::thread::scope(|s| {
        s.spawn(move || {
            ns.enter().map_err(CaptureError::Enter)?;
            // A repeated ADD: the chains exist, the rules are in (they go in
            // one iptables-restore commit, all or nothing).
            let installed = run(
                "iptables -t nat -S ISTIO_OUTPUT",
                &["iptables", "-t", "nat", "-S", "ISTIO_OUTPUT"],
                None,
            )
            .is_ok();
            if !installed {
                run(
                    "iptables-restore --noflush",
                    &["iptables-restore", "--noflush"],
                    Some(&rules),
                )?;
            }
            // A gateway upgraded beside the old one (SO_REUSEPORT): when the
            // old one closes its listeners, connections still in their accept
            // queues move to the new one's instead of being reset.
            run(
                "sysctl net.ipv4.tcp_migrate_req=1",
                &["sysctl", "-q", "-w", "net.ipv4.tcp_migrate_req=1"],
                None,
            )?;
            let mark = format!("0x{TPROXY_MARK:x}/0xfff");
            let table = ROUTE_TABLE.to_string();
            run_idempotent(&[
                "ip", "-4", "rule", "add", "fwmark", &mark, "pref", "32764", "lookup", &table,
            ])?;
            run_idempotent(&[
                "ip",
                "-4",
                "route",
                "add",
                "local",
                "0.0.0.0/0",
                "dev",
                "lo",
                "table",
                &table,
            ])
        })
        .join()
        .unwrap_or_else(|_| {
            Err(CaptureError::Command {
                command: "install".into(),
                detail: "the installing thread panicked".into(),
            })
        })
    })
}

/// The node's side of the probe exemption (in the namespace of the caller,
/// the node's): the kubelet's own connections to a pod leave SNATed to
/// [`PROBE_SNAT`], which the pod's rules let through uncaptured. One rule
/// per pod address in the nat chain `TIDEGATE_PROBES` (jumped to from
/// POSTROUTING); `add: false` removes the pod's rules. Idempotent.
pub fn probe_snat(add: bool, pod_ips: &[std::net::IpAddr]) -> Result<(), CaptureError> {
    let ipt = |args: &[&str]| {
        let mut argv = vec!["iptables", "-w", "-t", "nat"];
        argv.extend_from_slice(args);
        run(&argv.join(" "), &argv, None)
    };
    if add {
        if ipt(&["-S", PROBE_CHAIN]).is_err() {
            // Two ADDs may race to create it.
            if let Err(e) = ipt(&["-N", PROBE_CHAIN]) {
                ipt(&["-S", PROBE_CHAIN]).map_err(|_| e)?;
            }
        }
        if ipt(&["-C", "POSTROUTING", "-j", PROBE_CHAIN]).is_err() {
            ipt(&["-A", "POSTROUTING", "-j", PROBE_CHAIN])?;
        }
    }
    for ip in pod_ips.iter().filter(|ip| ip.is_ipv4()) {
        let dst = format!("{ip}/32");
        let rule = [
            PROBE_CHAIN,
            "-d",
            &dst,
            "-p",
            "tcp",
            "-m",
            "owner",
            "--socket-exists",
            "-j",
            "SNAT",
            "--to-source",
            PROBE_SNAT,
        ];
        let present = ipt(&[&["-C"][..], &rule[..]].concat()).is_ok();
        match (add, present) {
            (true, false) => ipt(&[&["-A"][..], &rule[..]].concat())?,
            (false, true) => ipt(&[&["-D"][..], &rule[..]].concat())?,
            _ => {}
        }
    }
    Ok(())
}

/// The node's nat chain of probe SNAT rules.
pub const PROBE_CHAIN: &str = "TIDEGATE_PROBES";

/// Runs `argv`, writing `stdin` to it; its stderr is the error's detail.
fn run(what: &str, argv: &[&str], stdin: Option<&str>) -> Result<(), CaptureError> {
    let fail = |detail: String| CaptureError::Command {
        command: what.to_owned(),
        detail,
    };
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot start {}: {e}", argv[0])))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|e| fail(e.to_string()))?;
    }
    let out = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
    if out.status.success() {
        return Ok(());
    }
    Err(fail(String::from_utf8_lossy(&out.stderr).trim().to_owned()))
}

/// `ip rule add` / `ip route add`: one that exists already is fine (a
/// repeated ADD).
fn run_idempotent(argv: &[&str]) -> Result<(), CaptureError> {
    match run(&argv.join(" "), argv, None) {
        Err(CaptureError::Command { detail, .. }) if detail.contains("File exists") => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_set_is_istio_cnis() {
        let r = rules(CapturePorts::default());
        for line in [
            "-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff",
            "-A ISTIO_PRERT -s 169.254.7.127/32 -p tcp -m tcp -j ACCEPT",
            "-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006",
            "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT",
            "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001",
        ] {
            assert!(r.lines().any(|l| l == line), "missing {line:?} in\n{r}");
        }
        assert_eq!(r.matches("COMMIT").count(), 2);
    }
}
