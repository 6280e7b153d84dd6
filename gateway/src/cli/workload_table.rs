//! `tidegate workloads [<uid|name|ns/name|ip>]`: every workload of a running
//! gateway with its lifecycle state, drain policy and why, read from the
//! admin API's `/config_dump` (the report the drain engine's selection
//! produces, so the table shows what decides).

use std::net::SocketAddr;

use serde_json::Value;

use crate::cli::admin_api::{self, AdminError};

/// Why the table could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error(transparent)]
    Admin(#[from] AdminError),
    #[error("admin API at {addr}: /config_dump is not the expected JSON: {detail}")]
    Json { addr: SocketAddr, detail: String },
    #[error("no workload has the uid, name, namespace/name or IP {0:?}")]
    NoMatch(String),
}

/// Fetches `/config_dump` from `admin` (an unspecified IP means loopback)
/// and renders the table, only the workloads matching `filter` if given.
pub fn fetch(admin: SocketAddr, filter: Option<&str>) -> Result<String, TableError> {
    let addr = admin_api::dial_addr(admin);
    let dump = admin_api::call(addr, "GET", "/config_dump", b"")?;
    render(&dump, filter).map_err(|e| match e {
        RenderError::Shape(detail) => TableError::Json { addr, detail },
        RenderError::NoMatch(f) => TableError::NoMatch(f),
    })
}

#[derive(Debug, PartialEq, Eq)]
pub enum RenderError {
    Shape(String),
    NoMatch(String),
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

fn matches(w: &Value, filter: &str) -> bool {
    let ns_name = format!("{}/{}", str_of(w, "namespace"), str_of(w, "name"));
    [str_of(w, "uid"), str_of(w, "name"), ns_name.as_str()].contains(&filter)
        || w["ips"]
            .as_array()
            .is_some_and(|ips| ips.iter().any(|ip| ip.as_str() == Some(filter)))
}

/// One row: workload, uid, state, policy, why.
fn row(w: &Value) -> [String; 5] {
    let workload = format!("{}/{}", str_of(w, "namespace"), str_of(w, "name"));
    let uid = str_of(w, "uid").to_owned();
    let state = str_of(w, "state").to_owned();
    if w["local"].as_bool() != Some(true) {
        let why = format!("peer on node {}: its gateway chooses", str_of(w, "node"));
        return [workload, uid, state, "-".into(), why];
    }
    let p = &w["policy"];
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
    [workload, uid, state, str_of(p, "name").to_owned(), why]
}

/// The table for a `/config_dump` answer.
pub fn render(dump: &Value, filter: Option<&str>) -> Result<String, RenderError> {
    let workloads = dump["workloads"]
        .as_array()
        .ok_or_else(|| RenderError::Shape("no `workloads` list".into()))?;
    let rows: Vec<[String; 5]> = workloads
        .iter()
        .filter(|w| filter.is_none_or(|f| matches(w, f)))
        .map(row)
        .collect();
    if let (Some(f), true) = (filter, rows.is_empty()) {
        return Err(RenderError::NoMatch(f.to_owned()));
    }
    let header = ["WORKLOAD", "UID", "STATE", "POLICY", "WHY"].map(str::to_owned);
    let mut width = [0; 4];
    for r in std::iter::once(&header).chain(&rows) {
        for (w, cell) in width.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&header).chain(&rows) {
        for (w, cell) in width.iter().zip(r) {
            out += &format!("{cell:<width$}  ", width = *w);
        }
        out += &r[4];
        out += "\n";
    }
    Ok(out)
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
}
