//! The gateway's CNI socket protocol (`inpod::intake::cni_socket::read_command`): any
//! byte stream is one request (`teardown` or `add`) or a refusal with a
//! metric reason, never a panic; an accepted request came from one line
//! within the bound.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tidegate::inpod::intake::cni_socket::{read_command, Refused, MAX_LINE};

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    match rt.block_on(read_command(data, Duration::from_secs(5))) {
        Ok(Some(req)) => {
            let line_len = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
            assert!(line_len <= MAX_LINE);
            assert!(
                ["teardown", "add"].contains(&req.command.as_str()),
                "{:?}",
                req.command
            );
        }
        Ok(None) => assert!(data.is_empty()),
        Err(Refused(reason, error)) => {
            assert!(
                ["bad_request", "line_too_long", "read_timeout"].contains(&reason),
                "{reason}"
            );
            assert!(!error.is_empty());
        }
    }
});
