//! The capture rules inside a pod's network namespace — istio-cni's in-pod
//! rule set, so a pod captured by tidegate looks to the node exactly like
//! one captured for ztunnel:
//!
//! - mangle: a packet with the gateway's mark (0x539) tags its connection
//!   (connmark 0x111), restored on the app's replies;
//! - nat: inbound TCP except to 15008 → 15006 (plaintext inbound), outbound
//!   TCP except marked, loopback and the pod's own IP → 15001; kubelet
//!   probes (SNATed by the node to 169.254.7.127, or to
//!   fd16:9254:7127:1337:ffff:ffff:ffff:ffff over IPv6) pass untouched;
//! - routing: replies marked 0x111 look up table 100, whose local default
//!   route hands them back to the gateway's transparent socket.
//!
//! Both address families, always together: the same chains, marks and
//! redirects for IPv6 (`ip6tables-restore`, `::1/128` for loopback) as for
//! IPv4, whatever addresses the pod has — a pod without an IPv6 address
//! still has IPv6 loopback and link-local traffic, which must not leave
//! uncaptured either. Either both families' rules are in place or neither:
//! an IPv6 failure after the IPv4 rules went in removes them again, and the
//! pod is refused ([`CaptureError::Ipv6`]) rather than enrolled with IPv6
//! open. Only a pod namespace without IPv6 (a kernel without it, or
//! `disable_ipv6=1` on every interface) gets the IPv4 rules alone, and the
//! outcome says why ([`Installed::ipv6_skipped`]).
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
/// The address the node SNATs kubelet probes over IPv6 to (istio-cni's
/// `HOST_PROBE_SNAT_IPV6`).
pub const PROBE_SNAT_V6: &str = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff";
/// The chains of the rule set, in both tables.
const CHAINS: [&str; 2] = ["ISTIO_PRERT", "ISTIO_OUTPUT"];

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

/// An address family of the rule set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    /// `iptables` or `ip6tables`.
    pub fn iptables(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }
    fn restore(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }
    fn save(self) -> &'static str {
        match self {
            Family::V4 => "iptables-save",
            Family::V6 => "ip6tables-save",
        }
    }
    fn loopback(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.1/32",
            Family::V6 => "::1/128",
        }
    }
    fn probe_snat(self) -> &'static str {
        match self {
            Family::V4 => PROBE_SNAT,
            Family::V6 => PROBE_SNAT_V6,
        }
    }
    fn host_prefix(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }
    fn ip_flag(self) -> &'static str {
        match self {
            Family::V4 => "-4",
            Family::V6 => "-6",
        }
    }
    fn any(self) -> &'static str {
        match self {
            Family::V4 => "0.0.0.0/0",
            Family::V6 => "::/0",
        }
    }
    fn of(ip: &std::net::IpAddr) -> Family {
        if ip.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }
}

/// IPv6 link-local destinations (`fe80::/10`).
pub const LINK_LOCAL_V6: &str = "fe80::/10";

/// The `iptables-restore --noflush` (IPv4) or `ip6tables-restore
/// --noflush` (IPv6) input for the pod: the same rules, the family's
/// loopback and probe addresses; for IPv6, also the link-local refusal
/// ([`link_local_refusal`]).
pub fn rules(family: Family, p: CapturePorts) -> String {
    let m = format!("0x{MESH_MARK:x}/0xfff");
    let t = format!("0x{TPROXY_MARK:x}/0xfff");
    let lo = family.loopback();
    let probe = format!("{}/{}", family.probe_snat(), family.host_prefix());
    let (link_local_nat, link_local_filter) = match family {
        Family::V4 => (String::new(), String::new()),
        Family::V6 => link_local_refusal(&m),
    };
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
         -A ISTIO_PRERT -s {probe} -p tcp -m tcp -j ACCEPT\n\
         -A ISTIO_PRERT ! -d {lo} -p tcp ! --dport {hbone} -m mark ! --mark {m} -j REDIRECT --to-ports {inbound}\n\
         -A ISTIO_OUTPUT -d {probe} -p tcp -m tcp -j ACCEPT\n\
         -A ISTIO_OUTPUT -p tcp -m mark --mark {t} -j ACCEPT\n\
         -A ISTIO_OUTPUT ! -d {lo} -o lo -j ACCEPT\n\
         {link_local_nat}\
         -A ISTIO_OUTPUT ! -d {lo} -p tcp -m mark ! --mark {m} -j REDIRECT --to-ports {outbound}\n\
         COMMIT\n\
         {link_local_filter}",
        hbone = p.hbone,
        inbound = p.inbound_plaintext,
        outbound = p.outbound,
    )
}

