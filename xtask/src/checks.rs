//! Named pass/fail checks run by xtask itself (the demo's "try next" lines,
//! the README's shell blocks), printed like libtest and counted in the
//! test command's closing line.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use anyhow::{bail, Context, Result};

/// How long one command of the demo or a README block may run.
const COMMAND_TIMEOUT_SECS: u32 = 600;

#[derive(Debug, Default)]
pub struct Checks {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
    failures: Vec<String>,
}

impl Checks {
    /// Records one check's outcome and prints it.
    pub fn record(&mut self, name: &str, result: Result<()>) {
        match result {
            Ok(()) => {
                self.passed += 1;
                println!("check {name} ... ok");
            }
            Err(e) => {
                self.failed += 1;
                println!("check {name} ... FAILED\n    {e:#}");
                self.failures.push(format!("{name}: {e:#}"));
            }
        }
    }

    pub fn skip(&mut self, name: &str, why: &str) {
        self.skipped += 1;
        println!("check {name} ... skipped ({why})");
    }

    /// Runs one line the demo printed and checks its answer.
    pub fn run_demo_line(&mut self, root: &Path, line: &str) {
        let name = format!("demo line `{line}`");
        let result = expectation(line).and_then(|expect| {
            let out = bash(root, line, &[])?;
            expect.check(&String::from_utf8_lossy(&out.stdout))
        });
        self.record(&name, result);
    }

    /// Fails when any check failed, naming them.
    pub fn result(&self) -> Result<()> {
        if self.failures.is_empty() {
            return Ok(());
        }
        bail!(
            "{} check(s) failed:\n  {}",
            self.failed,
            self.failures.join("\n  ")
        )
    }
}

/// What a "try next" line of the demo must answer.
#[derive(Debug, PartialEq)]
enum Expect {
    /// stdout is exactly this (`echo X | … connect` echoes X back).
    Stdout(String),
    /// stdout contains this.
    Contains(&'static str),
    /// stdout is JSON whose `workloads` name this workload.
    Workload(&'static str),
    /// stdout is JSON whose `policies` name this policy.
    Policy(&'static str),
}

/// The check for a line; a line without one is an error, so a new "try
/// next" line cannot be added without saying what it must answer.
fn expectation(line: &str) -> Result<Expect> {
    let cmd = line.split(" #").next().unwrap_or(line).trim();
    if let Some(rest) = cmd.strip_prefix("echo ") {
        if let Some((word, _)) = rest.split_once('|') {
            return Ok(Expect::Stdout(format!("{}\n", word.trim())));
        }
    }
    let expect = if cmd.ends_with(" workloads") {
        // The embedded default binds the demo's echo (app=echo) to this.
        Expect::Contains("drain-at-teardown")
    } else if cmd.ends_with("/config_dump") {
        Expect::Workload("echo")
    } else if cmd.ends_with("/policies") {
        Expect::Policy("recommended")
    } else if cmd.ends_with("/metrics") {
        Expect::Contains("tidegate_")
    } else if cmd.ends_with("/healthz/ready") {
        Expect::Stdout("ready\n".into())
    } else {
        bail!("no check for the demo's line {line:?}: add one in xtask/src/checks.rs")
    };
    Ok(expect)
}

impl Expect {
    fn check(&self, stdout: &str) -> Result<()> {
        let ok = match self {
            Expect::Stdout(want) => stdout == want,
            Expect::Contains(want) => stdout.contains(want),
            Expect::Workload(name) => json_names(stdout, "workloads")?.iter().any(|n| n == name),
            Expect::Policy(name) => json_names(stdout, "policies")?.iter().any(|n| n == name),
        };
        if !ok {
            let shown: String = stdout.chars().take(400).collect();
            bail!("expected {self:?}, got {shown:?}");
        }
        Ok(())
    }
}

/// The `name` (or `policy`) of each object in the array `key` of a JSON answer.
fn json_names(stdout: &str, key: &str) -> Result<Vec<String>> {
    let v: serde_json::Value =
        serde_json::from_str(stdout).with_context(|| format!("not JSON: {stdout:.200}"))?;
    let items = v
        .get(key)
        .and_then(|a| a.as_array())
        .with_context(|| format!("no array {key:?} in the answer"))?;
    Ok(items
        .iter()
        .filter_map(|i| i.get("name").or_else(|| i.get("policy")))
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect())
}

/// Runs `script` with `bash -euo pipefail` in `dir`, bounded, with
/// `target/debug` first on PATH (where `cargo install --path gateway` would
/// put `tidegate`). Fails on a non-zero exit, showing stderr.
pub fn bash(dir: &Path, script: &str, env: &[(&str, String)]) -> Result<Output> {
    let root = crate::repo_root();
    let path = format!(
        "{}:{}",
        root.join("target").join("debug").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("timeout")
        .arg(COMMAND_TIMEOUT_SECS.to_string())
        .args(["bash", "-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .context("running bash")?;
    if !out.status.success() {
        bail!(
            "exited with {}{}\n    stdout: {}\n    stderr: {}",
            out.status,
            if out.status.code() == Some(124) {
                format!(" (timed out after {COMMAND_TIMEOUT_SECS} s)")
            } else {
                String::new()
            },
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_demo_line_has_a_check() {
        assert_eq!(
            expectation("echo hello | cargo run -q -p tidegate -- connect --to 127.0.0.2:8080")
                .unwrap(),
            Expect::Stdout("hello\n".into())
        );
        assert_eq!(
            expectation("curl -s http://127.0.0.1:15000/config_dump     # workloads").unwrap(),
            Expect::Workload("echo")
        );
        assert!(expectation("rm -rf /tmp/x").is_err());
    }

    #[test]
    fn checks_fail_on_wrong_answers() {
        assert!(Expect::Stdout("hello\n".into()).check("hello\n").is_ok());
        assert!(Expect::Stdout("hello\n".into()).check("").is_err());
        let dump = r#"{"workloads": [{"name": "client"}]}"#;
        assert!(Expect::Workload("echo").check(dump).is_err());
        assert!(Expect::Workload("client").check(dump).is_ok());
        assert!(Expect::Workload("echo").check("not json").is_err());
    }
}
