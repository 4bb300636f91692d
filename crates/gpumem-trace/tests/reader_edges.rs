//! The edges of the readers found by fuzzing the CLI: fields a snapshot entry needs, device
//! allocations at the null pointer, unbounded lines and quotes, rows skipped without a word,
//! memo references to entries, integers beyond 64 bits.

mod common;

use common::{dict, pickled};
use std::io::Write;

use flate2::write::GzEncoder;
use gpumem_trace::{
    read, DeviceAllocation, Event, Format, InitialBlock, InitialSegment, ReadError, ReadOptions,
    SegmentType, Trace, TraceMeta, Violation, MAX_LINE_BYTES,
};

fn read_bytes(bytes: &[u8]) -> Result<Trace, ReadError> {
    read(bytes, ReadOptions::default())
}

fn error_of(bytes: &[u8]) -> String {
    match read_bytes(bytes) {
        Ok(trace) => panic!("read, with events {:?}", trace.events),
        Err(error) => error.to_string(),
    }
}

/// A snapshot pickle whose device 0 holds `entries`.
fn trace_pickle(entries: Vec<serde_pickle::Value>) -> Vec<u8> {
    use serde_pickle::Value::List;
    pickled(&dict(vec![
        ("segments", List(vec![])),
        ("device_traces", List(vec![List(entries)])),
    ]))
}

fn entry(fields: &[(&str, Option<i64>)], action: &str) -> serde_pickle::Value {
    use serde_pickle::Value::{None as PyNone, String as Str, I64};
    let mut entries = vec![("action", Str(action.to_owned()))];
    for &(key, value) in fields {
        entries.push((key, value.map_or(PyNone, I64)));
    }
    dict(entries)
}

const A: i64 = 1 << 32;

// F: entries that need `addr`/`size` and lack them.

#[test]
fn an_alloc_without_size_is_refused_naming_the_entry_and_field() {
    // The fuzzing repro: the first alloc has no size; it used to replay as a 0-byte alloc.
    let pickle = trace_pickle(vec![
        entry(&[("addr", Some(A)), ("stream", Some(0))], "alloc"),
        entry(&[("addr", Some(A + 4096)), ("size", Some(1000))], "alloc"),
    ]);
    let message = error_of(&pickle);
    assert!(
        message.starts_with("snapshot device_traces[0][0].size: expected a non-negative 64-bit"),
        "{message}"
    );
    assert!(
        message.contains("no `size` on an entry with action `alloc`"),
        "{message}"
    );
}

#[test]
fn block_and_segment_entries_need_addr_and_size_missing_or_none() {
    for action in [
        "alloc",
        "free_requested",
        "free_completed",
        "free",
        "segment_alloc",
        "segment_free",
        "segment_map",
        "segment_unmap",
    ] {
        for (missing, other) in [("addr", "size"), ("size", "addr")] {
            for value in [None, Some(None)] {
                let mut fields = vec![(other, Some(A))];
                if let Some(value) = value {
                    fields.push((missing, value));
                }
                let message = error_of(&trace_pickle(vec![entry(&fields, action)]));
                let path = format!("snapshot device_traces[0][0].{missing}: ");
                assert!(message.starts_with(&path), "{action}: {message}");
                assert!(message.contains(action), "{action}: {message}");
            }
        }
    }
    // The same in a JSON snapshot.
    let json = br#"{"device_traces": [[{"action": "free_completed", "size": 8}]]}"#;
    assert!(error_of(json).starts_with("snapshot device_traces[0][0].addr: "));
}

#[test]
fn entries_that_carry_no_block_need_no_addr() {
    // PyTorch writes `oom` with `device_free` instead of `addr`; `snapshot` and annotations
    // carry nothing the trace uses.
    let pickle = trace_pickle(vec![
        entry(&[("addr", Some(A)), ("size", Some(8))], "alloc"),
        entry(&[("device_free", Some(0)), ("size", Some(1 << 40))], "oom"),
        entry(&[], "snapshot"),
        entry(&[], "user_defined"),
        entry(&[("addr", Some(A)), ("size", Some(8))], "free_completed"),
    ]);
    let trace = read_bytes(&pickle).unwrap();
    assert_eq!(
        trace.events,
        vec![
            Event::Alloc {
                addr: A as u64,
                size: 8,
                stream: 0
            },
            Event::Free {
                addr: A as u64,
                stream: 0
            }
        ]
    );
}

