//! `tidegate workloads [<uid|ns/name|ip|name>] [-o json|yaml]`: every
//! workload of a running gateway with its lifecycle state, drain policy and
//! why, read from the admin API's `/config_dump` (the report the drain
//! engine's selection produces, so the table shows what decides).
//!
//! The filter follows the rule of every command taking a workload
//! ([`crate::admin::workload_ref`]): a uid, `namespace/name`, an IP, or a
//! bare name — which, when workloads of several namespaces have it, is an
//! error listing them.

use std::net::SocketAddr;

use serde::Serialize;
use serde_json::Value;

use crate::cli::admin_api::{self, AdminError};
use crate::cli::output::{table, Output};

/// Why the table could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error(transparent)]
    Admin(#[from] AdminError),
    #[error("admin API at {addr}: /config_dump is not the expected JSON: {detail}")]
    Json { addr: SocketAddr, detail: String },
    #[error("no workload has the uid, name, namespace/name or IP {0:?}")]
    NoMatch(String),
    #[error(
        "the name {name:?} is ambiguous: {} workloads have it: {}; name one by \
         namespace/name or uid",
        .candidates.len(),
        .candidates.join(", ")
    )]
    Ambiguous {
        name: String,
        candidates: Vec<String>,
    },
}

/// Fetches `/config_dump` from `admin` (an unspecified IP means loopback)
/// and renders it, only the workloads `filter` names if given.
pub fn fetch(
    admin: SocketAddr,
    filter: Option<&str>,
    output: Output,
) -> Result<String, TableError> {
    let addr = admin_api::dial_addr(admin);
    let dump = admin_api::call(addr, "GET", "/config_dump", b"")?;
    let rows = rows(&dump, filter).map_err(|e| match e {
        RenderError::Shape(detail) => TableError::Json { addr, detail },
        RenderError::NoMatch(f) => TableError::NoMatch(f),
        RenderError::Ambiguous(name, candidates) => TableError::Ambiguous { name, candidates },
    })?;
    Ok(output.render(&Workloads { workloads: &rows }, || draw(&rows)))
}

#[derive(Debug, PartialEq, Eq)]
pub enum RenderError {
    Shape(String),
    NoMatch(String),
    Ambiguous(String, Vec<String>),
}

/// `-o json|yaml`: `{"workloads": [...]}`, keys as in docs/cli.md.
#[derive(Serialize)]
struct Workloads<'a> {
    workloads: &'a [Row],
}

/// One workload as `tidegate workloads` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    /// `namespace/name`.
    pub workload: String,
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub node: String,
    /// On this gateway's node (its policy decides here).
    pub local: bool,
    pub ips: Vec<String>,
    pub state: String,
    /// The drain policy; `None` for a peer (its own gateway chooses).
    pub policy: Option<String>,
    pub why: String,
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// The workloads `filter` names: the one with that uid; with a `/`, those
/// of that namespace/name; an IP's; a bare name's, unless workloads of
/// several namespace/names have it (ambiguous).
fn pick<'a>(all: &'a [Value], filter: &str) -> Result<Vec<&'a Value>, RenderError> {
    let ns_name = |w: &Value| format!("{}/{}", str_of(w, "namespace"), str_of(w, "name"));
    if let Some(w) = all.iter().find(|w| str_of(w, "uid") == filter) {
        return Ok(vec![w]);
    }
    let found: Vec<&Value> = if filter.contains('/') {
        all.iter().filter(|w| ns_name(w) == filter).collect()
    } else if filter.parse::<std::net::IpAddr>().is_ok() {
        all.iter()
            .filter(|w| {
                w["ips"]
                    .as_array()
                    .is_some_and(|ips| ips.iter().any(|ip| ip.as_str() == Some(filter)))
            })
            .collect()
    } else {
        let named: Vec<&Value> = all.iter().filter(|w| str_of(w, "name") == filter).collect();
        let mut distinct: Vec<String> = named.iter().map(|w| ns_name(w)).collect();
        distinct.sort();
        distinct.dedup();
        if distinct.len() > 1 {
            let mut candidates: Vec<String> = named
                .iter()
                .map(|w| format!("{} (uid {})", ns_name(w), str_of(w, "uid")))
                .collect();
            candidates.sort();
            return Err(RenderError::Ambiguous(filter.to_owned(), candidates));
        }
        named
    };
    if found.is_empty() {
        return Err(RenderError::NoMatch(filter.to_owned()));
    }
    Ok(found)
}

