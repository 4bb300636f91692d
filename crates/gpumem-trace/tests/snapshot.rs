//! PyTorch snapshots: reading real-shaped pickles of every protocol, the cross-format check on
//! the small fixture, and the memory_viz writer (opcode subset, read-back, Python's view).

mod common;

use common::{dict, pickled};
use std::path::{Path, PathBuf};
use std::process::Command;

use gpumem_trace::snapshot::{
    Action, BlockState, SegmentType, SettingValue, Snapshot, SnapshotBlock, SnapshotSegment,
    Stacks, TraceEntry,
};
use gpumem_trace::{read_path, Event, Format, ReadError, ReadOptions, Trace};

const A: u64 = 0x7F00_0000_0000;
const B: u64 = 0x7F00_0020_0000;
const C: u64 = 0x7F00_0020_0200;
const D: u64 = B;
const E: u64 = 0x7F00_0200_0000;
const S7: u64 = 0x55D0_C0DE_0000;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// The block trace `make_fixtures.py` wrote in every format.
fn expected_events() -> Vec<Event> {
    let alloc = |addr, size, stream| Event::Alloc { addr, size, stream };
    let free = |addr| Event::Free { addr, stream: 0 };
    vec![
        alloc(A, 1024, 0),
        alloc(B, 512, 0),
        alloc(C, 1000, 0),
        free(B),
        free(A),
        alloc(D, 256, S7),
        free(C),
        alloc(E, 20 << 20, 0),
    ]
}

fn read_fixture_snapshot(protocol: u8) -> Snapshot {
    let file = std::fs::File::open(data(&format!("snapshot_p{protocol}.pickle"))).unwrap();
    gpumem_trace::snapshot::read(file).unwrap()
}

#[test]
fn every_pickle_protocol_reads_to_the_same_snapshot() {
    let reference = read_fixture_snapshot(2);
    for protocol in [0, 1, 3, 4, 5] {
        assert_eq!(
            read_fixture_snapshot(protocol),
            reference,
            "protocol {protocol}"
        );
    }
}

#[test]
fn snapshot_segments_blocks_and_settings_are_read() {
    let snapshot = read_fixture_snapshot(4);
    assert_eq!(snapshot.segments.len(), 2);
    let small = &snapshot.segments[0];
    assert_eq!(small.segment_type, Some(SegmentType::Small));
    assert_eq!(small.stream, S7);
    assert_eq!(
        small.blocks[1].state,
        BlockState::ActivePendingFree,
        "active_awaiting_free"
    );
    assert_eq!(small.blocks[1].requested_size, 1000);

    // The legacy segment: block address from the segment base, requested size from history,
    // allocated/active/requested sizes from the blocks.
    let legacy = &snapshot.segments[1];
    assert_eq!(legacy.segment_pool_id, (1, 2));
    assert!(legacy.is_expandable);
    assert_eq!(
        legacy.blocks,
        vec![SnapshotBlock {
            address: E,
            size: 20 << 20,
            requested_size: 20 << 20,
            state: BlockState::ActiveAllocated
        }]
    );
    assert_eq!(legacy.allocated_size, 20 << 20);
    assert_eq!(legacy.active_size, 20 << 20);

    let trace = &snapshot.device_traces[0];
    assert_eq!(trace.len(), 14);
    assert_eq!(trace[5].action, Action::Oom);
    assert_eq!(trace[5].device_free, Some(123 << 20));
    assert_eq!(trace[10].action, Action::UserDefined);
    assert!(snapshot.device_traces[1].is_empty());

    assert_eq!(
        snapshot.allocator_settings["expandable_segments"],
        SettingValue::Bool(true)
    );
    assert_eq!(
        snapshot.allocator_settings["max_split_size"],
        SettingValue::Int(-1)
    );
    let SettingValue::Map(divisions) = &snapshot.allocator_settings["roundup_power2_divisions"]
    else {
        panic!("roundup_power2_divisions is a dict")
    };
    assert_eq!(divisions.len(), 3);
}

