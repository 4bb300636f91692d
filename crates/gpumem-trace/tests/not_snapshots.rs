//! Documents that decode but are no memory snapshot (a pickled dict of something else, a list
//! of numbers, containers nested 200,000 deep) are errors that say what the document holds;
//! an empty snapshot is a trace of 0 events; every committed snapshot still reads as before.

mod common;

use common::{dict, pickled};
use std::path::{Path, PathBuf};

use gpumem_trace::{read, read_path, Format, ReadError, ReadOptions, SnapshotEncoding};

/// The limit the errors name (the readers' `MAX_NESTING`).
const LIMIT: usize = 100;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn pytorch() -> ReadOptions {
    ReadOptions {
        format: Format::Pytorch,
        device: None,
    }
}

fn int(value: i64) -> serde_pickle::Value {
    serde_pickle::Value::I64(value)
}

/// The `found` of a [`ReadError::NotASnapshot`], checking that the message says the rest.
fn not_a_snapshot(result: Result<gpumem_trace::Trace, ReadError>) -> (SnapshotEncoding, String) {
    let error = result.expect_err("not a snapshot, yet it read");
    let message = error.to_string();
    assert!(
        message.contains(
            "not a PyTorch memory snapshot, which is a dict with `segments` and/or `device_traces`"
        ),
        "{message}"
    );
    match error {
        ReadError::NotASnapshot { encoding, found } => (encoding, found),
        other => panic!("{other}"),
    }
}

#[test]
fn a_dict_without_segments_or_device_traces_is_not_a_snapshot() {
    use serde_pickle::Value::{List, String as Str};
    // serde-pickle writes a dict's keys sorted.
    let cases = [
        (
            dict(vec![("a", int(1)), ("b", List(vec![int(2)]))]),
            "a dict with keys a, b",
        ),
        (dict(vec![]), "an empty dict"),
        (
            dict(vec![
                ("allocator_settings", dict(vec![])),
                ("segment", List(vec![])),
            ]),
            "a dict with keys allocator_settings, segment",
        ),
        (
            dict(
                (0..10)
                    .map(|k| {
                        (
                            ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9"][k],
                            Str("v".into()),
                        )
                    })
                    .collect(),
            ),
            "a dict with keys k0, k1, k2, k3, k4, k5, k6, k7 and 2 more",
        ),
    ];
    for (value, expected) in cases {
        let found = not_a_snapshot(read(pickled(&value).as_slice(), ReadOptions::default()));
        assert_eq!(found, (SnapshotEncoding::Pickle, expected.to_owned()));
    }
    // The same from JSON, named so, and from Python's own pickle (protocol 4, keys unsorted).
    let found = not_a_snapshot(read(&b"{\"b\": [1], \"a\": {}}"[..], pytorch()));
    assert_eq!(
        found,
        (SnapshotEncoding::Json, "a dict with keys a, b".to_owned())
    );
    // pickle.dumps({"b": 1, "a": [2]}, protocol=4)
    let python = b"\x80\x04\x95\x14\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01b\x94K\x01\x8c\x01a\x94]\x94K\x02au.";
    let found = not_a_snapshot(read(&python[..], ReadOptions::default()));
    assert_eq!(found.1, "a dict with keys b, a");
}

#[test]
fn a_list_that_is_not_segments_is_not_a_snapshot() {
    use serde_pickle::Value::{List, None as PyNone, String as Str};
    let cases = [
        (List(vec![int(1), int(2), int(3)]), "a list of 3 integers"),
        (
            List(vec![int(1), Str("two".into()), int(3), PyNone]),
            "a list of 4 items (integers, strings, Nones)",
        ),
        (
            List(vec![dict(vec![("name", Str("x".into()))]), dict(vec![])]),
            "a list of 2 dicts, the first with key name",
        ),
        (
            List(vec![dict(vec![("a", int(1)), ("b", int(2))])]),
            "a list of one item, a dict with keys a, b",
        ),
        (
            List(vec![List(vec![List(vec![])])]),
            "a list of one item, a list",
        ),
        (Str("segments".into()), "a string"),
        (PyNone, "None"),
    ];
    for (value, expected) in cases {
        let found = not_a_snapshot(read(pickled(&value).as_slice(), ReadOptions::default()));
        assert_eq!(found.1, expected);
    }
    let found = not_a_snapshot(read(&b" [1, 2.5]"[..], pytorch()));
    assert_eq!(
        found,
        (
            SnapshotEncoding::Json,
            "a list of 2 items (integers, floats)".to_owned()
        )
    );
}

