//! One test run again, alone, in a child process: for what is the whole
//! process's (the open-file limit), which a test must not change under the
//! tests running beside it.

use std::process::Command;

/// Whether this process is the child [`alone`] started for `marker`.
pub fn is_child(marker: &str) -> bool {
    std::env::var_os(marker).is_some()
}

/// Runs `test` (its full path in the test binary, e.g. `zds::name`) in this
/// test binary again with `marker` set, and passes when the child succeeded
/// and printed `expect` (the line the child's own run ends with, so a
/// child that skipped its body is not taken for a pass).
pub fn alone(test: &str, marker: &str, expect: &str) {
    let out = Command::new(std::env::current_exe().expect("current_exe"))
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(marker, "1")
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(expect),
        "child: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
