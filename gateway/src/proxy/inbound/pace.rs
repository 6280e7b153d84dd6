//! Upstream dials paced per tunnel, against abuse only. A peer that opens
//! streams and resets them in a loop ("rapid reset") must not turn each one
//! into a connection to the workload; a peer that opens thousands of short
//! connections a second that each carry bytes is a busy client, and is
//! never refused for it (ztunnel refuses none of them either).
//!
//! So the budget counts *wasted* dials, not dials: each dial borrows a
//! token from the tunnel's bucket when it starts, and gives it back when
//! its stream proves useful — the peer sent at least one byte on it. A dial
//! whose stream the peer reset before the dial completed (the dial is
//! abandoned then), or whose stream ended without a byte from the peer,
//! keeps its token. The bucket refills at `wasted_per_second` and holds
//! ten seconds' worth plus one token per stream the tunnel may have open,
//! so that every open stream, silent or not, never empties it by itself.
//! Once it is empty, new dials are refused (`wasted_dials_limit`) until it
//! refills.
//!
//! Beside it, at most `in_flight` dials may be under way at once, and an
//! optional plain rate cap (`per_second`, 0: none) bounds dials started per
//! second whatever they carry; it is off by default, because it refuses
//! healthy load.

use std::sync::{Arc, Mutex};

use std::time::Instant;
use tidegate_base::sync::Locked;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The wasted-dial bucket holds this many seconds of its rate (plus one
/// token per concurrent stream).
pub const WASTED_BURST_SECONDS: u32 = 10;

/// Why a dial was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Paced {
    #[error("{0} upstream dials already in flight on this tunnel")]
    InFlight(usize),
    #[error("more than {0} upstream dials per second on this tunnel (hbone.max_dials_per_second_per_tunnel)")]
    Rate(u32),
    #[error(
        "this tunnel wasted more than {0} upstream dials per second (streams reset before their dial \
         completed, or that carried no byte from the peer)"
    )]
    Wasted(u32),
}

/// The limits of every tunnel's budget.
#[derive(Debug, Clone, Copy)]
pub struct PaceLimits {
    /// Dials under way at once.
    pub in_flight: usize,
    /// Dials started per second, whatever they carry; 0: no cap.
    pub per_second: u32,
    /// Wasted dials per second, on average.
    pub wasted_per_second: u32,
    /// Streams one tunnel may have open (`hbone.max_concurrent_streams`).
    pub streams: u32,
}

/// The dial budget of one inbound tunnel.
#[derive(Debug)]
pub struct DialBudget {
    in_flight: Arc<Semaphore>,
    limits: PaceLimits,
    rate: Option<Mutex<Bucket>>,
    wasted: Mutex<Bucket>,
}

/// A token bucket.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    capacity: f64,
    per_second: f64,
    at: Instant,
}

impl Bucket {
    fn full(capacity: f64, per_second: f64, now: Instant) -> Self {
        Bucket {
            tokens: capacity,
            capacity,
            per_second,
            at: now,
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + refill).min(self.capacity);
        self.at = now;
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }

    fn give_back(&mut self) {
        self.tokens = (self.tokens + 1.0).min(self.capacity);
    }
}

