//! The Kubernetes API server double as a program: serves what `tidegate-ca`
//! (and discovery) read, so the real `tidegate-ca` binary — and through it
//! any Istio CA client, ztunnel included — can be driven by hand.
//!
//! ```text
//! cargo run -p tidegate-e2e --bin kube-api-double -- \
//!     --pod <namespace>/<name>:<service-account>:<node>[:<ip>[,<ip>]] [--pod ...] \
//!     --token <token>=<namespace>/<service-account>[@<pod name>] [--token ...] \
//!     [--audience istio-ca]
//! tidegate-ca --api-server <printed URL> --serving-name 127.0.0.1 --listen 127.0.0.1:15012
//! ```
//! A dual-stack pod lists both addresses, the primary first
//! (`demo/web:web:node-a:10.0.0.5,fd00:10::5`). A pod's uid is `<name>-uid`; a token bound to a pod carries that pod's
//! name and uid (as a projected token's TokenReview answer does). It prints
//! `url <http://127.0.0.1:port>` and serves until stdin closes or it reads
//! `quit`; `pod <spec>` on stdin adds a pod, `token <spec>` a token.
//!
//! Checked against ztunnel built from its public source (commit 62d82653)
//! through `tidegate-ca`: README, "Certificates".

use std::io::BufRead;

use anyhow::{bail, Context};
use serde_json::json;
use tidegate_e2e::kube_api::{FakeApiServer, Kind, TokenInfo};

const USAGE: &str =
    "kube-api-double [--pod ns/name:sa:node[:ip[,ip]] ...] [--token tok=ns/sa[@pod] ...] [--audience A]";

fn pod(api: &FakeApiServer, spec: &str) -> anyhow::Result<()> {
    // The addresses come last and may hold colons (IPv6).
    let parts: Vec<&str> = spec.splitn(4, ':').collect();
    let (ns_name, sa, node, pod_ips) = match parts[..] {
        [n, sa, node] => (n, sa, node, None),
        [n, sa, node, ips] => (n, sa, node, Some(ips)),
        _ => bail!("--pod {spec:?}: expected namespace/name:service-account:node[:ip[,ip]]"),
    };
    let (ns, name) = ns_name
        .split_once('/')
        .with_context(|| format!("--pod {spec:?}: expected namespace/name first"))?;
    let mut status = json!({"phase": "Running"});
    if let Some(ips) = pod_ips {
        // Dual-stack: `10.0.0.5,fd00::5`, the primary first, as the
        // kubelet reports `podIP` and `podIPs`.
        let ips: Vec<&str> = ips.split(',').collect();
        for ip in &ips {
            ip.parse::<std::net::IpAddr>()
                .with_context(|| format!("--pod {spec:?}: {ip} is not an IP address"))?;
        }
        status["podIP"] = json!(ips[0]);
        status["podIPs"] = json!(ips.iter().map(|ip| json!({ "ip": ip })).collect::<Vec<_>>());
    }
    api.apply(
        Kind::Pod,
        json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("{name}-uid")},
            "spec": {"nodeName": node, "serviceAccountName": sa, "containers": [{"name": "app", "image": "app"}]},
            "status": status,
        }),
    );
    println!("pod {ns}/{name} sa {sa} on {node}");
    Ok(())
}

fn token(api: &FakeApiServer, spec: &str, audience: &str) -> anyhow::Result<()> {
    let (tok, who) = spec
        .split_once('=')
        .with_context(|| format!("--token {spec:?}: expected token=namespace/sa[@pod]"))?;
    let (account, pod) = match who.split_once('@') {
        Some((a, p)) => (a, Some(p)),
        None => (who, None),
    };
    let (ns, sa) = account
        .split_once('/')
        .with_context(|| format!("--token {spec:?}: expected namespace/service-account"))?;
    api.add_token(
        tok,
        TokenInfo {
            username: format!("system:serviceaccount:{ns}:{sa}"),
            audiences: vec![audience.to_owned()],
            pod: pod.map(|p| (p.to_owned(), format!("{p}-uid"))),
        },
    );
    println!(
        "token for {ns}/{sa}{}",
        pod.map(|p| format!(" (pod {p})")).unwrap_or_default()
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut pods = Vec::new();
    let mut tokens = Vec::new();
    let mut audience = "istio-ca".to_owned();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .with_context(|| format!("{a} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--pod" => pods.push(value()?),
            "--token" => tokens.push(value()?),
            "--audience" => audience = value()?,
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let api = FakeApiServer::start().await;
    for p in &pods {
        pod(&api, p)?;
    }
    for t in &tokens {
        token(&api, t, &audience)?;
    }
    println!("url {}", api.url());
    // Commands on stdin, read on a thread of their own (stdin blocks).
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if line.trim() == "quit" || tx.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = rx.recv().await {
        let result = match line.trim().split_once(' ') {
            Some(("pod", spec)) => pod(&api, spec),
            Some(("token", spec)) => token(&api, spec, &audience),
            _ => Err(anyhow::anyhow!(
                "unknown command {line:?}: pod <spec>, token <spec>, quit"
            )),
        };
        if let Err(e) = result {
            eprintln!("kube-api-double: {e:#}");
        }
    }
    Ok(())
}
