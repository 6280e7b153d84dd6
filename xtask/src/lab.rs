//! `cargo xtask lab [ARGS…]`: the drain lab (`tests/src/lab`, binary
//! `drain-lab`), and its bounded smoke run in `cargo xtask test`.
//!
//! Builds what the test command builds (`cargo build --workspace --bins
//! --tests`, so neither rebuilds for the other) — the plugins are built by
//! the caller — then runs `target/debug/drain-lab ARGS`. The lab needs root
//! (network namespaces, iptables) and says so.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::checks::Checks;

/// The smoke stage's arguments: one policy, light load, a short app drain;
/// `--check` asserts counts only (no failed request, no client tunnel to the
/// old pod at the end, CNI DEL returned), never timings.
const SMOKE_ARGS: &[&str] = &[
    "--policies",
    "recommended",
    "--rate",
    "50",
    "--long-streams",
    "2",
    "--app-drain",
    "1s",
    "--check",
];
/// What the second smoke run adds to [`SMOKE_ARGS`]: a rolling restart of
/// two replicas.
const ROLLOUT_SMOKE: &[&str] = &["--scenario", "rollout", "--replicas", "2"];
/// What the third adds to the second: the gateways fed by the istiod
/// double, 1,000 background workloads, 10 updates/s of churn (about 10 s).
const ISTIO_SMOKE: &[&str] = &["--source", "istio", "--background", "1000", "--churn", "10"];
/// What the fourth adds to the second: the same rolling restart on
/// IPv6-only pods, nodes and Service.
const IPV6_SMOKE: &[&str] = &["--ipv6"];
/// Bound on the smoke run (SIGTERM, then SIGKILL 10 s later): the lab
/// cleans up its namespaces on SIGTERM.
const SMOKE_TIMEOUT_SECS: u32 = 120;

fn build(root: &Path) -> Result<std::path::PathBuf> {
    crate::build_workspace(root)?;
    Ok(root.join("target").join("debug").join("drain-lab"))
}

/// `cargo xtask lab ARGS`.
pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let bin = build(root)?;
    let status = Command::new(&bin)
        .current_dir(root)
        .args(args)
        .status()
        .with_context(|| format!("running {}", bin.display()))?;
    if !status.success() {
        bail!("drain-lab exited with {status}");
    }
    Ok(())
}

/// The smoke stage: four bounded lab runs (a termination, a rolling
/// restart, the same through the istiod double, the same restart on
/// IPv6-only pods), a check each (skipped without root or without
/// `ip`/`iptables`, as the netns tests skip).
pub fn smoke(root: &Path, checks: &mut Checks) -> Result<()> {
    for args in [
        SMOKE_ARGS.to_vec(),
        [ROLLOUT_SMOKE, SMOKE_ARGS].concat(),
        [ROLLOUT_SMOKE, ISTIO_SMOKE, SMOKE_ARGS].concat(),
        [ROLLOUT_SMOKE, IPV6_SMOKE, SMOKE_ARGS].concat(),
    ] {
        smoke_run(root, checks, &args)?;
    }
    Ok(())
}

fn smoke_run(root: &Path, checks: &mut Checks, args: &[&str]) -> Result<()> {
    let name = format!("drain lab smoke (`drain-lab {}`)", args.join(" "));
    if let Some(why) = cannot_run(args.contains(&"--ipv6")) {
        checks.skip(&name, why);
        return Ok(());
    }
    let bin = build(root)?;
    let started = Instant::now();
    let out = Command::new("timeout")
        .args(["-s", "TERM", "-k", "10", &SMOKE_TIMEOUT_SECS.to_string()])
        .arg(&bin)
        .args(args)
        .current_dir(root)
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{}", stdout.trim_end());
    let result = if out.status.success() {
        println!(
            "drain lab smoke took {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Ok(())
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
        Err(anyhow::anyhow!(
            "exited with {}{}\n    {}",
            out.status,
            if out.status.code() == Some(124) {
                format!(" (timed out after {SMOKE_TIMEOUT_SECS} s)")
            } else {
                String::new()
            },
            tail.into_iter().rev().collect::<Vec<_>>().join("\n    ")
        ))
    };
    checks.record(&name, result);
    Ok(())
}

/// Why the lab cannot run on this machine, if it cannot.
/// Why the lab cannot run here (with `ipv6`: an IPv6-only run), if so.
fn cannot_run(ipv6: bool) -> Option<&'static str> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("needs root for network namespaces and iptables");
    }
    let works = |cmd: &str, arg: &str| {
        Command::new(cmd)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !works("ip", "-V") || !works("iptables", "--version") {
        return Some("`ip` (iproute2) or `iptables` is not installed");
    }
    if ipv6 && (!Path::new("/proc/sys/net/ipv6").exists() || !works("ip6tables", "--version")) {
        return Some("the kernel has no IPv6 or `ip6tables` is not installed");
    }
    None
}
