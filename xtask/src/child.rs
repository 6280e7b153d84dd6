//! The gateway as xtask's child (`demo`, `demo --check`, the test command's
//! README stage).
//!
//! It runs in a process group of its own, so a terminal's Ctrl-C reaches
//! xtask alone, and xtask decides: a SIGINT, SIGTERM or SIGHUP sent to xtask
//! is passed on to the gateway, xtask waits for it to drain and exit, then
//! exits as that signal would have ended it (128 + N); a second signal kills
//! the gateway at once. Any other way out of xtask (an error, a panic
//! unwinding) kills the gateway on drop. Only a SIGKILL of xtask itself
//! leaves the gateway running; a gateway started again then names it as the
//! holder of its ports.

use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitStatus};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// How long the gateway may take to exit after the signal xtask passed on.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running child, killed when dropped unless it was waited for.
pub struct Supervised {
    pid: u32,
    /// Its exit status, sent by the thread that owns (and reaps) it.
    exited: mpsc::Receiver<io::Result<ExitStatus>>,
    reaped: bool,
}

/// The signals xtask passes on, registered before the child is spawned so
/// that none arriving in between ends xtask with the child left behind.
struct Forwarded {
    runtime: tokio::runtime::Runtime,
    signals: [(i32, Signal); 3],
}

impl Forwarded {
    fn register() -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("a runtime for signal handling")?;
        let _entered = runtime.enter();
        let on = |kind: SignalKind| signal(kind).context("registering a signal handler");
        let signals = [
            (2, on(SignalKind::interrupt())?),
            (15, on(SignalKind::terminate())?),
            (1, on(SignalKind::hangup())?),
        ];
        Ok(Forwarded { runtime, signals })
    }

    /// Passes the first signal on to `pid` and waits for it to exit (a
    /// second signal, or [`STOP_TIMEOUT`], kills it), then exits xtask as
    /// the signal would have. Once the child is gone, a signal just exits.
    fn run(self, pid: u32, mut gone: tokio::sync::watch::Receiver<bool>) {
        let Forwarded {
            runtime,
            mut signals,
        } = self;
        runtime.block_on(async move {
            let first = next(&mut signals).await;
            if !*gone.borrow() {
                eprintln!(
                    "xtask: signal {first}: passed on to the gateway (pid {pid}); waiting for it to drain"
                );
                let _ = kill(pid, &first.to_string());
                let why = tokio::select! {
                    _ = gone.wait_for(|g| *g) => None,
                    n = next(&mut signals) => Some(format!("signal {n} again")),
                    _ = tokio::time::sleep(STOP_TIMEOUT) => {
                        Some(format!("still running {STOP_TIMEOUT:?} later"))
                    }
                };
                if let Some(why) = why {
                    eprintln!("xtask: {why}: killing the gateway (pid {pid})");
                    let _ = kill(pid, "KILL");
                    let _ = tokio::time::timeout(STOP_TIMEOUT, gone.wait_for(|g| *g)).await;
                }
            }
            std::process::exit(128 + first);
        });
    }
}

/// The number of the next signal among `signals`.
async fn next(signals: &mut [(i32, Signal); 3]) -> i32 {
    let [(a, one), (b, two), (c, three)] = signals;
    tokio::select! {
        _ = one.recv() => *a,
        _ = two.recv() => *b,
        _ = three.recv() => *c,
    }
}

/// Spawns `cmd` in a process group of its own, supervised (see the module
/// documentation); returns it with its stderr when that was piped.
pub fn spawn(cmd: &mut Command) -> Result<(Supervised, Option<std::process::ChildStderr>)> {
    let forwarded = Forwarded::register()?;
    let mut child = cmd
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let stderr = child.stderr.take();
    let pid = child.id();
    let (exit_tx, exited) = mpsc::channel();
    let (gone_tx, gone) = tokio::sync::watch::channel(false);
    std::thread::spawn(move || {
        let status = child.wait();
        gone_tx.send_replace(true);
        let _ = exit_tx.send(status);
    });
    std::thread::spawn(move || forwarded.run(pid, gone));
    let supervised = Supervised {
        pid,
        exited,
        reaped: false,
    };
    Ok((supervised, stderr))
}

impl Supervised {
    /// Waits for the child to exit.
    pub fn wait(mut self) -> Result<ExitStatus> {
        let status = self.exited.recv().context("the child's waiter thread")?;
        self.reaped = true;
        status.context("waiting for the gateway")
    }

    /// SIGTERM, then waits (bounded) for a clean exit.
    pub fn stop(mut self) -> Result<()> {
        kill(self.pid, "TERM")?;
        let status = match self.exited.recv_timeout(STOP_TIMEOUT) {
            Ok(status) => status.context("waiting for the gateway")?,
            Err(_) => bail!("the gateway did not exit within {STOP_TIMEOUT:?} of SIGTERM"),
        };
        self.reaped = true;
        if !status.success() {
            bail!("the gateway exited with {status} after SIGTERM");
        }
        Ok(())
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        // An error path: never leave a gateway holding the demo's ports.
        if !self.reaped {
            let _ = kill(self.pid, "KILL");
            let _ = self.exited.recv_timeout(STOP_TIMEOUT);
        }
    }
}

/// `kill -<sig> <pid>` (xtask has no libc dependency).
fn kill(pid: u32, sig: &str) -> Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill -{sig} {pid} failed ({status})");
    }
    Ok(())
}
