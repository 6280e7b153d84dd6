//! The drain lab (issue 13): in real network namespaces, two-plus-one nodes
//! each running the real `tidegate` binary, a client pod loading two server
//! pods, and a lifecycle scenario applied to the old server pod once per
//! drain policy; one markdown table of what each policy did.
//!
//! - `params.rs`: the command line; `topology.rs`: namespaces, veths, routes,
//!   iptables; `process.rs`: children inside a namespace;
//! - `gateway.rs`: the gateway processes and their config; `workloads.rs`:
//!   the pods' lifecycle as the gateways see it (the workload files, or
//!   `xds_feed.rs`: an istiod double with a large background and churn);
//! - `app_server.rs`: the server pods' HTTP app; `load.rs`: the client pod's
//!   load; `cni.rs`: CNI DEL through `tidegate-cni`;
//! - `http.rs`: admin/metrics requests inside a node; `probes.rs`: the
//!   pool, counter and drain watchers;
//! - `scenario.rs`: one policy's run (setup, load, the row), its timelines
//!   in `termination.rs`, `crash.rs`, `restart.rs` and `rollout.rs`; `report.rs`: the table and the
//!   section of `docs/drain-lab.md`.

pub mod app_server;
pub mod cni;
mod crash;
pub mod gateway;
pub mod http;
pub mod load;
pub mod params;
pub mod probes;
pub mod process;
pub mod report;
mod restart;
mod rollout;
pub mod scenario;
mod termination;
pub mod topology;
pub mod workloads;
pub mod xds_feed;

use std::path::Path;

use params::{Capture, Params};
use report::Row;

