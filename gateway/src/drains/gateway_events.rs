//! The events that are not a local workload's lifecycle: connect failures
//! reported by the pool, timers a policy set, and the gateway's own
//! shutdown.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tidegate_sdk as sdk;
use tokio::time::Instant;
use tracing::info;

use super::engine::DrainEngine;
use super::state::{unix_ms, unix_ms_after};
use crate::workloads::Workload;
use tidegate_base::shutdown::ShutdownWatch;
use tidegate_base::sync::Locked;
use tidegate_policy_host::Selection;

impl DrainEngine {
    /// Turns the pool's connect-failure reports into `connect-failing`
    /// events, decided by the source workload's policy (e.g. a backoff).
    pub async fn watch_connect_failures(
        self: Arc<Self>,
        mut failures: tokio::sync::mpsc::UnboundedReceiver<crate::proxy::pool::ConnectFailure>,
        mut drain: ShutdownWatch,
    ) {
        loop {
            let f = tokio::select! {
                f = failures.recv() => match f { Some(f) => f, None => return },
                _ = drain.signaled() => return,
            };
            let snapshot = self.workloads.snapshot();
            let Some(source) = snapshot
                .iter()
                .find(|w| w.local && w.identity == f.key.src)
                .cloned()
            else {
                continue;
            };
            let known = snapshot
                .by_uid(&f.key.dst_uid)
                .or_else(|| snapshot.by_ip(f.key.dst_addr.ip()));
            let peer = known.map(|p| super::peer_book::peer_info(p, &f.addr.to_string()));
            let event = sdk::Event::ConnectFailing(sdk::ConnectFailing {
                destination: f.addr.to_string(),
                peer,
                consecutive_failures: f.consecutive,
                last_error: f.last_error.clone(),
                failing_for_ms: f.failing_for.as_millis() as u64,
            });
            let selection = self.policies.select(&source);
            let decision = self.policies.decide(&selection, &event);
            let executed = self.execute(&source, &decision.actions, Instant::now());
            if !executed.descriptions.is_empty() {
                info!(
                    destination = %f.addr,
                    consecutive = f.consecutive,
                    policy = %decision.policy,
                    actions = ?executed.descriptions,
                    "connect-failing decision"
                );
                let key = known.map_or_else(|| f.addr.to_string(), |p| p.uid().to_owned());
                self.book.locked().record_peer(
                    &key,
                    known.map(|p| &**p),
                    super::peer_book::PeerDecision {
                        event: "connect-failing",
                        policy: decision.policy,
                        version: decision.version,
                        selected_by: selection.by.label(),
                        clients: vec![f.key.src.to_string()],
                        actions: executed.descriptions,
                        tunnels_evicted: executed.tunnels_evicted,
                        at_unix_ms: unix_ms(SystemTime::now()),
                    },
                );
            }
        }
    }

    /// The gateway itself is stopping: each policy is asked for a plan for
    /// the local workloads it governs (a `gateway-shutdown` event with the
    /// deadline), and its actions are executed before the default drain.
    pub fn on_gateway_shutdown(self: &Arc<Self>, deadline: Duration) -> Vec<String> {
        let snapshot = self.workloads.snapshot();
        let mut by_policy: BTreeMap<String, (Selection, Vec<Arc<Workload>>)> = BTreeMap::new();
        for w in snapshot.locals() {
            let sel = self.policies.select(w);
            by_policy
                .entry(sel.name.clone())
                .or_insert_with(|| (sel, Vec::new()))
                .1
                .push(w.clone());
        }
        let mut done = Vec::new();
        let now = Instant::now();
        for (_, (selection, workloads)) in by_policy {
            let event = sdk::Event::GatewayShutdown(sdk::GatewayShutdown {
                deadline_ms: unix_ms_after(deadline),
                remaining_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
                workloads: workloads.iter().map(|w| self.state_of(w)).collect(),
            });
            let decision = self.policies.decide(&selection, &event);
            for w in &workloads {
                let mine: Vec<sdk::Action> = decision
                    .actions
                    .iter()
                    .filter(|a| a.subject().is_none_or(|s| s == w.uid()))
                    .cloned()
                    .collect();
                let executed = self.execute(w, &mine, now);
                done.extend(executed.descriptions);
            }
        }
        done
    }

    /// A timer the policy asked for fired. Decided by the subject's drain
    /// (its pinned version) when it has one, else by the policy of the local
    /// workload whose decision set the timer (`source`): a peer uid or a
    /// connect-failing destination are valid subjects too.
    pub(super) fn timer_fired(
        self: &Arc<Self>,
        subject: String,
        tag: String,
        source: Arc<Workload>,
    ) {
        // The drains lock is released before `lookup`, which takes it again.
        let pinned = self.book.locked().pinned(&subject);
        let (selection, workload) = match pinned {
            Some((selection, w)) => (selection, Some(w)),
            None => match self.lookup(&subject) {
                Some(w) => (self.policies.select(&w), Some(w)),
                None => (self.policies.select(&source), None),
            },
        };
        let event = sdk::Event::TimerFired(sdk::TimerFired {
            subject: subject.clone(),
            tag: tag.clone(),
            workload: workload.as_deref().map(|w| self.state_of(w)),
        });
        let decision = self.policies.decide(&selection, &event);
        let on = workload.unwrap_or(source);
        let executed = self.execute(&on, &decision.actions, Instant::now());
        info!(subject, tag, policy = %decision.policy, actions = ?executed.descriptions, "timer decision");
        self.book
            .locked()
            .record_actions(&subject, &executed.descriptions);
    }
}
