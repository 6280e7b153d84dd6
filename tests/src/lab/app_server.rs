//! The server pods' application: a real HTTP/1.1 server (hyper) that, like
//! a well-behaved app, keeps serving for `app_drain` after SIGTERM
//! (answering `Connection: close` on keep-alive connections from then on),
//! then stops accepting and exits as soon as its connections are idle.
//! It runs as its own process (`drain-lab app-server`), so the lab can
//! signal it and observe its exit as the kubelet would.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::process::Proc;
use super::LabError;

/// The port every server pod listens on.
pub const APP_PORT: u16 = 8080;

/// The app process: serves until SIGTERM + `drain`, then until idle.
pub fn serve(name: &str, drain: Duration) -> Result<(), LabError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| LabError::Setup(format!("app {name}: runtime: {e}")))?;
    rt.block_on(serve_async(name.to_owned(), drain))
}

async fn serve_async(name: String, drain: Duration) -> Result<(), LabError> {
    // Both families (`[::]`, dual-stack): the lab runs IPv4 or IPv6 pods.
    let addr = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, APP_PORT));
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| LabError::Setup(format!("app {name}: bind {addr}: {e}")))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| LabError::Setup(format!("app {name}: SIGTERM handler: {e}")))?;
    println!("ready");
    let terminating = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut served_after_term = 0u64;
    let mut stop_accepting_at: Option<tokio::time::Instant> = None;
    loop {
        let deadline = async {
            match stop_accepting_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = term.recv(), if stop_accepting_at.is_none() => {
                terminating.store(true, Ordering::Release);
                stop_accepting_at = Some(tokio::time::Instant::now() + drain);
                eprintln!("app {name}: SIGTERM, serving {drain:?} more");
            }
            _ = deadline => break,
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                if terminating.load(Ordering::Acquire) {
                    served_after_term += 1;
                }
                conns.spawn(connection(tcp, terminating.clone(), name.clone(), stop_rx.clone()));
            }
            Some(_) = conns.join_next() => {}
        }
    }
    // Stop accepting; idle keep-alive connections close now, busy ones after
    // their response.
    drop(listener);
    let open = conns.len();
    let _ = stop_tx.send(true);
    let idle_from = Instant::now();
    while conns.join_next().await.is_some() {}
    eprintln!(
        "app {name}: exiting ({served_after_term} connections accepted after SIGTERM; \
         {open} open at the end of the drain, idle after {:?})",
        idle_from.elapsed()
    );
    Ok(())
}

async fn connection(
    tcp: tokio::net::TcpStream,
    terminating: Arc<AtomicBool>,
    name: String,
    mut stop: watch::Receiver<bool>,
) {
    let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
        let close = terminating.load(Ordering::Acquire);
        let name = name.clone();
        async move {
            let mut resp = Response::builder().header("content-type", "text/plain");
            if close {
                resp = resp.header("connection", "close");
            }
            Ok::<_, Infallible>(
                resp.body(Full::new(Bytes::from(format!("ok from {name}\n"))))
                    .expect("static response"),
            )
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(tcp), svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = stop.wait_for(|s| *s) => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

/// A server pod's app process, seen from the lab.
pub struct AppPod {
    pub proc: Proc,
}

impl AppPod {
    /// Starts `drain-lab app-server` (this same executable) in `ns` and waits
    /// until it listens.
    pub async fn start(
        ns: &str,
        name: &str,
        drain: Duration,
        log: &std::path::Path,
    ) -> Result<AppPod, LabError> {
        let exe =
            std::env::current_exe().map_err(|e| LabError::Setup(format!("current_exe: {e}")))?;
        let log_file = std::fs::File::create(log)
            .map_err(|e| LabError::Setup(format!("create {}: {e}", log.display())))?;
        let mut cmd = Command::new(exe);
        cmd.args(["app-server", "--name", name, "--app-drain-ms"])
            .arg(drain.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file);
        let (proc, mut child) = Proc::spawn(&format!("app {name}"), ns, cmd)?;
        let stdout = child.stdout.take().expect("piped");
        let ready = tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            line
        });
        match tokio::time::timeout(Duration::from_secs(10), ready).await {
            Ok(Ok(line)) if line.trim() == "ready" => Ok(AppPod { proc }),
            _ => Err(LabError::Setup(format!(
                "app {name} did not start (see {})",
                log.display()
            ))),
        }
    }
}
