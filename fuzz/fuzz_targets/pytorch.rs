//! The PyTorch snapshot reader (pickle of any protocol, or JSON) and its conversion to a
//! trace: no input panics, and a trace that comes back is valid.
#![no_main]

use gpumem_trace::Snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(snapshot) = Snapshot::read(data) {
        for device in 0..snapshot.device_traces.len().min(4) {
            if let Ok(trace) = snapshot.to_trace(Some(device)) {
                assert_eq!(trace.validate(), Ok(()));
            }
        }
    }
});
