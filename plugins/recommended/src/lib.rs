//! The recommended drain policy: drain-at-teardown + evict-on-delete +
//! backoff + OCI drain for workloads that opt in.
//!
//! - shutdown started: drain the OCI backends (per `oci-drain`); tunnels
//!   keep serving, since the app is still running.
//! - network teardown with inbound tunnels: GOAWAY (+ close_notify) and hold
//!   the teardown until they are idle or `hold-ms`, with an info log line.
//! - peer deleted: evict pooled tunnels to it now; peer terminating: per
//!   `on-peer-terminating`.
//! - connect failing `failure-threshold` times in a row: exponential
//!   backoff with jitter.
//!
//! Configuration (JSON object, every key optional):
//! - `hold-ms` (integer 0..=3600000, default 10000): longest teardown hold
//!   (also capped by the host's `max-hold-ms`) and the GOAWAY's hard deadline.
//! - `goaway-mode` (`"graceful"` or `"immediate"`, default `"graceful"`).
//! - `close-notify` (boolean, default true).
//! - `on-peer-terminating` (`"nothing"` or `"evict-when-idle"`, default
//!   `"nothing"`).
//! - `failure-threshold` (integer 1..=1000, default 3).
//! - `backoff-initial-ms` (integer 1..=600000, default 100).
//! - `backoff-max-ms` (integer 1..=600000, default 10000; not below
//!   `backoff-initial-ms`).
//! - `backoff-multiplier` (number 1.0..=10.0, default 2.0).
//! - `backoff-jitter` (number 0.0..=1.0, default 0.2).
//! - `oci-drain` (`"opt-in"`, `"always"` or `"never"`, default `"opt-in"`).
//! - `oci-opt-in-annotation` (non-empty string, default
//!   `"tidegate.io/oci-drain"`): value `"true"` opts a workload in.
//! - `oci-at-capacity` (`"keep"` or `"remove-early"`, default `"keep"`).

use tidegate_sdk::config::Config;
use tidegate_sdk::{
    export_policy, text, Action, AtCapacity, Backoff, Event, GoawayMode, LogLevel, MetadataReads,
    NetworkTeardown, Policy, WorkloadInfo,
};

const MAX_MS: u64 = 3_600_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OciMode {
    OptIn,
    Always,
    Never,
}

/// See the crate documentation.
#[derive(Debug)]
pub struct Recommended {
    hold_ms: u64,
    goaway_mode: GoawayMode,
    close_notify: bool,
    evict_on_terminating: bool,
    failure_threshold: u32,
    backoff: Backoff,
    oci: OciMode,
    oci_annotation: String,
    oci_at_capacity: AtCapacity,
}

impl Policy for Recommended {
    fn init(config: &str) -> Result<Self, String> {
        let mut c = Config::parse(config)?;
        let modes = [
            ("graceful", GoawayMode::Graceful),
            ("immediate", GoawayMode::Immediate),
        ];
        let terminating = [("nothing", false), ("evict-when-idle", true)];
        let oci_modes = [
            ("opt-in", OciMode::OptIn),
            ("always", OciMode::Always),
            ("never", OciMode::Never),
        ];
        let capacity = [
            ("keep", AtCapacity::Keep),
            ("remove-early", AtCapacity::RemoveEarly),
        ];
        let policy = Self {
            hold_ms: c.u64("hold-ms", 10_000, 0..=MAX_MS)?,
            goaway_mode: c.choice("goaway-mode", GoawayMode::Graceful, &modes)?,
            close_notify: c.bool("close-notify", true)?,
            evict_on_terminating: c.choice("on-peer-terminating", false, &terminating)?,
            failure_threshold: c.u32("failure-threshold", 3, 1..=1000)?,
            backoff: Action::backoff("")
                .initial_ms(c.u64("backoff-initial-ms", 100, 1..=600_000)?)
                .max_ms(c.u64("backoff-max-ms", 10_000, 1..=600_000)?)
                .multiplier(c.f64("backoff-multiplier", 2.0, 1.0..=10.0)?)
                .jitter(c.f64("backoff-jitter", 0.2, 0.0..=1.0)?),
            oci: c.choice("oci-drain", OciMode::OptIn, &oci_modes)?,
            oci_annotation: c.string("oci-opt-in-annotation", "tidegate.io/oci-drain")?,
            oci_at_capacity: c.choice("oci-at-capacity", AtCapacity::Keep, &capacity)?,
        };
        c.finish()?;
        if policy.backoff.max_ms < policy.backoff.initial_ms {
            return Err(format!(
                "config key `backoff-max-ms`: {} is below `backoff-initial-ms` {}",
                policy.backoff.max_ms, policy.backoff.initial_ms
            ));
        }
        Ok(policy)
    }

    /// Only the OCI opt-in annotation, and only when it decides anything.
    fn reads(&self) -> MetadataReads {
        match self.oci {
            OciMode::OptIn => MetadataReads::none().annotation(&self.oci_annotation),
            OciMode::Always | OciMode::Never => MetadataReads::none(),
        }
    }

    fn decide(&mut self, event: &Event) -> Vec<Action> {
        match event {
            Event::ShutdownStarted(s) if self.oci_opted_in(&s.workload.info) => {
                vec![Action::oci_drain(&s.workload)
                    .at_capacity(self.oci_at_capacity)
                    .into()]
            }
            Event::NetworkTeardown(t) if t.workload.inbound_tunnels > 0 => self.drain(t),
            Event::PeerDeleted(p) => vec![Action::evict_now(p)],
            Event::PeerTerminating(p) if self.evict_on_terminating => {
                vec![Action::evict_when_idle(p)]
            }
            Event::ConnectFailing(f) if f.consecutive_failures >= self.failure_threshold => {
                let mut backoff = self.backoff.clone();
                backoff.destination.clone_from(&f.destination);
                vec![backoff.into()]
            }
            _ => vec![],
        }
    }
}

impl Recommended {
    fn oci_opted_in(&self, w: &WorkloadInfo) -> bool {
        match self.oci {
            OciMode::Always => true,
            OciMode::Never => false,
            OciMode::OptIn => w.annotation(&self.oci_annotation) == Some("true"),
        }
    }

    fn drain(&self, t: &NetworkTeardown) -> Vec<Action> {
        let w = &t.workload;
        let bound = self.hold_ms.min(t.max_hold_ms);
        vec![
            // `text!`, not `format!`: this line is part of every teardown's
            // decision, and writing it with `core::fmt` cost ~14 % of the
            // decision's instructions (sdk/README.md, "Log lines").
            Action::log(
                LogLevel::Info,
                text!(
                    "draining ",
                    w.inbound_tunnels,
                    " inbound tunnels (",
                    w.inbound_streams,
                    " streams) of ",
                    w.info.namespace,
                    "/",
                    w.info.name,
                    ", holding teardown up to ",
                    bound,
                    " ms",
                ),
            ),
            Action::goaway_inbound(w)
                .mode(self.goaway_mode)
                .hard_deadline_ms(bound)
                .close_notify(self.close_notify)
                .into(),
            Action::hold_teardown(w, bound),
        ]
    }
}

export_policy!(Recommended);

#[cfg(test)]
mod tests;