/// What can stop a lab run.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("the drain lab needs root (network namespaces, iptables)")]
    NotRoot,
    #[error("`{0}` is not installed (the lab needs iproute2 and iptables)")]
    MissingTool(&'static str),
    #[error("per-pod capture is not available yet (issue 14); use --capture node")]
    PerPodCapture,
    #[error("{0}")]
    Source(&'static str),
    #[error("unknown policy {0:?}; reference policies: {1}")]
    UnknownPolicy(String, String),
    #[error("setup: {0}")]
    Setup(String),
    #[error("gateway: {0}")]
    Gateway(String),
    #[error("probe: {0}")]
    Probe(String),
    #[error("timed out waiting for {0}")]
    Timeout(String),
    #[error("docs/drain-lab.md: {0}")]
    Doc(String),
    #[error("interrupted")]
    Interrupted,
    #[error("check failed: {0}")]
    Check(String),
}

/// Refuses what cannot run here, before anything is created.
pub fn preflight(p: &Params) -> Result<(), LabError> {
    if p.capture == Capture::PerPod {
        return Err(LabError::PerPodCapture);
    }
    check_source(p)?;
    for policy in &p.policies {
        if !params::REFERENCE_POLICIES.contains(&policy.as_str()) {
            return Err(LabError::UnknownPolicy(
                policy.clone(),
                params::REFERENCE_POLICIES.join(", "),
            ));
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(LabError::NotRoot);
    }
    if crate::netns::tool_missing("ip", "-V") {
        return Err(LabError::MissingTool("ip"));
    }
    if crate::netns::tool_missing("iptables", "--version") {
        return Err(LabError::MissingTool("iptables"));
    }
    if p.ipv6 && crate::netns::tool_missing("ip6tables", "--version") {
        return Err(LabError::MissingTool("ip6tables"));
    }
    Ok(())
}

/// `--background`, `--churn` and `--source istio` go together, with
/// `rollout`.
fn check_source(p: &Params) -> Result<(), LabError> {
    let istio = p.source == params::Source::Istio;
    if !istio && (p.background > 0 || p.churn > 0) {
        return Err(LabError::Source(
            "--background and --churn are the istiod double's: add --source istio",
        ));
    }
    if p.churn > 0 && p.background == 0 {
        return Err(LabError::Source(
            "--churn updates background workloads: give --background N (N > 0)",
        ));
    }
    if istio && p.scenario != params::Scenario::Rollout {
        return Err(LabError::Source(
            "--source istio runs the rollout scenario only (--scenario rollout)",
        ));
    }
    Ok(())
}

/// Runs every policy of `p` one after the other, each in fresh namespaces.
pub async fn run(p: &Params) -> Result<Vec<Row>, LabError> {
    preflight(p)?;
    topology::remove_leftovers();
    let background = if p.source == params::Source::Istio {
        let t = std::time::Instant::now();
        let b = xds_feed::Background::new(p.background as usize);
        tracing::info!(workloads = p.background, took = ?t.elapsed(), "background set encoded");
        Some(b)
    } else {
        None
    };
    let mut rows = Vec::new();
    for (i, policy) in p.policies.iter().enumerate() {
        tracing::info!(policy, scenario = p.scenario.name(), "drain lab run");
        let mut lab = scenario::Lab::start(p, policy, i, background.as_ref()).await?;
        match lab.run(p, policy).await {
            Ok(row) => rows.push(row),
            Err(e) => {
                eprintln!("{}", lab.log_tails());
                return Err(e);
            }
        }
    }
    Ok(rows)
}

/// The command line that reproduces a run (for `docs/drain-lab.md`).
pub fn command_line(p: &Params) -> String {
    let mut s = format!(
        "cargo xtask lab --scenario {} --rate {} --long-streams {} --app-drain {} --grace {}",
        p.scenario.name(),
        p.rate,
        p.long_streams,
        cli_duration(p.app_drain),
        cli_duration(p.grace),
    );
    if p.different_sa {
        s.push_str(" --different-sa");
    }
    if p.ipv6 {
        s.push_str(" --ipv6");
    }
    if !p.endpoint_lag.is_zero() {
        s.push_str(&format!(" --endpoint-lag {}", cli_duration(p.endpoint_lag)));
    }
    match p.scenario {
        params::Scenario::CniHung => {
            s.push_str(&format!(" --cni-timeout {}", cli_duration(p.cni_timeout)))
        }
        params::Scenario::GatewayRestart => s.push_str(&format!(
            " --restart-node {}{}",
            if p.restart_node == params::Node::A {
                "a"
            } else {
                "b"
            },
            if p.kill_old { " --kill-old" } else { "" }
        )),
        params::Scenario::Rollout => s.push_str(&format!(" --replicas {}", p.replicas)),
        _ => {}
    }
    if p.source == params::Source::Istio {
        s.push_str(" --source istio");
        if p.background > 0 {
            s.push_str(&format!(" --background {}", p.background));
        }
        if p.churn > 0 {
            s.push_str(&format!(" --churn {}", p.churn));
        }
    }
    if p.policies.len() < params::REFERENCE_POLICIES.len() {
        s.push_str(&format!(" --policies {}", p.policies.join(",")));
    }
    s
}

/// A duration as the command line takes it (`7s`, `1500ms`).
fn cli_duration(d: std::time::Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The section of `docs/drain-lab.md`: when, how, the table and the notes.
pub fn section(p: &Params, rows: &[Row]) -> String {
    let output = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let date = output("date", &["-u", "+%Y-%m-%d"]);
    let commit = output("git", &["rev-parse", "--short", "HEAD"]);
    format!(
        "Measured by `{}` on {date} at commit {commit} (written by `--write-doc`; \
         a 2-core machine, debug build):\n\n{}\n{}",
        command_line(p),
        report::table(rows),
        report::notes(rows)
    )
}

/// `--check`: the smoke stage's assertions (counts only, never timings).
pub fn check(rows: &[Row]) -> Result<(), LabError> {
    let mut problems = Vec::new();
    for r in rows {
        if r.short_failed > 0 || r.long_failed > 0 {
            problems.push(format!(
                "{}: {} short and {} long-stream requests failed",
                r.policy, r.short_failed, r.long_failed
            ));
        }
        if r.old_tunnel_at_end {
            problems.push(format!(
                "{}: a client tunnel to the old pod is still pooled",
                r.policy
            ));
        }
        if r.cni_returned == Some(false) {
            problems.push(format!("{}: CNI DEL did not return", r.policy));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(LabError::Check(problems.join("; ")))
    }
}

/// `docs/drain-lab.md` of the repository (the lab is run from anywhere).
pub fn doc_path() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/drain-lab.md"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        p: Params,
    }

    fn params(args: &[&str]) -> Params {
        Cli::try_parse_from(std::iter::once("drain-lab").chain(args.iter().copied()))
            .unwrap()
            .p
    }

    #[test]
    fn the_istiod_double_options_go_together() {
        let refused = |args: &[&str], names: &str| match check_source(&params(args)) {
            Err(LabError::Source(why)) => assert!(why.contains(names), "{args:?}: {why}"),
            other => panic!("{args:?}: {other:?}"),
        };
        refused(
            &["--scenario", "rollout", "--background", "10"],
            "--source istio",
        );
        refused(&["--scenario", "rollout", "--churn", "5"], "--source istio");
        refused(
            &["--scenario", "rollout", "--source", "istio", "--churn", "5"],
            "--background N",
        );
        refused(&["--source", "istio"], "rollout scenario only");
        for ok in [
            &["--scenario", "rollout"][..],
            &["--scenario", "rollout", "--source", "istio"],
            &[
                "--scenario",
                "rollout",
                "--source",
                "istio",
                "--background",
                "100000",
                "--churn",
                "50",
            ],
        ] {
            assert!(check_source(&params(ok)).is_ok(), "{ok:?}");
        }
        // `--ipv6` is on the reproducing command line.
        let ipv6 = params(&["--scenario", "rollout", "--ipv6"]);
        assert!(ipv6.ipv6 && command_line(&ipv6).contains(" --ipv6"));
        assert!(!command_line(&params(&[])).contains("--ipv6"));
        // Bounds are clap's, naming the flag.
        let too_many = Cli::try_parse_from(["drain-lab", "--background", "200001"]);
        assert!(too_many.is_err_and(|e| e.to_string().contains("--background")));
        let p = params(&[
            "--scenario",
            "rollout",
            "--source",
            "istio",
            "--background",
            "1000",
            "--churn",
            "10",
        ]);
        assert!(command_line(&p).ends_with("--source istio --background 1000 --churn 10"));
    }
}
