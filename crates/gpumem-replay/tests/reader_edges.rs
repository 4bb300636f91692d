//! Replays at the readers' edges: memory placed at address 0 (the null pointer), which used
//! to lose its blocks' frees (freeing the block at device pointer 0 reads as free(NULL)), and
//! event addresses of 0, which only name blocks and replay like any other.

use gpumem_pool::PolicyKind;
use gpumem_replay::{replay_peaks, ReplayOptions};
use gpumem_trace::{
    read, Event, InitialBlock, InitialSegment, ReadOptions, SegmentType, Trace, TraceMeta,
};

const BLOCK: u64 = 128 << 10;

fn alloc(addr: u64) -> Event {
    Event::Alloc {
        addr,
        size: BLOCK,
        stream: 0,
    }
}

fn free(addr: u64) -> Event {
    Event::Free { addr, stream: 0 }
}

#[test]
fn a_device_allocation_at_address_zero_is_refused_when_read() {
    // The fuzzing repro: the none policy replayed it with a peak of two blocks.
    let text = format!(
        "{}\n{}\n{}\n{}\n",
        r#"{"gpumem_trace":1,"device_allocations":[{"address":0,"size":131072}]}"#,
        r#"{"op":"alloc","addr":1048576,"size":131072}"#,
        r#"{"op":"free","addr":1048576}"#,
        r#"{"op":"alloc","addr":2097152,"size":131072}"#,
    );
    let error = read(text.as_bytes(), ReadOptions::default()).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("at address 0: that is the null pointer"),
        "{error}"
    );
}

#[test]
fn events_at_address_zero_replay_like_any_other() {
    let text = format!(
        "{}\n{}\n{}\n{}\n",
        r#"{"gpumem_trace":1}"#,
        r#"{"op":"alloc","addr":0,"size":131072}"#,
        r#"{"op":"free","addr":0}"#,
        r#"{"op":"alloc","addr":0,"size":131072}"#,
    );
    let trace = read(text.as_bytes(), ReadOptions::default()).unwrap();
    for policy in [
        PolicyKind::None,
        PolicyKind::Torch,
        PolicyKind::Expandable,
        PolicyKind::Gpumem,
    ] {
        let report = replay_peaks(&trace, policy, &ReplayOptions::default()).unwrap();
        assert_eq!(report.peak_requested_bytes, BLOCK, "{policy:?}");
    }
}

#[test]
fn an_initial_segment_at_address_zero_is_not_adopted() {
    // Built in code (no reader would return it): the segment is not taken over at the null
    // pointer; its block is allocated by the first event instead, and freed by the second.
    let mut trace = Trace::new(
        TraceMeta::default(),
        vec![alloc(0), free(0), alloc(4 << 20)],
    );
    trace.initial_segments = vec![InitialSegment {
        address: 0,
        size: 2 << 20,
        stream: 0,
        pool: SegmentType::Large,
        expandable: false,
        blocks: vec![InitialBlock {
            address: 0,
            requested: BLOCK,
            size: None,
        }],
    }];
    // Nor does the simulated device hand the null pointer out to a device allocation of the
    // segment's size (`SimDevice::place_mallocs_at`), which would lose that block's free.
    for policy in [PolicyKind::None, PolicyKind::Torch] {
        let report = replay_peaks(&trace, policy, &ReplayOptions::default()).unwrap();
        assert_eq!(report.peak_requested_bytes, BLOCK, "{policy:?}");
        let state = report
            .initial_state
            .expect("the trace has initial segments");
        assert_eq!(state.adopted_segments, 0, "{policy:?}");
        assert!(
            state
                .notes
                .iter()
                .any(|note| note.contains("initial segment at address 0")),
            "{policy:?}: {:?}",
            state.notes
        );
    }
}
