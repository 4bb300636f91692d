//! Snapshots recorded mid-process: PyTorch's history started after earlier work in the same
//! process, so segments and live blocks existed before the first recorded event. The trace
//! carries that memory (`Trace::initial_segments`) and the replay starts the pool from it.
//!
//! The snapshots here are made in the test: cuts of the H200 snapshots of
//! `tests/cuda_snapshots.rs` (recorded from process start), whose dump-time `segments` are
//! the end state whatever the cut, and snapshots our pool writes after running work before
//! recording began. Either way the replay must give the reserved peak the process had.

use std::io::Read;
use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::policies::torch_settings::TorchSettings;
use gpumem_pool::{PolicyKind, Pool, PoolConfig};
use gpumem_replay::timeline::timeline;
use gpumem_replay::{replay, replay_peaks, ReplayOptions};
use gpumem_testkit::Rng;
use gpumem_trace::{Snapshot, Trace};

const MIB: u64 = 1 << 20;

/// A snapshot of `testdata/traces`, read whole.
fn recorded(name: &str) -> Snapshot {
    let path = format!(
        "{}/../../testdata/traces/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut bytes)
        .unwrap();
    gpumem_trace::snapshot::read(bytes.as_slice()).unwrap()
}

/// The snapshot as if recording had begun at entry `at` of device 0's trace: the entries
/// before it dropped, the dump-time segments as they are.
fn cut(snapshot: &Snapshot, at: usize) -> Trace {
    let mut cut = snapshot.clone();
    cut.device_traces[0].drain(..at);
    let trace = gpumem_trace::snapshot::to_trace(&cut, None).unwrap();
    trace.validate().unwrap();
    trace
}

/// The same trace as today's reader made it before initial segments: the live blocks only,
/// allocated at the start.
fn without_segments(trace: &Trace) -> Trace {
    Trace {
        initial_segments: Vec::new(),
        ..trace.clone()
    }
}

fn torch_peak(trace: &Trace) -> u64 {
    replay_peaks(trace, PolicyKind::Torch, &ReplayOptions::default())
        .unwrap()
        .peak_reserved_bytes
}

/// Every 5th cut of the GPT-2 training snapshot (1,705 cuts: between steps and inside them,
/// from the first events to the last; every one of the 8,521 gives the same when run) replays
/// to PyTorch's `max_memory_reserved` to the byte, as the whole snapshot does.
#[test]
fn every_cut_of_a_recorded_snapshot_replays_to_pytorchs_reserved_peak() {
    const RESERVED: u64 = 857_735_168;
    let snapshot = recorded("h200-gpt2-train.snapshot.pickle.gz");
    let entries = snapshot.device_traces[0].len();
    for at in (0..entries).step_by(5) {
        let trace = cut(&snapshot, at);
        assert_eq!(torch_peak(&trace), RESERVED, "cut at entry {at}");
    }
    // A cut late in the run: all 42 segments existed before it.
    let late = cut(&snapshot, 8_000);
    assert_eq!(late.initial_segments.len(), 42);
    assert_eq!(
        late.meta.extra["initial_segment_bytes"],
        RESERVED.to_string()
    );
}

#[test]
fn cuts_of_the_resnet_snapshot_replay_to_its_reserved_peak() {
    let snapshot = recorded("h200-resnet-train.snapshot.pickle.gz");
    let entries = snapshot.device_traces[0].len();
    for at in (0..entries).step_by(97) {
        assert_eq!(torch_peak(&cut(&snapshot, at)), 436_207_616, "cut {at}");
    }
}

/// Before initial segments, the blocks live at the cut were allocated at the start into
/// fresh segments, packed as they never were: the peak came out wrong both ways. On the
/// GPT-2 snapshot, for instance, a cut at entry 1,455 gave 916,455,424 B (+58.7 MB), one at
/// 2,716 gave 845,152,256 B (-12.6 MB) and one at 8,439 gave 482,344,960 B (-375 MB), against
/// PyTorch's 857,735,168 B.
#[test]
fn without_the_initial_segments_the_peak_was_wrong() {
    let snapshot = recorded("h200-gpt2-train.snapshot.pickle.gz");
    for at in [1_455, 2_716, 8_439] {
        let trace = cut(&snapshot, at);
        assert_eq!(torch_peak(&trace), 857_735_168, "cut {at}");
        assert_ne!(
            torch_peak(&without_segments(&trace)),
            857_735_168,
            "cut {at}"
        );
    }
}

/// Policies that lay memory out their own way allocate the live blocks at the start, and the
/// report says so; the events keep their indices, and the timeline agrees with the replay.
#[test]
fn the_report_says_how_the_replay_began() {
    let snapshot = recorded("h200-gpt2-train.snapshot.pickle.gz");
    let trace = cut(&snapshot, 4_000);
    let options = ReplayOptions::default();
    let torch = replay(&trace, PolicyKind::Torch, &options, &mut |_| {}).unwrap();
    let state = torch.report.initial_state.clone().unwrap();
    assert_eq!(state.segments, trace.initial_segments.len());
    assert_eq!(state.adopted_segments, state.segments);
    assert_eq!(state.allocated_blocks, 0);
    assert!(state.notes.is_empty(), "{:?}", state.notes);
    let line = timeline(&trace, PolicyKind::Torch, &options, &mut |_| {}).unwrap();
    assert_eq!(line.reserved.len(), trace.events.len());
    assert_eq!(line.reserved[0], state.adopted_bytes);
    assert_eq!(
        line.reserved.iter().max(),
        Some(&torch.report.peak_reserved_bytes)
    );

    for policy in [PolicyKind::Gpumem, PolicyKind::None] {
        let report = replay(&trace, policy, &options, &mut |_| {})
            .unwrap()
            .report;
        let state = report.initial_state.unwrap();
        assert_eq!(state.adopted_segments, 0, "{policy:?}");
        assert_eq!(state.allocated_blocks, trace.initial_allocs(), "{policy:?}");
        assert_eq!(state.notes.len(), 1, "{policy:?}");
        assert!(state.notes[0].contains("cannot adopt"), "{:?}", state.notes);
        // As before initial segments: the same replay as of the trace without them.
        let flat = replay_peaks(&without_segments(&trace), policy, &options).unwrap();
        assert_eq!(report.peak_reserved_bytes, flat.peak_reserved_bytes);
    }
    let json = serde_json::to_value(&torch.report).unwrap();
    assert_eq!(json["initial_state"]["adopted_segments"], state.segments);
    let whole = replay_peaks(&cut(&snapshot, 0), PolicyKind::Torch, &options).unwrap();
    assert_eq!(whole.initial_state, None);
}

/// On a device smaller than what the process held before recording, the replay runs out of
/// memory at the start (at the alloc of the first block that did not fit), and the smallest
/// device is still found.
#[test]
fn memory_held_before_recording_counts_against_the_capacity() {
    let snapshot = recorded("h200-gpt2-train.snapshot.pickle.gz");
    let trace = cut(&snapshot, 4_000);
    let options = ReplayOptions {
        capacity: Some(300 * MIB),
        smallest_capacity: true,
        ..ReplayOptions::default()
    };
    let report = replay(&trace, PolicyKind::Torch, &options, &mut |_| {})
        .unwrap()
        .report;
    let oom = report.oom.unwrap();
    assert!(oom.event_index < trace.initial_allocs(), "{oom:?}");
    let segment_sizes: Vec<u64> = trace.initial_segments.iter().map(|s| s.size).collect();
    assert!(segment_sizes.contains(&oom.requested_bytes), "{oom:?}");
    let smallest = report.smallest_capacity_bytes.unwrap();
    assert!(
        smallest > 300 * MIB && smallest <= 857_735_168,
        "{smallest}"
    );
}

/// Runs random work on a pool of `policy`, records history from the middle of it on, and
/// returns the pool's snapshot (as a pickle, after an `empty_cache` that frees the segments
/// emptied by then) and its reserved peak since recording began.
fn snapshot_after_earlier_work(policy: PolicyKind) -> (Vec<u8>, u64) {
    let device = Arc::new(SimDevice::new(SimConfig::address_only(1 << 40)).unwrap());
    let torch = match policy {
        PolicyKind::Expandable => "expandable_segments:True",
        _ => "",
    };
    let config = PoolConfig {
        policy,
        torch: TorchSettings::parse(torch).unwrap(),
        ..PoolConfig::default()
    };
    let pool = Pool::new(device, config).unwrap();
    let mut rng = Rng::new(0x6d69_6470);
    let mut live = Vec::new();
    let mut work = |operations: usize, live: &mut Vec<u64>| {
        for _ in 0..operations {
            if live.is_empty() || rng.below(100) < 55 {
                // Mostly small and medium tensors, some large ones.
                let size = rng.log_uniform(256, 48 * MIB);
                live.push(pool.allocate(size, StreamId::DEFAULT).unwrap().ptr);
            } else {
                let victim = rng.below(live.len() as u64) as usize;
                pool.free(live.swap_remove(victim)).unwrap();
            }
        }
    };
    work(800, &mut live);
    pool.set_history_capacity(1 << 20);
    pool.reset_peak_stats();
    work(3_000, &mut live);
    let peak = pool.stats().reserved_bytes.all.peak;
    for ptr in live.drain(..).step_by(2) {
        pool.free(ptr).unwrap();
    }
    pool.empty_cache().unwrap();
    let mut pickle = Vec::new();
    pool.snapshot().write_pickle(&mut pickle).unwrap();
    (pickle, peak)
}

/// A snapshot our pool wrote after working before history recording began replays to the
/// pool's own reserved peak since then, to the byte.
#[test]
fn a_snapshot_of_our_pool_recorded_mid_process_replays_to_its_own_peak() {
    let (pickle, peak) = snapshot_after_earlier_work(PolicyKind::Torch);
    let trace = gpumem_trace::snapshot::read_trace(pickle.as_slice(), None).unwrap();
    trace.validate().unwrap();
    assert!(!trace.initial_segments.is_empty());
    // Segments that existed before recording, some still there at the dump, some freed by
    // the empty_cache: initial either way.
    let dump = gpumem_trace::snapshot::read(pickle.as_slice()).unwrap();
    let (kept, freed): (Vec<_>, Vec<_>) = trace
        .initial_segments
        .iter()
        .partition(|initial| dump.segments.iter().any(|s| s.address == initial.address));
    println!(
        "{} initial segments ({} freed during recording), {} initial blocks; peak {peak} B",
        trace.initial_segments.len(),
        freed.len(),
        trace.initial_allocs()
    );
    assert!(!kept.is_empty() && !freed.is_empty());
    assert_eq!(torch_peak(&trace), peak);
    let before = torch_peak(&without_segments(&trace));
    println!("without initial segments: {before} B");
    assert_ne!(before, peak);
}

/// An expandable pool's snapshot holds ranges of expandable segments, which no policy takes
/// over yet: the replay allocates their blocks and says so.
#[test]
fn expandable_ranges_are_allocated_and_the_report_says_why() {
    let (pickle, _) = snapshot_after_earlier_work(PolicyKind::Expandable);
    let trace = gpumem_trace::snapshot::read_trace(pickle.as_slice(), None).unwrap();
    trace.validate().unwrap();
    assert!(trace.initial_segments.iter().all(|s| s.expandable));
    let report = replay_peaks(&trace, PolicyKind::Expandable, &ReplayOptions::default()).unwrap();
    let state = report.initial_state.unwrap();
    assert_eq!(state.adopted_segments, 0);
    assert!(
        state.notes[0].contains("expandable segment"),
        "{:?}",
        state.notes
    );
}