/// An empty snapshot is a snapshot: a trace of no events, not an error.
#[test]
fn an_empty_snapshot_reads_as_zero_events() {
    use serde_pickle::Value::List;
    let empty = [
        dict(vec![
            ("segments", List(vec![])),
            ("device_traces", List(vec![List(vec![])])),
        ]),
        dict(vec![
            ("segments", List(vec![])),
            ("device_traces", List(vec![])),
        ]),
        dict(vec![("device_traces", List(vec![List(vec![])]))]),
        dict(vec![("segments", List(vec![]))]),
        // PyTorch 1.13's memory_snapshot() with nothing reserved.
        List(vec![]),
    ];
    for value in empty {
        let trace = read(pickled(&value).as_slice(), ReadOptions::default())
            .unwrap_or_else(|error| panic!("{value:?}: {error}"));
        assert_eq!(trace.events.len(), 0, "{value:?}");
        assert_eq!(trace.meta.source, "pytorch-snapshot");
    }
    let json = br#"{"segments": [], "device_traces": [[]], "allocator_settings": {}}"#;
    let trace = read(&json[..], ReadOptions::default()).unwrap();
    assert_eq!(trace.events.len(), 0);
}

/// `x = []; for _ in range(200_000): x = [x]`, as CPython's pickler writes it with protocol
/// 2: an EMPTY_LIST and a BINPUT (LONG_BINPUT from id 256) per list, then an APPEND per level
/// (checked byte for byte against Python's output when this was written).
fn deep_list_protocol_2(depth: u32) -> Vec<u8> {
    let mut pickle = b"\x80\x02".to_vec();
    for id in 0..=depth {
        pickle.push(b']');
        match u8::try_from(id) {
            Ok(id) => pickle.extend([b'q', id]),
            Err(_) => {
                pickle.push(b'r');
                pickle.extend(id.to_le_bytes());
            }
        }
    }
    pickle.extend(std::iter::repeat_n(b'a', depth as usize));
    pickle.push(b'.');
    pickle
}

/// The offset and encoding of a [`ReadError::NestedTooDeep`], checking its message.
fn too_deep(result: Result<gpumem_trace::Trace, ReadError>) -> (SnapshotEncoding, u64) {
    let error = result.expect_err("nested too deep, yet it read");
    let message = error.to_string();
    assert!(
        message.contains(&format!("containers nested more than {LIMIT} deep; a PyTorch memory snapshot nests fewer than 10 levels")),
        "{message}"
    );
    match error {
        ReadError::NestedTooDeep {
            encoding,
            offset,
            limit,
        } => {
            assert_eq!(limit, LIMIT);
            (encoding, offset)
        }
        other => panic!("{other}"),
    }
}

#[test]
fn pickles_nested_200000_deep_are_refused_naming_the_limit() {
    let depth = 200_000;
    let protocol_2 = deep_list_protocol_2(depth);
    let (encoding, offset) = too_deep(read(protocol_2.as_slice(), ReadOptions::default()));
    assert_eq!(encoding, SnapshotEncoding::Pickle);
    // The APPEND that makes level 101: after the lists (3 bytes each up to id 255, 6 after).
    let lists = 2 + 256 * 3 + (depth as u64 + 1 - 256) * 6;
    assert_eq!(offset, lists + LIMIT as u64 - 1);
    // Python's own protocol 5 (framed) and protocol 4 dicts, gzipped, through the file path.
    for name in ["deep_list_p5.pickle.gz", "deep_dict_p4.pickle.gz"] {
        let error = read_path(data(name), ReadOptions::default()).unwrap_err();
        let ReadError::InFile { source, .. } = error else {
            panic!("{name}: {error}")
        };
        too_deep(Err(*source));
    }
    // Within the limit, under a key gpumem does not read, nesting is no error.
    let mut nested = serde_pickle::Value::List(vec![]);
    for _ in 0..LIMIT - 2 {
        nested = serde_pickle::Value::List(vec![nested]);
    }
    let snapshot = dict(vec![
        ("device_traces", serde_pickle::Value::List(vec![])),
        ("external_annotations", nested.clone()),
    ]);
    assert!(read(pickled(&snapshot).as_slice(), ReadOptions::default()).is_ok());
    let snapshot = dict(vec![
        ("device_traces", serde_pickle::Value::List(vec![])),
        (
            "external_annotations",
            serde_pickle::Value::List(vec![nested]),
        ),
    ]);
    too_deep(read(pickled(&snapshot).as_slice(), ReadOptions::default()));
}

#[test]
fn json_nested_200000_deep_is_refused_naming_the_limit() {
    let depth = 200_000;
    let list = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let (encoding, offset) = too_deep(read(list.as_bytes(), pytorch()));
    assert_eq!((encoding, offset), (SnapshotEncoding::Json, LIMIT as u64));
    // Detected as a snapshot by its keys, then refused.
    let document = format!("{{\"segments\": {list}}}");
    let (_, offset) = too_deep(read(document.as_bytes(), ReadOptions::default()));
    assert_eq!(offset, "{\"segments\": ".len() as u64 + LIMIT as u64 - 1);
    // Brackets in strings do not count; 100 deep is accepted.
    let within = format!(
        "{{\"device_traces\": [], \"note\": \"{}\\\"[\", \"x\": {}{}}}",
        "[{".repeat(depth),
        "[".repeat(LIMIT - 1),
        "]".repeat(LIMIT - 1)
    );
    let trace = read(within.as_bytes(), ReadOptions::default()).unwrap();
    assert_eq!(trace.events.len(), 0);
}