/// The IPv6 rules that refuse a pod's TCP connection to a link-local
/// address (another host on its link, `fe80::/10`) at once, with a reset,
/// rather than redirect it: the nat `RETURN` before the outbound REDIRECT,
/// and a filter chain of one `REJECT`.
///
/// A redirected link-local connection can never be served. The app's
/// socket is bound to its interface (the scope of the link-local address),
/// and the kernel routes the redirected SYN (now to `::1`) out of that
/// interface: there is no such route (`Ip6OutNoRoutes`), the SYN is
/// dropped, and the app's `connect` retries until it times out. Neither
/// ztunnel nor istio-cni has a rule for it (istio-cni's rule set captures
/// link-local like any address, so under istio-cni the connection waits,
/// for ztunnel as for tidegate); and letting it pass uncaptured would open
/// a way between pods on one bridge around the mesh. Only new connections
/// (`--syn`) of the app (not the gateway's mark) leaving the pod (not `lo`,
/// the pod's own link-local address) are refused; the packet counter of
/// the `REJECT` rule (`ip6tables -t filter -L ISTIO_OUTPUT -v`) counts
/// them.
fn link_local_refusal(mesh_mark: &str) -> (String, String) {
    (
        format!("-A ISTIO_OUTPUT -d {LINK_LOCAL_V6} -p tcp -j RETURN\n"),
        format!(
            "*filter\n\
             :ISTIO_OUTPUT - [0:0]\n\
             -A OUTPUT -j ISTIO_OUTPUT\n\
             -A ISTIO_OUTPUT -d {LINK_LOCAL_V6} ! -o lo -p tcp -m tcp --syn -m mark ! --mark {mesh_mark} -j REJECT --reject-with tcp-reset\n\
             COMMIT\n"
        ),
    )
}

/// The `--noflush` restore input that takes the rule set out of a family's
/// tables, from that family's `iptables-save` output: the jumps to our
/// chains deleted, the chains flushed and deleted — only what is there, so
/// removing twice changes nothing. `None`: nothing of ours is there.
pub fn removal(saved: &str) -> Option<String> {
    let mut out = String::new();
    let mut table: Option<(&str, Vec<String>, Vec<&str>)> = None;
    let mut any = false;
    for line in saved.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = Some((name, Vec::new(), Vec::new()));
        } else if line == "COMMIT" {
            if let Some((name, jumps, chains)) = table.take() {
                if jumps.is_empty() && chains.is_empty() {
                    continue;
                }
                any = true;
                out.push_str(&format!("*{name}\n"));
                for j in jumps {
                    out.push_str(&format!("-D {j}\n"));
                }
                for c in &chains {
                    out.push_str(&format!("-F {c}\n"));
                }
                for c in &chains {
                    out.push_str(&format!("-X {c}\n"));
                }
                out.push_str("COMMIT\n");
            }
        } else if let Some((_, jumps, chains)) = table.as_mut() {
            // Counters (`iptables-save -c`) are not asked for.
            if let Some(chain) = line.strip_prefix(':').and_then(|l| l.split(' ').next()) {
                if CHAINS.contains(&chain) {
                    chains.push(chain);
                }
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let ours = CHAINS.iter().any(|c| rule.ends_with(&format!(" -j {c}")));
                let from_builtin = !CHAINS.iter().any(|c| rule.starts_with(&format!("{c} ")));
                if ours && from_builtin {
                    jumps.push(rule.to_owned());
                }
            }
        }
    }
    any.then_some(out)
}

