//! What every control-plane listener shares — the admin (127.0.0.1:15000),
//! metrics (15020) and readiness (15021) HTTP servers, the CNI socket and
//! `tidegate-ca`'s listeners: a connection cap per listener, a pause after
//! accept errors (10 ms doubling to 100 ms, logged at most once a second),
//! their metrics, and the descriptor budget that keeps the data path's reserve.
//!
//! **Descriptor budget.** At start the open-file soft limit is raised to the
//! hard limit (both logged). The control plane may hold at most
//! `3 × control_plane.max_connections` (HTTP listeners) +
//! `control_plane.cni_max_connections` (CNI socket, when configured) +
//! [`FIXED_DESCRIPTORS`] (listeners, files, the runtime) descriptors, and
//! start-up refuses a configuration whose budget exceeds half the limit: the
//! other half at least is the data path's, which no control-plane peer can
//! take. With the defaults the budget is 416. The inbound connection caps
//! are derived from the data path's share (`proxy/inbound/limits.rs`), so no
//! data-path peer can take the control plane's either.
//!
//! It imports only the config section ([`crate::config`]).

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tracing::{info, warn};

use tidegate_base::shutdown::ShutdownWatch;
use tidegate_base::sync::Locked;

use crate::config::ControlPlaneConfig;

/// After a failed accept (EMFILE, ENFILE, ENOBUFS…) the loop waits instead
/// of spinning on an error that will not clear by itself: this long after
/// the first failure, doubling with each further one in a row up to
/// [`ACCEPT_ERROR_PAUSE`].
pub const ACCEPT_ERROR_FIRST_PAUSE: Duration = Duration::from_millis(10);

/// The longest pause after failed accepts.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Failed accepts of one listener are logged at most this often (the
/// first at once; the next with the number left unlogged meanwhile).
pub const ACCEPT_ERROR_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Descriptors the control plane holds besides its connections: its
/// listeners, the workload, certificate and plugin files being read, the
/// runtime's epoll and event descriptors, the Kubernetes client's connections.
pub const FIXED_DESCRIPTORS: u64 = 64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    listener: &'static str,
    reason: &'static str,
}

/// `tidegate_control_*`: connections open, refused and timed out, accept
/// errors, by listener (`admin`, `metrics`, `readiness`, `cni`).
#[derive(Clone, Debug, Default)]
pub struct ControlMetrics {
    open: Family<ListenerLabels, Gauge>,
    refusals: Family<RefusalLabels, Counter>,
    accept_errors: Family<ListenerLabels, Counter>,
}

impl ControlMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = ControlMetrics::default();
        registry.register(
            "control_connections_open",
            "Connections open on a control-plane listener",
            m.open.clone(),
        );
        registry.register(
            "control_refusals",
            "Control-plane connections closed by the gateway, by listener and reason \
             (over_capacity, evicted: idle the longest when a new one came to a full listener, \
             header_timeout, read_timeout, line_too_long, bad_request)",
            m.refusals.clone(),
        );
        registry.register(
            "control_accept_errors",
            "Failed accepts on a control-plane listener (each followed by a pause)",
            m.accept_errors.clone(),
        );
        m
    }
}

/// One listener's connection cap and metrics.
#[derive(Clone, Debug)]
pub struct ConnLimit {
    listener: &'static str,
    max: u32,
    permits: Arc<Semaphore>,
    metrics: ControlMetrics,
    accept_errors: Arc<Mutex<AcceptErrors>>,
}

/// Failed accepts in a row: the next pause and the log's rate limit.
#[derive(Debug, Default)]
struct AcceptErrors {
    /// Failures since the last successful accept.
    in_a_row: u32,
    last_logged: Option<tokio::time::Instant>,
    /// Failures not logged since `last_logged`.
    unlogged: u64,
}

impl AcceptErrors {
    /// Counts a failure; returns the pause, and whether to log it with
    /// the number of failures left unlogged before it.
    fn failed(&mut self, now: tokio::time::Instant) -> (Duration, Option<u64>) {
        let pause = ACCEPT_ERROR_FIRST_PAUSE
            .saturating_mul(1 << self.in_a_row.min(16))
            .min(ACCEPT_ERROR_PAUSE);
        self.in_a_row = self.in_a_row.saturating_add(1);
        let due = self
            .last_logged
            .is_none_or(|at| now.duration_since(at) >= ACCEPT_ERROR_LOG_INTERVAL);
        if !due {
            self.unlogged += 1;
            return (pause, None);
        }
        self.last_logged = Some(now);
        (pause, Some(std::mem::take(&mut self.unlogged)))
    }
}

