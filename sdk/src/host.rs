//! What the host gives a policy: a log, the clock, counters.
//!
//! On `wasm32` these call the `tidegate:policy/host` imports. Natively (unit
//! tests) they use a per-thread stand-in: the clock is the system clock
//! unless a test sets it with [`testing::set_now_ms`], and log lines and
//! counters are recorded for [`testing::take_logs`] and
//! [`testing::metric_total`].

use crate::action::LogLevel;

/// Writes a line to the gateway log right away (not part of the decision).
pub fn log(level: LogLevel, message: &str) {
    imp::log(level, message);
}

/// Wall-clock time in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    imp::now_ms()
}

/// Adds `delta` to the policy's counter `name` (`[a-z0-9_]{1,64}`).
pub fn metric(name: &str, delta: u64) {
    imp::metric(name, delta);
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use crate::action::LogLevel;
    use crate::bindings::tidegate::policy::host;

    pub(super) fn log(level: LogLevel, message: &str) {
        host::log(level.into(), message);
    }

    pub(super) fn now_ms() -> u64 {
        host::now_ms()
    }

    pub(super) fn metric(name: &str, delta: u64) {
        host::metric(name, delta);
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use std::cell::RefCell;
    use std::collections::BTreeMap;
    use std::time::{SystemTime, UNIX_EPOCH};

    use crate::action::LogLevel;

    #[derive(Default)]
    pub(super) struct Mock {
        pub(super) now_ms: Option<u64>,
        pub(super) logs: Vec<(LogLevel, String)>,
        pub(super) metrics: BTreeMap<String, u64>,
    }

    thread_local! {
        pub(super) static MOCK: RefCell<Mock> = RefCell::new(Mock::default());
    }

    pub(super) fn log(level: LogLevel, message: &str) {
        MOCK.with(|m| m.borrow_mut().logs.push((level, message.to_owned())));
    }

    pub(super) fn now_ms() -> u64 {
        MOCK.with(|m| m.borrow().now_ms).unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        })
    }

    pub(super) fn metric(name: &str, delta: u64) {
        MOCK.with(|m| {
            let mut m = m.borrow_mut();
            let total = m.metrics.entry(name.to_owned()).or_default();
            *total = total.saturating_add(delta);
        });
    }
}

/// Native stand-in controls for unit tests (per thread).
#[cfg(not(target_arch = "wasm32"))]
pub mod testing {
    use super::imp::MOCK;
    use crate::action::LogLevel;

    /// Fixes what [`super::now_ms`] returns; `None` returns to the system clock.
    pub fn set_now_ms(now: Option<u64>) {
        MOCK.with(|m| m.borrow_mut().now_ms = now);
    }

    /// Returns and forgets the lines written with [`super::log`].
    pub fn take_logs() -> Vec<(LogLevel, String)> {
        MOCK.with(|m| std::mem::take(&mut m.borrow_mut().logs))
    }

    /// The total added to counter `name` with [`super::metric`].
    pub fn metric_total(name: &str) -> u64 {
        MOCK.with(|m| m.borrow().metrics.get(name).copied().unwrap_or(0))
    }

    /// Forgets logs and counters and returns to the system clock.
    pub fn reset() {
        MOCK.with(|m| *m.borrow_mut() = Default::default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_stand_in_records_logs_metrics_and_fixed_clock() {
        testing::reset();
        testing::set_now_ms(Some(42));
        assert_eq!(now_ms(), 42);
        log(LogLevel::Warn, "hello");
        metric("drains", 2);
        metric("drains", 3);
        assert_eq!(
            testing::take_logs(),
            vec![(LogLevel::Warn, "hello".to_owned())]
        );
        assert!(testing::take_logs().is_empty());
        assert_eq!(testing::metric_total("drains"), 5);
        testing::set_now_ms(None);
        assert!(now_ms() > 1_600_000_000_000, "system clock after reset");
    }
}