// G: device allocations at the null pointer.

#[test]
fn a_snapshot_segment_at_address_zero_is_refused() {
    let pickle = trace_pickle(vec![
        entry(
            &[("addr", Some(0)), ("size", Some(2 << 20))],
            "segment_alloc",
        ),
        entry(&[("addr", Some(0)), ("size", Some(1 << 20))], "alloc"),
    ]);
    let message = error_of(&pickle);
    assert!(
        message.starts_with("snapshot device_traces[0][0].addr: expected the address of a device allocation, which is never 0 (the null pointer), found 0"),
        "{message}"
    );
    let json = br#"{"segments": [{"address": 0, "total_size": 2097152, "blocks": []}]}"#;
    assert!(
        error_of(json).starts_with(
            "snapshot segments[0].address: expected the address of a device allocation"
        ),
        "{}",
        error_of(json)
    );
}

#[test]
fn a_native_header_placing_memory_at_address_zero_is_refused() {
    let events = "{\"op\":\"alloc\",\"addr\":1048576,\"size\":131072}\n\
                  {\"op\":\"free\",\"addr\":1048576}\n";
    let header = r#"{"gpumem_trace":1,"device_allocations":[{"address":0,"size":131072}]}"#;
    let message = error_of(format!("{header}\n{events}").as_bytes());
    assert_eq!(
        message,
        "line 1: device allocation 0 (of 131072 bytes) at address 0: that is the null pointer, \
         which no device allocation has"
    );
    let header = r#"{"gpumem_trace":1,"initial_segments":[{"address":0,"size":2097152,"pool":"large","blocks":[{"address":0,"requested":512}]}]}"#;
    let message =
        error_of(format!("{header}\n{{\"op\":\"alloc\",\"addr\":0,\"size\":512}}\n").as_bytes());
    assert_eq!(
        message,
        "line 1: initial segment at address 0: that is the null pointer, which no device \
         allocation has"
    );

    let mut trace = Trace::new(TraceMeta::default(), Vec::new());
    trace.device_allocations = vec![DeviceAllocation {
        address: 0,
        size: 4096,
    }];
    assert_eq!(
        trace.validate().unwrap_err().violation,
        Violation::DeviceAllocationAtNull {
            position: 0,
            size: 4096
        }
    );
}

#[test]
fn event_addresses_may_be_zero_they_only_name_blocks() {
    let text = "{\"gpumem_trace\":1}\n{\"op\":\"alloc\",\"addr\":0,\"size\":8}\n\
                {\"op\":\"free\",\"addr\":0}\n{\"op\":\"alloc\",\"addr\":0,\"size\":16}\n";
    let trace = read_bytes(text.as_bytes()).unwrap();
    assert_eq!(trace.events.len(), 3);
    assert_eq!(trace.summary().peak_live_bytes, 16);
}

// O: line length and quoted text.

