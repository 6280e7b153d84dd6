//! Refusal log lines a peer can provoke, bounded: at most `burst` lines per
//! interval for one kind of refusal, and the next line let through says how
//! many were left out. A peer looping on a refused handshake must not turn
//! every attempt into a line at `info` (the log is the operator's, and
//! writing it costs the gateway), yet the first refusals, and a steady
//! trickle after them, still say who and why.

use std::sync::Mutex;
use std::time::{Duration, Instant};
use tidegate_base::sync::Locked;

/// One kind of refusal's log budget.
#[derive(Debug)]
pub struct LogLimit {
    burst: u32,
    interval: Duration,
    state: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    started: Option<Instant>,
    logged: u32,
    left_out: u64,
}

impl LogLimit {
    /// At most `burst` lines per `interval`.
    pub const fn new(burst: u32, interval: Duration) -> Self {
        LogLimit {
            burst,
            interval,
            state: Mutex::new(Window {
                started: None,
                logged: 0,
                left_out: 0,
            }),
        }
    }

    /// Ten lines a second: what the data path's refusals use.
    pub const fn per_second() -> Self {
        LogLimit::new(10, Duration::from_secs(1))
    }

    /// `Some(n)` when this line may be written, `n` the lines left out
    /// since the last one written; `None` when it is over the budget.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut w = self.state.locked();
        let expired = w
            .started
            .is_none_or(|s| now.saturating_duration_since(s) >= self.interval);
        if expired {
            w.started = Some(now);
            w.logged = 0;
        }
        if w.logged >= self.burst {
            w.left_out += 1;
            return None;
        }
        w.logged += 1;
        Some(std::mem::take(&mut w.left_out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_interval_then_the_count_of_lines_left_out() {
        let limit = LogLimit::new(2, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(limit.admit_at(t0), Some(0));
        assert_eq!(limit.admit_at(t0), Some(0));
        for _ in 0..5 {
            assert_eq!(limit.admit_at(t0 + Duration::from_millis(500)), None);
        }
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(
            limit.admit_at(t1),
            Some(5),
            "the next line says 5 were left out"
        );
        assert_eq!(limit.admit_at(t1), Some(0));
        assert_eq!(limit.admit_at(t1), None);
    }
}
