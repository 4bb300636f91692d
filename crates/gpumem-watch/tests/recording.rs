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
