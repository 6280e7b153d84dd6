//! Upstream dials paced per tunnel: a peer that opens and resets streams in
//! a loop ("rapid reset") must not turn each stream into a connection to the
//! workload. Each inbound tunnel may have at most `in_flight` dials
//! outstanding and start at most `per_second` of them per second (a token
//! bucket holding one second's worth); beyond that the CONNECT is refused
//! before any dial.

use std::sync::{Arc, Mutex};

use std::time::Instant;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why a dial was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Paced {
    #[error("{0} upstream dials already in flight on this tunnel")]
    InFlight(usize),
    #[error("more than {0} upstream dials per second on this tunnel")]
    Rate(u32),
}

/// The dial budget of one inbound tunnel.
#[derive(Debug)]
pub struct DialBudget {
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
    per_second: u32,
    bucket: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Held while a dial is in flight.
#[derive(Debug)]
pub struct DialPermit(#[allow(dead_code)] OwnedSemaphorePermit);

impl DialBudget {
    pub fn new(max_in_flight: usize, per_second: u32) -> Self {
        DialBudget {
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            per_second,
            bucket: Mutex::new(Bucket {
                tokens: f64::from(per_second),
                at: Instant::now(),
            }),
        }
    }

    /// Takes a slot and a token, or says which bound refused the dial.
    pub fn try_start(&self) -> Result<DialPermit, Paced> {
        self.try_start_at(Instant::now())
    }

    fn try_start_at(&self, now: Instant) -> Result<DialPermit, Paced> {
        let permit = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| Paced::InFlight(self.max_in_flight))?;
        let rate = f64::from(self.per_second);
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let refill = now.saturating_duration_since(b.at).as_secs_f64() * rate;
        b.tokens = (b.tokens + refill).min(rate);
        b.at = now;
        if b.tokens < 1.0 {
            return Err(Paced::Rate(self.per_second));
        }
        b.tokens -= 1.0;
        Ok(DialPermit(permit))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn bounds_dials_in_flight() {
        let budget = DialBudget::new(2, 1000);
        let a = budget.try_start().unwrap();
        let _b = budget.try_start().unwrap();
        assert_eq!(budget.try_start().unwrap_err(), Paced::InFlight(2));
        drop(a);
        assert!(budget.try_start().is_ok(), "an ended dial frees its slot");
    }

    #[test]
    fn bounds_dials_per_second_with_one_second_of_burst() {
        let budget = DialBudget::new(1000, 10);
        let t0 = Instant::now();
        for _ in 0..10 {
            budget.try_start_at(t0).unwrap();
        }
        assert_eq!(budget.try_start_at(t0).unwrap_err(), Paced::Rate(10));
        let t1 = t0 + Duration::from_millis(100);
        budget.try_start_at(t1).unwrap();
        assert_eq!(budget.try_start_at(t1).unwrap_err(), Paced::Rate(10));
        // Idle time refills one second's worth, never more.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..10 {
            budget.try_start_at(t2).unwrap();
        }
        assert!(budget.try_start_at(t2).is_err());
    }
}
