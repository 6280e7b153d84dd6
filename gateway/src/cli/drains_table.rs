//! `tidegate drains [-o json|yaml]`: `GET /drains` of a running gateway —
//! its workloads' drains (phase, policy, what is left) and the decisions it
//! took about draining peers. JSON and YAML are the admin API's answer as
//! it is (`drains`, `peer_drains`: docs/cli.md).

use std::net::SocketAddr;

use serde_json::Value;

use super::admin_api::{self, AdminError};
use super::output::{joined, list, str_of, table, Output};

pub fn fetch(admin: SocketAddr, output: Output) -> Result<String, AdminError> {
    let answer = admin_api::call(admin_api::dial_addr(admin), "GET", "/drains", b"")?;
    Ok(output.render(&answer, || render(&answer)))
}

/// Two tables: the local drains, then the peers' (when there are any).
fn render(answer: &Value) -> String {
    let rows: Vec<[String; 7]> = list(&answer["drains"])
        .iter()
        .map(|d| {
            let phase = match d["ended"].as_str() {
                Some(end) => format!("{} (ended: {end})", str_of(d, "phase")),
                None => str_of(d, "phase").to_owned(),
            };
            [
                str_of(d, "workload").to_owned(),
                str_of(d, "uid").to_owned(),
                phase,
                str_of(d, "policy").to_owned(),
                str_of(d, "trigger").to_owned(),
                format!("{}/{}", d["tunnels_remaining"], d["streams_remaining"]),
                joined(&d["actions_taken"], "; "),
            ]
        })
        .collect();
    let mut out = if rows.is_empty() {
        "no drain on this gateway\n".to_owned()
    } else {
        table(
            [
                "WORKLOAD",
                "UID",
                "PHASE",
                "POLICY",
                "TRIGGER",
                "TUNNELS/STREAMS",
                "ACTIONS",
            ],
            &rows,
        )
    };
    let peers: Vec<[String; 4]> = list(&answer["peer_drains"])
        .iter()
        .flat_map(|p| {
            list(&p["decisions"]).iter().map(move |d| {
                [
                    p["workload"]
                        .as_str()
                        .unwrap_or(str_of(p, "peer"))
                        .to_owned(),
                    str_of(d, "event").to_owned(),
                    format!("{} ({})", str_of(d, "policy"), str_of(d, "selected_by")),
                    joined(&d["actions"], "; "),
                ]
            })
        })
        .collect();
    if !peers.is_empty() {
        out += "\n";
        out += &table(["PEER", "EVENT", "POLICY", "ACTIONS"], &peers);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn local_drains_then_peer_decisions() {
        let answer = json!({
            "drains": [{"uid": "u-echo", "workload": "demo/echo", "policy": "recommended",
                "version": "ab12", "trigger": "admin", "phase": "shutting-down",
                "started_unix_ms": 1, "deadline_unix_ms": null,
                "actions_taken": ["goaway graceful"], "tunnels_remaining": 2,
                "streams_remaining": 5, "ended": null}],
            "peer_drains": [{"peer": "u-web", "workload": "shop/web", "identity": null,
                "decisions": [{"event": "peer-terminating", "policy": "default",
                    "version": null, "selected_by": "default", "clients": [],
                    "actions": ["evict-pool"], "tunnels_evicted": 1}]}]
        });
        let t = render(&answer);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("WORKLOAD"), "{t}");
        for cell in [
            "demo/echo",
            "u-echo",
            "shutting-down",
            "recommended",
            "admin",
            "2/5",
            "goaway graceful",
        ] {
            assert!(lines[1].contains(cell), "{cell}: {t}");
        }
        assert!(lines[3].starts_with("PEER"), "{t}");
        assert!(
            lines[4].contains("shop/web") && lines[4].contains("evict-pool"),
            "{t}"
        );
        assert_eq!(
            render(&json!({"drains": [], "peer_drains": []})),
            "no drain on this gateway\n"
        );
    }
}
