//! Snapshots recorded mid-process: the segments and live blocks that existed when recording
//! began, as the reader infers them (`Trace::initial_segments`), carried by the native
//! format, and checked by validation.

use gpumem_trace::snapshot::{
    Action, BlockState, SegmentType, Snapshot, SnapshotBlock, SnapshotSegment, TraceEntry,
};
use gpumem_trace::{
    read, write, Event, Format, InitialBlock, InitialSegment, ReadError, ReadOptions, Trace,
    Violation,
};

const MIB: u64 = 1 << 20;
/// A large segment that existed before recording and is still there at the dump.
const P: u64 = 0x1000_0000;
/// A small segment that existed before recording and was freed during it.
const Q: u64 = 0x2000_0000;
/// An expandable segment's mapped range, half of it mapped during recording.
const E: u64 = 0x3000_0000;
/// A segment allocated during recording.
const N: u64 = 0x4000_0000;
/// A block freed during recording that lies in no known segment.
const X: u64 = 0x9000_0000;

fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
    TraceEntry {
        action,
        addr,
        size,
        stream: 0,
        time_us: 0,
        device_free: None,
        stack: None,
    }
}

fn block(address: u64, size: u64, requested_size: u64, state: BlockState) -> SnapshotBlock {
    SnapshotBlock {
        address,
        size,
        requested_size,
        state,
    }
}

fn segment(
    address: u64,
    total_size: u64,
    expandable: bool,
    blocks: Vec<SnapshotBlock>,
) -> SnapshotSegment {
    SnapshotSegment {
        device: 0,
        address,
        total_size,
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream: 0,
        segment_type: Some(SegmentType::Large),
        segment_pool_id: (0, 0),
        is_expandable: expandable,
        blocks,
    }
}

/// A snapshot whose recording began after P, Q and E's first half existed.
fn mid_process_snapshot() -> Snapshot {
    use Action::{Alloc, FreeCompleted, FreeRequested, SegmentAlloc, SegmentFree, SegmentMap};
    use BlockState::{ActiveAllocated, Inactive};
    let free = |addr, size| {
        [
            entry(FreeRequested, addr, size),
            entry(FreeCompleted, addr, size),
        ]
    };
    let mut trace = vec![entry(Alloc, P + 8 * MIB, 2 * MIB)];
    trace.extend(free(P + 12 * MIB, MIB + 100));
    trace.extend(free(Q + 512, 100));
    trace.push(entry(SegmentFree, Q, 2 * MIB));
    trace.extend(free(X, 4096));
    trace.push(entry(SegmentAlloc, N, 20 * MIB));
    trace.push(entry(Alloc, N, 5 * MIB));
    trace.push(entry(SegmentMap, E + 20 * MIB, 20 * MIB));
    Snapshot {
        segments: vec![
            segment(
                P,
                20 * MIB,
                false,
                vec![
                    block(P, 3 * MIB, 3 * MIB - 10, ActiveAllocated),
                    block(P + 3 * MIB, 5 * MIB, 0, Inactive),
                    block(P + 8 * MIB, 2 * MIB, 2 * MIB, ActiveAllocated),
                    block(P + 10 * MIB, 10 * MIB, 0, Inactive),
                ],
            ),
            segment(
                E,
                40 * MIB,
                true,
                vec![
                    block(E, 4 * MIB, 4 * MIB - 1, ActiveAllocated),
                    block(E + 4 * MIB, 36 * MIB, 0, Inactive),
                ],
            ),
            segment(
                N,
                20 * MIB,
                false,
                vec![
                    block(N, 5 * MIB, 5 * MIB, ActiveAllocated),
                    block(N + 5 * MIB, 15 * MIB, 0, Inactive),
                ],
            ),
        ],
        device_traces: vec![trace],
        ..Snapshot::default()
    }
}

