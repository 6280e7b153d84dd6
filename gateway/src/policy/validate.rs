//! The host validates every action a policy returns: actions about anything
//! but the event's subjects are ignored and counted, numbers are clamped to
//! configured bounds, the list is bounded. In a decision about a terminating
//! pod no deadline about it outlives the time the pod has left (see
//! [`time_left`]), whatever the plugin computed.

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
    /// How many numbers were clamped (to the configured bounds or to the
    /// time the pod has left).
    pub clamped: usize,
    /// Of those, how many to the time the pod has left ([`time_left`]).
    pub clamped_to_time_left: usize,
}

/// The numbers one decision had clamped so far.
#[derive(Default)]
struct Clamps {
    to_bounds: usize,
    to_time_left: usize,
}

impl Clamps {
    /// Clamps `v` to `bound` and, when set, to `left`; counted once, as
    /// clamped to the time left when `left` is what bound it.
    fn ms(&mut self, v: &mut u64, bound: Duration, left: Option<Duration>) {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let bound = ms(bound);
        match left.map(ms) {
            Some(left) if left < bound && *v > left => {
                *v = left;
                self.to_time_left += 1;
            }
            _ if *v > bound => {
                *v = bound;
                self.to_bounds += 1;
            }
            _ => {}
        }
    }
}

