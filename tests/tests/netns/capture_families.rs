//! `tidegate-cni` installs and removes the in-pod capture rules of both
//! address families together: the real binary, run as a runtime runs it
//! from a node namespace, on a real dual-stack pod namespace, with a
//! stand-in for the gateway's CNI socket (it answers the hand-over
//! "added", the teardown "idle"; serving the pod is not what is tested).
//!
//! ```text
//!  v6c<pid>s<k>p (pod)                         v6c<pid>s<k>n (node)
//!  eth0 10.99.0.2/24, fd00:99::2/64 ──veth── to-pod 10.99.0.1/24, fd00:99::1/64
//!       fe80::99:2/64                                 fe80::99:1/64
//! ```

use std::net::{Ipv6Addr, SocketAddr};
use std::path::Path;
use std::process::{Command, Output};

use tidegate_e2e::cni::CniPod;
use tidegate_e2e::netns::{run, tool_missing, veth, NetnsGuard, NsThread, STEP};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::skip;

const POD_V4: &str = "10.99.0.2";
const POD_V6: &str = "fd00:99::2";
const NODE_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 1);
/// The node's and the pod's link-local addresses on the veth.
const NODE_LINK_LOCAL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0x99, 1);
const POD_LINK_LOCAL: &str = "fe80::99:2";
const OUTSIDE_PORT: u16 = 8080;
const PROBE_V6_RULE: &str = "-A TIDEGATE_PROBES -d fd00:99::2/128 -p tcp -m owner --socket-exists -j SNAT --to-source fd16:9254:7127:1337:ffff:ffff:ffff:ffff";

/// A node and one pod, both families; the guard deletes what it created.
struct Pod {
    node: String,
    pod: String,
    /// The node's namespace, where the plugin runs.
    shell: NsThread,
    dir: tempfile::TempDir,
    socket: std::path::PathBuf,
    _gateway: tokio::task::JoinHandle<()>,
    _guard: NetnsGuard,
}

impl Pod {
    async fn new(k: u8) -> Pod {
        tidegate_e2e::init_tracing();
        let pid = std::process::id();
        let (node, pod) = (format!("v6c{pid}s{k}n"), format!("v6c{pid}s{k}p"));
        let guard = NetnsGuard::fresh(&[&node, &pod]);
        veth(
            &node,
            "to-pod",
            "10.99.0.1/24",
            &pod,
            "eth0",
            &format!("{POD_V4}/24"),
        );
        run(&format!(
            "ip -n {node} -6 addr add {NODE_V6}/64 dev to-pod nodad"
        ));
        run(&format!(
            "ip -n {pod} -6 addr add {POD_V6}/64 dev eth0 nodad"
        ));
        run(&format!(
            "ip -n {node} -6 addr add {NODE_LINK_LOCAL}/64 dev to-pod nodad"
        ));
        run(&format!(
            "ip -n {pod} -6 addr add {POD_LINK_LOCAL}/64 dev eth0 nodad"
        ));
        run(&format!("ip -n {pod} route add default via 10.99.0.1"));
        run(&format!("ip -n {pod} -6 route add default via {NODE_V6}"));
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cni.sock");
        let gateway = stand_in_gateway(&socket);
        Pod {
            shell: NsThread::idle(&node),
            node,
            pod,
            dir,
            socket,
            _gateway: gateway,
            _guard: guard,
        }
    }

