//! The gateway's file descriptors: how many are open against the open-file
//! limit. In-pod mode reads them before taking a pod (each served pod holds
//! its namespace and its listeners — eight with the DNS proxy — for as long as
//! it is served), and an
//! error that comes from the descriptor table being full names these
//! figures instead of a symptom.

use std::fmt;
use std::io;

/// Descriptors open now, and the open-file (soft) limit they count against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub open: u64,
    pub limit: u64,
}

impl Usage {
    /// Counts `/proc/self/fd`: its size where the kernel reports the count
    /// there (Linux 6.2 and later; no descriptor needed, and no listing:
    /// re-adopting 1,000 pods beside 16,000 descriptors took 17.3 s with
    /// the listing at every pod, 184 ms without), else its
    /// entries. When the listing fails for want of a descriptor (EMFILE,
    /// ENFILE), the table is full: `open` is the limit.
    pub fn now() -> io::Result<Usage> {
        let (limit, _) = rlimit::getrlimit(rlimit::Resource::NOFILE)?;
        if let Some(open) = std::fs::metadata("/proc/self/fd")
            .ok()
            .map(|m| m.len())
            .filter(|n| *n > 0)
        {
            return Ok(Usage { open, limit });
        }
        Ok(Usage {
            open: Self::listed(limit)?,
            limit,
        })
    }

    /// The entries of `/proc/self/fd`.
    fn listed(limit: u64) -> io::Result<u64> {
        Ok(match std::fs::read_dir("/proc/self/fd") {
            // The listing includes the descriptor that reads it.
            Ok(dir) => (dir.count() as u64).saturating_sub(1),
            Err(e) if is_exhaustion(&e) => limit,
            Err(e) => return Err(e),
        })
    }

    /// Descriptors that can still be opened.
    pub fn free(&self) -> u64 {
        self.limit.saturating_sub(self.open)
    }
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of the open-file limit {} in use",
            self.open, self.limit
        )
    }
}

/// Why descriptors sent with a message were not received (the kernel
/// reported them cut off, though fewer came than there was room for): for
/// the error an operator reads.
pub fn why_lost() -> String {
    match Usage::now() {
        Ok(u) if u.free() == 0 => format!(
            "the gateway is out of file descriptors ({u}); raise its open-file limit (LimitNOFILE, ulimit -n) or lower capture.max_pods"
        ),
        Ok(u) => format!(
            "the kernel did not install it ({u}, so not the open-file limit; does a security module refuse descriptor passing?)"
        ),
        Err(e) => format!("the gateway is likely out of file descriptors (cannot count them: {e})"),
    }
}

/// EMFILE (the process's table is full) or ENFILE (the system's is).
pub fn is_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_this_process_descriptors() {
        let before = Usage::now().unwrap();
        assert!(before.open >= 3 && before.limit >= before.open, "{before}");
        // Other tests open and close descriptors concurrently: hold many so
        // the difference shows whatever they do.
        let held: Vec<std::fs::File> = (0..64)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let during = Usage::now().unwrap();
        drop(held);
        assert!(during.open >= 64, "{during} while holding 64 descriptors");
        // The size the kernel reports and the listing agree (give or take
        // what other tests open meanwhile, and the listing's own).
        let listed = Usage::listed(during.limit).unwrap();
        assert!(listed.abs_diff(Usage::now().unwrap().open) < 64, "{listed}");
        assert_eq!(during.free(), during.limit - during.open);
        assert!(is_exhaustion(&io::Error::from_raw_os_error(libc::EMFILE)));
        assert!(!is_exhaustion(&io::Error::from_raw_os_error(libc::ENOENT)));
    }
}