/// The pod a decision is about and the time it has left: at
/// `shutdown-started` its remaining grace; at `network-teardown` the
/// longest hold the host allows (`max-hold-ms`: `drains.max_hold`, and never
/// more than the grace the pod had left), after which its network is gone.
/// No deadline a policy sets about the pod (a GOAWAY's delay and hard
/// deadline, a timer, a teardown hold) may outlive it.
pub fn time_left(event: &sdk::Event) -> Option<(&str, Duration)> {
    match event {
        sdk::Event::ShutdownStarted(s) => Some((
            s.workload.info.uid.as_str(),
            Duration::from_millis(s.grace_remaining_ms),
        )),
        sdk::Event::NetworkTeardown(t) => Some((
            t.workload.info.uid.as_str(),
            Duration::from_millis(t.max_hold_ms),
        )),
        _ => None,
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
    let ctx = Context {
        event,
        teardown: matches!(event, sdk::Event::NetworkTeardown(_)),
        left: time_left(event),
        bounds,
    };
    let mut clamps = Clamps::default();
    let mut valid = 0;
    while valid < actions.len() && check(&ctx, &mut actions[valid], valid, &mut clamps).is_ok() {
        valid += 1;
    }
    let rest = actions.split_off(valid);
    let mut ignored = Vec::new();
    for mut action in rest {
        match check(&ctx, &mut action, actions.len(), &mut clamps) {
            Ok(()) => actions.push(action),
            Err(why) => ignored.push((why, action)),
        }
    }
    Validated {
        actions,
        ignored,
        clamped: clamps.to_bounds + clamps.to_time_left,
        clamped_to_time_left: clamps.to_time_left,
    }
}

/// What every action of one decision is checked against.
struct Context<'a> {
    event: &'a sdk::Event,
    /// `hold-teardown` applies.
    teardown: bool,
    left: Option<(&'a str, Duration)>,
    bounds: &'a Bounds,
}

/// Clamps one action's numbers in place, or says why it is dropped (before
/// touching it); `kept` is how many of the decision's actions passed before
/// it.
fn check(
    ctx: &Context<'_>,
    action: &mut sdk::Action,
    kept: usize,
    c: &mut Clamps,
) -> Result<(), Ignored> {
    let bounds = ctx.bounds;
    if kept >= bounds.max_actions {
        return Err(Ignored::TooMany);
    }
    if let Some(s) = action.subject() {
        if !ctx.event.has_subject(s) {
            return Err(Ignored::OtherSubject);
        }
    }
    if matches!(action, sdk::Action::HoldTeardown(_)) && !ctx.teardown {
        return Err(Ignored::NotApplicable);
    }
    // The time the pod has left binds the deadlines of actions about it.
    let left = ctx
        .left
        .filter(|(uid, _)| action.subject() == Some(*uid))
        .map(|(_, left)| left);
    match action {
        sdk::Action::Goaway(g) => {
            c.ms(&mut g.delay_ms, bounds.max_delay, left);
            if let Some(d) = g.hard_deadline_ms.as_mut() {
                let after_delay = left.map(|l| l.saturating_sub(Duration::from_millis(g.delay_ms)));
                c.ms(d, bounds.max_deadline, after_delay);
            }
        }
        sdk::Action::Backoff(b) => {
            c.ms(&mut b.max_ms, bounds.max_backoff, None);
            c.ms(&mut b.initial_ms, Duration::from_millis(b.max_ms), None);
            clamp_f64(&mut b.multiplier, 1.0, 16.0, &mut c.to_bounds);
            clamp_f64(&mut b.jitter, 0.0, 1.0, &mut c.to_bounds);
        }
        sdk::Action::HoldTeardown(h) => c.ms(&mut h.bound_ms, bounds.max_hold, left),
        sdk::Action::SetTimer(t) => c.ms(&mut t.after_ms, bounds.max_timer, left),
        sdk::Action::Log(l) => {
            if l.message.len() > bounds.max_log_len {
                let mut end = bounds.max_log_len;
                while !l.message.is_char_boundary(end) {
                    end -= 1;
                }
                l.message.truncate(end);
                c.to_bounds += 1;
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
        teardown_with(uid, 3_600_000)
    }

    fn teardown_with(uid: &str, max_hold_ms: u64) -> sdk::Event {
        sdk::Event::NetworkTeardown(sdk::NetworkTeardown {
            workload: sdk::WorkloadState::new(sdk::WorkloadInfo::new(uid)),
            since_shutdown_ms: None,
            max_hold_ms,
        })
    }

    fn shutdown(uid: &str, grace_remaining_ms: u64) -> sdk::Event {
        sdk::Event::ShutdownStarted(sdk::ShutdownStarted {
            workload: sdk::WorkloadState::new(sdk::WorkloadInfo::new(uid)),
            grace_deadline_ms: 1_000_000 + grace_remaining_ms,
            grace_remaining_ms,
        })
    }

    fn timer(subject: &str, after_ms: u64) -> sdk::Action {
        sdk::Action::SetTimer(sdk::SetTimer {
            subject: subject.into(),
            tag: "t".into(),
            after_ms,
        })
    }

    fn hold(uid: &str, bound_ms: u64) -> sdk::Action {
        sdk::Action::HoldTeardown(sdk::HoldTeardown {
            workload: uid.into(),
            bound_ms,
        })
    }

    /// The numbers of a decision's actions, in order: a GOAWAY's delay and
    /// hard deadline, a timer's delay, a hold's bound.
    fn numbers(v: &Validated) -> Vec<Option<u64>> {
        v.actions
            .iter()
            .flat_map(|a| match a {
                sdk::Action::Goaway(g) => vec![Some(g.delay_ms), g.hard_deadline_ms],
                sdk::Action::SetTimer(t) => vec![Some(t.after_ms)],
                sdk::Action::HoldTeardown(h) => vec![Some(h.bound_ms)],
                _ => vec![],
            })
            .collect()
    }

    /// With 5 s of grace left no deadline about the pod outlives it: a
    /// GOAWAY is sent and cut, a timer fires, within 5 s. A deadline
    /// already within it, and a GOAWAY naming none (the executor bounds the
    /// default), are left alone.
    #[test]
    fn with_a_5s_grace_no_deadline_about_the_pod_outlives_it() {
        let w = sdk::WorkloadInfo::new("mine");
        let actions = vec![
            sdk::Action::goaway_inbound(&w)
                .delay_ms(1_000)
                .hard_deadline_ms(10_000)
                .into(),
            sdk::Action::goaway_inbound(&w)
                .delay_ms(8_000)
                .hard_deadline_ms(1_000)
                .into(),
            sdk::Action::goaway_inbound(&w)
                .hard_deadline_ms(4_000)
                .into(),
            sdk::Action::goaway_inbound(&w).into(),
            timer("mine", 10_000),
        ];
        let v = validate(&shutdown("mine", 5_000), actions, &Bounds::default());
        assert_eq!(
            numbers(&v),
            [
                Some(1_000),
                Some(4_000),
                Some(5_000),
                Some(0),
                Some(0),
                Some(4_000),
                Some(0),
                None,
                Some(5_000)
            ]
        );
        assert_eq!((v.clamped, v.clamped_to_time_left), (4, 4));
    }

    /// At the teardown the time left is `max-hold-ms` (the engine makes it
    /// no more than the remaining grace): what the reference policies ask
    /// for with their default 10 s hold is held to 5 s.
    #[test]
    fn at_a_teardown_the_hold_and_goaway_end_within_max_hold() {
        let w = sdk::WorkloadInfo::new("mine");
        let actions = vec![
            sdk::Action::goaway_inbound(&w)
                .graceful()
                .hard_deadline_ms(10_000)
                .close_notify(true)
                .into(),
            hold("mine", 10_000),
        ];
        let v = validate(&teardown_with("mine", 5_000), actions, &Bounds::default());
        assert_eq!(numbers(&v), [Some(0), Some(5_000), Some(5_000)]);
        assert_eq!((v.clamped, v.clamped_to_time_left), (2, 2));
        // The configured bound binds first when it is the smaller: counted
        // as a bound, not as the time left.
        let v = validate(
            &teardown_with("mine", 3_600_000),
            vec![hold("mine", 3_600_000)],
            &Bounds::default(),
        );
        assert_eq!(numbers(&v), [Some(30_000)]);
        assert_eq!((v.clamped, v.clamped_to_time_left), (1, 0));
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
            hold("mine", 60_000),
        ];
        let v = validate(&teardown_with("mine", 5_000), actions, &Bounds::default());
        assert_eq!(v.actions.len(), 2);
        assert_eq!(v.ignored.len(), 1);
        assert_eq!(v.ignored[0].0, Ignored::OtherSubject);
        let sdk::Action::Goaway(g) = &v.actions[0] else {
            panic!()
        };
        assert_eq!(g.delay_ms, 5_000, "bounded by the event's max-hold-ms");
        assert_eq!(g.hard_deadline_ms, Some(0), "nothing left after the delay");
        let sdk::Action::HoldTeardown(h) = &v.actions[1] else {
            panic!()
        };
        assert_eq!(h.bound_ms, 5_000, "bounded by the event's max-hold-ms");
        assert_eq!((v.clamped, v.clamped_to_time_left), (3, 3));
        // Where no pod's time binds, the configured bounds do.
        let v = validate(
            &teardown("mine"),
            vec![sdk::Action::goaway_inbound(&w)
                .delay_ms(u64::MAX)
                .hard_deadline_ms(u64::MAX)
                .into()],
            &Bounds::default(),
        );
        assert_eq!(numbers(&v), [Some(60_000), Some(600_000)]);
        assert_eq!((v.clamped, v.clamped_to_time_left), (2, 0));
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
