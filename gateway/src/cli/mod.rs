//! Command-line interface. `main` parses this and calls one function:
//! [`connect`] (`tidegate connect`),
//! [`workload_ops`] (`tidegate drain|bind|unbind`, over [`admin_api`]),
//! [`workload_table`] (`tidegate workloads`).

pub mod admin_api;
pub mod connect;
pub mod workload_ops;
pub mod workload_table;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, ConfigError};
use tidegate_protocol::identity::SpiffeId;

#[derive(Debug, Parser)]
#[command(
    name = "tidegate",
    version,
    about = "Per-node HBONE gateway with WebAssembly drain policies"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
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
    /// Run the gateway (the default).
    Run,
    /// Pipe stdin/stdout through an HBONE tunnel to a workload (nc over HBONE).
    Connect(Box<ConnectArgs>),
    /// Show each workload of a running gateway with its drain policy and why.
    Workloads(WorkloadsArgs),
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
}

#[derive(Debug, Clone, Args)]
pub struct WorkloadsArgs {
    /// Only workloads whose uid, name, namespace/name or IP is this.
    pub workload: Option<String>,
    /// The gateway's admin address; default: `listeners.admin` of the config.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
}

#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Calls POST /workloads/<WORKLOAD>/shutdown-starting on the admin API \
and prints the policy's decision. Exits 1 with the gateway's reason if it refuses."
)]
pub struct DrainArgs {
    /// The workload: its uid, or namespace/name (one workload of this node).
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
    /// The workload: its uid, or namespace/name (one workload of this node).
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
    /// The workload: its uid, or namespace/name (one workload of this node).
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
                cfg
            }
        }
    }
}