/// An admitted connection: holds its slot until dropped.
#[derive(Debug)]
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
    _open: Open,
}

/// Counts a connection in `tidegate_control_connections_open` until dropped.
#[derive(Debug)]
pub struct Open(Gauge);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl ConnLimit {
    pub fn new(listener: &'static str, max: u32, metrics: &ControlMetrics) -> ConnLimit {
        // Registered at 0 so the series exist before the first refusal.
        let _ = metrics.open.get_or_create(&ListenerLabels { listener });
        ConnLimit {
            listener,
            max,
            permits: Arc::new(Semaphore::new(max as usize)),
            metrics: metrics.clone(),
            accept_errors: Arc::default(),
        }
    }

    pub fn listener(&self) -> &'static str {
        self.listener
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max as usize
    }

    /// Counts a connection as open (the HTTP listeners keep their own
    /// slots: `crate::slots`).
    pub fn open(&self) -> Open {
        let open = self
            .metrics
            .open
            .get_or_create(&ListenerLabels {
                listener: self.listener,
            })
            .clone();
        open.inc();
        Open(open)
    }

    /// A slot for a connection just accepted, or `None` — counted as
    /// `over_capacity` — when the listener is full: the caller drops the
    /// connection at once.
    pub fn admit(&self) -> Option<Admitted> {
        self.accept_errors.locked().in_a_row = 0;
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => Some(Admitted {
                _permit: permit,
                _open: self.open(),
            }),
            Err(_) => {
                self.refused("over_capacity");
                None
            }
        }
    }

    /// Counts a connection the gateway closed, with its reason.
    pub fn refused(&self, reason: &'static str) {
        self.metrics
            .refusals
            .get_or_create(&RefusalLabels {
                listener: self.listener,
                reason,
            })
            .inc();
    }

    /// Counts a failed accept, logs it (at most once a second), then
    /// pauses (10 ms doubling to 100 ms while failures go on): EMFILE does
    /// not clear by retrying at once, and spinning on it took a whole core
    /// and wrote hundreds of thousands of log lines a second.
    pub async fn accept_failed(&self, e: &io::Error) {
        self.metrics
            .accept_errors
            .get_or_create(&ListenerLabels {
                listener: self.listener,
            })
            .inc();
        let (pause, log) = self
            .accept_errors
            .locked()
            .failed(tokio::time::Instant::now());
        if let Some(unlogged) = log {
            warn!(listener = self.listener, error = %e, pause = ?pause, unlogged_since_last_line = unlogged, "accept failed; pausing");
        }
        tokio::time::sleep(pause).await;
    }

    /// The listener's next connection (`accept` is its accept call), with
    /// a failed accept counted and paused on ([`ConnLimit::accept_failed`]);
    /// `None` once `drain` fires.
    pub async fn accept<T, Fut>(
        &self,
        mut accept: impl FnMut() -> Fut,
        drain: &mut ShutdownWatch,
    ) -> Option<T>
    where
        Fut: std::future::Future<Output = io::Result<T>>,
    {
        loop {
            tokio::select! {
                a = accept() => match a {
                    Ok(a) => return Some(a),
                    Err(e) => self.accept_failed(&e).await,
                },
                _ = drain.signaled() => return None,
            }
        }
    }
}

/// Descriptors the control plane may hold with this configuration.
pub fn budget(cfg: &ControlPlaneConfig, cni_socket: bool) -> u64 {
    3 * u64::from(cfg.max_connections)
        + if cni_socket {
            u64::from(cfg.cni_max_connections)
        } else {
            0
        }
        + FIXED_DESCRIPTORS
}

#[derive(Debug, thiserror::Error)]
#[error(
    "the control plane may hold {budget} descriptors, more than half of the open-file limit \
     {limit}: the data path would be left too few; lower control_plane.max_connections / \
     control_plane.cni_max_connections or raise the limit (ulimit -n, LimitNOFILE)"
)]
pub struct BudgetError {
    pub budget: u64,
    pub limit: u64,
}

