//! `tidegate config workloads|services|policies|certificates [-o
//! json|yaml]`: one of the sections of `/config_dump` that ztunnel also
//! writes, read from a running gateway (`GET /config_dump?only=<section>`),
//! as `istioctl ztunnel-config` shows ztunnel's. JSON and YAML are the
//! section as the admin API answers it (a list; its keys:
//! docs/observability.md, "istioctl ztunnel-config"); the table picks
//! ztunnel's fields.

use std::net::SocketAddr;

use serde_json::Value;

use super::admin_api::{self, AdminError};
use super::output::{joined, list, str_of, table, Output};

/// A section of the dump in ztunnel's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Section {
    Workloads,
    Services,
    Policies,
    Certificates,
}

impl Section {
    /// Its key in `/config_dump`.
    pub fn key(self) -> &'static str {
        match self {
            Section::Workloads => "workloads",
            Section::Services => "services",
            Section::Policies => "policies",
            Section::Certificates => "certificates",
        }
    }
}

pub fn fetch(admin: SocketAddr, section: Section, output: Output) -> Result<String, AdminError> {
    let path = format!("/config_dump?only={}", section.key());
    let answer = admin_api::call(admin_api::dial_addr(admin), "GET", &path, b"")?;
    let entries = answer[section.key()].clone();
    Ok(output.render(&entries, || render(section, &entries)))
}

/// A waypoint as istioctl shows it: its destination, or `None`.
fn waypoint(v: &Value) -> String {
    v["waypoint"]["destination"]
        .as_str()
        .unwrap_or("None")
        .to_owned()
}

fn render(section: Section, entries: &Value) -> String {
    let rows = list(entries);
    if rows.is_empty() {
        return format!("no {} on this gateway\n", section.key());
    }
    match section {
        Section::Workloads => {
            let rows: Vec<[String; 8]> = rows
                .iter()
                .map(|w| {
                    [
                        str_of(w, "namespace").to_owned(),
                        str_of(w, "name").to_owned(),
                        joined(&w["workloadIps"], ","),
                        str_of(w, "node").to_owned(),
                        waypoint(w),
                        str_of(w, "protocol").to_owned(),
                        str_of(w, "status").to_owned(),
                        w["capacity"].to_string(),
                    ]
                })
                .collect();
            table(
                [
                    "NAMESPACE",
                    "NAME",
                    "ADDRESS",
                    "NODE",
                    "WAYPOINT",
                    "PROTOCOL",
                    "STATUS",
                    "CAPACITY",
                ],
                &rows,
            )
        }
        Section::Services => {
            let rows: Vec<[String; 6]> = rows
                .iter()
                .map(|s| {
                    let endpoints = s["endpoints"].as_object();
                    let healthy = endpoints
                        .into_iter()
                        .flatten()
                        .filter(|(_, e)| e["status"] == "Healthy")
                        .count();
                    let total = endpoints.map_or(0, |e| e.len());
                    [
                        str_of(s, "namespace").to_owned(),
                        str_of(s, "name").to_owned(),
                        joined(&s["vips"], ","),
                        waypoint(s),
                        format!("{healthy}/{total}"),
                        joined(&s["subjectAltNames"], ","),
                    ]
                })
                .collect();
            table(
                ["NAMESPACE", "NAME", "VIPS", "WAYPOINT", "ENDPOINTS", "SANS"],
                &rows,
            )
        }
        Section::Policies => {
            let rows: Vec<[String; 6]> = rows
                .iter()
                .map(|p| {
                    let held = match p["refused"].as_str() {
                        Some(why) => format!("{} (refused: {why})", str_of(p, "held")),
                        None => str_of(p, "held").to_owned(),
                    };
                    [
                        str_of(p, "namespace").to_owned(),
                        str_of(p, "name").to_owned(),
                        str_of(p, "scope").to_owned(),
                        str_of(p, "action").to_owned(),
                        list(&p["rules"]).len().to_string(),
                        held,
                    ]
                })
                .collect();
            table(
                ["NAMESPACE", "NAME", "SCOPE", "ACTION", "RULES", "HELD"],
                &rows,
            )
        }
        Section::Certificates => {
            let rows: Vec<[String; 5]> = rows
                .iter()
                .map(|c| {
                    let leaf = &c["certChain"][0];
                    [
                        str_of(c, "identity").to_owned(),
                        str_of(c, "state").to_owned(),
                        str_of(leaf, "serialNumber").to_owned(),
                        str_of(leaf, "expirationTime").to_owned(),
                        list(&c["rootCerts"]).len().to_string(),
                    ]
                })
                .collect();
            table(["IDENTITY", "STATE", "SERIAL", "EXPIRES", "ROOTS"], &rows)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn second_line(t: &str) -> &str {
        t.lines().nth(1).unwrap_or_else(|| panic!("one row: {t}"))
    }

    #[test]
    fn each_section_s_table_shows_ztunnel_s_fields() {
        let w = json!([{"namespace": "demo", "name": "echo", "workloadIps": ["10.0.0.2"],
            "node": "node-a", "protocol": "HBONE", "status": "Healthy", "capacity": 3,
            "waypoint": {"destination": "/10.0.0.5"}}]);
        let t = render(Section::Workloads, &w);
        assert!(t.starts_with("NAMESPACE"), "{t}");
        for cell in [
            "demo",
            "echo",
            "10.0.0.2",
            "node-a",
            "/10.0.0.5",
            "HBONE",
            "Healthy",
            "3",
        ] {
            assert!(second_line(&t).contains(cell), "{cell}: {t}");
        }
        let s = json!([{"namespace": "demo", "name": "web", "vips": ["/172.16.0.1"],
            "endpoints": {"u1": {"status": "Healthy"}, "u2": {"status": "Unhealthy"}},
            "subjectAltNames": ["spiffe://cluster.local/ns/demo/sa/canary"]}]);
        let t = render(Section::Services, &s);
        for cell in ["web", "/172.16.0.1", "None", "1/2", "sa/canary"] {
            assert!(second_line(&t).contains(cell), "{cell}: {t}");
        }
        let p = json!([{"namespace": "demo", "name": "broken", "scope": "WorkloadSelector",
            "action": "Allow", "rules": [], "held": "closed", "refused": "bad source_ips"}]);
        let t = render(Section::Policies, &p);
        for cell in [
            "broken",
            "WorkloadSelector",
            "Allow",
            "closed (refused: bad source_ips)",
        ] {
            assert!(second_line(&t).contains(cell), "{cell}: {t}");
        }
        let c = json!([{"identity": "spiffe://cluster.local/ns/demo/sa/echo",
            "state": "Available", "certChain": [{"serialNumber": "42",
            "expirationTime": "2026-12-08T00:00:00Z"}], "rootCerts": [{}]}]);
        let t = render(Section::Certificates, &c);
        for cell in ["sa/echo", "Available", "42", "2026-12-08T00:00:00Z", "1"] {
            assert!(second_line(&t).contains(cell), "{cell}: {t}");
        }
        assert_eq!(
            render(Section::Policies, &json!([])),
            "no policies on this gateway\n"
        );
    }
}