fn gzipped(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn lines_past_the_limit_are_refused_by_number_in_every_line_format() {
    let long = "a".repeat(8 * MAX_LINE_BYTES);
    for (name, text) in [
        ("native", format!("{{\"gpumem_trace\":1}}\n{long}\n")),
        ("rmm", format!("Action,Pointer,Size\n{long}\n")),
        (
            "rmm data",
            format!("Action,Pointer,Size\nallocate,0x10,{long}\n"),
        ),
    ] {
        for bytes in [text.clone().into_bytes(), gzipped(text.as_bytes())] {
            let error = read_bytes(&bytes).unwrap_err();
            assert!(
                matches!(error, ReadError::LineTooLong { line: 2, limit } if limit == MAX_LINE_BYTES),
                "{name}: {error}"
            );
            assert!(error.to_string().len() < 200, "{name}: {error}");
        }
    }
}

#[test]
fn errors_quote_only_an_excerpt_of_long_text() {
    let long = "a".repeat(MAX_LINE_BYTES / 2);
    let cases = [
        format!("{{\"gpumem_trace\":1}}\n{{\"op\":\"{long}\"}}\n"),
        format!("Action,Pointer,Size\n{long}\n"),
        format!("Action,Pointer,Size\nallocate,0x10,{long}\n"),
        format!("Action,Pointer,Size\n{long},0x10,5\n"),
        format!("Action,Pointer,Size\nallocate,0x{long},5\n"),
        format!("{{\"segments\": [{{\"address\": 1, \"total_size\": 8, \"segment_type\": \"{long}\"}}]}}"),
        format!("{{\"device_traces\": [[{{\"action\": \"alloc\", \"addr\": \"{long}\"}}]]}}"),
        format!("{{\"{long}\": 1}}"),
    ];
    for text in cases {
        let message = error_of(text.as_bytes());
        assert!(message.len() < 600, "{}", &message[..600]);
    }
}

// M: what the readers skip is counted and explained.

#[test]
fn skipped_rmm_rows_are_counted_and_explained() {
    let log = "Thread,Time,Action,Pointer,Size,Stream\n\
        1,00:00:00.000001,allocate,0x10,8,0\n\
        1,00:00:00.000002,allocate failure,(nil),1099511627776,0\n\
        1,00:00:00.000003,allocate failure,0x0,1099511627776,0\n\
        1,00:00:00.000004,allocate,(nil),0,0\n\
        1,00:00:00.000005,free,0x10,8,0\n";
    let trace = read_bytes(log.as_bytes()).unwrap();
    assert_eq!(trace.events.len(), 2);
    assert_eq!(trace.meta.skipped("allocate_failure_rows"), 2);
    assert_eq!(trace.meta.skipped("null_pointer_rows"), 1);
    let notes = trace.meta.skipped_notes();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0]
            .starts_with("2 RMM `allocate failure` rows skipped: the traced run ran out of memory"),
        "{notes:?}"
    );
    assert!(
        notes[1].starts_with("1 RMM row with a null pointer"),
        "{notes:?}"
    );

    // A clean log has no notes; the counts survive a conversion to the native format.
    let clean = read_bytes(b"Action,Pointer,Size\nallocate,0x10,8\n").unwrap();
    assert!(clean.meta.skipped_notes().is_empty());
    let mut native = Vec::new();
    gpumem_trace::write(&trace, &mut native, gpumem_trace::Format::Native).unwrap();
    assert_eq!(read_bytes(&native).unwrap().meta.skipped_notes(), notes);
}

#[test]
fn skipped_snapshot_entries_are_counted_with_their_actions() {
    let pickle = trace_pickle(vec![
        entry(&[("addr", Some(A)), ("size", Some(8))], "alloc"),
        entry(&[("addr", Some(0)), ("size", Some(0))], "annotate"),
        entry(&[("device_free", Some(0)), ("size", Some(1 << 40))], "oom"),
        entry(&[], "annotate"),
        entry(&[], "something_new"),
    ]);
    let trace = read_bytes(&pickle).unwrap();
    assert_eq!(trace.events.len(), 1);
    assert_eq!(trace.meta.skipped("unknown_action_entries"), 3);
    assert_eq!(trace.meta.skipped("oom_entries"), 1);
    let notes = trace.meta.skipped_notes();
    assert_eq!(
        notes,
        [
            "1 snapshot `oom` entry skipped: the traced run ran out of memory there, and the \
             failed requests are not in the trace",
            "3 snapshot entries with actions the reader does not know skipped (\"annotate\", \
             \"something_new\")",
        ]
    );
}

// N: memo references to entries.

/// `pickle.dumps({'segments': [], 'device_traces': [[E, F, E, F]]}, protocol=4)` with
/// `E = {'action': 'alloc', 'addr': 1 << 32, 'size': 1000, 'stream': 0}` and `F` its
/// `free_completed`: the second E and F are memo references (BINGET).
const SAME_ENTRY_TWICE: &[u8] = b"\x80\x04\x95\x8e\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\x0ddevice_traces\x94]\x94]\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94\x8a\x05\x00\x00\x00\x00\x01\x8c\x04size\x94M\xe8\x03\x8c\x06stream\x94K\x00u}\x94(h\x07\x8c\x0efree_completed\x94h\x09\x8a\x05\x00\x00\x00\x00\x01h\x0aM\xe8\x03h\x0bK\x00uh\x06h\x0ceau.";

