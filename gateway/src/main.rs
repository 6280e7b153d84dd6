//! The `tidegate` binary: parses the command line ([`tidegate::cli`]) and runs the
//! one command it names.

#![forbid(unsafe_code)]

use clap::Parser;
use tidegate::cli::{exit, Cli, Command, PolicyCommand};

/// jemalloc: see [`tidegate::allocator`].
#[global_allocator]
static ALLOCATOR: tidegate::Allocator = tidegate::ALLOCATOR;

fn main() -> std::process::ExitCode {
    // A usage error (and `tidegate` alone, which prints the help) exits 2.
    let cli = Cli::parse();
    tidegate_base::logging::init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = runtime.block_on(run(cli));
    // `tidegate connect` reads stdin on a blocking thread that no stream end
    // can interrupt; dropping the runtime would wait for it forever.
    runtime.shutdown_background();
    match result {
        Ok(()) => std::process::ExitCode::from(exit::OK),
        Err(e) => {
            eprintln!("tidegate: {}", error_line(&e));
            std::process::ExitCode::from(exit::code(&e))
        }
    }
}

/// The error and its causes on one line, each cause once: our errors name
/// their source in their own message (`cannot read config file …: No such
/// file`), which anyhow's `{:#}` would print a second time.
fn error_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !line.contains(&cause) {
            line.push_str(": ");
            line.push_str(&cause);
        }
    }
    line
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    if let Command::Version(args) = &cli.command {
        print!("{}", tidegate::cli::version::render(args.output));
        return Ok(());
    }
    // Every other command reads the same config `run` would use
    // (`--config`, `TIDEGATE_*`, `--set`, else the embedded default): the
    // admin address, the plugins' limits.
    let mut config = match &cli.command {
        Command::Proxy(_) => cli.config.load_as_ztunnel()?,
        _ => cli.config.load()?,
    };
    let configured_admin = config.listeners.admin;
    let admin = move |given: Option<std::net::SocketAddr>| given.unwrap_or(configured_admin);
    match cli.command {
        Command::Run(args) => {
            config.listeners.take_over = args.take_over;
            let demo = config.demo.is_some();
            let app = tidegate::app::build(config).await?;
            if demo {
                print_next_steps(&app);
            }
            app.run_until_signal().await
        }
        Command::Proxy(_) => tidegate::app::build(config).await?.run_until_signal().await,
        Command::Connect(args) => tidegate::cli::connect::run(config, *args).await,
        Command::Workloads(args) => {
            let out = tidegate::cli::workload_table::fetch(
                admin(args.read.admin),
                args.workload.as_deref(),
                args.read.output,
            )?;
            print!("{out}");
            Ok(())
        }
        Command::Drains(args) => {
            print!(
                "{}",
                tidegate::cli::drains_table::fetch(admin(args.admin), args.output)?
            );
            Ok(())
        }
        Command::Config(args) => {
            print!(
                "{}",
                tidegate::cli::config_view::fetch(
                    admin(args.read.admin),
                    args.section,
                    args.read.output
                )?
            );
            Ok(())
        }
        Command::Drain(args) => {
            let out = tidegate::cli::workload_ops::drain(admin(args.admin), &args)?;
            println!("{out}");
            Ok(())
        }
        Command::Bind(args) => {
            let out = tidegate::cli::workload_ops::bind(admin(args.admin), &args)?;
            println!("{out}");
            Ok(())
        }
        Command::Unbind(args) => {
            let out = tidegate::cli::workload_ops::unbind(admin(args.admin), &args)?;
            println!("{out}");
            Ok(())
        }
        Command::Policy(PolicyCommand::Upload(args)) => {
            let out = tidegate::cli::policy_ops::upload(admin(args.admin), &args)?;
            println!("{out}");
            Ok(())
        }
        Command::Policy(PolicyCommand::List(args)) => {
            print!(
                "{}",
                tidegate::cli::policy_ops::list(admin(args.admin), args.output)?
            );
            Ok(())
        }
        Command::Policy(cmd) => policy(cmd, &config.policies),
        Command::Version(_) => unreachable!("answered above"),
    }
}

/// `tidegate policy test|check`: prints the report; a failure is the error (exit 1).
fn policy(
    cmd: PolicyCommand,
    limits: &tidegate_policy_host::config::PoliciesConfig,
) -> anyhow::Result<()> {
    let result = match cmd {
        PolicyCommand::Test { plugin, trace } => {
            tidegate_policy_host::trace::test(&plugin, &trace, limits)
        }
        PolicyCommand::Check {
            plugin,
            policy_config,
        } => tidegate_policy_host::trace::check(&plugin, &policy_config, limits),
        PolicyCommand::Upload(_) | PolicyCommand::List(_) => {
            unreachable!("answered by the admin API")
        }
    };
    match result {
        Ok(report) => {
            println!("{report}");
            Ok(())
        }
        Err(e) => anyhow::bail!("{e}"),
    }
}

fn print_next_steps(app: &tidegate::app::App) {
    // Listeners on 0.0.0.0 are reachable on loopback; print addresses one can paste.
    let local = |a: std::net::SocketAddr| {
        if a.ip().is_unspecified() {
            std::net::SocketAddr::from(([127, 0, 0, 1], a.port()))
        } else {
            a
        }
    };
    let a = &app.addrs;
    let echo = a.demo_echo.map(|e| e.to_string()).unwrap_or_default();
    let me = this_binary();
    eprintln!(
        "\ntidegate is running on the embedded default (demo workloads, development CA).\n\
         Try, in another terminal:\n\
         \n  echo hello | {me} connect --to {echo}\n\
         \n  echo hi | {me} connect --to 127.0.0.10:80     # the Service `echo`: one of its two endpoints\n\
         \n  {me} workloads     # each workload's state and drain policy, and why\n\
         \n  curl -s http://{admin}/config_dump     # workloads, tunnels, pool\n\
         \n  curl -s http://{admin}/policies        # loaded policies, versions, calls\n\
         \n  curl -s http://{metrics}/metrics        # Prometheus metrics\n\
         \n  curl -s http://{ready}/healthz/ready\n\
         \nCtrl-C drains and stops.\n",
        admin = local(a.admin),
        metrics = local(a.metrics),
        ready = local(a.readiness),
    );
}

/// How to run this binary again from the current directory: `tidegate`
/// when it is the one on PATH, else its path (relative when below the
/// current directory, as `target/debug/tidegate` is for `cargo xtask demo`).
fn this_binary() -> String {
    let Ok(exe) = std::env::current_exe() else {
        return "tidegate".into();
    };
    let on_path = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("tidegate") == exe));
    if on_path {
        return "tidegate".into();
    }
    std::env::current_dir()
        .ok()
        .and_then(|cwd| exe.strip_prefix(cwd).ok().map(|p| p.display().to_string()))
        .unwrap_or_else(|| exe.display().to_string())
}