    /// `tidegate-cni <command>` for the pod, with `ips` in the previous
    /// result and `env` added to the plugin's environment.
    async fn cni(&self, command: &str, ips: &[&str], env: &[(&'static str, String)]) -> Output {
        let ips: Vec<String> = ips
            .iter()
            .map(|ip| {
                let prefix = if ip.contains(':') { 64 } else { 24 };
                format!(r#"{{"address": "{ip}/{prefix}", "interface": 0}}"#)
            })
            .collect();
        let conf = format!(
            r#"{{"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "tidegate-cni",
                "socket": "{}", "timeout_ms": 10000, "capture": "inpod", "state_dir": "{}",
                "prevResult": {{"cniVersion": "1.0.0", "interfaces": [{{"name": "eth0"}}],
                                "ips": [{}]}}}}"#,
            self.socket.display(),
            self.dir.path().join("pods").display(),
            ips.join(", ")
        );
        let netns = format!("/var/run/netns/{}", self.pod);
        let command = command.to_owned();
        let env = env.to_vec();
        self.shell
            .run(&format!("tidegate-cni {command}"), STEP, async move {
                let pod = CniPod {
                    namespace: "demo",
                    name: "dual",
                    uid: "dual-uid",
                    netns: &netns,
                };
                let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let bin = tidegate_e2e::cni::binary();
                tidegate_e2e::cni::spawn_with_env(&bin, &command, &pod, &conf, &env)
                    .and_then(|c| c.wait_with_output())
                    .expect("run tidegate-cni")
            })
            .await
    }
}

/// Answers each request on `socket`: `add` with "added", anything else
/// (the teardown) with "idle".
fn stand_in_gateway(socket: &Path) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::UnixListener::bind(socket).expect("bind the CNI socket");
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut line = String::new();
                if BufReader::new(r).read_line(&mut line).await.is_err() {
                    return;
                }
                let answer = if line.contains(r#""command":"add""#) {
                    "{\"result\":\"added\"}\n"
                } else {
                    "{\"result\":\"idle\"}\n"
                };
                let _ = w.write_all(answer.as_bytes()).await;
            });
        }
    })
}

