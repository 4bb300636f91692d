//! Recordings round-trip, report bad lines by number, and the bundled demo recording is the
//! synthetic demo (regenerate it with `GPUMEM_WRITE_TESTDATA=1 cargo test -p gpumem-watch
//! --test recording`).

use std::path::PathBuf;

use gpumem_watch::{synthetic, Recording, RecordingWriter, SampleSource, WatchError};

fn demo_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/watch/demo.jsonl")
}

#[test]
fn a_recording_plays_back_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    let samples = synthetic::demo(5);
    let mut writer = RecordingWriter::create(&path).unwrap();
    for s in &samples {
        writer.write(s).unwrap();
    }
    let mut recording = Recording::read(&path).unwrap();
    for s in &samples {
        assert_eq!(recording.next_sample().unwrap().as_ref(), Some(s));
    }
    assert_eq!(recording.next_sample().unwrap(), None);
}

#[test]
fn readers_need_only_the_time_and_ignore_extras() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    std::fs::write(&path, "{\"time_ms\": 5, \"future_field\": [1]}\n\n{\"time_ms\": 6, \"gpus\": [{\"index\": 0, \"memory_used\": 1, \"memory_total\": 2}]}\n").unwrap();
    let recording = Recording::read(&path).unwrap();
    assert_eq!(recording.samples().len(), 2);
    assert_eq!(recording.samples()[1].gpus[0].memory_total, 2);
}

#[test]
fn a_bad_line_is_named_by_number() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    std::fs::write(&path, "{\"time_ms\": 5}\n{\"time_ms\": \"soon\"}\n").unwrap();
    let error = Recording::read(&path).unwrap_err();
    assert!(
        matches!(error, WatchError::BadRecording { line: 2, .. }),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("r.jsonl:2: not a gpumem watch sample"),
        "{error}"
    );
    std::fs::write(&path, "\n").unwrap();
    assert!(Recording::read(&path)
        .unwrap_err()
        .to_string()
        .contains("holds no sample"));
}

#[test]
fn impossible_figures_are_refused_naming_the_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    let gpu_of = |used: u64, total: u64, fields: &str| {
        format!("{{\"index\": 0, \"memory_used\": {used}, \"memory_total\": {total}{fields}}}")
    };
    let gpu = |fields: &str| gpu_of(1, 2, fields);
    let cases = [
        (
            gpu_of(3, 2, ""),
            "gpus[0].memory_used is 3, above memory_total 2",
        ),
        (gpu_of(0, 0, ""), "gpus[0].memory_total is 0"),
        (
            gpu(", \"gpu_util\": 250"),
            "gpus[0].gpu_util is 250.0; accepted: a percentage from 0 to 100",
        ),
        (gpu(", \"gpu_util\": -1e308"), "gpus[0].gpu_util is -1e308"),
        (
            gpu(", \"memory_util\": 1e308"),
            "gpus[0].memory_util is 1e308",
        ),
        (
            gpu(", \"power_watts\": -5"),
            "gpus[0].power_watts is -5.0; accepted: a finite number, 0 or more",
        ),
        (
            gpu(", \"processes\": [{\"pid\": 1, \"cpu_percent\": -1}]"),
            "gpus[0].processes[].cpu_percent is -1.0",
        ),
        (
            format!("{}, {}", gpu(""), gpu("")),
            "gpus[1].index is 0, as in an earlier entry",
        ),
    ];
    for (gpus, expected) in cases {
        let bad = format!("{{\"time_ms\": 6, \"gpus\": [{gpus}]}}");
        std::fs::write(&path, format!("{{\"time_ms\": 5}}\n{bad}\n")).unwrap();
        let error = Recording::read(&path).unwrap_err();
        assert!(
            matches!(error, WatchError::BadSample { line: 2, .. }),
            "{bad}: {error}"
        );
        let text = error.to_string();
        assert!(text.contains("r.jsonl:2: impossible sample: "), "{text}");
        assert!(text.contains(expected), "{bad}: {text}");
    }
    let pool = |pid: u32, allocated: u64| {
        format!("{{\"pid\": {pid}, \"device\": 0, \"policy\": \"torch\", \"allocated\": {allocated}, \"reserved\": 10, \"largest_free_block\": 0, \"num_ooms\": 0, \"soft_limit\": null, \"hard_limit\": null, \"last_oom\": null, \"status\": \"\"}}")
    };
    for (pools, expected) in [
        (pool(1, 11), "pools[0].allocated is 11, above reserved 10"),
        (
            format!("{}, {}", pool(1, 1), pool(1, 2)),
            "pools[1] is a second pool of pid 1 on device 0",
        ),
    ] {
        std::fs::write(&path, format!("{{\"time_ms\": 5, \"pools\": [{pools}]}}\n")).unwrap();
        let text = Recording::read(&path).unwrap_err().to_string();
        assert!(
            text.contains(&format!("r.jsonl:1: impossible sample: {expected}")),
            "{text}"
        );
    }
}

#[test]
fn samples_play_in_file_order_even_when_the_clock_went_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    std::fs::write(&path, "{\"time_ms\": 5000}\n{\"time_ms\": 4000}\n").unwrap();
    let times: Vec<u64> = Recording::read(&path)
        .unwrap()
        .samples()
        .iter()
        .map(|s| s.time_ms)
        .collect();
    assert_eq!(times, vec![5000, 4000]);
}

#[test]
fn the_bundled_demo_is_the_synthetic_demo() {
    let demo = synthetic::demo(60);
    if std::env::var_os("GPUMEM_WRITE_TESTDATA").is_some() {
        std::fs::create_dir_all(demo_path().parent().unwrap()).unwrap();
        let mut writer = RecordingWriter::create(&demo_path()).unwrap();
        for s in &demo {
            writer.write(s).unwrap();
        }
    }
    let bundled = Recording::read(&demo_path()).unwrap();
    assert_eq!(bundled.samples(), demo.as_slice());
    let last_oom = demo[59].pools[1].last_oom.as_deref().unwrap();
    assert!(!last_oom.contains("did not fail"), "{last_oom}");
    assert!(last_oom.contains("2.50 GiB"), "{last_oom}");
}
