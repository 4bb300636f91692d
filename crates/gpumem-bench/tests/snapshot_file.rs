//! The generated snapshot is what it says it is: gpumem's reader finds the entries, events and
//! peak the generator counted, with and without frames, and Python's own unpickler reads the
//! same number of entries (without python3 the test fails with what to install, or skips that
//! check when the user opted out of missing test dependencies: `gpumem_testkit::deps`).

use std::process::Command;

use gpumem_bench::snapshot_file::{write_snapshot, Stacks};
use gpumem_testkit::deps;
use gpumem_trace::{read, ReadOptions};

#[test]
fn generated_snapshots_read_back_as_generated() {
    for stacks in [Stacks::Recorded, Stacks::None] {
        let mut pickle = Vec::new();
        let generated = write_snapshot(&mut pickle, 1 << 20, 7, stacks).unwrap();
        assert_eq!(generated.bytes, pickle.len() as u64);
        assert!(generated.bytes >= 1 << 20);
        let trace = read(pickle.as_slice(), ReadOptions::default()).unwrap();
        assert_eq!(trace.validate(), Ok(()));
        assert_eq!(trace.events.len() as u64, generated.events, "{stacks:?}");
        let summary = trace.summary();
        assert_eq!(summary.peak_live_bytes, generated.peak_live_bytes);
        assert_eq!(summary.live_bytes_at_end, generated.live_bytes_at_end);
        assert_eq!(trace.meta.extra["synthesized_allocs"], "0");
        assert_eq!(trace.meta.extra["segments"], "32");

        let snapshot = gpumem_trace::snapshot::read(pickle.as_slice()).unwrap();
        assert_eq!(snapshot.device_traces.len(), 2);
        assert_eq!(snapshot.device_traces[0].len() as u64, generated.entries);

        let python = Command::new("python3").arg("--version").output();
        if deps::require(deps::PYTHON3, python).is_none() {
            continue;
        }
        let path = std::env::temp_dir().join(format!(
            "gpumem-generated-snapshot-{}-{stacks:?}.pickle",
            std::process::id()
        ));
        std::fs::write(&path, &pickle).unwrap();
        let output = Command::new("python3")
            .arg("-c")
            .arg("import pickle, sys; s = pickle.load(open(sys.argv[1], 'rb')); print(len(s['device_traces'][0]), len(s['segments']))")
            .arg(&path)
            .output()
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            format!("{} 32", generated.entries)
        );
    }
}
