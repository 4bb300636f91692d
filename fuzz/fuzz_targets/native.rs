//! The native JSON-lines reader, also through gzip and format detection: no input panics,
//! and a trace that comes back is valid.
#![no_main]

use gpumem_trace::formats::native::read_native;
use gpumem_trace::{read, ReadOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(trace) = read_native(data) {
        assert_eq!(trace.validate(), Ok(()));
    }
    if let Ok(trace) = read(data, ReadOptions::default()) {
        assert_eq!(trace.validate(), Ok(()));
    }
});