/// `cmd` (space-separated) run inside namespace `ns`: its stdout.
fn in_ns(ns: &str, cmd: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(cmd.split_whitespace())
        .output()
        .unwrap_or_else(|e| panic!("run {cmd} in {ns}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} in {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed: stdout {} stderr {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

const V4_OUTBOUND: &str =
    "-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001";
const V6_OUTBOUND: &str =
    "-A ISTIO_OUTPUT ! -d ::1/128 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001";

/// The packets `ip6tables`' (or `iptables`') outbound REDIRECT rule in the
/// pod has seen: one per connection (nat sees a connection's first packet).
fn redirected(ns: &str, save: &str, rule: &str) -> u64 {
    counted(ns, save, "nat", rule)
}

/// The packets the rule ending in `rule` of `table` in the pod has seen.
fn counted(ns: &str, save: &str, table: &str, rule: &str) -> u64 {
    let saved = in_ns(ns, &format!("{save} -c -t {table}"));
    let line = saved
        .lines()
        .find(|l| l.ends_with(rule))
        .unwrap_or_else(|| panic!("{rule:?} not in {save} of {ns}:\n{saved}"));
    let counters = line.split(']').next().unwrap().trim_start_matches('[');
    counters.split(':').next().unwrap().parse().unwrap()
}

/// The IPv6 link-local refusal in the pod's filter table, as
/// `ip6tables-save` writes it.
const V6_LINK_LOCAL_REJECT: &str = "-A ISTIO_OUTPUT -d fe80::/10 ! -o lo -p tcp -m tcp --tcp-flags FIN,SYN,RST,ACK SYN -m mark ! --mark 0x539/0xfff -j REJECT --reject-with tcp-reset";

/// The index of interface `name` in namespace `ns` (a link-local
/// address's scope).
fn ifindex(ns: &str, name: &str) -> u32 {
    let out = in_ns(ns, &format!("ip -o link show {name}"));
    let index = out.split(':').next().unwrap_or_default().trim();
    index
        .parse()
        .unwrap_or_else(|e| panic!("{name}'s index in {out:?}: {e}"))
}

/// The host has IPv6 and ip6tables; says why when skipping.
fn has_ipv6() -> bool {
    if !Path::new("/proc/sys/net/ipv6").exists() {
        println!("SKIPPED: the kernel has no IPv6");
        return false;
    }
    if tool_missing("ip6tables-restore", "--version") {
        println!("SKIPPED: ip6tables is not installed");
        return false;
    }
    true
}

#[tokio::test]
async fn cni_add_captures_ipv6_with_ipv4_and_del_removes_both() {
    if skip() || !has_ipv6() {
        return;
    }
    let p = Pod::new(0).await;
    let out = p.cni("ADD", &[POD_V4, POD_V6], &[]).await;
    ok("ADD", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("IPv4 rules only"), "{stderr}");

    // Both families' rules, routes and probe exemptions are in.
    assert!(in_ns(&p.pod, "iptables-save").contains(V4_OUTBOUND));
    let v6 = in_ns(&p.pod, "ip6tables-save");
    for line in [
        V6_OUTBOUND,
        "-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff",
        "-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff",
        "-A ISTIO_PRERT ! -d ::1/128 -p tcp -m tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006",
        "-A ISTIO_PRERT -s fd16:9254:7127:1337:ffff:ffff:ffff:ffff/128 -p tcp -m tcp -j ACCEPT",
    ] {
        assert!(v6.contains(line), "{line:?} not in ip6tables-save:\n{v6}");
    }
    let rules6 = in_ns(&p.pod, "ip -6 rule");
    assert!(rules6.contains("fwmark 0x111/0xfff lookup 100"), "{rules6}");
    let table6 = in_ns(&p.pod, "ip -6 route show table 100");
    assert!(
        table6.contains("local") && table6.contains("dev lo"),
        "{table6}"
    );
    assert!(in_ns(&p.node, "ip6tables-save -t nat").contains(PROBE_V6_RULE));

    // IPv6 from the pod to an outside address is redirected to the gateway's outbound port (nobody listens there in
    // this test, so it is refused) and never reaches the outside listener;
    // IPv4 likewise.
    let outside = p
        .shell
        .run("outside listener", STEP, async move {
            let l = std::net::TcpListener::bind((Ipv6Addr::UNSPECIFIED, OUTSIDE_PORT))
                .expect("bind [::]:8080 on the node");
            l.set_nonblocking(true).unwrap();
            l
        })
        .await;
    let before6 = redirected(&p.pod, "ip6tables-save", V6_OUTBOUND);
    let before4 = redirected(&p.pod, "iptables-save", V4_OUTBOUND);
    let app = NsThread::idle(&p.pod);
    let results = app
        .run("connections from the pod", STEP, async move {
            let targets = [
                SocketAddr::from((NODE_V6, OUTSIDE_PORT)),
                SocketAddr::from(([10, 99, 0, 1], OUTSIDE_PORT)),
            ];
            targets.map(|t| (t, std::net::TcpStream::connect_timeout(&t, STEP).map(drop)))
        })
        .await;
    for (target, r) in &results {
        let e = r
            .as_ref()
            .expect_err("nobody listens on the gateway's port");
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{target}: {e}"
        );
    }
    // A connection that leaked would have completed its handshake with
    // the listener before connect returned.
    assert_eq!(
        outside.accept().map(|(_, peer)| peer).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "a connection from the pod reached the outside listener uncaptured"
    );
    assert_eq!(
        redirected(&p.pod, "ip6tables-save", V6_OUTBOUND),
        before6 + 1
    );
    assert_eq!(
        redirected(&p.pod, "iptables-save", V4_OUTBOUND),
        before4 + 1
    );

    // IPv6 to another host on the pod's link (the node's link-local
    // address) is refused at once by the pod's reject rule: redirected, its
    // SYN would be dropped and connect would wait out its bound (TimedOut).
    // It does not leak either.
    let redirected6 = redirected(&p.pod, "ip6tables-save", V6_OUTBOUND);
    let scope = ifindex(&p.pod, "eth0");
    let link_local = app
        .run("a link-local connection from the pod", STEP, async move {
            let target = std::net::SocketAddrV6::new(NODE_LINK_LOCAL, OUTSIDE_PORT, 0, scope);
            std::net::TcpStream::connect_timeout(&target.into(), STEP).map(drop)
        })
        .await;
    assert_eq!(
        link_local.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionRefused),
        "a link-local connection from the pod to [{NODE_LINK_LOCAL}%eth0]:{OUTSIDE_PORT}"
    );
    assert_eq!(
        outside.accept().map(|(_, peer)| peer).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "a link-local connection from the pod reached the node uncaptured"
    );
    assert_eq!(
        counted(&p.pod, "ip6tables-save", "filter", V6_LINK_LOCAL_REJECT),
        1
    );
    assert_eq!(
        redirected(&p.pod, "ip6tables-save", V6_OUTBOUND),
        redirected6,
        "a link-local connection was redirected"
    );

    // DEL: both families' rules, routes and probe exemptions go; twice is fine.
    for _ in 0..2 {
        ok("DEL", &p.cni("DEL", &[POD_V4, POD_V6], &[]).await);
        for save in ["iptables-save", "ip6tables-save"] {
            let saved = in_ns(&p.pod, save);
            assert!(!saved.contains("ISTIO_"), "{save} after DEL:\n{saved}");
            assert!(!saved.contains("fe80::/10"), "{save} after DEL:\n{saved}");
        }
        for family in ["-4", "-6"] {
            let rules = in_ns(&p.pod, &format!("ip {family} rule"));
            assert!(!rules.contains("lookup 100"), "{rules}");
        }
        assert!(!in_ns(&p.node, "ip6tables-save -t nat").contains(PROBE_V6_RULE));
    }
    drop((app, outside));
}

/// Stand-in tools first on the plugin's `PATH`: an `ip6tables-restore`
/// that fails as one does on a kernel without ip6_tables' nat table.
fn failing_ip6tables(dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let tools = dir.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    let tool = tools.join("ip6tables-restore");
    std::fs::write(
        &tool,
        "#!/bin/sh\necho \"ip6tables-restore v1.8.9 (nf_tables): can't initialize ip6tables table 'nat': Table does not exist\" >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "{}:{}",
        tools.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[tokio::test]
async fn cni_add_refuses_a_pod_whose_ipv6_cannot_be_captured_and_leaves_no_ipv4_rule() {
    if skip() || !has_ipv6() {
        return;
    }
    let p = Pod::new(1).await;
    let path = failing_ip6tables(p.dir.path());
    let out = p.cni("ADD", &[POD_V4, POD_V6], &[("PATH", path)]).await;
    assert!(!out.status.success(), "ADD must fail");
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a CNI error");
    assert_eq!(e["code"], 5, "{e}");
    let details = e["details"].as_str().unwrap();
    for part in [
        "IPv6 is on in the pod but its IPv6 capture rules cannot be installed",
        "Table does not exist",
    ] {
        assert!(details.contains(part), "{part:?} not in {details}");
    }
    // Neither family is captured: the IPv4 rules and route went again, and
    // the node has no probe exemption for the pod.
    for save in ["iptables-save", "ip6tables-save"] {
        let saved = in_ns(&p.pod, save);
        assert!(
            !saved.contains("ISTIO_"),
            "{save} after the refusal:\n{saved}"
        );
    }
    let rules = in_ns(&p.pod, "ip -4 rule");
    assert!(!rules.contains("lookup 100"), "{rules}");
    let node = in_ns(&p.node, "iptables-save -t nat");
    assert!(!node.contains(&format!("-d {POD_V4}/32")), "{node}");

    // With working ip6tables the same pod is enrolled, both families.
    ok("ADD", &p.cni("ADD", &[POD_V4, POD_V6], &[]).await);
    assert!(in_ns(&p.pod, "iptables-save").contains(V4_OUTBOUND));
    assert!(in_ns(&p.pod, "ip6tables-save").contains(V6_OUTBOUND));
    ok("DEL", &p.cni("DEL", &[POD_V4, POD_V6], &[]).await);
}

#[tokio::test]
async fn cni_add_gives_a_pod_without_ipv6_its_ipv4_rules_and_says_why() {
    if skip() || !has_ipv6() {
        return;
    }
    let p = Pod::new(2).await;
    run(&format!(
        "ip netns exec {} sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.lo.disable_ipv6=1 net.ipv6.conf.eth0.disable_ipv6=1",
        p.pod
    ));
    let out = p.cni("ADD", &[POD_V4], &[]).await;
    ok("ADD", &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("IPv4 rules only: IPv6 is disabled in the pod (disable_ipv6=1"),
        "{stderr}"
    );
    assert!(in_ns(&p.pod, "iptables-save").contains(V4_OUTBOUND));
    let v6 = in_ns(&p.pod, "ip6tables-save");
    assert!(!v6.contains("ISTIO_"), "{v6}");
    ok("DEL", &p.cni("DEL", &[POD_V4], &[]).await);
    let v4 = in_ns(&p.pod, "iptables-save");
    assert!(!v4.contains("ISTIO_"), "{v4}");
}