#[test]
fn snapshot_trace_synthesises_allocations_made_before_recording() {
    let trace = gpumem_trace::snapshot::to_trace(&read_fixture_snapshot(2), None).unwrap();
    assert_eq!(trace.events, expected_events());
    assert_eq!(trace.validate(), Ok(()));
    assert_eq!(trace.meta.extra["synthesized_allocs"], "1");
    assert_eq!(trace.meta.extra["synthesized_alloc_bytes"], "1024");
    assert_eq!(trace.meta.extra["segments"], "2");
    assert_eq!(
        trace.meta.extra["reserved_bytes"],
        (22u64 << 20).to_string()
    );
    let summary = trace.summary();
    assert_eq!(summary.live_bytes_at_end, 256 + (20 << 20));
}

#[test]
fn device_choice_is_honoured() {
    let snapshot = read_fixture_snapshot(3);
    assert!(gpumem_trace::snapshot::to_trace(&snapshot, Some(1))
        .unwrap()
        .events
        .is_empty());
    assert!(matches!(
        gpumem_trace::snapshot::to_trace(&snapshot, Some(2)),
        Err(ReadError::NoSuchDevice {
            requested: 2,
            available: 2
        })
    ));
    let options = ReadOptions {
        format: Format::Auto,
        device: Some(1),
    };
    assert!(read_path(data("snapshot_p4.pickle"), options)
        .unwrap()
        .events
        .is_empty());
}

#[test]
fn the_three_formats_of_the_small_trace_agree() {
    for name in [
        "small.jsonl",
        "small_rmm.csv",
        "snapshot_p0.pickle",
        "snapshot_p1.pickle",
        "snapshot_p2.pickle",
        "snapshot_p3.pickle",
        "snapshot_p4.pickle",
        "snapshot_p5.pickle",
    ] {
        let trace = read_path(data(name), ReadOptions::default()).unwrap();
        assert_eq!(trace.events, expected_events(), "{name}");
    }
}

#[test]
fn invalid_snapshot_events_name_device_and_index() {
    let mut snapshot = read_fixture_snapshot(4);
    let double_alloc = snapshot.device_traces[0][1].clone();
    snapshot.device_traces[0].insert(2, double_alloc);
    let error = gpumem_trace::snapshot::to_trace(&snapshot, Some(0)).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("snapshot device_traces[0][2]: alloc at address {B:#x}, which is already live")
    );
}

#[test]
fn malformed_snapshots_are_errors_that_say_where() {
    let cases: [(&[u8], &str); 6] = [
        (b"\x80\x04garbage", "pickle byte 2: opcode 0x67"),
        (
            b"\x80\x03K\x05.",
            "the pickle holds an integer: not a PyTorch memory snapshot",
        ),
        (
            b"{\"segments\": 5}",
            "snapshot segments: expected a list, found an integer",
        ),
        (
            b"{\"segments\": [{\"address\": 1, \"segment_type\": \"large\"}]}",
            "snapshot segments[0].total_size: expected a value (the field is required)",
        ),
        (
            b"{\"device_traces\": [[{\"action\": \"alloc\", \"addr\": -1}]]}",
            "snapshot device_traces[0][0].addr: expected a non-negative 64-bit integer (0 to 18446744073709551615), found -1",
        ),
        (
            b"{\"segments\": [}",
            "line 1: expected a JSON memory snapshot",
        ),
    ];
    for (bytes, expected) in cases {
        let message = gpumem_trace::snapshot::read(bytes).unwrap_err().to_string();
        assert!(message.starts_with(expected), "{message}");
    }
}

