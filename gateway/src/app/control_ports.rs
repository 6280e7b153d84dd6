//! One gateway per node: the admin, metrics and readiness ports answer for
//! one process, so they are bound exclusively (no SO_REUSEPORT, unlike the
//! data listeners) and first, before anything the running gateway serves is
//! touched. A second gateway started beside a running one refuses, naming
//! the port, the process `/proc` says holds it and what that process's admin
//! API says it is; with `tidegate run --take-over` it asks the running one
//! to hand its control ports over (`POST /hand-over`) and binds them — last,
//! once everything else of the new gateway is bound, so a new gateway that
//! fails to start leaves the running one its ports.
//!
//! The data listeners (HBONE, capture, the pods' own) keep SO_REUSEPORT:
//! during an upgrade the new gateway takes new connections beside the old
//! one, which drains and exits (`tests/tests/hbone/lifecycle.rs`).

use std::net::SocketAddr;

use tracing::{info, warn};

use super::listeners::HttpListeners;
use crate::cli::admin_api::{self, AdminError};
use crate::config::Config;
use crate::proxy::listener::{bind_exclusive, BindError};
use crate::proxy::port_holder::{self, Holder};

/// Why the control ports could not be had.
#[derive(Debug, thiserror::Error)]
pub enum ControlPortError {
    #[error(
        "cannot listen on {addr} for {what}: {source}; port {} is {holder}{answers}: stop it or \
         change `listeners.{what}`. One gateway per node: to take the admin, metrics and \
         readiness ports over from a running gateway, start this one with `tidegate run \
         --take-over`",
        .addr.port()
    )]
    Taken {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
        holder: Holder,
        /// What the admin API on `listeners.admin` says it is, if it answers.
        answers: String,
    },
    #[error(transparent)]
    Bind(BindError),
    #[error(
        "--take-over: the process on the admin port {admin} did not hand its ports over \
         (is it a tidegate gateway? `listeners.admin` must be the running one's): {source}"
    )]
    HandOver {
        admin: SocketAddr,
        source: AdminError,
    },
}

/// Binds admin, metrics and readiness; on a port in use, refuses — or,
/// with `take_over`, answers `None`: [`take_over`] runs once the rest of
/// the gateway is bound, so a start that fails on anything else leaves the
/// running gateway its control ports.
pub(super) async fn bind(config: &Config) -> Result<Option<HttpListeners>, ControlPortError> {
    let l = &config.listeners;
    match bind_all(ports(config)) {
        Ok(listeners) => Ok(Some(listeners)),
        Err(e) if in_use(&e) && l.take_over => Ok(None),
        Err(e) if in_use(&e) => Err(refusal(e, l.admin).await),
        Err(e) => Err(ControlPortError::Bind(e)),
    }
}

/// Has the gateway on `listeners.admin` release its control ports, then
/// binds them.
pub(super) async fn take_over(config: &Config) -> Result<HttpListeners, ControlPortError> {
    let l = &config.listeners;
    let from = blocking(l.admin, |addr| {
        let path = format!("/hand-over?pid={}", std::process::id());
        admin_api::call(addr, "POST", &path, b"")
    })
    .await
    .map_err(|source| ControlPortError::HandOver {
        admin: l.admin,
        source,
    })?;
    warn!(
        from_pid = from["pid"].as_u64(),
        from_version = from["version"].as_str(),
        "took the admin, metrics and readiness ports over (--take-over); the data listeners \
         share their ports with that gateway until it is stopped"
    );
    match bind_all(ports(config)) {
        Ok(listeners) => Ok(listeners),
        Err(e) if in_use(&e) => Err(refusal(e, l.admin).await),
        Err(e) => Err(ControlPortError::Bind(e)),
    }
}

fn ports(config: &Config) -> [(&'static str, SocketAddr); 3] {
    let l = &config.listeners;
    [
        ("admin", l.admin),
        ("metrics", l.metrics),
        ("readiness", l.readiness),
    ]
}

fn bind_all(ports: [(&'static str, SocketAddr); 3]) -> Result<HttpListeners, BindError> {
    let [a, m, r] = ports;
    Ok(HttpListeners {
        admin: bind_exclusive(a.0, a.1)?,
        metrics: bind_exclusive(m.0, m.1)?,
        readiness: bind_exclusive(r.0, r.1)?,
    })
}

fn in_use(e: &BindError) -> bool {
    e.source.kind() == std::io::ErrorKind::AddrInUse
}

/// The refusal for a port in use: its holder, and what the admin API
/// answers as (a gateway names its version and pid).
async fn refusal(e: BindError, admin: SocketAddr) -> ControlPortError {
    let holder = port_holder::find(e.addr);
    let answers = match blocking(admin, admin_api::identify).await {
        Ok(v) => format!(
            "; the admin API on {admin} answers as tidegate {} (commit {}, pid {}, node {})",
            v["version"].as_str().unwrap_or("?"),
            v["commit"].as_str().unwrap_or("?"),
            v["pid"].as_u64().unwrap_or_default(),
            v["node"].as_str().unwrap_or("?"),
        ),
        Err(_) => String::new(),
    };
    info!(port = e.addr.port(), %holder, "control port in use");
    ControlPortError::Taken {
        what: e.what,
        addr: e.addr,
        source: e.source,
        holder,
        answers,
    }
}

/// One admin API call (blocking I/O) off the runtime's threads.
async fn blocking<T: Send + 'static>(
    admin: SocketAddr,
    call: impl FnOnce(SocketAddr) -> Result<T, AdminError> + Send + 'static,
) -> Result<T, AdminError> {
    let addr = admin_api::dial_addr(admin);
    tokio::task::spawn_blocking(move || call(addr))
        .await
        .unwrap_or_else(|e| {
            Err(AdminError::Io {
                addr,
                source: std::io::Error::other(e.to_string()),
            })
        })
}
