//! `cargo xtask demo [--check] [ARGS…]`: the README's first command.
//!
//! Builds the plugins and the gateway in the dev profile (the same build the
//! test command uses, so one build serves both; dependencies are optimised
//! in dev, see the workspace `Cargo.toml`), then runs `tidegate run ARGS` on
//! the embedded default. With `--check` it waits until the gateway prints
//! its "try next" lines, runs each of them, checks the answers, stops the
//! gateway with SIGTERM and exits: `cargo xtask test` does the same, so the
//! first command and what it tells a new user to type cannot break unseen.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::checks::Checks;
use crate::child::{self, Supervised};

/// The line the gateway prints before its "try next" commands.
const NEXT_STEPS_START: &str = "Try, in another terminal:";
/// The line the gateway prints after them.
const NEXT_STEPS_END: &str = "Ctrl-C drains and stops.";
/// How long the gateway may take from spawn to printing its next steps.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Builds `tidegate` (dev profile, progress visible) and returns its path.
///
/// The build is the test command's ([`crate::build_workspace`]): a little
/// more on the first run (the test binaries link), nothing twice.
pub fn build_gateway(root: &Path) -> Result<PathBuf> {
    eprintln!(
        "xtask: building the gateway and its tests (dev profile; the first build of a fresh \
         clone takes about 22 minutes on 2 cores, later ones seconds)"
    );
    crate::build_workspace(root)?;
    Ok(root.join("target").join("debug").join("tidegate"))
}

/// A running demo gateway and the commands it told the user to try.
pub struct Demo {
    gateway: Supervised,
    pub next_steps: Vec<String>,
}

/// `tidegate run ARGS` in `root`, supervised ([`crate::child`]): it ends
/// when xtask does.
fn command(root: &Path, bin: &Path, args: &[String]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.current_dir(root)
        .arg("run")
        .args(args)
        .stdin(Stdio::null());
    cmd
}

/// `cargo xtask demo`: runs the gateway until it exits; a Ctrl-C or
/// SIGTERM to xtask drains it first ([`crate::child`]).
pub fn run(root: &Path, bin: &Path, args: &[String]) -> Result<()> {
    let (gateway, _) = child::spawn(&mut command(root, bin, args))?;
    let status = gateway.wait()?;
    if !status.success() {
        bail!("tidegate run exited with {status}");
    }
    Ok(())
}

/// Starts `tidegate run ARGS` in `root` and waits for its "try next" lines.
/// The gateway's log goes to our stderr as it comes.
pub fn start(root: &Path, bin: &Path, args: &[String]) -> Result<Demo> {
    let (gateway, stderr) = child::spawn(command(root, bin, args).stderr(Stdio::piped()))?;
    let stderr = stderr.expect("piped");
    let (lines_tx, lines_rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            eprintln!("  | {line}");
            // The receiver goes away once the next steps are read; keep echoing.
            let _ = lines_tx.send(line);
        }
    });
    let next_steps = read_next_steps(&lines_rx)?;
    Ok(Demo {
        gateway,
        next_steps,
    })
}

/// Collects the commands between [`NEXT_STEPS_START`] and [`NEXT_STEPS_END`].
fn read_next_steps(lines: &mpsc::Receiver<String>) -> Result<Vec<String>> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut started = false;
    let mut steps = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match lines.recv_timeout(left) {
            Ok(line) => line,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                bail!("the gateway printed no \"{NEXT_STEPS_START}\" within {START_TIMEOUT:?}")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the gateway exited before printing its next steps (its log is above)")
            }
        };
        let line = line.trim();
        if line == NEXT_STEPS_START {
            started = true;
        } else if line == NEXT_STEPS_END {
            if steps.is_empty() {
                bail!("the gateway printed no command to try");
            }
            return Ok(steps);
        } else if started && !line.is_empty() {
            steps.push(line.to_owned());
        }
    }
}

impl Demo {
    /// SIGTERM, then waits (bounded) for a clean exit.
    pub fn stop(self) -> Result<()> {
        self.gateway.stop()
    }
}

/// `cargo xtask demo --check`: start, run every "try next" line, run
/// `while_up` (the test command's README blocks) against the running demo,
/// stop. A demo that does not start is one failed check, not an early exit.
pub fn check(
    root: &Path,
    args: &[String],
    checks: &mut Checks,
    while_up: impl FnOnce(&mut Checks) -> Result<()>,
) -> Result<()> {
    let started = build_gateway(root).and_then(|bin| start(root, &bin, args));
    let demo = match started {
        Ok(demo) => demo,
        Err(e) => {
            checks.record("the demo starts and prints what to try", Err(e));
            return Ok(());
        }
    };
    for line in &demo.next_steps {
        checks.run_demo_line(root, line);
    }
    while_up(checks)?;
    checks.record("the demo stops cleanly on SIGTERM", demo.stop());
    Ok(())
}