#[test]
fn the_memory_held_before_recording_began_is_inferred() {
    let trace = gpumem_trace::snapshot::to_trace(&mid_process_snapshot(), None).unwrap();
    trace.validate().unwrap();
    let initial = |address, size, pool, expandable, blocks| InitialSegment {
        address,
        size,
        stream: 0,
        pool,
        expandable,
        blocks,
    };
    let live = |address, requested, size| InitialBlock {
        address,
        requested,
        size,
    };
    assert_eq!(
        trace.initial_segments,
        vec![
            // Still there: the block nobody mentions (its size known), and one freed later.
            initial(
                P,
                20 * MIB,
                SegmentType::Large,
                false,
                vec![
                    live(P, 3 * MIB - 10, Some(3 * MIB)),
                    live(P + 12 * MIB, MIB + 100, None),
                ]
            ),
            // Freed during recording: 2 MiB with a block of 100 B, so the small pool.
            initial(
                Q,
                2 * MIB,
                SegmentType::Small,
                false,
                vec![live(Q + 512, 100, None)]
            ),
            // The part of the range that recording did not map.
            initial(
                E,
                20 * MIB,
                SegmentType::Large,
                true,
                vec![live(E, 4 * MIB - 1, Some(4 * MIB))]
            ),
        ]
    );
    let alloc = |addr, size| Event::Alloc {
        addr,
        size,
        stream: 0,
    };
    assert_eq!(
        trace.events[..5],
        [
            alloc(P, 3 * MIB - 10),
            alloc(P + 12 * MIB, MIB + 100),
            alloc(Q + 512, 100),
            alloc(E, 4 * MIB - 1),
            // In no segment: allocated at the start, as before segments were inferred.
            alloc(X, 4096),
        ]
    );
    assert_eq!(trace.initial_allocs(), 4);
    let extra = &trace.meta.extra;
    assert_eq!(extra["initial_segments"], "3");
    assert_eq!(extra["initial_segment_bytes"], (42 * MIB).to_string());
    assert_eq!(extra["synthesized_allocs"], "5");
    assert_eq!(extra["synthesized_from_segments"], "2");
}

#[test]
fn a_snapshot_recorded_from_the_start_has_no_initial_segments() {
    let mut snapshot = mid_process_snapshot();
    snapshot.segments.retain(|s| s.address == N);
    snapshot.device_traces[0].retain(|e| [N, P + 8 * MIB].contains(&e.addr));
    snapshot.device_traces[0].insert(0, entry(Action::SegmentAlloc, P, 20 * MIB));
    let trace = gpumem_trace::snapshot::to_trace(&snapshot, None).unwrap();
    assert!(trace.initial_segments.is_empty());
    assert_eq!(trace.meta.extra["initial_segments"], "0");
}

#[test]
fn a_block_that_contradicts_its_segment_is_allocated_bare() {
    let mut snapshot = mid_process_snapshot();
    // Freed after its segment was: it cannot have lain there.
    let entries = &mut snapshot.device_traces[0];
    let late = entries.iter().position(|e| e.addr == Q + 512).unwrap();
    let moved: Vec<TraceEntry> = entries.drain(late..late + 2).collect();
    entries.extend(moved);
    let trace = gpumem_trace::snapshot::to_trace(&snapshot, None).unwrap();
    trace.validate().unwrap();
    let q = trace
        .initial_segments
        .iter()
        .find(|s| s.address == Q)
        .unwrap();
    assert!(q.blocks.is_empty());
    assert!(trace.events[..5].contains(&Event::Alloc {
        addr: Q + 512,
        size: 100,
        stream: 0
    }));
}

