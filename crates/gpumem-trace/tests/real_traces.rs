//! The real traces under `testdata/traces/` (captured from PyTorch by `tools/`): each trace's
//! native, RMM and snapshot files must give the same block sequence, and the native header's
//! own statistics must match our summary.

use std::collections::HashMap;
use std::path::PathBuf;

use gpumem_trace::{read_path, Event, Format, ReadOptions, Trace};

fn traces_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/traces")
}

fn read(name: &str, format: Format) -> Trace {
    let options = ReadOptions {
        format,
        device: None,
    };
    read_path(traces_dir().join(name), options).unwrap_or_else(|error| panic!("{error}"))
}

fn blocks(trace: &Trace) -> Vec<Event> {
    trace
        .events
        .iter()
        .copied()
        .filter(|event| !matches!(event, Event::Step { .. }))
        .collect()
}

/// A block event with the address replaced by the allocation's ordinal: the same history
/// at other addresses (`gpumem-convert-trace` gives every snapshot block a fresh
/// device-like address) normalises to the same sequence.
#[derive(Debug, PartialEq, Eq)]
enum Relabelled {
    Alloc { id: usize, size: u64, stream: u64 },
    Free { id: usize, stream: u64 },
}

fn relabelled(events: &[Event]) -> Vec<Relabelled> {
    let mut ids = HashMap::new();
    let mut next_id = 0;
    events
        .iter()
        .filter_map(|event| match *event {
            Event::Alloc { addr, size, stream } => {
                ids.insert(addr, next_id);
                next_id += 1;
                Some(Relabelled::Alloc {
                    id: next_id - 1,
                    size,
                    stream,
                })
            }
            Event::Free { addr, stream } => Some(Relabelled::Free {
                id: ids[&addr],
                stream,
            }),
            Event::Step { .. } => None,
        })
        .collect()
}

/// Stems of the trace files whose name ends in `suffix`.
fn stems_with(suffix: &str) -> Vec<String> {
    let mut stems: Vec<String> = std::fs::read_dir(traces_dir())
        .map(|entries| {
            entries
                .filter_map(|entry| {
                    let name = entry.ok()?.file_name().into_string().ok()?;
                    name.strip_suffix(suffix).map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    stems.sort();
    stems
}

/// Stems of the traces that come in every format.
fn cross_format_stems() -> Vec<String> {
    stems_with(".rmm.csv")
}

#[test]
fn formats_of_the_same_real_trace_agree() {
    let stems = cross_format_stems();
    assert!(
        !stems.is_empty(),
        "no cross-format traces in {:?}",
        traces_dir()
    );
    for stem in stems {
        let native = read(&format!("{stem}.jsonl.gz"), Format::Auto);
        assert_eq!(native.validate(), Ok(()));
        let expected = blocks(&native);
        assert!(!expected.is_empty(), "{stem}");
        let rmm = read(&format!("{stem}.rmm.csv"), Format::Auto);
        assert_eq!(rmm.events, expected, "{stem}: RMM log");
        for protocol in ["p2", "p4"] {
            let name = format!("{stem}.snapshot.{protocol}.pickle");
            if traces_dir().join(&name).exists() {
                let snapshot = read(&name, Format::Auto);
                assert_eq!(
                    relabelled(&snapshot.events),
                    relabelled(&expected),
                    "{name}"
                );
            }
        }
    }
}

#[test]
fn every_native_trace_is_valid_and_its_header_agrees_with_our_summary() {
    let stems = stems_with(".jsonl.gz");
    assert!(!stems.is_empty(), "no native traces in {:?}", traces_dir());
    for stem in stems {
        let trace = read(&format!("{stem}.jsonl.gz"), Format::Native);
        assert_eq!(trace.validate(), Ok(()), "{stem}");
        let summary = trace.summary();
        let stated = |key: &str| {
            trace
                .meta
                .extra
                .get(key)
                .map(|value| value.parse::<u64>().unwrap())
        };
        if let Some(events) = stated("events") {
            assert_eq!(summary.events as u64, events, "{stem}");
        }
        if let Some(steps) = stated("steps") {
            assert_eq!(summary.steps, steps, "{stem}");
        }
        if let Some(peak) = stated("peak_live_bytes") {
            assert_eq!(summary.peak_live_bytes, peak, "{stem}");
        }
        if let Some(live) = stated("final_live_bytes") {
            assert_eq!(summary.live_bytes_at_end, live, "{stem}");
        }
    }
}
