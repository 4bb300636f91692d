//! The RMM logging CSV reader: no input panics, and a trace that comes back is valid.
#![no_main]

use gpumem_trace::formats::rmm::read_rmm;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(trace) = read_rmm(data) {
        assert_eq!(trace.validate(), Ok(()));
    }
});