/// What [`install`] put in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// Why the pod has no IPv6 rules (its namespace has no IPv6); `None`:
    /// both families are captured.
    pub ipv6_skipped: Option<String>,
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
    /// The pod has IPv6 but its IPv6 rules cannot go in: refused, never
    /// enrolled with IPv6 uncaptured.
    #[error(
        "IPv6 is on in the pod but its IPv6 capture rules cannot be installed ({detail}); \
         the pod is refused rather than let IPv6 bypass the mesh: the node needs \
         ip6tables-restore and the kernel's ip6_tables (nat, mangle, filter) and REJECT support{rollback}"
    )]
    Ipv6 { detail: String, rollback: String },
}

/// Installs both families' rules and the reply routes inside the namespace
/// at `netns` (a `CNI_NETNS` path); idempotent (a retried ADD changes
/// nothing). Either every rule goes in or none this call added stays: a
/// failure removes what it had installed. IPv4 alone only where the pod's
/// namespace has no IPv6 ([`Installed::ipv6_skipped`] says why). The
/// commands run as children of a thread that entered the namespace (a
/// child is born in its parent thread's namespace); that thread ends
/// afterwards, never serving anything else.
pub fn install(netns: &Path, p: CapturePorts) -> Result<Installed, CaptureError> {
    in_namespace(netns, "install", move || install_here(p))
}

/// Removes both families' rules and reply routes from the namespace at
/// `netns`; what is not there is not an error (removing twice is fine).
pub fn remove(netns: &Path) -> Result<(), CaptureError> {
    in_namespace(netns, "remove", || {
        let mut failed = Vec::new();
        let ipv6 = ipv6_absent(Path::new("/proc/sys/net/ipv6")).is_none();
        for family in Family::BOTH {
            if let Err(e) = remove_rules(family) {
                failed.push(e.to_string());
            }
            // Without IPv6 there is no IPv6 route to remove.
            if family == Family::V4 || ipv6 {
                if let Err(e) = routes(family, false) {
                    failed.push(e.to_string());
                }
            }
        }
        match failed.is_empty() {
            true => Ok(()),
            false => Err(CaptureError::Command {
                command: "remove".into(),
                detail: failed.join("; "),
            }),
        }
    })
}

/// Runs `f` on a thread that entered the namespace at `netns`.
fn in_namespace<T: Send>(
    netns: &Path,
    what: &str,
    f: impl FnOnce() -> Result<T, CaptureError> + Send,
) -> Result<T, CaptureError> {
    let ns = crate::namespace::PodNetns::open(netns).map_err(|source| CaptureError::Netns {
        path: netns.display().to_string(),
        source,
    })?;
    std::thread::scope(|s| {
        s.spawn(move || {
            ns.enter().map_err(CaptureError::Enter)?;
            f()
        })
        .join()
        .unwrap_or_else(|_| {
            Err(CaptureError::Command {
                command: what.into(),
                detail: format!("the thread doing `{what}` panicked"),
            })
        })
    })
}

