//! The host validates every action a policy returns: actions about anything
//! but the event's subjects are ignored and counted, numbers are clamped to
//! configured bounds, the list is bounded.

use std::time::Duration;

use tidegate_sdk as sdk;

/// Bounds on what a policy may ask for.
#[derive(Clone, Debug)]
pub struct Bounds {
    pub max_actions: usize,
    pub max_delay: Duration,
    pub max_deadline: Duration,
    pub max_hold: Duration,
    pub max_backoff: Duration,
    pub max_timer: Duration,
    pub max_log_len: usize,
}

/// Longest `log` text an action may carry (not configurable).
const MAX_LOG_LEN: usize = 1024;

impl crate::config::PoliciesConfig {
    /// The action bounds these settings give; the only place they are read.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            max_actions: self.max_actions,
            max_delay: self.max_delay,
            max_deadline: self.max_deadline,
            max_hold: self.max_hold,
            max_backoff: self.max_backoff,
            max_timer: self.max_timer,
            max_log_len: MAX_LOG_LEN,
        }
    }
}

/// The bounds of the default `policies:` section (defined there, once).
impl Default for Bounds {
    fn default() -> Self {
        crate::config::PoliciesConfig::default().bounds()
    }
}

/// Why an action was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ignored {
    /// It names a workload, peer or destination the event is not about.
    OtherSubject,
    /// `hold-teardown` outside `network-teardown`.
    NotApplicable,
    /// Past `max_actions`.
    TooMany,
}

