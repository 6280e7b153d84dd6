//! The workload file loader: any text is a list of workloads or an error
//! naming what is wrong, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = tidegate::workloads::parse_workload_file(text);
    }
});
