//! The SDK's WIT conversions: every event and action a trace file can hold
//! survives the trip to the generated WIT types and back unchanged (what a
//! plugin receives is what the host sent). Trace files are parsed with the
//! same loader `tidegate policy test` uses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidegate_sdk::bindings::tidegate::policy::types as wit;
use tidegate_sdk::trace::Trace;
use tidegate_sdk::{Action, Event};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(trace) = Trace::from_yaml(text) else {
        return;
    };
    for step in trace.steps {
        // Compared as Debug text: a NaN multiplier is equal to itself there.
        let back = Event::from(wit::Event::from(step.event.clone()));
        assert_eq!(format!("{back:?}"), format!("{:?}", step.event));
        for action in step.expect {
            let back = Action::from(wit::Action::from(action.clone()));
            assert_eq!(format!("{back:?}"), format!("{action:?}"));
        }
    }
});
