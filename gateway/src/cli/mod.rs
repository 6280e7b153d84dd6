//! Command-line interface. `main` parses this and calls one function:
//! [`connect`] (`tidegate connect`),
//! [`workload_ops`] (`tidegate drain|bind|unbind`, over [`admin_api`]),
//! [`workload_table`] (`tidegate workloads`), [`drains_table`]
//! (`tidegate drains`), [`policy_ops`] (`tidegate policy upload|list`),
//! [`config_view`] (`tidegate config workloads|services|policies|certificates`),
//! [`version`] (`tidegate version`); [`output`]: `-o table|json|yaml`;
//! [`exit`]: the exit codes.
//!
//! `tidegate` alone prints the help and exits 2: the gateway starts only
//! with `tidegate run`.

pub mod admin_api;
pub mod config_view;
pub mod connect;
pub mod drains_table;
pub mod exit;
pub mod output;
pub mod policy_ops;
pub mod version;
pub mod workload_ops;
pub mod workload_table;

pub use output::Output;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, ConfigError, ControlPlaneKind};
use tidegate_protocol::identity::SpiffeId;

#[derive(Debug, Parser)]
#[command(
    name = "tidegate",
    version,
    about = "Per-node HBONE gateway with WebAssembly drain policies",
    arg_required_else_help = true,
    subcommand_required = true,
    after_help = "`tidegate run` starts the gateway (nothing else does). Exit codes: 0 done, \
1 the operation failed (a refusal prints the gateway's reason), 2 usage error (this help \
included), 3 the gateway's admin API is unreachable."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub config: ConfigArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// Config file (YAML). Without it, the embedded default (demo workloads, dev CA, echo backend).
    #[arg(long, short = 'c', env = "TIDEGATE_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// Override a config key, e.g. `--set listeners.admin=127.0.0.1:16000` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE", global = true)]
    pub sets: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway (one per node: refuses when another holds the admin, metrics or
    /// readiness port, unless --take-over).
    Run(RunArgs),
    /// Pipe stdin/stdout through an HBONE tunnel to a workload (nc over HBONE).
    Connect(Box<ConnectArgs>),
    /// Show each workload of a running gateway with its drain policy and why.
    Workloads(WorkloadsArgs),
    /// Show the drains of a running gateway: its workloads' and its peers'.
    Drains(ReadArgs),
    /// Show what istiod's resources became on a running gateway, in ztunnel's shape
    /// (the sections `istioctl ztunnel-config` reads from /config_dump).
    Config(ConfigViewArgs),
    /// Print this binary's version, commit, profile and the protocol versions it speaks.
    Version(VersionArgs),
    /// Start a workload's drain on a running gateway: its shutdown starts, its policy decides.
    Drain(DrainArgs),
    /// Bind a workload to a loaded policy at run time (above its annotation and the configured
    /// bindings; used by its next drain; not kept across restarts).
    Bind(BindArgs),
    /// Remove a workload's run-time binding (`tidegate bind`).
    Unbind(UnbindArgs),
    /// Work with drain-policy plugins without starting the gateway.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// `proxy ztunnel`: the arguments ztunnel's DaemonSet passes (Cilium's keeps them
    /// when its image is overridden). Runs the gateway as `run` does, with
    /// `control_plane: cilium` unless a layer names another, and no embedded default file.
    #[command(hide = true)]
    Proxy(ProxyArgs),
}

/// `tidegate proxy ztunnel`.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// The component ztunnel's binary runs: only `ztunnel`.
    #[arg(value_parser = ["ztunnel"])]
    pub component: String,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Play a trace (events and expected actions) against a plugin in the real host.
    Test {
        /// The plugin component (.wasm).
        plugin: PathBuf,
        /// The trace file (YAML; format in sdk/README.md).
        trace: PathBuf,
    },
    /// Validate a plugin as a hot swap would: contract version, imports, init, self-test event.
    Check {
        /// The plugin component (.wasm).
        plugin: PathBuf,
        /// Configuration passed to the plugin's init (e.g. JSON).
        #[arg(long, default_value = "")]
        policy_config: String,
    },
    /// Upload a plugin to a running gateway (PUT /policies/NAME): validated, then swapped in.
    Upload(UploadArgs),
    /// List a running gateway's policies: version, source, calls, failures.
    List(ReadArgs),
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Take the admin, metrics and readiness ports over from the gateway holding them
    /// (it is asked to release them; its data path serves on until it is stopped),
    /// instead of refusing to start. For upgrades: the data listeners share their ports
    /// (SO_REUSEPORT) either way.
    #[arg(long)]
    pub take_over: bool,
}

/// A read of a running gateway: where, and in which form.
#[derive(Debug, Clone, Args)]
pub struct ReadArgs {
    /// The gateway's admin address; default: `listeners.admin` of the config.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
    /// Output form (json and yaml keys: docs/cli.md).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Debug, Clone, Args)]
pub struct ConfigViewArgs {
    /// The section of /config_dump: workloads, services, policies or certificates.
    #[arg(value_enum)]
    pub section: config_view::Section,
    #[command(flatten)]
    pub read: ReadArgs,
}

#[derive(Debug, Clone, Args)]
pub struct VersionArgs {
    /// Output form (json and yaml keys: docs/cli.md).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Exits 1 with the gateway's reason if it refuses the plugin (the \
previous version, if any, stays loaded)."
)]
pub struct UploadArgs {
    /// The policy's name (1-64 letters, digits, '-' or '_').
    pub name: String,
    /// The plugin component (.wasm).
    pub file: PathBuf,
    /// Configuration passed to the plugin's init (e.g. JSON), as `policy check` takes it.
    #[arg(long, value_name = "JSON")]
    pub policy_config: Option<String>,
    /// The gateway's admin address; default: `listeners.admin` of the config.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
}

