//! `drain-lab`: the drain lab (see `tidegate_e2e::lab`); `cargo xtask lab`
//! builds what it needs and runs it. Needs root.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tidegate_e2e::lab::{self, params::Params, LabError};

#[derive(Parser)]
#[command(
    name = "drain-lab",
    about = "Measure what each drain policy does in network namespaces, under load",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    role: Option<Role>,
    #[command(flatten)]
    params: Params,
}

#[derive(Subcommand)]
enum Role {
    /// The server pods' HTTP app (started by the lab inside a pod namespace).
    #[command(hide = true)]
    AppServer {
        #[arg(long)]
        name: String,
        #[arg(long)]
        app_drain_ms: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.role {
        Some(Role::AppServer { name, app_drain_ms }) => {
            lab::app_server::serve(&name, Duration::from_millis(app_drain_ms))
        }
        None => run_lab(&cli.params),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("drain-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_lab(p: &Params) -> Result<(), LabError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("LAB_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    lab::preflight(p)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| LabError::Setup(format!("runtime: {e}")))?;
    // Ctrl-C or SIGTERM drops the run: every process is killed and every
    // namespace deleted by the guards' Drop.
    let rows = rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| LabError::Setup(format!("SIGTERM handler: {e}")))?;
        tokio::select! {
            rows = lab::run(p) => rows,
            _ = tokio::signal::ctrl_c() => Err(LabError::Interrupted),
            _ = term.recv() => Err(LabError::Interrupted),
        }
    });
    // Cancelled tasks on the namespace threads end with the runtime.
    rt.shutdown_timeout(Duration::from_secs(5));
    let rows = rows?;
    let section = lab::section(p, &rows);
    println!("{section}");
    if p.write_doc {
        lab::report::write_doc(lab::doc_path(), &section)?;
        println!("(docs/drain-lab.md updated)");
    }
    if p.check {
        lab::check(&rows)?;
        println!("drain-lab check: ok");
    }
    Ok(())
}
