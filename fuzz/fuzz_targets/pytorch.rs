//! The PyTorch snapshot reader (pickle of any protocol, or JSON) and its conversion to a
//! trace: no input panics, and a trace that comes back is valid.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(snapshot) = gpumem_trace::snapshot::read(data) {
        for device in 0..snapshot.device_traces.len().min(4) {
            if let Ok(trace) = gpumem_trace::snapshot::to_trace(&snapshot, Some(device)) {
                assert_eq!(trace.validate(), Ok(()));
            }
        }
    }
});
