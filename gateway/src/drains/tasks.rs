//! The drain engine's own tasks (timers, delayed GOAWAYs, lifecycle events
//! raised off the caller's task): tracked so that shutdown reaches them.

use std::future::Future;
use std::sync::Mutex;

use tidegate_base::sync::Locked;
use tokio::task::JoinSet;

/// Tasks the drain engine and its executor run off the caller's task.
///
/// Contract: [`DrainTasks::shutdown`] aborts every task still pending and
/// returns once all of them are gone; nothing spawned here outlives it.
#[derive(Default)]
pub(super) struct DrainTasks(Mutex<JoinSet<()>>);

impl DrainTasks {
    /// Runs `task` (finished ones are reaped; a panicked one is logged).
    pub(super) fn spawn(
        &self,
        what: &'static str,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        let mut tasks = self.0.locked();
        while let Some(done) = tasks.try_join_next() {
            if let Err(e) = done {
                if e.is_panic() {
                    tracing::error!(error = %e, "a drain task panicked");
                }
            }
        }
        tasks.spawn(tracing::Instrument::instrument(
            task,
            tracing::info_span!("drain_task", what),
        ));
    }

    /// Tasks pending now.
    pub(super) fn len(&self) -> usize {
        self.0.locked().len()
    }

    /// Awaits every task spawned so far (tests: what a lifecycle event did).
    #[cfg(test)]
    pub(super) async fn settle(&self) {
        let mut tasks = std::mem::take(&mut *self.0.locked());
        while tasks.join_next().await.is_some() {}
    }

    /// Cancels the pending tasks and awaits them.
    pub(super) async fn shutdown(&self) {
        let mut tasks = std::mem::take(&mut *self.0.locked());
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}