/// Held while a dial is under way.
#[derive(Debug)]
pub struct DialPermit(#[allow(dead_code)] OwnedSemaphorePermit);

/// The wasted-dial token a dial borrowed: given back by [`Borrowed::useful`],
/// kept (the dial counts as wasted) when dropped without it.
#[derive(Debug)]
pub struct Borrowed {
    budget: Arc<DialBudget>,
}

impl Borrowed {
    /// The peer sent bytes on the dial's stream: the token goes back.
    pub fn useful(self) {
        let mut b = self.budget.wasted.locked();
        b.give_back();
    }
}

impl DialBudget {
    pub fn new(limits: PaceLimits) -> Arc<Self> {
        Self::new_at(limits, Instant::now())
    }

    fn new_at(limits: PaceLimits, now: Instant) -> Arc<Self> {
        let wasted_rate = f64::from(limits.wasted_per_second);
        let capacity = wasted_rate * f64::from(WASTED_BURST_SECONDS) + f64::from(limits.streams);
        let rate = (limits.per_second > 0).then(|| {
            let r = f64::from(limits.per_second);
            Mutex::new(Bucket::full(r, r, now))
        });
        Arc::new(DialBudget {
            in_flight: Arc::new(Semaphore::new(limits.in_flight)),
            limits,
            rate,
            wasted: Mutex::new(Bucket::full(capacity, wasted_rate, now)),
        })
    }

    /// Takes a slot, a token of the rate cap (when set) and borrows a
    /// wasted-dial token, or says which bound refused the dial.
    pub fn try_start(self: &Arc<Self>) -> Result<(DialPermit, Borrowed), Paced> {
        self.try_start_at(Instant::now())
    }

    fn try_start_at(self: &Arc<Self>, now: Instant) -> Result<(DialPermit, Borrowed), Paced> {
        let permit = self
            .in_flight
            .clone()
            .try_acquire_owned()
            .map_err(|_| Paced::InFlight(self.limits.in_flight))?;
        // Waste first: a refused dial must not spend a token of the rate cap.
        if !self.wasted.locked().take(now) {
            return Err(Paced::Wasted(self.limits.wasted_per_second));
        }
        let borrowed = Borrowed {
            budget: self.clone(),
        };
        if let Some(rate) = &self.rate {
            if !rate.locked().take(now) {
                // Not dialed, so not wasted.
                borrowed.useful();
                return Err(Paced::Rate(self.limits.per_second));
            }
        }
        Ok((DialPermit(permit), borrowed))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limits(in_flight: usize, per_second: u32, wasted_per_second: u32) -> PaceLimits {
        PaceLimits {
            in_flight,
            per_second,
            wasted_per_second,
            streams: 0,
        }
    }

    #[test]
    fn bounds_dials_in_flight() {
        let budget = DialBudget::new(limits(2, 0, 100));
        let a = budget.try_start().unwrap();
        let _b = budget.try_start().unwrap();
        assert_eq!(budget.try_start().unwrap_err(), Paced::InFlight(2));
        drop(a);
        assert!(budget.try_start().is_ok(), "an ended dial frees its slot");
    }

    #[test]
    fn useful_dials_are_never_refused_however_many() {
        let t0 = Instant::now();
        let budget = DialBudget::new_at(limits(100, 0, 1), t0);
        // 100,000 dials in the same instant, each used: the bucket of 10
        // wasted dials never empties.
        for _ in 0..100_000 {
            let (permit, borrowed) = budget.try_start_at(t0).unwrap();
            borrowed.useful();
            drop(permit);
        }
    }

    #[test]
    fn wasted_dials_are_refused_past_ten_seconds_of_their_rate() {
        let t0 = Instant::now();
        let budget = DialBudget::new_at(limits(1000, 0, 10), t0);
        for _ in 0..10 * WASTED_BURST_SECONDS {
            let _wasted = budget.try_start_at(t0).unwrap();
        }
        assert_eq!(budget.try_start_at(t0).unwrap_err(), Paced::Wasted(10));
        // A tenth of a second refills one token.
        let t1 = t0 + Duration::from_millis(100);
        let (_, borrowed) = budget.try_start_at(t1).unwrap();
        assert_eq!(budget.try_start_at(t1).unwrap_err(), Paced::Wasted(10));
        // A useful dial gives its token back.
        borrowed.useful();
        let _ = budget.try_start_at(t1).unwrap();
        // Idle time refills the burst, never more.
        let t2 = t1 + Duration::from_secs(3600);
        for _ in 0..10 * WASTED_BURST_SECONDS {
            let _wasted = budget.try_start_at(t2).unwrap();
        }
        assert!(budget.try_start_at(t2).is_err());
    }

    #[test]
    fn every_open_stream_may_hold_a_token_without_emptying_the_bucket() {
        let t0 = Instant::now();
        let l = PaceLimits {
            streams: 200,
            ..limits(1000, 0, 1)
        };
        let budget = DialBudget::new_at(l, t0);
        // 200 silent streams open at once, then ten seconds' worth of waste.
        let held: Vec<_> = (0..200).map(|_| budget.try_start_at(t0).unwrap()).collect();
        for _ in 0..WASTED_BURST_SECONDS {
            let _wasted = budget.try_start_at(t0).unwrap();
        }
        assert_eq!(budget.try_start_at(t0).unwrap_err(), Paced::Wasted(1));
        drop(held);
    }

    #[test]
    fn the_optional_rate_cap_bounds_every_dial_with_one_second_of_burst() {
        let budget = DialBudget::new(limits(1000, 10, 1000));
        let t0 = Instant::now();
        for _ in 0..10 {
            budget.try_start_at(t0).unwrap().1.useful();
        }
        assert_eq!(budget.try_start_at(t0).unwrap_err(), Paced::Rate(10));
        let t1 = t0 + Duration::from_millis(100);
        budget.try_start_at(t1).unwrap().1.useful();
        assert_eq!(budget.try_start_at(t1).unwrap_err(), Paced::Rate(10));
        // Refused by the rate cap: not dialed, so no wasted token was kept.
        let wasted = budget.wasted.locked().tokens;
        assert!(wasted >= 10_000.0 - 1.0, "{wasted}");
    }
}
