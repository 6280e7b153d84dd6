//! `--dump` (with `--pair NAME=COMMAND`): tidegate's and the other
//! gateway's `/config_dump` for the same xDS input, compared key by key.
//!
//! ```text
//! cargo bench --profile dev -p tidegate-e2e --bench xds -- --dump \
//!     --pair 'ztunnel=exec env PROXY_MODE=shared NODE_NAME=$XDS_PAIR_NODE ... /path/to/ztunnel proxy ztunnel'
//! ```
//!
//! Two doubles hold the same small set — three pods (two on the gateway's
//! node, one with capacity 3, one a bare pod naming a workload-selector
//! policy), a Service without a waypoint and one with a waypoint, a
//! `subject_alt_names` entry, IPv4 only, visible in its namespace only and
//! canonical, a namespace-wide DENY, a dry-run ALLOW and
//! a workload-selector ALLOW — one feeding tidegate in this process, the
//! other the command in its namespace (see [`super::pair`]). Once both
//! are ready (and both list a certificate for each local identity, or
//! 10 s passed), the bench reads tidegate's `/config_dump` and the other's
//! `http://127.0.0.1:15000/config_dump` in its namespace, and compares
//! the sections the other writes in ztunnel's shape — `workloads` (by
//! uid), `services` (by `namespace/hostname`), `policies` (by
//! `namespace/name`), `certificates` (by identity) — field by field on
//! the other's keys: a key missing from tidegate's entry, a value that
//! differs (nested objects by path), and the keys only tidegate has.
//! Certificates come from two CAs, so their values differ by construction:
//! there the comparison is of shape (keys and JSON types) and `state`.
//! With `XDS_DUMP_DIR` set, both dumps are also written there
//! (`tidegate.json`, `NAME.json`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message as _;
use serde_json::Value;
use tidegate_e2e::http_get;
use tidegate_e2e::synthetic_cluster::GATEWAY_NODE;
use tidegate_e2e::xds_double::{authorization, principal};
use tidegate_xds::client::{ADDRESS, AUTHORIZATION};
use tidegate_xds::workload::{
    address, gateway_address, service::Visibility, Address, GatewayAddress, IpFamilies,
    NetworkAddress, Port, PortList, Service, TunnelProtocol, Workload, WorkloadStatus,
    WorkloadType,
};

use super::pair::{PairEnv, PairSpec};
use super::DoubleThread;

/// ztunnel's admin port (not configurable there).
const ADMIN_PORT: u16 = 15000;
/// How long to wait for both to list their local identities' certificates.
const CERTS_WAIT: Duration = Duration::from_secs(10);

fn v4(d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 70, 0, d))
}

fn ip_bytes(ip: IpAddr) -> Bytes {
    match ip {
        IpAddr::V4(a) => Bytes::copy_from_slice(&a.octets()),
        IpAddr::V6(a) => Bytes::copy_from_slice(&a.octets()),
    }
}

fn uid(name: &str) -> String {
    format!("Kubernetes//Pod/demo/{name}")
}

fn port(service_port: u32, target_port: u32) -> Port {
    Port {
        service_port,
        target_port,
        app_protocol: 0,
    }
}

