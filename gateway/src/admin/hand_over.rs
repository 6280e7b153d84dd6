//! One gateway per node, seen from the admin port.
//!
//! - `GET /version`: who answers here (version, commit, pid, node); a
//!   second gateway names the holder of the node's ports with it.
//! - `POST /hand-over[?pid=N]`: a gateway started with `tidegate run
//!   --take-over` asks this one to release its admin, metrics and readiness
//!   listeners. They close (requests already in, this one included, are
//!   answered); the answer comes once all three are closed, so the caller
//!   can bind them. The data path is not touched: its listeners share their
//!   ports with the new gateway (SO_REUSEPORT) and this gateway serves until
//!   it is stopped, as in any upgrade.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use tidegate_base::shutdown::{self, ShutdownTrigger, ShutdownWatch};
use tracing::warn;

use super::{json_response, text, AdminState, Body};

/// How long the listeners may take to close once released.
const RELEASE_WITHIN: Duration = Duration::from_secs(5);

/// The admin, metrics and readiness servers' second stop signal (the first
/// is the end of the gateway's shutdown), and how many have closed.
pub struct HandOver {
    release: ShutdownTrigger,
    watch: ShutdownWatch,
    closed: tokio::sync::watch::Sender<usize>,
    handed_over: AtomicBool,
}

impl Default for HandOver {
    fn default() -> Self {
        let (release, watch) = shutdown::channel();
        HandOver {
            release,
            watch,
            closed: tokio::sync::watch::Sender::new(0),
            handed_over: AtomicBool::new(false),
        }
    }
}

impl HandOver {
    /// Fires when the listeners are handed over.
    pub fn released(&self) -> ShutdownWatch {
        self.watch.clone()
    }

    /// A control server has closed its listener (handed over, or shut down).
    pub fn closed(&self) {
        self.closed.send_modify(|n| *n += 1);
    }

    /// Whether this gateway's control ports went to another one.
    pub fn handed_over(&self) -> bool {
        self.handed_over.load(Ordering::Acquire)
    }
}

/// The identity `GET /version` answers (and `POST /hand-over` with it).
fn identity(state: &AdminState) -> serde_json::Value {
    let info = crate::build_info::BuildInfo::get();
    json!({
        "version": info.version,
        "commit": info.commit,
        "profile": info.profile,
        "pid": std::process::id(),
        "node": state.node,
        "handed_over": state.hand_over.handed_over(),
    })
}

/// `GET /version`.
pub(super) fn version(state: &AdminState) -> Response<Body> {
    json_response(identity(state))
}

/// `POST /hand-over`: closes the admin, metrics and readiness listeners
/// (`listeners`: how many this gateway serves), answers once they are.
pub(super) async fn post(
    state: Arc<AdminState>,
    req: Request<Incoming>,
    listeners: usize,
) -> Response<Body> {
    let by = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("pid=")))
        .and_then(|p| p.parse::<u32>().ok());
    let ho = &state.hand_over;
    ho.handed_over.store(true, Ordering::Release);
    warn!(
        to_pid = by,
        "handing the admin, metrics and readiness ports over (tidegate run --take-over); \
         the data path serves on until this gateway is stopped"
    );
    ho.release.start(Duration::ZERO);
    let mut closed = ho.closed.subscribe();
    let all = tokio::time::timeout(RELEASE_WITHIN, closed.wait_for(|n| *n >= listeners)).await;
    match all {
        Ok(Ok(_)) => json_response(identity(&state)),
        _ => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "the admin, metrics and readiness listeners did not close within {}s\n",
                RELEASE_WITHIN.as_secs()
            ),
        ),
    }
}