/// A snapshot exercising every field the writer emits.
fn written_snapshot() -> Snapshot {
    let entry = |action, addr, size| TraceEntry {
        action,
        addr,
        size,
        stream: S7,
        time_us: 1_732_233_600_000_000,
        device_free: None,
        stack: None,
    };
    let mut stacks = Stacks::default();
    let frames = [
        stacks.frame("/site-packages/torch/nn/modules/linear.py", 125, "forward"),
        stacks.frame("train.py", 42, "step"),
    ];
    let stack = stacks.stack(&frames);
    Snapshot {
        segments: vec![SnapshotSegment {
            device: 0,
            address: E,
            total_size: 20 << 20,
            allocated_size: 12 << 20,
            active_size: 12 << 20,
            requested_size: (12 << 20) - 100,
            stream: S7,
            segment_type: Some(SegmentType::Large),
            segment_pool_id: (0, 0),
            is_expandable: false,
            blocks: vec![
                SnapshotBlock {
                    address: E,
                    size: 12 << 20,
                    requested_size: (12 << 20) - 100,
                    state: BlockState::ActiveAllocated,
                },
                SnapshotBlock {
                    address: E + (12 << 20),
                    size: 8 << 20,
                    requested_size: 0,
                    state: BlockState::Inactive,
                },
            ],
        }],
        device_traces: vec![vec![
            entry(Action::SegmentAlloc, E, 20 << 20),
            TraceEntry {
                stack,
                ..entry(Action::Alloc, E, (12 << 20) - 100)
            },
            entry(Action::Alloc, E + (12 << 20), 5),
            entry(Action::FreeRequested, E + (12 << 20), 5),
            entry(Action::FreeCompleted, E + (12 << 20), 5),
            TraceEntry {
                device_free: Some(1 << 30),
                ..entry(Action::Oom, 0, 40 << 30)
            },
            entry(Action::SegmentMap, E, 2 << 20),
            entry(Action::SegmentUnmap, E, 2 << 20),
            entry(Action::SegmentFree, A, 2 << 20),
        ]],
        allocator_settings: [
            ("expandable_segments".to_owned(), SettingValue::Bool(false)),
            ("max_split_size".to_owned(), SettingValue::Int(-1)),
            (
                "garbage_collection_threshold".to_owned(),
                SettingValue::Float(0.8),
            ),
            (
                "PYTORCH_CUDA_ALLOC_CONF".to_owned(),
                SettingValue::Str(String::new()),
            ),
        ]
        .into_iter()
        .collect(),
        stacks,
    }
}

#[test]
fn written_pickle_and_json_read_back_equal() {
    let snapshot = written_snapshot();
    let mut pickle = Vec::new();
    snapshot.write_pickle(&mut pickle).unwrap();
    assert_eq!(&pickle[..2], &[0x80, 3], "protocol 3");
    assert_eq!(
        gpumem_trace::snapshot::read(pickle.as_slice()).unwrap(),
        snapshot
    );
    let mut json = Vec::new();
    snapshot.write_json(&mut json).unwrap();
    assert_eq!(
        gpumem_trace::snapshot::read(json.as_slice()).unwrap(),
        snapshot
    );
}

/// Walks a pickle's opcodes, accepting only those memory_viz's JavaScript unpickler handles,
/// and LONG1 integers of at most 8 bytes (longer ones become BigInts that break its
/// arithmetic). Returns the opcodes seen.
fn viewer_opcodes(pickle: &[u8]) -> Result<Vec<u8>, String> {
    let mut seen = Vec::new();
    let mut at = 0;
    loop {
        let opcode = *pickle.get(at).ok_or("no STOP")?;
        seen.push(opcode);
        at += 1;
        let argument_len = match opcode {
            b'.' => return Ok(seen),
            0x80 => 1, // PROTO
            b'}' | b']' | b')' | b'(' | b'e' | b'u' | b'a' | b's' | b'l' | b'd' | b't' | 0x85
            | 0x86 | 0x87 | 0x88 | 0x89 | b'N' | 0x94 => 0,
            b'K' | b'q' | b'h' => 1,
            b'M' => 2,
            b'J' | b'r' | b'j' => 4,
            b'G' => 8,
            0x95 => 8, // FRAME
            0x8a => {
                let len = pickle[at] as usize;
                if len > 8 {
                    return Err(format!("LONG1 of {len} bytes at {at}"));
                }
                1 + len
            }
            b'X' => 4 + u32::from_le_bytes(pickle[at..at + 4].try_into().unwrap()) as usize,
            0x8c => 1 + pickle[at] as usize,
            other => return Err(format!("opcode {other:#04x} at {} not accepted", at - 1)),
        };
        at += argument_len;
    }
}

