//! What `tidegate-cni` reads from the container runtime and the gateway
//! (its `conf.rs`, included as it is): any network configuration is a
//! result or a CNI error with one of the spec's codes, never a panic; a
//! DEL's own keys are always in range; and an acknowledgement is only ever
//! a JSON object with a string `result` other than `bad-request`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

#[path = "../../cni/src/conf.rs"]
#[allow(dead_code)]
mod conf;

const COMMANDS: [&str; 8] = [
    "ADD", "CHECK", "DEL", "GC", "STATUS", "VERSION", "", "BOGUS",
];

fuzz_target!(|data: &[u8]| {
    if let Ok(ack) = conf::acknowledgement(data) {
        let v: Value = serde_json::from_str(&ack).expect("an acknowledgement is JSON");
        let result = v
            .get("result")
            .and_then(Value::as_str)
            .expect("with a result");
        assert!(!result.is_empty() && result != "bad-request", "{ack}");
    }
    let Some((&c, rest)) = data.split_first() else {
        return;
    };
    let Ok(stdin) = std::str::from_utf8(rest) else {
        return;
    };
    match conf::parse(COMMANDS[c as usize % COMMANDS.len()], stdin) {
        Ok(conf::Parsed::Del(keys)) => {
            let ms = keys.timeout.as_millis() as u64;
            assert!((1..=conf::MAX_TIMEOUT_MS).contains(&ms), "{ms}");
            assert!(!keys.socket.is_empty());
        }
        Ok(conf::Parsed::Add(out, _) | conf::Parsed::Version(out)) => {
            serde_json::from_str::<Value>(&out).expect("ADD and VERSION print JSON");
        }
        Ok(conf::Parsed::Nothing) => {}
        Err(e) => assert!([1, 4, 6, 7].contains(&e.code), "code {}", e.code),
    }
});
