//! Reading and writing through the public entry points: gzip, detection, paths.

use gpumem_trace::{
    read, read_path, write_path, Event, Format, ReadError, ReadOptions, Trace, TraceMeta,
};

fn small_trace() -> Trace {
    Trace::new(
        TraceMeta {
            name: String::new(),
            source: "test".to_owned(),
            device_total: None,
            extra: Default::default(),
        },
        vec![
            Event::Step { index: 0 },
            Event::Alloc {
                addr: 0x1000,
                size: 512,
                stream: 0,
            },
            Event::Alloc {
                addr: 0x2000,
                size: 1 << 20,
                stream: 3,
            },
            Event::Free {
                addr: 0x1000,
                stream: 0,
            },
        ],
    )
}

fn temp_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumem-trace-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn native_gzip_round_trip_through_paths_names_the_trace_after_the_file() {
    let path = temp_dir().join("tiny.jsonl.gz");
    write_path(&small_trace(), &path, Format::Native).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "written gzip-compressed");
    let trace = read_path(&path, ReadOptions::default()).unwrap();
    assert_eq!(trace.meta.name, "tiny");
    assert_eq!(trace.events, small_trace().events);
}

#[test]
fn unnamed_traces_are_named_after_the_file_without_its_extensions() {
    let path = temp_dir().join("gpt2-1.5b.csv.gz");
    write_path(&small_trace(), &path, Format::Auto).unwrap();
    assert_eq!(
        read_path(&path, ReadOptions::default()).unwrap().meta.name,
        "gpt2-1.5b"
    );
}

#[test]
fn errors_from_files_name_the_file() {
    let path = temp_dir().join("broken.jsonl");
    std::fs::write(
        &path,
        "{\"gpumem_trace\":1}\n{\"op\":\"free\",\"addr\":1}\n",
    )
    .unwrap();
    let error = read_path(&path, ReadOptions::default()).unwrap_err();
    assert!(matches!(error, ReadError::InFile { .. }));
    let message = error.to_string();
    assert!(message.contains("broken.jsonl"), "{message}");
    assert!(message.contains("line 2: free of address 0x1"), "{message}");
}

#[test]
fn unknown_content_is_not_guessed() {
    let error = read(&b"hello world"[..], ReadOptions::default()).unwrap_err();
    assert!(matches!(error, ReadError::UnknownFormat { .. }), "{error}");
    let error = read(&b""[..], ReadOptions::default()).unwrap_err();
    assert!(matches!(error, ReadError::UnknownFormat { .. }), "{error}");
}

#[test]
fn format_names_parse() {
    assert_eq!("native".parse::<Format>(), Ok(Format::Native));
    assert_eq!("auto".parse::<Format>(), Ok(Format::Auto));
    assert!("xml".parse::<Format>().is_err());
}

#[test]
fn every_format_round_trips_through_a_gzip_file_chosen_by_extension() {
    let dir = temp_dir();
    let blocks_only: Vec<Event> = small_trace().events[1..].to_vec();
    for name in ["t.jsonl.gz", "t.csv.gz", "t.pickle.gz", "t.csv", "t.pickle"] {
        let path = dir.join(name);
        write_path(&small_trace(), &path, Format::Auto).unwrap();
        let trace = read_path(&path, ReadOptions::default()).unwrap();
        let expected = if name.starts_with("t.jsonl") {
            small_trace().events
        } else {
            blocks_only.clone()
        };
        assert_eq!(trace.events, expected, "{name}");
    }
}

#[test]
fn snapshot_write_path_picks_json_or_pickle() {
    let dir = temp_dir();
    let snapshot = gpumem_trace::snapshot::from_trace(&small_trace(), 0);
    for name in ["s.json", "s.pickle"] {
        let path = dir.join(name);
        snapshot.write_path(&path).unwrap();
        let first = std::fs::read(&path).unwrap()[0];
        assert_eq!(first, if name.ends_with("json") { b'{' } else { 0x80 });
        let back = gpumem_trace::snapshot::read(std::fs::File::open(&path).unwrap()).unwrap();
        assert_eq!(back, snapshot);
    }
}