#[derive(Debug, Clone, Args)]
pub struct WorkloadsArgs {
    /// Only this workload: its uid, namespace/name, IP, or name (when one workload has it).
    pub workload: Option<String>,
    #[command(flatten)]
    pub read: ReadArgs,
}

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Calls POST /workloads/<WORKLOAD>/shutdown-starting on the admin API \
and prints the policy's decision. Exits 1 with the gateway's reason if it refuses."
)]
pub struct DrainArgs {
    /// The workload: its uid, namespace/name, IP, or name (one workload of this node).
    pub workload: String,
    /// The grace period the policy is told (e.g. 30s, 2m; 0s to 24h); default `drains.default_grace`.
    #[arg(long, value_name = "DURATION")]
    pub grace: Option<String>,
    /// The gateway's admin address; default: `listeners.admin` of the config.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
}

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Calls PUT /workloads/<WORKLOAD>/policy on the admin API and prints \
the workload's policy and why. Exits 1 with the gateway's reason if it refuses (no such \
workload, no policy of that name loaded)."
)]
pub struct BindArgs {
    /// The workload: its uid, namespace/name, IP, or name (one workload of this node).
    pub workload: String,
    /// A loaded policy's name (`GET /policies` lists them).
    pub policy: String,
    /// The gateway's admin address; default: `listeners.admin` of the config.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
}

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Calls DELETE /workloads/<WORKLOAD>/policy on the admin API and prints \
the policy the workload has again. Exits 1 with the gateway's reason if it refuses."
)]
pub struct UnbindArgs {
    /// The workload: its uid, namespace/name, IP, or name (one workload of this node).
    pub workload: String,
    /// The gateway's admin address; default: `listeners.admin` of the config.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
}

#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// Destination: a workload address, or a Service VIP:port (one of its endpoints).
    #[arg(long)]
    pub to: SocketAddr,
    /// Identity to connect as (needs a certificate from the configured source).
    #[arg(long = "as", value_name = "SPIFFE_ID")]
    pub as_identity: Option<SpiffeId>,
    /// HBONE address to dial; default `<to ip>:<hbone.port>`.
    #[arg(long)]
    pub via: Option<SocketAddr>,
    /// Identity the server must present; default: the workload's from the workload file.
    #[arg(long, value_name = "SPIFFE_ID")]
    pub server_identity: Option<SpiffeId>,
}

impl ConfigArgs {
    /// `tidegate proxy ztunnel`'s config: `--config` if given (else no
    /// file), ztunnel's variables, `TIDEGATE_*`, `--set`, with Cilium as
    /// the control plane unless one of them names another.
    pub fn load_as_ztunnel(&self) -> Result<Config, ConfigError> {
        Config::load_as(
            self.config.as_deref(),
            std::env::vars(),
            &self.sets,
            ControlPlaneKind::Cilium,
        )
    }

    /// The typed config: embedded default or `--config`, then `TIDEGATE_*`, then `--set`.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let env = std::env::vars();
        match &self.config {
            Some(path) => Config::load(Some(path), env, &self.sets),
            None => {
                let dir =
                    std::env::temp_dir().join(format!("tidegate-default-{}", std::process::id()));
                let _ = std::fs::create_dir_all(&dir);
                let path = dir.join("tidegate.yaml");
                std::fs::write(&path, crate::app::DEFAULT_CONFIG).map_err(|source| {
                    ConfigError::Read {
                        path: path.clone(),
                        source,
                    }
                })?;
                let cfg = Config::load(Some(&path), env, &self.sets);
                let _ = std::fs::remove_dir_all(&dir);
                let mut cfg = cfg?;
                reference_plugins_from_the_clone(&mut cfg, &built_from());
                Ok(cfg)
            }
        }
    }
}

/// The clone this binary was built from (`cargo install --path gateway`
/// and `target/debug/tidegate` alike).
fn built_from() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The embedded default names the reference plugins relative to the
/// current directory (`target/plugins/…`, where `cargo xtask demo` builds
/// them). Run elsewhere, a plugin missing there is taken from the clone the
/// binary was built from when it is there, so `tidegate run` loads the
/// reference policies from any directory.
fn reference_plugins_from_the_clone(cfg: &mut Config, clone: &std::path::Path) {
    for spec in cfg.policies.plugins.values_mut() {
        if spec.file.is_relative() && !spec.file.exists() {
            let there = clone.join(&spec.file);
            if there.exists() {
                spec.file = there;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_plugin_missing_here_is_taken_from_the_clone() {
        let clone = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(clone.path().join("target/plugins")).unwrap();
        let built = clone.path().join("target/plugins/recommended.wasm");
        std::fs::write(&built, b"wasm").unwrap();
        let mut cfg = ConfigArgs {
            config: None,
            sets: vec![],
        }
        .load()
        .unwrap();
        // As the embedded default names them (`load` already looked in the
        // clone this test binary was built from).
        for (name, spec) in cfg.policies.plugins.iter_mut() {
            spec.file = PathBuf::from(format!("target/plugins/{name}.wasm"));
        }
        reference_plugins_from_the_clone(&mut cfg, clone.path());
        let file = |name: &str| cfg.policies.plugins[name].file.clone();
        if !std::path::Path::new("target/plugins/recommended.wasm").exists() {
            assert_eq!(file("recommended"), built);
        }
        // Not built in the clone either: left as configured (its load error says so).
        if !std::path::Path::new("target/plugins/oci-drain.wasm").exists() {
            assert_eq!(
                file("oci-drain"),
                PathBuf::from("target/plugins/oci-drain.wasm")
            );
        }
    }
}
