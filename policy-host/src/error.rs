//! Policy errors: why a plugin was refused, and why a decision failed.

/// A plugin refused at load or swap time; the previous version (if any) stays.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "cannot read plugin {path}: {source} (a relative path is read from the current \
         directory; the reference plugins are built into a clone's target/plugins/ by `cargo \
         xtask demo` or `cargo xtask plugins`: run from the clone's root, point \
         `policies.plugins.<name>.file` at one with an absolute path, or upload one to a running \
         gateway with `tidegate policy upload NAME FILE`)"
    )]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("not a WebAssembly component: {0}")]
    NotAComponent(String),
    #[error("plugin does not export tidegate:policy/policy (exports: {0})")]
    NoPolicyExport(String),
    #[error("plugin built for tidegate:policy@{plugin}, this gateway implements {host}")]
    IncompatibleVersion { plugin: String, host: String },
    #[error("plugin imports {0}, which this gateway does not provide (build for wasm32-unknown-unknown: no WASI)")]
    UnsupportedImport(String),
    #[error("cannot instantiate plugin: {0}")]
    Instantiate(String),
    #[error("plugin refused its configuration: {0}")]
    Init(String),
    #[error("plugin failed the self-test event: {0}")]
    SelfTest(String),
}

impl LoadError {
    /// A bounded label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            LoadError::Read { .. } => "read",
            LoadError::NotAComponent(_) => "not_a_component",
            LoadError::NoPolicyExport(_) => "no_policy_export",
            LoadError::IncompatibleVersion { .. } => "incompatible_version",
            LoadError::UnsupportedImport(_) => "unsupported_import",
            LoadError::Instantiate(_) => "instantiate",
            LoadError::Init(_) => "init",
            LoadError::SelfTest(_) => "self_test",
        }
    }
}

/// Why a plugin call did not produce a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The epoch deadline interrupted the call.
    Timeout,
    /// The plugin tried to grow its memory past the cap.
    Memory,
    /// Any other trap (unreachable, out-of-bounds, a panic in the guest).
    Trap,
    /// The call returned something the host could not lift (bad UTF-8, bad discriminant…).
    Invalid,
    /// `init` returned an error or failed when re-instantiating.
    Init,
    /// The version is quarantined after repeated failures.
    Quarantined,
}

impl FailureKind {
    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Timeout => "timeout",
            FailureKind::Memory => "memory",
            FailureKind::Trap => "trap",
            FailureKind::Invalid => "invalid",
            FailureKind::Init => "init",
            FailureKind::Quarantined => "quarantined",
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// A failed call, with the detail for the log.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {detail}")]
pub struct CallFailure {
    pub kind: FailureKind,
    pub detail: String,
}

/// A message on one line, for admin answers, `GET /policies` and log fields:
/// whitespace runs (newlines of a wasm backtrace, the pretty-printed byte
/// arrays of wasmparser's messages) become one space.
pub(crate) fn one_line(message: impl AsRef<str>) -> String {
    let words: Vec<&str> = message.as_ref().split_whitespace().collect();
    words
        .join(" ")
        .replace("[ ", "[")
        .replace(", ]", "]")
        .replace(" ]", "]")
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn one_line_collapses_pretty_printed_arrays_and_backtraces() {
        let pretty = format!("bad magic number - expected={:#x?} actual=x", [0u8, 0x61]);
        assert!(pretty.contains('\n'));
        assert_eq!(
            one_line(pretty),
            "bad magic number - expected=[0x0, 0x61] actual=x"
        );
        assert_eq!(
            one_line("trap\nwasm backtrace:\n    0: f"),
            "trap wasm backtrace: 0: f"
        );
    }
}