#[test]
fn written_pickle_uses_only_opcodes_memory_viz_accepts() {
    let mut pickle = Vec::new();
    written_snapshot().write_pickle(&mut pickle).unwrap();
    let opcodes = viewer_opcodes(&pickle).unwrap();
    assert!(opcodes.contains(&0x8a), "large addresses are LONG1");
    // A real PyTorch pickle of protocol 4 goes through the same checker (FRAME, MEMOIZE...).
    let torch_like = std::fs::read(data("snapshot_p4.pickle")).unwrap();
    viewer_opcodes(&torch_like).unwrap();
}

#[test]
fn python_loads_the_written_snapshot() {
    // Without python3: a failure naming the package, or a skip when the user opted out.
    let python = Command::new("python3").arg("--version").output();
    if gpumem_testkit::deps::require(gpumem_testkit::deps::PYTHON3, python).is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("gpumem-snapshot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pickle_path = dir.join("snapshot.pickle");
    let json_path = dir.join("snapshot.json");
    let snapshot = written_snapshot();
    snapshot
        .write_pickle(std::fs::File::create(&pickle_path).unwrap())
        .unwrap();
    snapshot
        .write_json(std::fs::File::create(&json_path).unwrap())
        .unwrap();
    let output = Command::new("python3")
        .arg(data("check_snapshot.py"))
        .arg(&pickle_path)
        .arg(&json_path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("ok: 1 segments"));
}

#[test]
fn trace_to_snapshot_and_back_keeps_blocks() {
    let trace = read_path(data("small.jsonl"), ReadOptions::default()).unwrap();
    let snapshot = gpumem_trace::snapshot::from_trace(&trace, 1);
    assert!(snapshot.device_traces[0].is_empty());
    let actions: Vec<Action> = snapshot.device_traces[1].iter().map(|e| e.action).collect();
    assert_eq!(
        &actions[3..5],
        &[Action::FreeRequested, Action::FreeCompleted]
    );
    assert_eq!(
        snapshot.device_traces[1][3].size, 512,
        "frees carry the block size"
    );
    let back: Trace = gpumem_trace::snapshot::to_trace(&snapshot, None).unwrap();
    assert_eq!(back.events, trace.events);
    assert_eq!(back.meta.extra["device"], "1");
}

#[test]
fn blocks_allocated_before_recording_and_never_freed_come_from_segments() {
    let mut snapshot = written_snapshot();
    // The trace allocates E+12MiB and frees it; the block at E (12 MiB - 100 requested) is
    // active in the segment but absent from the trace: allocated before recording.
    snapshot.device_traces[0].retain(|entry| entry.addr != E || entry.action != Action::Alloc);
    let trace = gpumem_trace::snapshot::to_trace(&snapshot, None).unwrap();
    assert_eq!(
        trace.events[0],
        Event::Alloc {
            addr: E,
            size: (12 << 20) - 100,
            stream: S7
        }
    );
    assert_eq!(trace.meta.extra["synthesized_from_segments"], "1");
    assert_eq!(trace.meta.extra["synthesized_allocs"], "1");
    assert_eq!(trace.summary().live_bytes_at_end, (12 << 20) - 100);
    assert_eq!(trace.validate(), Ok(()));
}

/// Snapshots written by PyTorch's own code (`make_torch_snapshots.py`: PyTorch 2.15's
/// `_profile_to_snapshot`, which memory_viz's `profile_plot` uses) read and replay as the
/// numbers Python itself read from them say: no `segment_type`, no block addresses, stack
/// frames and categories on every event.
#[test]
fn snapshots_written_by_pytorch_itself_are_read() {
    let name = "torch2.15.0_profile_to_snapshot";
    let expected: serde_json::Value = serde_json::from_reader(
        std::fs::File::open(data(&format!("{name}.expected.json"))).unwrap(),
    )
    .unwrap();
    for suffix in ["", "_p2"] {
        let file = std::fs::File::open(data(&format!("{name}{suffix}.pickle"))).unwrap();
        let snapshot = gpumem_trace::snapshot::read(file).unwrap();
        let segments = expected["segments"].as_array().unwrap();
        assert_eq!(snapshot.segments.len(), segments.len());
        for (ours, theirs) in snapshot.segments.iter().zip(segments) {
            assert_eq!(ours.address, theirs["address"].as_u64().unwrap());
            assert_eq!(ours.total_size, theirs["total_size"].as_u64().unwrap());
            assert_eq!(ours.blocks.len() as u64, theirs["blocks"].as_u64().unwrap());
            assert_eq!(ours.segment_type, None, "PyTorch wrote none");
            // Blocks without addresses tile the segment from its base.
            let end = ours.blocks.last().map(|b| b.address + b.size).unwrap();
            assert_eq!(end, ours.address + ours.total_size);
        }
        let device = expected["device"].as_u64().unwrap() as usize;
        let trace = gpumem_trace::snapshot::to_trace(&snapshot, Some(device)).unwrap();
        assert_eq!(trace.validate(), Ok(()));
        assert_eq!(
            trace.events.len() as u64,
            expected["events"].as_u64().unwrap()
        );
        assert_eq!(
            trace.summary().peak_live_bytes,
            expected["peak_live_bytes"].as_u64().unwrap()
        );
        // Auto-detected as a PyTorch snapshot by the format reader too.
        let path = data(&format!("{name}{suffix}.pickle"));
        let read = read_path(&path, ReadOptions::default()).unwrap();
        assert_eq!(read.events, trace.events);
    }
}

/// Snapshots in the layouts of PyTorch's producers across versions (`make_version_snapshots.py`):
/// each reads to the same block trace; the fields each version lacks are not required.
#[test]
fn snapshots_of_every_pytorch_version_read_to_the_same_trace() {
    for name in [
        "torch2.0_python.pickle",
        "torch2.0_cpp.pickle",
        "torch2.1_python.pickle",
        "torch2.15_python.pickle",
    ] {
        let trace = read_path(data(name), ReadOptions::default()).unwrap();
        assert_eq!(trace.events, expected_events(), "{name}");
        assert_eq!(trace.meta.extra["segments"], "2", "{name}");
        let snapshot = gpumem_trace::snapshot::read(std::fs::File::open(data(name)).unwrap())
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        // The live block of B's segment: its address and requested size, from the block or
        // (2.0, no address or requested size) from its history and the segment base.
        let block = &snapshot.segments[0].blocks[0];
        assert_eq!((block.address, block.requested_size), (D, 256), "{name}");
        assert_eq!(snapshot.device_traces[0][5].action, Action::Oom, "{name}");
        assert_eq!(
            snapshot.device_traces[0][5].device_free,
            Some(123 << 20),
            "{name}"
        );
    }
    let newest =
        gpumem_trace::snapshot::read(std::fs::File::open(data("torch2.15_python.pickle")).unwrap())
            .unwrap();
    assert_eq!(
        newest.device_traces[0][9].action,
        Action::Unknown,
        "annotate"
    );
    assert_eq!(
        newest.allocator_settings["max_split_size"],
        SettingValue::Int(-1)
    );
}

/// PyTorch 1.13's `memory_snapshot()` is a list of segments with no trace: the blocks live
/// at snapshot time become the trace.
#[test]
fn a_list_of_segments_reads_as_the_live_blocks() {
    let trace = read_path(data("torch1.13_segments.pickle"), ReadOptions::default()).unwrap();
    assert_eq!(
        trace.events,
        vec![
            Event::Alloc {
                addr: D,
                size: 256,
                stream: S7
            },
            Event::Alloc {
                addr: E,
                size: 20 << 20,
                stream: 0
            },
        ]
    );
    assert_eq!(trace.meta.extra["synthesized_from_segments"], "2");
}

/// Every prefix of a snapshot (plain and gzipped) is an error naming where the input ended,
/// never a panic and never a trace.
#[test]
fn a_snapshot_cut_anywhere_is_an_error_naming_the_offset() {
    for name in [
        "torch2.15_python.pickle",
        "torch2.0_cpp.pickle",
        "snapshot_p0.pickle",
    ] {
        let bytes = std::fs::read(data(name)).unwrap();
        for cut in 1..bytes.len() {
            let error = gpumem_trace::read(&bytes[..cut], ReadOptions::default()).unwrap_err();
            let ReadError::Pickle { offset, detail } = &error else {
                panic!("{name} cut at {cut}: {error}");
            };
            assert!(*offset <= cut as u64, "{name} cut at {cut}: {error}");
            assert!(detail.contains("ends"), "{name} cut at {cut}: {error}");
        }
    }
    let mut gzipped = Vec::new();
    {
        use std::io::Write;
        let mut encoder =
            flate2::write::GzEncoder::new(&mut gzipped, flate2::Compression::default());
        encoder
            .write_all(&std::fs::read(data("torch2.15_python.pickle")).unwrap())
            .unwrap();
        encoder.finish().unwrap();
    }
    for cut in 1..gzipped.len() {
        assert!(
            gpumem_trace::read(&gzipped[..cut], ReadOptions::default()).is_err(),
            "gzip cut at {cut}"
        );
    }
}

#[test]
fn wrong_types_in_fields_are_errors_naming_the_field() {
    use serde_pickle::Value::{Bool, Bytes, Dict, Int, List, String as Str};
    let good_entry = || {
        dict(vec![
            ("action", Str("alloc".into())),
            ("addr", Int(4096.into())),
            ("size", Int(512.into())),
        ])
    };
    let traces = |entry| {
        dict(vec![(
            "device_traces",
            List(vec![List(vec![good_entry(), entry])]),
        )])
    };
    let cases = [
        (
            traces(dict(vec![("action", Str("alloc".into())), ("addr", Str("0x10".into()))])),
            "snapshot device_traces[0][1].addr: expected a non-negative 64-bit integer (0 to 18446744073709551615), found a string",
        ),
        (
            traces(dict(vec![("action", Int(3.into()))])),
            "snapshot device_traces[0][1].action: expected a string, found an integer",
        ),
        (
            traces(dict(vec![("addr", Int(1.into()))])),
            "snapshot device_traces[0][1].action: expected a value (the field is required)",
        ),
        (
            traces(List(vec![])),
            "snapshot device_traces[0][1]: expected a dict, found a list",
        ),
        (
            dict(vec![("device_traces", Int(5.into()))]),
            "snapshot device_traces: expected a list, found an integer",
        ),
        (
            dict(vec![(
                "segments",
                List(vec![dict(vec![
                    ("address", Int(4096.into())),
                    ("total_size", Int(1024.into())),
                    (
                        "blocks",
                        List(vec![dict(vec![
                            ("size", Int(1024.into())),
                            ("state", Str("busy".into())),
                        ])]),
                    ),
                ])]),
            )]),
            "snapshot segments[0].blocks[0].state: expected active_allocated, active_pending_free or inactive, found \"busy\"",
        ),
        (
            dict(vec![(
                "segments",
                List(vec![dict(vec![
                    ("address", Int(4096.into())),
                    ("total_size", Int(1024.into())),
                    ("is_expandable", Bytes(vec![1])),
                ])]),
            )]),
            "snapshot segments[0].is_expandable: expected a bool, found bytes",
        ),
        (
            dict(vec![
                ("device_traces", List(vec![])),
                ("allocator_settings", Bool(true)),
            ]),
            "snapshot allocator_settings: expected a dict, found a bool",
        ),
        (
            Dict(Default::default()),
            "the pickle holds an empty dict: not a PyTorch memory snapshot",
        ),
    ];
    for (root, expected) in cases {
        let result = gpumem_trace::read(pickled(&root).as_slice(), ReadOptions::default());
        match result {
            Err(error) => assert!(error.to_string().starts_with(expected), "{error}"),
            Ok(_) => panic!("read, expected {expected}"),
        }
    }
}

#[test]
fn unknown_opcodes_are_errors_naming_them() {
    for (pickle, expected) in [
        (
            &b"\x80\x04\xff."[..],
            "pickle byte 2: opcode 0xff: not supported",
        ),
        (
            b"\x80\x04}\x94(\x8c\x01a\x94\x8c\x01b\x94u\x81.",
            "pickle byte 14: opcode 0x81: not supported",
        ),
        (
            b"\x80\x02cbuiltins\neval\n.",
            "pickle byte 2: opcode 0x63: not supported",
        ),
    ] {
        let error = gpumem_trace::snapshot::read(pickle)
            .unwrap_err()
            .to_string();
        assert!(error.starts_with(expected), "{error}");
    }
}

/// Pickles whose containers are made after their items (protocol 0's MARK ... DICT, LIST)
/// cannot be streamed, and are read whole.
#[test]
fn containers_made_after_their_items_are_read_whole() {
    let pickle = b"(Vdevice_traces\n(((Vaction\nValloc\nVaddr\nI4096\nVsize\nI512\ndlld.";
    let trace = gpumem_trace::read(&pickle[..], ReadOptions::default()).unwrap();
    assert_eq!(
        trace.events,
        vec![Event::Alloc {
            addr: 4096,
            size: 512,
            stream: 0
        }]
    );
}

#[test]
fn alloc_frames_read_as_python_reads_them() {
    // (file, alloc entries with frames, their frames together), by Python's pickle:
    // [e for t in s["device_traces"] for e in t if e["action"] == "alloc" and e["frames"]]
    for (name, with_frames, frames) in [
        ("snapshot_p0.pickle", 4, 8),
        ("snapshot_p4.pickle", 4, 8),
        ("torch2.0_python.pickle", 4, 8),
        ("torch2.15.0_profile_to_snapshot.pickle", 196, 1678),
        ("torch2.15.0_profile_to_snapshot_p2.pickle", 196, 1678),
    ] {
        let snapshot = gpumem_trace::snapshot::read(std::fs::File::open(data(name)).unwrap())
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        let stacks: Vec<_> = snapshot
            .device_traces
            .iter()
            .flatten()
            .filter(|entry| entry.action == Action::Alloc)
            .filter_map(|entry| entry.stack)
            .collect();
        let total: usize = stacks
            .iter()
            .map(|&id| snapshot.stacks.frames(id).len())
            .sum();
        assert_eq!((stacks.len(), total), (with_frames, frames), "{name}");
        // The streaming reader keeps the same stacks for the trace.
        let trace = read_path(data(name), ReadOptions::default()).unwrap();
        let kept = trace.alloc_stacks.iter().flatten().count();
        assert_eq!(kept, with_frames, "{name}");
    }
    let frames = |name| {
        let snapshot = gpumem_trace::snapshot::read(std::fs::File::open(data(name)).unwrap());
        let snapshot = snapshot.unwrap();
        let first = snapshot.device_traces[0]
            .iter()
            .find_map(|e| e.stack)
            .unwrap();
        let frame = snapshot.stacks.frames(first).next().unwrap().clone();
        (
            frame.filename.to_string(),
            frame.line,
            frame.name.to_string(),
        )
    };
    assert_eq!(
        frames("torch2.15.0_profile_to_snapshot.pickle"),
        ("none".into(), 0, "<built-in function linear>".into())
    );
}