/// A JSON dump of PyTorch 1.13's list of segments is detected and read like its pickle.
#[test]
fn a_json_list_of_segments_is_a_snapshot() {
    let json = br#"[{"device": 0, "address": 4096, "total_size": 2097152, "stream": 0,
        "blocks": [{"size": 512, "state": "active_allocated", "requested_size": 500},
                   {"size": 2096640, "state": "inactive"}]}]"#;
    let trace = read(&json[..], ReadOptions::default()).unwrap();
    assert_eq!(
        trace.events,
        vec![gpumem_trace::Event::Alloc {
            addr: 4096,
            size: 500,
            stream: 0
        }]
    );
}

/// Errors of a file name it once, first.
#[test]
fn a_file_error_names_the_path_once() {
    let dir = std::env::temp_dir().join(format!("gpumem-not-snapshot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("f.pickle");
    std::fs::write(&path, pickled(&dict(vec![("a", int(1))]))).unwrap();
    let message = read_path(&path, ReadOptions::default())
        .unwrap_err()
        .to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    let shown = path.display().to_string();
    assert!(
        message.starts_with(&format!(
            "{shown}: the pickle holds a dict with key a: not a PyTorch memory snapshot"
        )),
        "{message}"
    );
    assert_eq!(message.matches(&shown).count(), 1, "{message}");
}

/// Every committed snapshot reads to the number of events and the peak it read to before the
/// readers learnt to refuse what is no snapshot (recorded then).
#[test]
fn committed_snapshots_read_as_before() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let tests = "crates/gpumem-trace/tests/data";
    let traces = "testdata/traces";
    let small = (8, 20_971_776);
    let cases: [(&str, &str, (usize, u64)); 17] = [
        (tests, "snapshot_p0.pickle", small),
        (tests, "snapshot_p1.pickle", small),
        (tests, "snapshot_p2.pickle", small),
        (tests, "snapshot_p3.pickle", small),
        (tests, "snapshot_p4.pickle", small),
        (tests, "snapshot_p5.pickle", small),
        (tests, "torch1.13_segments.pickle", (2, 20_971_776)),
        (tests, "torch2.0_cpp.pickle", small),
        (tests, "torch2.0_python.pickle", small),
        (tests, "torch2.1_python.pickle", small),
        (tests, "torch2.15_python.pickle", small),
        (
            tests,
            "torch2.15.0_profile_to_snapshot.pickle",
            (416, 669_728),
        ),
        (
            tests,
            "torch2.15.0_profile_to_snapshot_p2.pickle",
            (416, 669_728),
        ),
        (
            traces,
            "small-gpt2-2l-infer-b1-s32.snapshot.p2.pickle",
            (364, 65_297_792),
        ),
        (
            traces,
            "small-gpt2-2l-infer-b1-s32.snapshot.p4.pickle",
            (364, 65_297_792),
        ),
        (
            traces,
            "h200-gpt2-train.snapshot.pickle.gz",
            (5725, 816_186_816),
        ),
        (
            traces,
            "h200-resnet-train.snapshot.pickle.gz",
            (5852, 366_095_976),
        ),
    ];
    for (dir, name, (events, peak)) in cases {
        let path = root.join(dir).join(name);
        let trace = read_path(&path, ReadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (trace.events.len(), trace.summary().peak_live_bytes),
            (events, peak),
            "{name}"
        );
        // Its JSON form (the same snapshot, written as JSON) reads to the same events.
        let snapshot = gpumem_trace::snapshot::read(flate2_or_plain(&path)).unwrap();
        let mut json = Vec::new();
        snapshot.write_json(&mut json).unwrap();
        let from_json = read(json.as_slice(), ReadOptions::default()).unwrap();
        assert_eq!(from_json.events, trace.events, "{name} as JSON");
    }
}

/// The bytes of `path`, gunzipped if it ends in `.gz`.
fn flate2_or_plain(path: &Path) -> std::io::Cursor<Vec<u8>> {
    use std::io::Read;
    let bytes = std::fs::read(path).unwrap();
    if path.extension().is_some_and(|extension| extension == "gz") {
        let mut plain = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes.as_slice())
            .read_to_end(&mut plain)
            .unwrap();
        std::io::Cursor::new(plain)
    } else {
        std::io::Cursor::new(bytes)
    }
}