/// [`install`], on a thread inside the pod's namespace.
fn install_here(p: CapturePorts) -> Result<Installed, CaptureError> {
    // A gateway upgraded beside the old one (SO_REUSEPORT): when the old
    // one closes its listeners, connections still in their accept queues
    // move to the new one's instead of being reset. (The `ipv4` sysctl
    // covers IPv6 sockets too.)
    run(
        "sysctl net.ipv4.tcp_migrate_req=1",
        &["sysctl", "-q", "-w", "net.ipv4.tcp_migrate_req=1"],
        None,
    )?;
    let ipv6_skipped = ipv6_absent(Path::new("/proc/sys/net/ipv6"));
    let families: &[Family] = match ipv6_skipped {
        None => &Family::BOTH,
        Some(_) => &[Family::V4],
    };
    // What this call added, taken out again if a later step fails.
    let mut added = Vec::new();
    let undo = |added: &[Family]| -> String {
        let failed: Vec<String> = added
            .iter()
            .flat_map(|f| [remove_rules(*f), routes(*f, false)])
            .filter_map(Result::err)
            .map(|e| e.to_string())
            .collect();
        match failed.is_empty() {
            true => String::new(),
            false => format!(
                "; removing what was installed failed too: {}",
                failed.join("; ")
            ),
        }
    };
    for &family in families {
        // A repeated ADD: the chains exist, the rules are in (they go in
        // one restore commit per family, all or nothing).
        let present = run(
            &format!("{} -t nat -S ISTIO_OUTPUT", family.iptables()),
            &[family.iptables(), "-t", "nat", "-S", "ISTIO_OUTPUT"],
            None,
        )
        .is_ok();
        let outcome = match present {
            true => Ok(()),
            false => run(
                &format!("{} --noflush", family.restore()),
                &[family.restore(), "--noflush"],
                Some(&rules(family, p)),
            ),
        }
        .and_then(|()| {
            if !present {
                added.push(family);
            }
            routes(family, true)
        });
        if let Err(e) = outcome {
            let rollback = undo(&added);
            return Err(match (family, e) {
                (Family::V6, CaptureError::Command { command, detail }) => CaptureError::Ipv6 {
                    detail: format!("`{command}`: {detail}"),
                    rollback,
                },
                (_, CaptureError::Command { command, detail }) => CaptureError::Command {
                    command,
                    detail: detail + &rollback,
                },
                (_, other) => other,
            });
        }
    }
    Ok(Installed { ipv6_skipped })
}

/// Why the namespace has no IPv6, read from `ipv6_sysctl` (its
/// `/proc/sys/net/ipv6`, as seen by the calling thread): the kernel has
/// none, or every interface has `disable_ipv6=1`. `None`: IPv6 is on
/// somewhere, and must be captured.
pub fn ipv6_absent(ipv6_sysctl: &Path) -> Option<String> {
    let conf = ipv6_sysctl.join("conf");
    let Ok(entries) = std::fs::read_dir(&conf) else {
        return Some(format!(
            "the kernel has no IPv6 support ({} is absent)",
            conf.display()
        ));
    };
    let mut interfaces = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name == "all" || name == "default" {
            continue;
        }
        interfaces += 1;
        let disabled = std::fs::read_to_string(entry.path().join("disable_ipv6"))
            .is_ok_and(|v| v.trim() == "1");
        if !disabled {
            return None;
        }
    }
    (interfaces > 0).then(|| {
        format!("IPv6 is disabled in the pod (disable_ipv6=1 on all {interfaces} interfaces)")
    })
}

/// Takes a family's rule set out, if any of it is there.
fn remove_rules(family: Family) -> Result<(), CaptureError> {
    let saved = match output(family.save(), &[family.save()]) {
        Ok(s) => s,
        // No tool for the family: no rule of it can be there.
        Err(CaptureError::Command { detail, .. }) if detail.starts_with("cannot start") => {
            return Ok(())
        }
        Err(e) => return Err(e),
    };
    match removal(&saved) {
        Some(script) => run(
            &format!("{} --noflush (removal)", family.restore()),
            &[family.restore(), "--noflush"],
            Some(&script),
        ),
        None => Ok(()),
    }
}