/// The same E and F in two devices' traces: `[[E, F], [E, F]]`.
const SAME_ENTRIES_ON_TWO_DEVICES: &[u8] = b"\x80\x04\x95\x93\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\x0ddevice_traces\x94]\x94(]\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94\x8a\x05\x00\x00\x00\x00\x01\x8c\x04size\x94M\xe8\x03\x8c\x06stream\x94K\x00u}\x94(h\x07\x8c\x0efree_completed\x94h\x09\x8a\x05\x00\x00\x00\x00\x01h\x0aM\xe8\x03h\x0bK\x00ue]\x94(h\x06h\x0ceeu.";

/// `[[E, F, E, F, G, H]]`, G and H a new alloc and free of 7 bytes at `2 << 32` after the
/// references.
const NEW_ENTRIES_AFTER_REFERENCES: &[u8] = b"\x80\x04\x95\xc0\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94\x8c\x0ddevice_traces\x94]\x94]\x94(}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94\x8a\x05\x00\x00\x00\x00\x01\x8c\x04size\x94M\xe8\x03\x8c\x06stream\x94K\x00u}\x94(h\x07\x8c\x0efree_completed\x94h\x09\x8a\x05\x00\x00\x00\x00\x01h\x0aM\xe8\x03h\x0bK\x00uh\x06h\x0c}\x94(h\x07h\x08h\x09\x8a\x05\x00\x00\x00\x00\x02h\x0aK\x07h\x0bK\x00u}\x94(h\x07h\x0dh\x09\x8a\x05\x00\x00\x00\x00\x02h\x0aK\x07h\x0bK\x00ueau.";

fn alloc_free(addr: u64, size: u64) -> [Event; 2] {
    [
        Event::Alloc {
            addr,
            size,
            stream: 0,
        },
        Event::Free { addr, stream: 0 },
    ]
}

#[test]
fn memo_references_to_entries_resolve() {
    let a = alloc_free(1 << 32, 1000);
    let trace = read_bytes(SAME_ENTRY_TWICE).unwrap();
    assert_eq!(trace.events, [a, a].concat());

    for device in [0, 1] {
        let options = ReadOptions {
            device: Some(device),
            ..ReadOptions::default()
        };
        let trace = read(SAME_ENTRIES_ON_TWO_DEVICES, options).unwrap();
        assert_eq!(trace.events, a, "device {device}");
    }

    let trace = read_bytes(NEW_ENTRIES_AFTER_REFERENCES).unwrap();
    assert_eq!(trace.events, [a, a, alloc_free(2 << 32, 7)].concat());
    let snapshot = gpumem_trace::snapshot::read(NEW_ENTRIES_AFTER_REFERENCES).unwrap();
    assert_eq!(snapshot.device_traces[0].len(), 6);
}

// K: integers beyond 64 bits.

/// `{'device_traces': [[{'action': 'alloc', 'addr': 1 << 32, 'size': 1 << 70}]]}`, protocol 4.
const SIZE_2_POW_70: &[u8] = b"\x80\x04\x95O\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x0ddevice_traces\x94]\x94]\x94}\x94(\x8c\x06action\x94\x8c\x05alloc\x94\x8c\x04addr\x94\x8a\x05\x00\x00\x00\x00\x01\x8c\x04size\x94\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00@uaas.";

/// The same with `size` `-(1 << 70)`, protocol 2.
const SIZE_MINUS_2_POW_70: &[u8] = b"\x80\x02}q\x00X\x0d\x00\x00\x00device_tracesq\x01]q\x02]q\x03}q\x04(X\x06\x00\x00\x00actionq\x05X\x05\x00\x00\x00allocq\x06X\x04\x00\x00\x00addrq\x07\x8a\x05\x00\x00\x00\x00\x01X\x04\x00\x00\x00sizeq\x08\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\xc0uaas.";

#[test]
fn integers_beyond_64_bits_are_named_as_such() {
    let expected = "snapshot device_traces[0][0].size: expected a non-negative 64-bit integer \
                    (0 to 18446744073709551615), found an integer too large for 64 bits";
    assert_eq!(error_of(SIZE_2_POW_70), expected);
    assert_eq!(error_of(SIZE_MINUS_2_POW_70), expected);
    // JSON has no integers beyond 64 bits: serde_json reads them as floats.
    let json = br#"{"device_traces": [[{"action": "alloc", "addr": 4096, "size": 1180591620717411303424}]]}"#;
    let message = error_of(json);
    assert!(
        message.ends_with(
            "(0 to 18446744073709551615), found a number too large for 64 bits \
             (1180591620717411300000)"
        ),
        "{message}"
    );
    // A float is still a float.
    let json = br#"{"device_traces": [[{"action": "alloc", "addr": 4096, "size": 1.5}]]}"#;
    assert!(
        error_of(json).ends_with("found a float"),
        "{}",
        error_of(json)
    );
}

