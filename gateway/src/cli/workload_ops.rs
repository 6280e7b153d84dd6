//! `tidegate drain|bind|unbind <workload>` (a uid, `namespace/name`, IP or
//! unique name: [`crate::admin::workload_ref`]): the admin API's
//! workload operations without curl, each answered on one line. An error
//! status is the error (exit 1), with the gateway's reason.

use std::net::SocketAddr;

use serde_json::Value;

use super::admin_api::{self, path_segment, AdminError};
use super::{BindArgs, DrainArgs, UnbindArgs};

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// `POST /workloads/<workload>/shutdown-starting[?grace=…]`.
pub fn drain(admin: SocketAddr, args: &DrainArgs) -> Result<String, AdminError> {
    let mut path = format!(
        "/workloads/{}/shutdown-starting",
        path_segment(&args.workload)
    );
    if let Some(grace) = &args.grace {
        path += &format!("?grace={}", path_segment(grace));
    }
    let outcome = admin_api::call(admin_api::dial_addr(admin), "POST", &path, b"")?;
    Ok(drain_line(&args.workload, &outcome))
}

/// `PUT /workloads/<workload>/policy` with the policy name.
pub fn bind(admin: SocketAddr, args: &BindArgs) -> Result<String, AdminError> {
    let path = format!("/workloads/{}/policy", path_segment(&args.workload));
    let report = admin_api::call(
        admin_api::dial_addr(admin),
        "PUT",
        &path,
        args.policy.as_bytes(),
    )?;
    Ok(binding_line(&format!("bound to {}", args.policy), &report))
}

/// `DELETE /workloads/<workload>/policy`.
pub fn unbind(admin: SocketAddr, args: &UnbindArgs) -> Result<String, AdminError> {
    let path = format!("/workloads/{}/policy", path_segment(&args.workload));
    let report = admin_api::call(admin_api::dial_addr(admin), "DELETE", &path, b"")?;
    Ok(binding_line("run-time binding removed", &report))
}

/// A drain outcome: the policy that decided and what it did.
fn drain_line(workload: &str, outcome: &Value) -> String {
    let uid = str_of(outcome, "uid");
    let who = if uid == workload {
        uid.to_owned()
    } else {
        format!("{workload} (uid {uid})")
    };
    let policy = str_of(outcome, "policy");
    let version = outcome["version"].as_str().unwrap_or("built-in");
    if outcome["duplicate"].as_bool() == Some(true) {
        return format!(
            "{who}: already shutting down; the drain in progress keeps policy {policy} ({version})"
        );
    }
    let actions: Vec<&str> = outcome["actions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let actions = if actions.is_empty() {
        "no actions".to_owned()
    } else {
        actions.join("; ")
    };
    let fallback = match outcome["fallback"].as_str() {
        Some(f) => format!(", fallback {f}"),
        None => String::new(),
    };
    format!("{who}: draining, policy {policy} ({version}{fallback}): {actions}")
}

/// A binding report: the workload's policy now, why, and the binding before.
fn binding_line(what: &str, report: &Value) -> String {
    let p = &report["policy"];
    let previous = match report["previous_binding"].as_str() {
        Some(b) => format!("run-time binding before: {b}"),
        None => "no run-time binding before".to_owned(),
    };
    format!(
        "{} (uid {}): {what}; policy {} ({}); {previous}",
        str_of(report, "workload"),
        str_of(report, "uid"),
        str_of(p, "name"),
        str_of(p, "why"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_drain_is_one_line_naming_policy_and_actions() {
        let outcome = json!({"uid": "u-echo", "event": "shutdown-starting", "duplicate": false,
            "policy": "recommended", "version": "ab12", "fallback": null,
            "actions": ["goaway graceful", "deadline 28s"]});
        assert_eq!(
            drain_line("demo/echo", &outcome),
            "demo/echo (uid u-echo): draining, policy recommended (ab12): goaway graceful; deadline 28s"
        );
        let again = json!({"uid": "u-echo", "duplicate": true, "policy": "keepalive-only",
            "version": null, "actions": []});
        assert_eq!(
            drain_line("u-echo", &again),
            "u-echo: already shutting down; the drain in progress keeps policy keepalive-only (built-in)"
        );
    }

    #[test]
    fn a_binding_is_one_line_with_the_previous_one() {
        let report = json!({"uid": "u-echo", "workload": "demo/echo", "previous_binding": "old",
            "policy": {"name": "trial", "why": "run-time binding (PUT /workloads/u-echo/policy)"}});
        let line = binding_line("bound to trial", &report);
        assert_eq!(
            line,
            "demo/echo (uid u-echo): bound to trial; policy trial (run-time binding (PUT /workloads/u-echo/policy)); run-time binding before: old"
        );
        assert!(!line.contains('\n'));
    }
}
