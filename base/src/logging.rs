//! The binaries' log output: to stderr, filtered by `TIDEGATE_LOG` (an
//! `EnvFilter`, `info` when unset or unreadable), in colour only on a
//! terminal so piped or collected logs stay plain text.

use tracing_subscriber::EnvFilter;

/// Installs the subscriber; once per process, first thing in `main`.
pub fn init() {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("TIDEGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