#[test]
fn a_device_is_asked_only_of_a_snapshot() {
    let native = "{\"gpumem_trace\":1}\n{\"op\":\"alloc\",\"addr\":1,\"size\":512}\n";
    let rmm = "Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.000000,allocate,0x10,512,0\n";
    for (text, format) in [(native, "native"), (rmm, "rmm")] {
        let options = gpumem_trace::ReadOptions {
            device: Some(7),
            ..gpumem_trace::ReadOptions::default()
        };
        let error = gpumem_trace::read(text.as_bytes(), options).unwrap_err();
        assert!(
            matches!(
                error,
                gpumem_trace::ReadError::DeviceOfOneDeviceTrace { device: 7, .. }
            ),
            "{format}: {error}"
        );
        assert!(
            error
                .to_string()
                .starts_with(&format!("device 7 asked of a {format} trace")),
            "{error}"
        );
        assert!(gpumem_trace::read(text.as_bytes(), gpumem_trace::ReadOptions::default()).is_ok());
    }
}

#[test]
fn a_snapshot_of_several_devices_says_which_it_read_and_what_it_left() {
    let entry = |addr: i64| {
        dict(vec![
            ("action", serde_pickle::Value::String("alloc".into())),
            ("addr", serde_pickle::Value::I64(addr)),
            ("size", serde_pickle::Value::I64(512)),
            ("stream", serde_pickle::Value::I64(0)),
        ])
    };
    let snapshot = dict(vec![
        ("segments", serde_pickle::Value::List(vec![])),
        (
            "device_traces",
            serde_pickle::Value::List(vec![
                serde_pickle::Value::List(vec![entry(1 << 32)]),
                serde_pickle::Value::List(vec![entry(2 << 32), entry(3 << 32)]),
            ]),
        ),
    ]);
    let bytes = pickled(&snapshot);
    let first = gpumem_trace::read(&bytes[..], gpumem_trace::ReadOptions::default()).unwrap();
    assert_eq!(
        first.meta.skipped_notes(),
        [
            "2 snapshot entries of other devices skipped: a snapshot holds one trace per device, \
          and this is device 0's (choose another with --device)"
        ]
    );
    let options = gpumem_trace::ReadOptions {
        device: Some(1),
        ..gpumem_trace::ReadOptions::default()
    };
    let second = gpumem_trace::read(&bytes[..], options).unwrap();
    assert!(second.meta.skipped_notes()[0].starts_with("1 snapshot entry of other devices"));
    assert!(second.meta.skipped_notes()[0].contains("device 1's"));
}

#[test]
fn a_native_trace_of_a_large_mid_process_pool_reads_back() {
    // A snapshot taken in the middle of a large job (here 2 000 segments of 25 live blocks)
    // becomes a native trace whose header holds every live block: the header line is larger
    // than any event line, and must read back as written.
    let (segments, per_segment, block) = (2_000u64, 25u64, 1u64 << 20);
    let mut events = Vec::new();
    let initial_segments: Vec<InitialSegment> = (0..segments)
        .map(|s| {
            let address = (1 << 40) + s * per_segment * block;
            let blocks = (0..per_segment)
                .map(|b| {
                    let address = address + b * block;
                    events.push(Event::Alloc {
                        addr: address,
                        size: block,
                        stream: 0,
                    });
                    InitialBlock {
                        address,
                        requested: block,
                        size: None,
                    }
                })
                .collect();
            InitialSegment {
                address,
                size: per_segment * block,
                stream: 0,
                pool: SegmentType::Large,
                expandable: false,
                blocks,
            }
        })
        .collect();
    let mut trace = Trace::new(TraceMeta::default(), events);
    trace.initial_segments = initial_segments;
    let mut written = Vec::new();
    gpumem_trace::write(&trace, &mut written, Format::Native).unwrap();
    let header = written.split(|&b| b == b'\n').next().unwrap().len();
    assert!(header > MAX_LINE_BYTES, "{header} bytes");
    let back = read(&written[..], ReadOptions::default()).unwrap();
    assert_eq!(back.initial_segments, trace.initial_segments);
}