/// The family's reply route: `ip rule` for marked replies, the local
/// default route of table 100; added (an existing one is fine) or deleted
/// (an absent one is fine).
fn routes(family: Family, add: bool) -> Result<(), CaptureError> {
    let mark = format!("0x{TPROXY_MARK:x}/0xfff");
    let table = ROUTE_TABLE.to_string();
    let verb = if add { "add" } else { "del" };
    let f = family.ip_flag();
    let rule = [
        "ip", f, "rule", verb, "fwmark", &mark, "pref", "32764", "lookup", &table,
    ];
    let route = [
        "ip",
        f,
        "route",
        verb,
        "local",
        family.any(),
        "dev",
        "lo",
        "table",
        &table,
    ];
    run_idempotent(&rule)?;
    // IPv6 off on loopback alone (on elsewhere): no local IPv6 route can
    // exist; the rules still capture, as istio-cni does it.
    let lo_off = std::fs::read_to_string("/proc/sys/net/ipv6/conf/lo/disable_ipv6")
        .is_ok_and(|v| v.trim() == "1");
    if family == Family::V6 && lo_off {
        return Ok(());
    }
    run_idempotent(&route)
}

/// The node's side of the probe exemption (in the namespace of the caller,
/// the node's): the kubelet's own connections to a pod leave SNATed to
/// [`PROBE_SNAT`] (IPv4) or [`PROBE_SNAT_V6`] (IPv6), which the pod's rules
/// let through uncaptured. One rule per pod address in the nat chain
/// `TIDEGATE_PROBES` of its family (jumped to from POSTROUTING); `add:
/// false` removes the pod's rules. Idempotent.
pub fn probe_snat(add: bool, pod_ips: &[std::net::IpAddr]) -> Result<(), CaptureError> {
    for family in Family::BOTH {
        let ips: Vec<_> = pod_ips
            .iter()
            .filter(|ip| Family::of(ip) == family)
            .collect();
        if !ips.is_empty() {
            probe_snat_family(family, add, &ips)?;
        }
    }
    Ok(())
}

fn probe_snat_family(
    family: Family,
    add: bool,
    pod_ips: &[&std::net::IpAddr],
) -> Result<(), CaptureError> {
    let ipt = |args: &[&str]| {
        let mut argv = vec![family.iptables(), "-w", "-t", "nat"];
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
    for ip in pod_ips {
        let dst = format!("{ip}/{}", family.host_prefix());
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
            family.probe_snat(),
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
    // A tool that fails before reading its input (a missing table) closes
    // the pipe: its own reason, on stderr, is the one to give, not the
    // broken pipe.
    let written = match (stdin, child.stdin.take()) {
        (Some(text), Some(mut pipe)) => pipe.write_all(text.as_bytes()),
        _ => Ok(()),
    };
    let out = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
    match (out.status.success(), written) {
        (true, Ok(())) => Ok(()),
        (true, Err(e)) => Err(fail(format!("writing its input: {e}"))),
        (false, _) => Err(fail(String::from_utf8_lossy(&out.stderr).trim().to_owned())),
    }
}

/// `ip rule add|del` / `ip route add|del`: one that exists already on add
/// (a repeated ADD), or is absent on del, is fine.
fn run_idempotent(argv: &[&str]) -> Result<(), CaptureError> {
    match run(&argv.join(" "), argv, None) {
        Err(CaptureError::Command { detail, .. })
            if ["File exists", "No such file", "No such process"]
                .iter()
                .any(|m| detail.contains(m)) =>
        {
            Ok(())
        }
        r => r,
    }
}

/// Runs `argv` and returns its stdout.
fn output(what: &str, argv: &[&str]) -> Result<String, CaptureError> {
    let fail = |detail: String| CaptureError::Command {
        command: what.to_owned(),
        detail,
    };
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| fail(format!("cannot start {}: {e}", argv[0])))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    Err(fail(String::from_utf8_lossy(&out.stderr).trim().to_owned()))
}

#[cfg(test)]
#[path = "capture_tests.rs"]
mod tests;