/// One row: workload, uid, state, policy, why.
fn row(w: &Value) -> Row {
    let local = w["local"].as_bool() == Some(true);
    let p = &w["policy"];
    let (policy, why) = if local {
        let mut why = str_of(p, "why").to_owned();
        if p["pinned_by_drain"].as_bool() == Some(true) {
            why += "; pinned by the drain in progress";
        }
        for s in p["skipped"].as_array().into_iter().flatten() {
            why += &format!(
                "; skipped {} {:?}: {}",
                str_of(s, "source"),
                str_of(s, "policy"),
                str_of(s, "reason")
            );
        }
        (Some(str_of(p, "name").to_owned()), why)
    } else {
        let why = format!("peer on node {}: its gateway chooses", str_of(w, "node"));
        (None, why)
    };
    Row {
        workload: format!("{}/{}", str_of(w, "namespace"), str_of(w, "name")),
        uid: str_of(w, "uid").to_owned(),
        namespace: str_of(w, "namespace").to_owned(),
        name: str_of(w, "name").to_owned(),
        node: str_of(w, "node").to_owned(),
        local,
        ips: w["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        state: str_of(w, "state").to_owned(),
        policy,
        why,
    }
}

/// The rows of a `/config_dump` answer, only those `filter` names if given.
pub fn rows(dump: &Value, filter: Option<&str>) -> Result<Vec<Row>, RenderError> {
    let workloads = dump["workloads"]
        .as_array()
        .ok_or_else(|| RenderError::Shape("no `workloads` list".into()))?;
    let picked = match filter {
        Some(f) => pick(workloads, f)?,
        None => workloads.iter().collect(),
    };
    Ok(picked.into_iter().map(row).collect())
}

/// The table of `rows`.
pub fn draw(rows: &[Row]) -> String {
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                r.workload.clone(),
                r.uid.clone(),
                r.state.clone(),
                r.policy.clone().unwrap_or_else(|| "-".into()),
                r.why.clone(),
            ]
        })
        .collect();
    table(["WORKLOAD", "UID", "STATE", "POLICY", "WHY"], &cells)
}

/// The table for a `/config_dump` answer.
pub fn render(dump: &Value, filter: Option<&str>) -> Result<String, RenderError> {
    Ok(draw(&rows(dump, filter)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dump() -> Value {
        json!({"workloads": [
            {"uid": "u-echo", "name": "echo", "namespace": "demo", "ips": ["127.0.0.2"], "node": "node-a",
             "local": true, "state": "shutting-down",
             "policy": {"name": "drain-at-teardown", "source": "binding", "binding": 0,
                        "why": "policies.bindings[0] (namespace demo, app=echo)", "pinned_by_drain": true,
                        "skipped": [{"policy": "typo", "source": "annotation", "reason": "no such policy"}]}},
            {"uid": "u-peer", "name": "web", "namespace": "shop", "ips": ["10.0.0.9"], "node": "node-b",
             "local": false, "state": "running"}
        ]})
    }

    #[test]
    fn rows_say_policy_and_why_and_peers_are_marked() {
        let t = render(&dump(), None).unwrap();
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("WORKLOAD"), "{t}");
        assert!(
            lines[1].contains("demo/echo")
                && lines[1].contains("shutting-down")
                && lines[1].contains("drain-at-teardown")
                && lines[1].contains("policies.bindings[0]")
                && lines[1].contains("pinned by the drain")
                && lines[1].contains("skipped annotation \"typo\""),
            "{t}"
        );
        assert!(lines[2].contains("shop/web") && lines[2].contains("peer on node node-b"));
        // Columns line up.
        assert_eq!(lines[0].find("POLICY"), lines[1].find("drain-at-teardown"));
    }

    #[test]
    fn filters_by_uid_name_or_ip() {
        for f in ["u-echo", "echo", "demo/echo", "127.0.0.2"] {
            let t = render(&dump(), Some(f)).unwrap();
            assert_eq!(t.lines().count(), 2, "{f}: {t}");
        }
        assert_eq!(
            render(&dump(), Some("nope")),
            Err(RenderError::NoMatch("nope".into()))
        );
    }

    #[test]
    fn a_name_in_two_namespaces_is_ambiguous_and_lists_them() {
        let mut d = dump();
        d["workloads"].as_array_mut().unwrap().push(json!({
            "uid": "u-echo-2", "name": "echo", "namespace": "lab", "ips": ["127.0.0.3"],
            "node": "node-a", "local": true, "state": "running",
            "policy": {"name": "recommended", "why": "default"}}));
        assert_eq!(
            render(&d, Some("echo")),
            Err(RenderError::Ambiguous(
                "echo".into(),
                vec![
                    "demo/echo (uid u-echo)".into(),
                    "lab/echo (uid u-echo-2)".into()
                ]
            ))
        );
        assert_eq!(render(&d, Some("lab/echo")).unwrap().lines().count(), 2);
    }

    #[test]
    fn the_json_rows_are_the_table_s_facts() {
        let r = rows(&dump(), None).unwrap();
        let v = serde_json::to_value(Workloads { workloads: &r }).unwrap();
        assert_eq!(v["workloads"][0]["workload"], "demo/echo");
        assert_eq!(v["workloads"][0]["policy"], "drain-at-teardown");
        assert_eq!(v["workloads"][0]["ips"][0], "127.0.0.2");
        assert_eq!(v["workloads"][1]["local"], false);
        assert_eq!(v["workloads"][1]["policy"], serde_json::Value::Null);
    }
}