fn address_of(t: address::Type) -> Bytes {
    Address { r#type: Some(t) }.encode_to_vec().into()
}

fn pod(name: &str, node: &str, d: u8, service: Option<&str>) -> Workload {
    Workload {
        uid: uid(name),
        name: name.into(),
        namespace: "demo".into(),
        addresses: vec![ip_bytes(v4(d))],
        tunnel_protocol: TunnelProtocol::Hbone as i32,
        trust_domain: "cluster.local".into(),
        service_account: name.into(),
        node: node.into(),
        canonical_name: name.into(),
        canonical_revision: "v1".into(),
        workload_name: name.into(),
        cluster_id: "Kubernetes".into(),
        status: WorkloadStatus::Healthy as i32,
        services: service
            .map(|s| {
                let ports = PortList {
                    ports: vec![port(80, 8080)],
                };
                BTreeMap::from([(format!("demo/{s}.demo.svc.cluster.local"), ports)])
            })
            .unwrap_or_default()
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

fn service(name: &str, vip: u8, sans: &[&str], waypoint: Option<IpAddr>) -> Service {
    Service {
        name: name.into(),
        namespace: "demo".into(),
        hostname: format!("{name}.demo.svc.cluster.local"),
        addresses: vec![NetworkAddress {
            network: String::new(),
            address: ip_bytes(IpAddr::V4(Ipv4Addr::new(172, 20, 0, vip))),
            length: None,
        }],
        ports: vec![port(80, 8080)],
        subject_alt_names: sans.iter().map(ToString::to_string).collect(),
        waypoint: waypoint.map(|ip| GatewayAddress {
            destination: Some(gateway_address::Destination::Address(NetworkAddress {
                network: String::new(),
                address: ip_bytes(ip),
                length: None,
            })),
            hbone_mtls_port: 15008,
        }),
        ..Default::default()
    }
}

/// The set both doubles hold: (type URL, resource name, value).
fn resources() -> Vec<(&'static str, String, Bytes)> {
    let mut echo = pod("echo", GATEWAY_NODE, 2, Some("echo"));
    echo.capacity = Some(3);
    let client = pod("client", GATEWAY_NODE, 3, None);
    let mut web = pod("web", "node-0002", 4, Some("web"));
    web.authorization_policies = vec!["demo/only-client".into()];
    web.workload_type = WorkloadType::Pod as i32;
    let canary = "spiffe://cluster.local/ns/demo/sa/echo-canary";
    let mut out: Vec<(&'static str, String, Bytes)> = [echo, client, web]
        .into_iter()
        .map(|w| {
            let name = w.uid.clone();
            (ADDRESS, name, address_of(address::Type::Workload(w)))
        })
        .collect();
    out.push((
        ADDRESS,
        "demo/echo.demo.svc.cluster.local".into(),
        address_of(address::Type::Service(service("echo", 1, &[], None))),
    ));
    let web_svc = Service {
        ip_families: IpFamilies::Ipv4Only as i32,
        visibility: Visibility::Namespace as i32,
        canonical: true,
        ..service("web", 2, &[canary], Some(v4(5)))
    };
    out.push((
        ADDRESS,
        "demo/web.demo.svc.cluster.local".into(),
        address_of(address::Type::Service(web_svc)),
    ));
    let client_sa = "cluster.local/ns/demo/sa/client";
    for (name, scope, action, p, dry_run) in [
        (
            "deny-nobody",
            1,
            1,
            "cluster.local/ns/demo/sa/nobody",
            false,
        ),
        ("trial", 1, 0, client_sa, true),
        ("only-client", 2, 0, client_sa, false),
    ] {
        out.push((
            AUTHORIZATION,
            format!("demo/{name}"),
            authorization("demo", name, scope, action, principal(p), dry_run),
        ));
    }
    out
}

/// The local identities both should list a certificate for.
const LOCAL_IDENTITIES: [&str; 2] = [
    "spiffe://cluster.local/ns/demo/sa/echo",
    "spiffe://cluster.local/ns/demo/sa/client",
];

fn has_local_certificates(dump: &Value) -> bool {
    let listed: BTreeSet<&str> = dump["certificates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["state"] == "Available")
        .filter_map(|c| c["identity"].as_str())
        .collect();
    LOCAL_IDENTITIES.iter().all(|i| listed.contains(i))
}

/// Reads a dump with `get` until both local identities' certificates are
/// listed, or [`CERTS_WAIT`] passed (then the last one read).
async fn dump_settled<F, Fut>(get: F) -> anyhow::Result<Value>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = (u16, String)>,
{
    let t0 = Instant::now();
    loop {
        let (status, body) = get().await;
        anyhow::ensure!(status == 200, "/config_dump answered {status}: {body}");
        let dump: Value = serde_json::from_str(&body)?;
        if has_local_certificates(&dump) || t0.elapsed() > CERTS_WAIT {
            return Ok(dump);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `--dump` run.
pub async fn run(spec: PairSpec) -> anyhow::Result<()> {
    tidegate_e2e::raise_fd_limit();
    let name = spec.name.clone();
    let items = resources();
    println!(
        "/config_dump side by side: tidegate and {name}, each fed by an xDS double holding the same {} resources\n",
        items.len()
    );
    let doubles = DoubleThread::new();
    let ours = doubles.double().await;
    let mut env = PairEnv::new(spec).await?;
    let theirs = env.double().await;
    for (type_url, key, value) in &items {
        ours.set_quietly(type_url, key, value.clone());
        theirs.set_quietly(type_url, key, value.clone());
    }
    let dir = tempfile::tempdir()?;
    let app = tidegate::app::build(super::config(dir.path(), &ours)).await?;
    tidegate_e2e::poll_within(super::WAIT, || async {
        super::ready(&app).await.then_some(())
    })
    .await
    .ok_or_else(|| anyhow::anyhow!("tidegate not ready within {:?}", super::WAIT))?;
    let other = env.start(&theirs).await?;
    let admin = app.addrs.admin;
    let tg = dump_settled(|| http_get(admin, "/config_dump")).await?;
    let addr = SocketAddr::from(([127, 0, 0, 1], ADMIN_PORT));
    let zt = dump_settled(|| env.get(addr, "/config_dump")).await?;
    let (count, first) = other.log_warnings();
    println!(
        "{name}'s log: {count} WARN/ERROR lines{}",
        match first {
            Some(l) => format!(", the first: {l}"),
            None => String::new(),
        }
    );
    if let Some(dir) = std::env::var_os("XDS_DUMP_DIR") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::write(
            dir.join("tidegate.json"),
            serde_json::to_string_pretty(&tg)?,
        )?;
        std::fs::write(
            dir.join(format!("{name}.json")),
            serde_json::to_string_pretty(&zt)?,
        )?;
        println!("both dumps written to {}", dir.display());
    }
    print_comparison(&name, &tg, &zt);
    drop(other);
    app.shutdown().await;
    Ok(())
}

/// Each section, keyed as its entries are told apart.
const SECTIONS: [(&str, &[&str]); 4] = [
    ("workloads", &["uid"]),
    ("services", &["namespace", "hostname"]),
    ("policies", &["namespace", "name"]),
    ("certificates", &["identity"]),
];

fn keyed<'a>(dump: &'a Value, section: &str, key: &[&str]) -> BTreeMap<String, &'a Value> {
    dump[section]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let k: Vec<&str> = key.iter().map(|f| e[*f].as_str().unwrap_or("?")).collect();
            (k.join("/"), e)
        })
        .collect()
}

fn print_comparison(name: &str, tg: &Value, zt: &Value) {
    let keys = |v: &Value| -> BTreeSet<String> {
        v.as_object()
            .into_iter()
            .flatten()
            .map(|(k, _)| k.clone())
            .collect()
    };
    let (tk, zk) = (keys(tg), keys(zt));
    println!("top-level keys, {name}: {}", join(&zk));
    println!(
        "  missing from tidegate's: {}",
        join(&zk.difference(&tk).cloned().collect())
    );
    println!();
    let mut total = 0;
    for (section, key) in SECTIONS {
        let (t, z) = (keyed(tg, section, key), keyed(zt, section, key));
        println!(
            "{section}: {} in {name}'s, {} in tidegate's",
            z.len(),
            t.len()
        );
        for k in z.keys().filter(|k| !t.contains_key(*k)) {
            println!("  only {name}'s: {k}");
            total += 1;
        }
        for k in t.keys().filter(|k| !z.contains_key(*k)) {
            println!("  only tidegate's: {k}");
            total += 1;
        }
        for (k, zv) in &z {
            let Some(tv) = t.get(k) else { continue };
            let mut diffs = Vec::new();
            if section == "certificates" {
                shape_diff("", tv, zv, &mut diffs);
                if tv["state"] != zv["state"] {
                    diffs.push(format!(
                        "state: tidegate {} / {name} {}",
                        tv["state"], zv["state"]
                    ));
                }
            } else {
                value_diff("", tv, zv, &mut diffs);
            }
            let added: BTreeSet<String> = keys(tv).difference(&keys(zv)).cloned().collect();
            let same = if diffs.is_empty() { "same" } else { "differs" };
            println!("  {k}: {same} on {name}'s {} keys", keys(zv).len());
            for d in &diffs {
                println!("    {d}");
            }
            total += diffs.len();
            if !added.is_empty() {
                println!("    tidegate adds: {}", join(&added));
            }
        }
        println!();
    }
    println!("{total} differences on {name}'s keys");
}

fn join(s: &BTreeSet<String>) -> String {
    if s.is_empty() {
        return "none".into();
    }
    s.iter().cloned().collect::<Vec<_>>().join(" ")
}

/// The path of key `k` of the object at `path` (`""`: the entry itself).
fn child(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_owned()
    } else {
        format!("{path}.{k}")
    }
}

/// Where `t` (tidegate's) differs from `z` (the other's) on `z`'s keys.
fn value_diff(path: &str, t: &Value, z: &Value, out: &mut Vec<String>) {
    match (t, z) {
        (Value::Object(to), Value::Object(zo)) => {
            for (k, zv) in zo {
                let p = child(path, k);
                match to.get(k) {
                    None => out.push(format!("{p}: missing (theirs {})", short(zv))),
                    Some(tv) => value_diff(&p, tv, zv, out),
                }
            }
        }
        (Value::Array(ta), Value::Array(za)) if ta.len() == za.len() => {
            for (i, (tv, zv)) in ta.iter().zip(za).enumerate() {
                value_diff(&format!("{path}[{i}]"), tv, zv, out);
            }
        }
        _ if t != z => out.push(format!(
            "{path}: tidegate {} / theirs {}",
            short(t),
            short(z)
        )),
        _ => {}
    }
}

/// Where `t`'s keys and JSON types differ from `z`'s.
fn shape_diff(path: &str, t: &Value, z: &Value, out: &mut Vec<String>) {
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    match (t, z) {
        (Value::Object(to), Value::Object(zo)) => {
            for (k, zv) in zo {
                let p = child(path, k);
                match to.get(k) {
                    None => out.push(format!("{p}: missing ({})", kind(zv))),
                    Some(tv) => shape_diff(&p, tv, zv, out),
                }
            }
        }
        (Value::Array(ta), Value::Array(za)) => {
            if ta.len() != za.len() {
                out.push(format!(
                    "{path}: {} entries / theirs {}",
                    ta.len(),
                    za.len()
                ));
            }
            if let (Some(tv), Some(zv)) = (ta.first(), za.first()) {
                shape_diff(&format!("{path}[0]"), tv, zv, out);
            }
        }
        _ if kind(t) != kind(z) => {
            out.push(format!(
                "{path}: tidegate a {} / theirs a {}",
                kind(t),
                kind(z)
            ));
        }
        _ => {}
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 120 {
        format!("{}…", s.chars().take(117).collect::<String>())
    } else {
        s
    }
}