impl Ignored {
    pub fn label(self) -> &'static str {
        match self {
            Ignored::OtherSubject => "other_subject",
            Ignored::NotApplicable => "not_applicable",
            Ignored::TooMany => "too_many",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Validated {
    pub actions: Vec<sdk::Action>,
    pub ignored: Vec<(Ignored, sdk::Action)>,
    /// How many numbers were clamped.
    pub clamped: usize,
}

fn clamp_ms(v: &mut u64, max: Duration, clamped: &mut usize) {
    let max = max.as_millis() as u64;
    if *v > max {
        *v = max;
        *clamped += 1;
    }
}

fn clamp_f64(v: &mut f64, lo: f64, hi: f64, clamped: &mut usize) {
    let c = if v.is_nan() { lo } else { v.clamp(lo, hi) };
    if c != *v || v.is_nan() {
        *v = c;
        *clamped += 1;
    }
}

pub fn validate(event: &sdk::Event, mut actions: Vec<sdk::Action>, bounds: &Bounds) -> Validated {
    let max_hold = match event {
        sdk::Event::NetworkTeardown(t) => {
            Some(Duration::from_millis(t.max_hold_ms).min(bounds.max_hold))
        }
        _ => None,
    };
    // The usual decision is all valid: checked in place, it is returned in
    // the policy's own vector and nothing is allocated. From the first
    // action dropped on, each one is put back (in order) or moved out with
    // its reason; `check` refuses before it changes anything, so checking
    // that first one again gives the same answer.
    let mut clamped = 0;
    let mut valid = 0;
    while valid < actions.len()
        && check(
            event,
            &mut actions[valid],
            max_hold,
            bounds,
            valid,
            &mut clamped,
        )
        .is_ok()
    {
        valid += 1;
    }
    let rest = actions.split_off(valid);
    let mut ignored = Vec::new();
    for mut action in rest {
        match check(
            event,
            &mut action,
            max_hold,
            bounds,
            actions.len(),
            &mut clamped,
        ) {
            Ok(()) => actions.push(action),
            Err(why) => ignored.push((why, action)),
        }
    }
    Validated {
        actions,
        ignored,
        clamped,
    }
}

/// Clamps one action's numbers in place, or says why it is dropped (before
/// touching it); `kept` is how many of the decision's actions passed before
/// it.
fn check(
    event: &sdk::Event,
    action: &mut sdk::Action,
    max_hold: Option<Duration>,
    bounds: &Bounds,
    kept: usize,
    c: &mut usize,
) -> Result<(), Ignored> {
    if kept >= bounds.max_actions {
        return Err(Ignored::TooMany);
    }
    if let Some(s) = action.subject() {
        if !event.has_subject(s) {
            return Err(Ignored::OtherSubject);
        }
    }
    match action {
        sdk::Action::Goaway(g) => {
            clamp_ms(&mut g.delay_ms, bounds.max_delay, c);
            if let Some(d) = g.hard_deadline_ms.as_mut() {
                clamp_ms(d, bounds.max_deadline, c);
            }
        }
        sdk::Action::Backoff(b) => {
            clamp_ms(&mut b.max_ms, bounds.max_backoff, c);
            clamp_ms(&mut b.initial_ms, Duration::from_millis(b.max_ms), c);
            clamp_f64(&mut b.multiplier, 1.0, 16.0, c);
            clamp_f64(&mut b.jitter, 0.0, 1.0, c);
        }
        sdk::Action::HoldTeardown(h) => match max_hold {
            Some(max) => clamp_ms(&mut h.bound_ms, max, c),
            None => return Err(Ignored::NotApplicable),
        },
        sdk::Action::SetTimer(t) => clamp_ms(&mut t.after_ms, bounds.max_timer, c),
        sdk::Action::Log(l) => {
            if l.message.len() > bounds.max_log_len {
                let mut end = bounds.max_log_len;
                while !l.message.is_char_boundary(end) {
                    end -= 1;
                }
                l.message.truncate(end);
                *c += 1;
            }
        }
        sdk::Action::Evict(_) | sdk::Action::OciDrain(_) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn teardown(uid: &str) -> sdk::Event {
        sdk::Event::NetworkTeardown(sdk::NetworkTeardown {
            workload: sdk::WorkloadState::new(sdk::WorkloadInfo::new(uid)),
            since_shutdown_ms: None,
            max_hold_ms: 5_000,
        })
    }

    #[test]
    fn other_subjects_are_ignored_and_numbers_clamped() {
        let w = sdk::WorkloadInfo::new("mine");
        let other = sdk::WorkloadInfo::new("theirs");
        let actions = vec![
            sdk::Action::goaway_inbound(&w)
                .delay_ms(u64::MAX)
                .hard_deadline_ms(u64::MAX)
                .into(),
            sdk::Action::goaway_inbound(&other).into(),
            sdk::Action::HoldTeardown(sdk::HoldTeardown {
                workload: "mine".into(),
                bound_ms: 60_000,
            }),
        ];
        let v = validate(&teardown("mine"), actions, &Bounds::default());
        assert_eq!(v.actions.len(), 2);
        assert_eq!(v.ignored.len(), 1);
        assert_eq!(v.ignored[0].0, Ignored::OtherSubject);
        let sdk::Action::Goaway(g) = &v.actions[0] else {
            panic!()
        };
        assert_eq!(g.delay_ms, 60_000);
        assert_eq!(g.hard_deadline_ms, Some(600_000));
        let sdk::Action::HoldTeardown(h) = &v.actions[1] else {
            panic!()
        };
        assert_eq!(h.bound_ms, 5_000, "bounded by the event's max-hold-ms");
        assert_eq!(v.clamped, 3);
    }

    #[test]
    fn after_a_dropped_action_the_rest_keep_their_order_and_clamps_count_once() {
        let w = sdk::WorkloadInfo::new("mine");
        let other = sdk::WorkloadInfo::new("theirs");
        let log = |m: &str| {
            sdk::Action::Log(sdk::LogLine {
                level: sdk::LogLevel::Info,
                message: m.into(),
            })
        };
        let actions = vec![
            log("first"),
            sdk::Action::goaway_inbound(&other).into(),
            sdk::Action::goaway_inbound(&w).delay_ms(u64::MAX).into(),
            sdk::Action::goaway_inbound(&other).into(),
            log("last"),
        ];
        let v = validate(&teardown("mine"), actions, &Bounds::default());
        let kept: Vec<String> = v.actions.iter().map(|a| format!("{a:?}")).collect();
        assert_eq!(v.actions.len(), 3, "{kept:?}");
        assert!(matches!(&v.actions[0], sdk::Action::Log(l) if l.message == "first"));
        assert!(
            matches!(&v.actions[1], sdk::Action::Goaway(g) if g.workload == "mine" && g.delay_ms == 60_000)
        );
        assert!(matches!(&v.actions[2], sdk::Action::Log(l) if l.message == "last"));
        assert_eq!(v.clamped, 1);
        assert_eq!(v.ignored.len(), 2);
        assert!(v
            .ignored
            .iter()
            .all(|(why, a)| *why == Ignored::OtherSubject && a.subject() == Some("theirs")));
    }

    #[test]
    fn hold_outside_teardown_and_floods_are_dropped() {
        let event = sdk::Event::WorkloadAdded(sdk::WorkloadState::new(sdk::WorkloadInfo::new("w")));
        let hold = sdk::Action::HoldTeardown(sdk::HoldTeardown {
            workload: "w".into(),
            bound_ms: 1,
        });
        let mut actions = vec![hold];
        for _ in 0..40 {
            actions.push(sdk::Action::Log(sdk::LogLine {
                level: sdk::LogLevel::Info,
                message: "x".repeat(5000),
            }));
        }
        let v = validate(&event, actions, &Bounds::default());
        assert_eq!(v.actions.len(), 32);
        assert!(v.ignored.iter().any(|(r, _)| *r == Ignored::NotApplicable));
        assert_eq!(
            v.ignored
                .iter()
                .filter(|(r, _)| *r == Ignored::TooMany)
                .count(),
            8
        );
        let sdk::Action::Log(l) = &v.actions[0] else {
            panic!()
        };
        assert_eq!(l.message.len(), 1024);
    }
}