#[test]
fn the_native_format_carries_initial_segments() {
    let trace = gpumem_trace::snapshot::to_trace(&mid_process_snapshot(), None).unwrap();
    let mut text = Vec::new();
    write(&trace, &mut text, Format::Native).unwrap();
    let header = text.split(|&b| b == b'\n').next().unwrap();
    assert!(String::from_utf8_lossy(header).contains("\"initial_segments\":[{\"address\""));
    let back = read(text.as_slice(), ReadOptions::default()).unwrap();
    assert_eq!(back.initial_segments, trace.initial_segments);
    assert_eq!(back.events, trace.events);

    // A trace without them writes no such key.
    let plain = Trace {
        initial_segments: Vec::new(),
        ..trace.clone()
    };
    let mut text = Vec::new();
    write(&plain, &mut text, Format::Native).unwrap();
    assert!(!String::from_utf8_lossy(&text).contains("\"initial_segments\":["));
}

#[test]
fn the_native_reader_names_the_line_of_a_bad_initial_state() {
    let header =
        |segments: &str| format!("{{\"gpumem_trace\":1,\"initial_segments\":[{segments}]}}\n");
    let one_block = r#"{"address":4096,"size":8192,"pool":"small","blocks":[{"address":4096,"requested":100}]}"#;
    let alloc = "{\"op\":\"alloc\",\"addr\":4096,\"size\":100}\n";
    let good = header(one_block) + alloc;
    let trace = read(good.as_bytes(), ReadOptions::default()).unwrap();
    assert_eq!(trace.initial_allocs(), 1);
    assert_eq!(trace.initial_segments[0].pool, SegmentType::Small);

    // The first event is not the block's alloc: its line is named.
    let wrong = header(one_block) + "{\"op\":\"step\",\"index\":0}\n" + alloc;
    let error = read(wrong.as_bytes(), ReadOptions::default()).unwrap_err();
    assert!(
        matches!(
            error,
            ReadError::InvalidEvent {
                line: 2,
                violation: Violation::InitialAllocMissing { addr: 4096 }
            }
        ),
        "{error}"
    );
    // A block outside its segment: the header's line.
    let outside =
        r#"{"address":4096,"size":64,"pool":"small","blocks":[{"address":4096,"requested":100}]}"#;
    let error = read((header(outside) + alloc).as_bytes(), ReadOptions::default()).unwrap_err();
    assert!(
        matches!(
            error,
            ReadError::InvalidEvent {
                line: 1,
                violation: Violation::InitialBlockMisplaced { .. }
            }
        ),
        "{error}"
    );
    // A segment without its pool: malformed.
    let no_pool = r#"{"address":4096,"size":8192}"#;
    let error = read(header(no_pool).as_bytes(), ReadOptions::default()).unwrap_err();
    assert!(
        matches!(error, ReadError::Malformed { line: 1, .. }),
        "{error}"
    );
}

#[test]
fn validation_checks_the_initial_layout() {
    let trace = gpumem_trace::snapshot::to_trace(&mid_process_snapshot(), None).unwrap();
    let with = |change: &dyn Fn(&mut Trace)| {
        let mut trace = trace.clone();
        change(&mut trace);
        trace.validate().unwrap_err()
    };
    let overlap = with(&|t| t.initial_segments[1].address = P + MIB);
    assert_eq!(
        overlap.violation,
        Violation::InitialSegmentOverlap { addr: P + MIB }
    );
    assert_eq!(overlap.index, 2, "where the segment's allocs begin");
    let empty = with(&|t| t.initial_segments[0].blocks[0].requested = 0);
    assert_eq!(empty.violation, Violation::InitialBlockSize { addr: P });
    let swapped = with(&|t| {
        t.initial_segments[0].blocks.swap(0, 1);
        t.events.swap(0, 1);
    });
    assert!(matches!(
        swapped.violation,
        Violation::InitialBlockMisplaced { .. }
    ));
    let missing = with(&|t| t.events.swap(0, 1));
    assert_eq!(
        missing.violation,
        Violation::InitialAllocMissing { addr: P }
    );
    assert_eq!(
        missing.to_string(),
        "event 0: initial block at 0x10000000: this event should be its alloc (its address, \
         requested size and its segment's stream)"
    );
}
