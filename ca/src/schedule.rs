//! When the next attempt for an identity starts: renewal of an accepted
//! certificate at half-life, retries with backoff, and how much a handshake
//! that needs a certificate may hurry an attempt. No path here leads to an
//! attempt right after the previous one: a certificate refused, expired on
//! arrival or past half-life on arrival never makes the loop spin.

use std::time::{Duration, SystemTime};

/// The shortest wait before renewing an accepted certificate, even one
/// past its half-life on arrival.
pub const MIN_RENEWAL: Duration = Duration::from_secs(1);

/// A handshake without a valid certificate may hurry the next attempt, but
/// to no sooner than this after the previous attempt ended.
pub const HURRY_SPACING: Duration = Duration::from_secs(1);

/// How long after `now` to renew a certificate valid from `not_before` to
/// `not_after`: at half-life (ztunnel's `refresh_at`) moved by up to ±5 % of
/// the lifetime; when that has passed already (the CA's clock is behind
/// ours), halfway through what remains; never sooner than [`MIN_RENEWAL`].
pub fn renew_in(not_before: SystemTime, not_after: SystemTime, now: SystemTime) -> Duration {
    let life = not_after.duration_since(not_before).unwrap_or_default();
    let jitter = life.mul_f64(0.05 * fastrand::f64());
    let half = not_before + life / 2;
    let at = if fastrand::bool() {
        half + jitter
    } else {
        half - jitter
    };
    let wait = match at.duration_since(now) {
        Ok(d) => d,
        Err(_) => not_after.duration_since(now).unwrap_or_default() / 2,
    };
    wait.max(MIN_RENEWAL)
}

/// The deadline of the next attempt once a handshake asked to hurry: the
/// scheduled one, or [`HURRY_SPACING`] after the last attempt ended if
/// that is sooner.
pub fn hurried(
    scheduled: tokio::time::Instant,
    last_ended: tokio::time::Instant,
) -> tokio::time::Instant {
    scheduled.min(last_ended + HURRY_SPACING)
}

/// 500 ms doubling to 150 s, ±20 % jitter (ztunnel's CA backoff).
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: Duration::from_millis(500),
        }
    }
}

impl Backoff {
    pub const MAX: Duration = Duration::from_secs(150);

    /// The wait before the next attempt; each call doubles the one after it.
    pub fn step(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(Self::MAX);
        d.mul_f64(0.8 + 0.4 * fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_half_a_second_to_150_seconds_with_jitter() {
        let mut b = Backoff::default();
        let steps: Vec<Duration> = (0..12).map(|_| b.step()).collect();
        let base = [
            0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 150.0, 150.0, 150.0,
        ];
        for (d, want) in steps.iter().zip(base) {
            let s = d.as_secs_f64();
            assert!(
                s >= want * 0.8 - 1e-9 && s <= want * 1.2 + 1e-9,
                "{s} vs {want}"
            );
        }
    }

    #[test]
    fn renewal_falls_at_half_life_within_the_jitter() {
        let nb = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let na = nb + Duration::from_secs(1000);
        for _ in 0..200 {
            let at = renew_in(nb, na, nb).as_secs_f64();
            assert!((450.0..=550.0).contains(&at), "{at}");
        }
    }

    #[test]
    fn a_certificate_past_half_life_on_arrival_renews_halfway_through_what_remains_never_at_once() {
        let nb = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let na = nb + Duration::from_secs(1000);
        // 900 s in: 100 s remain.
        let now = nb + Duration::from_secs(900);
        assert_eq!(renew_in(nb, na, now), Duration::from_secs(50));
        // Expired or about to: the floor, not zero.
        assert_eq!(renew_in(nb, na, na), MIN_RENEWAL);
        assert_eq!(renew_in(nb, na, na + Duration::from_secs(10)), MIN_RENEWAL);
        assert_eq!(
            renew_in(nb, na, na - Duration::from_millis(500)),
            MIN_RENEWAL
        );
    }

    #[test]
    fn a_hurry_brings_the_attempt_forward_to_no_sooner_than_the_spacing() {
        let ended = tokio::time::Instant::now();
        let far = ended + Duration::from_secs(100);
        assert_eq!(hurried(far, ended), ended + HURRY_SPACING);
        let near = ended + Duration::from_millis(200);
        assert_eq!(hurried(near, ended), near, "never later than scheduled");
    }
}
