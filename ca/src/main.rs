//! `tidegate-ca`: the Istio CA protocol for clusters without istiod. Serves
//! until SIGTERM or SIGINT; `tidegate-ca --help` lists every flag and the
//! environment variable each reads.

#![forbid(unsafe_code)]

use std::time::Duration;

use clap::Parser;
use tidegate_ca::config::CaServerConfig;
use tokio::signal::unix::{signal, SignalKind};

/// How long the connections in flight get to finish at SIGTERM.
const GRACE: Duration = Duration::from_secs(5);

fn main() -> std::process::ExitCode {
    let cfg = CaServerConfig::parse();
    tidegate_base::logging::init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(serve(cfg)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tidegate-ca: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(cfg: CaServerConfig) -> anyhow::Result<()> {
    let (trigger, drain) = tidegate_base::shutdown::channel();
    let running = tidegate_ca::server::start(cfg, drain).await?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    trigger.start(GRACE);
    let _ = tokio::time::timeout(GRACE, running.task).await;
    Ok(())
}