/// Raises the open-file soft limit to the hard limit, logs both, and checks
/// that the control plane's `budget` leaves at least half of it to the data
/// path. Returns the descriptors left to the data path (the limit less the
/// budget; `None` when the limit cannot be read, which is logged and not
/// fatal; a limit that cannot be raised is logged and used as it is).
pub fn reserve_descriptors(budget: u64) -> Result<Option<u64>, BudgetError> {
    let (before, hard) = match rlimit::getrlimit(rlimit::Resource::NOFILE) {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %e, "cannot read the open-file limit");
            return Ok(None);
        }
    };
    let soft = match rlimit::increase_nofile_limit(hard) {
        Ok(soft) => soft,
        Err(e) => {
            warn!(error = %e, soft = before, hard, "cannot raise the open-file limit");
            before
        }
    };
    info!(
        soft_before = before,
        soft,
        hard,
        control_plane_budget = budget,
        data_path_reserve = soft.saturating_sub(budget),
        "open-file limit"
    );
    if budget.saturating_mul(2) > soft {
        return Err(BudgetError {
            budget,
            limit: soft,
        });
    }
    Ok(Some(soft.saturating_sub(budget)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_refuses_and_counts_and_frees_slots_on_drop() {
        let mut registry = Registry::default();
        let m = ControlMetrics::register(&mut registry);
        let limit = ConnLimit::new("metrics", 2, &m);
        let a = limit.admit().unwrap();
        let _b = limit.admit().unwrap();
        assert!(limit.admit().is_none());
        drop(a);
        assert!(limit.admit().is_some());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"control_refusals_total{listener="metrics",reason="over_capacity"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"control_connections_open{listener="metrics"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn failed_accepts_pause_longer_in_a_row_and_are_logged_at_most_once_a_second() {
        let mut errors = AcceptErrors::default();
        let t0 = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        // A burst of 1,000 failures within the first second: pauses grow
        // to the cap, one line logged.
        let mut pauses = Vec::new();
        let mut logged = Vec::new();
        for i in 0..1000 {
            let (pause, log) = errors.failed(t0 + ms(i / 2));
            pauses.push(pause);
            logged.extend(log);
        }
        assert_eq!(&pauses[..5], [ms(10), ms(20), ms(40), ms(80), ms(100)]);
        assert!(pauses[5..].iter().all(|p| *p == ACCEPT_ERROR_PAUSE));
        assert_eq!(logged, [0], "the first failure only");
        // A second on: one line, with the count left out meanwhile.
        let (_, log) = errors.failed(t0 + ms(1000));
        assert_eq!(log, Some(999));
    }

    #[test]
    fn a_successful_accept_starts_the_pauses_over() {
        let limit = ConnLimit::new("admin", 1, &ControlMetrics::default());
        let t0 = tokio::time::Instant::now();
        let failed = || limit.accept_errors.locked().failed(t0).0;
        assert_eq!(failed(), Duration::from_millis(10));
        assert_eq!(failed(), Duration::from_millis(20));
        let _slot = limit.admit().unwrap();
        assert_eq!(failed(), Duration::from_millis(10));
    }

    #[tokio::test]
    async fn a_failed_accept_is_counted() {
        let mut registry = Registry::default();
        let m = ControlMetrics::register(&mut registry);
        let limit = ConnLimit::new("admin", 1, &m);
        limit
            .accept_failed(&io::Error::from_raw_os_error(24)) // EMFILE
            .await;
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"control_accept_errors_total{listener="admin"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn the_default_budget_is_small_and_fixed() {
        let cfg = ControlPlaneConfig::default();
        assert_eq!(budget(&cfg, true), 416, "update the module doc and README");
        assert_eq!(budget(&cfg, false), 160);
        // The largest allowed caps still fit a common limit (1,048,576) many times over.
        let max = ControlPlaneConfig {
            max_connections: crate::config::CONTROL_PLANE_MAX_CONNECTIONS as u32,
            cni_max_connections: crate::config::CONTROL_PLANE_MAX_CONNECTIONS as u32,
            ..cfg
        };
        assert_eq!(budget(&max, true), 4 * 1024 + FIXED_DESCRIPTORS);
    }
}
