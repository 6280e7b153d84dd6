//! Child processes of the lab (gateways, server apps) started inside a
//! network namespace: `setns` between fork and exec, their own process
//! group (a Ctrl-C reaches the lab, which then stops them), SIGKILL if the
//! lab dies first, and SIGKILL on drop.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::watch;

use super::LabError;

/// A running child; its exit (status, when) is published by a waiter thread.
pub struct Proc {
    pub name: String,
    pub pid: u32,
    exited: watch::Receiver<Option<(String, Instant)>>,
    /// Set once the waiter reaped it (its pid may be reused after that).
    reaped: Arc<Mutex<bool>>,
}

impl Proc {
    /// Spawns `cmd` inside `/var/run/netns/<ns>`; `cmd`'s stdio as configured.
    pub fn spawn(name: &str, ns: &str, mut cmd: Command) -> Result<(Proc, Child), LabError> {
        let path = format!("/var/run/netns/{ns}");
        let netns =
            std::fs::File::open(&path).map_err(|e| LabError::Setup(format!("open {path}: {e}")))?;
        let fd = netns.as_raw_fd();
        // SAFETY: between fork and exec the hook calls only setns(2), setpgid(2)
        // and prctl(2), which are async-signal-safe and allocate nothing; `fd`
        // stays open (owned by `netns`) until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0
                    || libc::setpgid(0, 0) != 0
                    || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| LabError::Setup(format!("spawn {name} in {ns}: {e}")))?;
        drop(netns);
        let (tx, exited) = watch::channel(None);
        let pid = child.id();
        let reaped = Arc::new(Mutex::new(false));
        let reaped_w = reaped.clone();
        // The caller keeps the Child only for its pipes; this thread reaps.
        std::thread::spawn(move || {
            let mut status: libc::c_int = 0;
            // SAFETY: waitpid on our own child's pid with a valid out pointer.
            let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
            let at = Instant::now();
            *reaped_w.lock().unwrap_or_else(|e| e.into_inner()) = true;
            let what = if rc < 0 {
                format!("waitpid: {}", std::io::Error::last_os_error())
            } else if libc::WIFEXITED(status) {
                format!("exit {}", libc::WEXITSTATUS(status))
            } else if libc::WIFSIGNALED(status) {
                format!("signal {}", libc::WTERMSIG(status))
            } else {
                format!("status {status}")
            };
            let _ = tx.send(Some((what, at)));
        });
        let proc = Proc {
            name: name.to_owned(),
            pid,
            exited,
            reaped,
        };
        Ok((proc, child))
    }

    /// Sends `sig` unless the process was already reaped.
    pub fn signal(&self, sig: libc::c_int) {
        let reaped = self.reaped.lock().unwrap_or_else(|e| e.into_inner());
        if !*reaped {
            // SAFETY: kill(2) on the pid of our own unreaped child.
            unsafe { libc::kill(self.pid as libc::pid_t, sig) };
        }
    }

    /// How it ended and when, if it has.
    pub fn exit(&self) -> Option<(String, Instant)> {
        self.exited.borrow().clone()
    }

    /// Waits for the exit, at most `within`.
    pub async fn wait(&self, within: std::time::Duration) -> Result<(String, Instant), LabError> {
        let mut rx = self.exited.clone();
        let waited = tokio::time::timeout(within, rx.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(v)) => Ok(v.clone().expect("waited for Some")),
            Ok(Err(_)) => Err(LabError::Setup(format!(
                "{}: waiter thread gone",
                self.name
            ))),
            Err(_) => Err(LabError::Timeout(format!(
                "{} (pid {}) to exit within {within:?}",
                self.name, self.pid
            ))),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // A stopped process must be continued for SIGKILL to be reaped promptly.
        self.signal(libc::SIGKILL);
        self.signal(libc::SIGCONT);
    }
}
