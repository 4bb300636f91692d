//! What a replay report shows, computed from traces by replaying them: per rank (one trace
//! each) and per policy the figures of `gpumem replay`, the memory over time reduced for
//! drawing, the segment map at the peak, the out-of-memory point, the largest live allocations
//! at the trace's peak and, when asked, the `tune` table.

use std::collections::HashMap;

use gpumem_pool::policies::torch_settings::TorchSettings;
use gpumem_pool::policies::GpumemSettings;
use gpumem_pool::{PolicyKind, SegmentView};
use gpumem_replay::timeline::{segments_after, timeline};
use gpumem_replay::tune::{tune, TuneError, TuneOptions, TuneReport};
use gpumem_replay::{highest_rank, replay, PolicyReport, ReplayError, ReplayOptions, TraceInfo};
use gpumem_trace::{Event, Frame, StackId, Trace};
use rayon::prelude::*;
use serde::Serialize;

use crate::series::Series;

/// Buckets per chart series: a few per pixel of a wide chart, so that zooming in a few times
/// still draws from buckets no wider than a pixel.
pub const DEFAULT_BUCKETS: usize = 4000;

/// Size groups listed among the largest live allocations at the peak.
const LARGEST_GROUPS: usize = 15;

/// Step markers drawn at most (a long trace's steps are thinned evenly).
const MAX_STEP_MARKS: usize = 400;

/// What a report replays and shows.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// The policies to replay each trace through, in the order shown.
    pub policies: Vec<PolicyKind>,
    /// The replay's settings: `capacity` is the device the report checks for out-of-memory.
    pub replay: ReplayOptions,
    /// Also run `gpumem tune` on each trace with these options and show its table.
    pub tune: Option<TuneOptions>,
    /// Buckets per chart series ([`DEFAULT_BUCKETS`]).
    pub buckets: usize,
}

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// No trace was given.
    #[error("no trace to report on")]
    NoTraces,
    /// No policy was given.
    #[error("no policy to replay the traces through")]
    NoPolicies,
    /// A trace allocates nothing.
    #[error("rank {rank} ({name}): the trace allocates nothing, so there is nothing to report")]
    NothingAllocated {
        /// The rank (position among the traces).
        rank: usize,
        /// The trace's name.
        name: String,
    },
    /// The capacity is below what the trace holds live at once: no policy can run it.
    #[error(
        "rank {rank} ({name}): capacity {} ({capacity} bytes) is below the trace's peak live bytes {} ({peak_live} bytes): no allocator can run it; give a larger --capacity or none",
        gpumem_pool::Bytes(*capacity),
        gpumem_pool::Bytes(*peak_live)
    )]
    CapacityBelowPeakLive {
        /// The rank.
        rank: usize,
        /// The trace's name.
        name: String,
        /// The capacity asked for.
        capacity: u64,
        /// The most bytes the trace holds live at once.
        peak_live: u64,
    },
    /// A replay failed.
    #[error("rank {rank}: {source}")]
    Replay {
        /// The rank.
        rank: usize,
        /// The replay's error.
        source: ReplayError,
    },
    /// The tune search failed.
    #[error("rank {rank}: tune: {source}")]
    Tune {
        /// The rank.
        rank: usize,
        /// The search's error.
        source: TuneError,
    },
    /// The output path is a directory (or ends with a separator).
    #[error(
        "cannot write {}: it is a directory; give the path of a file for the page, such as {}",
        path.display(),
        path.join("report.html").display()
    )]
    OutputIsDirectory {
        /// The output path.
        path: std::path::PathBuf,
    },
    /// The output path is one of the traces read: the page would replace it.
    #[error(
        "cannot write {}: it is the trace {}, which the page would replace; give another path",
        path.display(),
        input.display()
    )]
    OutputIsInput {
        /// The output path.
        path: std::path::PathBuf,
        /// The trace it names, as given.
        input: std::path::PathBuf,
    },
    /// The report could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The output path.
        path: std::path::PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
}

/// A report over one or more traces (ranks of one job).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The device capacity checked, if any.
    pub capacity_bytes: Option<u64>,
    /// One entry per trace, in the order given.
    pub ranks: Vec<RankReport>,
    /// The rank whose highest peak reserved (over the policies) is the highest.
    pub highest_rank: usize,
    /// The allocator settings the replays ran with, one line each: PyTorch's options
    /// (`PyTorch's defaults` when unchanged) and the gpumem policy's changed options.
    pub settings: Vec<String>,
}

/// A step marker: the event index where step `step` begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct StepMark {
    /// The event index of the marker.
    pub event_index: usize,
    /// The step number the trace gives.
    pub step: u64,
}

/// One trace's report.
#[derive(Clone, Debug, Serialize)]
pub struct RankReport {
    /// The rank (position among the traces given).
    pub rank: usize,
    /// The trace's facts as `gpumem replay --json` gives them, with what the reader skipped.
    pub trace: TraceInfo,
    /// Where steps begin (at most a few hundred, evenly thinned).
    pub steps: Vec<StepMark>,
    /// Bytes live in the trace (as requested) over time.
    pub live: Series<u64>,
    /// One entry per policy.
    pub policies: Vec<PolicyView>,
    /// The largest live allocations at the trace's peak.
    pub largest_live: LargestLive,
    /// The `tune` search's result, when asked.
    pub tune: Option<TuneReport>,
}

/// One policy's replay of one trace.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyView {
    /// The figures, exactly as `gpumem replay` reports them.
    pub report: PolicyReport,
    /// Allocated bytes over time (device without a limit).
    pub allocated: Series<u64>,
    /// Reserved bytes over time (device without a limit).
    pub reserved: Series<u64>,
    /// Fragmentation over time: the share of reserved bytes not allocated.
    pub fragmentation: Series<f32>,
    /// The segments at the event where reserved memory peaks.
    pub peak_map: MapView,
    /// The stack of the allocation that runs out of memory, when the trace recorded one.
    pub oom_stack: Option<StackView>,
}

/// One stack frame as the report shows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct FrameView {
    /// Source file (for PyTorch profiler frames, taken from the name `file(line): function`).
    pub filename: String,
    /// Line in the file.
    pub line: u64,
    /// Function name.
    pub name: String,
}

impl FrameView {
    /// A frame as recorded, with a profiler frame's `file(line): function` name (filename
    /// `none`) split into its parts.
    pub fn of(frame: &Frame) -> Self {
        let profiler = match &*frame.filename {
            "" | "none" | "??" => frame.name.split_once("): ").and_then(|(place, name)| {
                let (file, line) = place.rsplit_once('(')?;
                Some((file, line.parse().ok()?, name))
            }),
            _ => None,
        };
        let (filename, line, name) = profiler.unwrap_or((&frame.filename, frame.line, &frame.name));
        Self {
            filename: filename.to_owned(),
            line,
            name: name.to_owned(),
        }
    }

    /// Whether the frame is PyTorch's own or has no source: inside the `torch` package, in
    /// C/C++/CUDA sources, a built-in or a profiler marker (`nn.Module: ...`) — frames that
    /// do not say which line of the user's code allocated.
    pub fn is_internal(&self) -> bool {
        let path = self.filename.replace('\\', "/");
        let no_source = matches!(path.as_str(), "" | "none" | "??") || path.starts_with('<');
        let native = [".cpp", ".cc", ".h", ".cu", ".cuh"]
            .iter()
            .any(|ext| path.ends_with(ext));
        no_source || native || path.starts_with("torch/") || path.contains("/torch/")
    }
}

/// A stack as the report shows it: the user's frames, innermost first, and how many
/// PyTorch-internal frames ([`FrameView::is_internal`]) were left out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StackView {
    /// The user's frames, innermost first.
    pub frames: Vec<FrameView>,
    /// Internal frames not listed.
    pub hidden: usize,
}

impl StackView {
    /// The stack `id` of `trace`, its internal frames left out.
    pub fn of(trace: &Trace, id: StackId) -> Self {
        let (mut frames, mut hidden) = (Vec::new(), 0);
        for frame in trace.stacks.frames(id).map(FrameView::of) {
            match frame.is_internal() {
                true => hidden += 1,
                false => frames.push(frame),
            }
        }
        Self { frames, hidden }
    }
}

/// Cells a segment map's data resolves (about the pixels of the widest map drawn): segments
/// and ranges narrower than a cell are merged into buckets, so that a map holds at most about
/// four times this many elements however many blocks it has.
pub const MAP_CELLS: u64 = 4096;

/// A segment map, ready to draw.
#[derive(Clone, Debug, Serialize)]
pub struct MapView {
    /// The event after which the map was taken.
    pub event_index: usize,
    /// Segments in the map (before merging).
    pub segment_count: usize,
    /// Bytes of live blocks in the map.
    pub live_bytes: u64,
    /// Segments in address order; neighbours narrower than a cell ([`MAP_CELLS`]) merged.
    pub segments: Vec<SegmentDraw>,
}

impl MapView {
    /// The map of `segments` (in address order) after event `event_index`, bounded: the bytes
    /// of each segment and state stay exact where drawn at least a cell wide, and the map's
    /// total is exact.
    pub fn of(event_index: usize, segments: &[SegmentView]) -> Self {
        let draws: Vec<SegmentDraw> = segments.iter().map(SegmentDraw::of).collect();
        let total: u64 = draws.iter().map(|s| s.size).sum();
        let live_bytes = draws
            .iter()
            .flat_map(|s| &s.ranges)
            .filter(|(_, _, state)| *state == RangeState::Live)
            .map(|(_, size, _)| size)
            .sum();
        let cell = total.div_ceil(MAP_CELLS).max(1);
        let mut merged: Vec<SegmentDraw> = Vec::new();
        for draw in draws {
            match merged.last_mut() {
                Some(last) if last.size < cell && draw.size < cell => {
                    let at = last.size;
                    let moved = draw.ranges.iter().map(|&(o, size, st)| (at + o, size, st));
                    last.ranges.extend(moved);
                    last.size += draw.size;
                    last.count += draw.count;
                    last.expandable |= draw.expandable;
                }
                _ => merged.push(draw),
            }
        }
        for segment in &mut merged {
            segment.ranges = bucket_ranges(&segment.ranges, cell);
        }
        MapView {
            event_index,
            segment_count: segments.len(),
            live_bytes,
            segments: merged,
        }
    }
}

/// `ranges` (tiling a segment) with runs of ranges narrower than `cell` merged into buckets
/// of at least `cell` bytes (the last of a run may be smaller), each in the state holding
/// most of its bytes.
fn bucket_ranges(ranges: &[(u64, u64, RangeState)], cell: u64) -> Vec<(u64, u64, RangeState)> {
    const STATES: [RangeState; 3] = [RangeState::Live, RangeState::Cached, RangeState::Hole];
    let mut out = Vec::new();
    // The bucket being filled: its offset, size and bytes per state.
    let mut pending: Option<(u64, u64, [u64; 3])> = None;
    let flush = |out: &mut Vec<_>, pending: &mut Option<(u64, u64, [u64; 3])>| {
        if let Some((offset, size, bytes)) = pending.take() {
            let most = (0..3).max_by_key(|&i| (bytes[i], 3 - i)).unwrap_or(0);
            out.push((offset, size, STATES[most]));
        }
    };
    for &(offset, size, state) in ranges {
        if size >= cell {
            flush(&mut out, &mut pending);
            out.push((offset, size, state));
            continue;
        }
        let bucket = pending.get_or_insert((offset, 0, [0; 3]));
        bucket.1 += size;
        bucket.2[STATES.iter().position(|&s| s == state).unwrap_or(0)] += size;
        if bucket.1 >= cell {
            flush(&mut out, &mut pending);
        }
    }
    flush(&mut out, &mut pending);
    out
}

/// What a range of a segment holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RangeState {
    /// A block handed out (or waiting on a stream).
    Live,
    /// A cached free block.
    Cached,
    /// Inside the segment's span but in no block (an unmapped stretch of a growable segment).
    Hole,
}

/// One segment of a map (or neighbouring segments too narrow to draw apart): its address,
/// size and the ranges that tile it.
#[derive(Clone, Debug, Serialize)]
pub struct SegmentDraw {
    /// Start address.
    pub address: u64,
    /// Segments it stands for: 1, or more where narrow neighbours were merged.
    pub count: usize,
    /// Bytes from the segment's start to the end of its last range.
    pub size: u64,
    /// Whether it is a growable (VMM) segment.
    pub expandable: bool,
    /// `(offset, size, state)` of each range, in address order.
    pub ranges: Vec<(u64, u64, RangeState)>,
}

impl SegmentDraw {
    /// A segment's ranges: its blocks, and holes where no block covers its span.
    pub fn of(segment: &SegmentView) -> Self {
        let mut ranges = Vec::with_capacity(segment.blocks.len());
        let mut offset = 0;
        for block in &segment.blocks {
            let start = block.address.saturating_sub(segment.address);
            if start > offset {
                ranges.push((offset, start - offset, RangeState::Hole));
            }
            let state = match block.in_use {
                true => RangeState::Live,
                false => RangeState::Cached,
            };
            ranges.push((start, block.size, state));
            offset = start + block.size;
        }
        if segment.total_size > offset {
            ranges.push((offset, segment.total_size - offset, RangeState::Hole));
            offset = segment.total_size;
        }
        SegmentDraw {
            address: segment.address,
            count: 1,
            size: offset,
            expandable: segment.is_expandable,
            ranges,
        }
    }
}

/// Allocations of one size live at the peak.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AllocGroup {
    /// Bytes each allocation asked for.
    pub size: u64,
    /// How many are live.
    pub count: u64,
    /// Their bytes together.
    pub bytes: u64,
}

/// Allocations live at the peak that were made from one place in the user's code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FrameGroup {
    /// Their innermost user frame; `None` for allocations whose stack has no user frame
    /// or that have no stack.
    pub frame: Option<FrameView>,
    /// How many are live.
    pub count: u64,
    /// Their bytes together.
    pub bytes: u64,
    /// The largest of them.
    pub largest: u64,
}

/// The allocations live when the trace holds the most bytes, grouped by size and, when the
/// trace recorded stacks, by their innermost user frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LargestLive {
    /// The event after which the trace's live bytes peak.
    pub event_index: usize,
    /// Live bytes then.
    pub live_bytes: u64,
    /// Live allocations then.
    pub live_count: u64,
    /// The size groups holding the most bytes, largest first.
    pub groups: Vec<AllocGroup>,
    /// The frame groups holding the most bytes, largest first (empty without stacks).
    pub by_frame: Vec<FrameGroup>,
}

/// Replays every trace (one per rank) through every policy of `options` and gathers what the
/// report shows. Replays run in parallel.
pub fn build(traces: &[Trace], options: &ReportOptions) -> Result<Report, ReportError> {
    if traces.is_empty() {
        return Err(ReportError::NoTraces);
    }
    if options.policies.is_empty() {
        return Err(ReportError::NoPolicies);
    }
    for (rank, trace) in traces.iter().enumerate() {
        check(rank, trace, options.replay.capacity)?;
    }
    let ranks = traces
        .par_iter()
        .enumerate()
        .map(|(rank, trace)| rank_report(rank, trace, options))
        .collect::<Result<Vec<_>, _>>()?;
    let reports: Vec<Vec<PolicyReport>> = ranks
        .iter()
        .map(|r| r.policies.iter().map(|p| p.report.clone()).collect())
        .collect();
    let highest_rank = highest_rank(reports.iter().map(Vec::as_slice));
    Ok(Report {
        capacity_bytes: options.replay.capacity,
        ranks,
        highest_rank,
        settings: settings_in_force(options),
    })
}

/// The allocator settings of `options`, one line each: PyTorch's options in
/// `PYTORCH_CUDA_ALLOC_CONF` syntax (`PyTorch's defaults` when unchanged) and, when the gpumem
/// policy is replayed, its options that differ from its defaults.
fn settings_in_force(options: &ReportOptions) -> Vec<String> {
    let torch = &options.replay.torch;
    let mut lines = vec![match *torch == TorchSettings::default() {
        true => "PyTorch's defaults".to_string(),
        false => format!("PyTorch allocator {}", torch.conf()),
    }];
    if options.policies.contains(&PolicyKind::Gpumem) {
        let defaults = GpumemSettings::default().options();
        let changed: Vec<String> = options
            .replay
            .gpumem
            .options()
            .into_iter()
            .filter(|option| !defaults.contains(option))
            .map(|(key, value)| format!("{key}:{value}"))
            .collect();
        if !changed.is_empty() {
            lines.push(format!("gpumem policy {}", changed.join(",")));
        }
    }
    lines
}

/// Refuses a trace there is nothing to show for, or one no device of `capacity` can run.
fn check(rank: usize, trace: &Trace, capacity: Option<u64>) -> Result<(), ReportError> {
    let summary = trace.summary();
    if summary.allocs == 0 {
        return Err(ReportError::NothingAllocated {
            rank,
            name: trace.meta.name.clone(),
        });
    }
    match capacity {
        Some(capacity) if capacity < summary.peak_live_bytes => {
            Err(ReportError::CapacityBelowPeakLive {
                rank,
                name: trace.meta.name.clone(),
                capacity,
                peak_live: summary.peak_live_bytes,
            })
        }
        _ => Ok(()),
    }
}

fn rank_report(
    rank: usize,
    trace: &Trace,
    options: &ReportOptions,
) -> Result<RankReport, ReportError> {
    let policies = options
        .policies
        .par_iter()
        .map(|&policy| policy_view(trace, policy, options))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| ReportError::Replay { rank, source })?;
    let tune = match &options.tune {
        Some(tune_options) => Some(
            tune(trace, tune_options, &|_| {})
                .map_err(|source| ReportError::Tune { rank, source })?,
        ),
        None => None,
    };
    let (live, largest_live) = live_bytes(trace, options.buckets);
    Ok(RankReport {
        rank,
        trace: TraceInfo::of(trace),
        steps: step_marks(trace),
        live,
        policies,
        largest_live,
        tune,
    })
}

fn policy_view(
    trace: &Trace,
    policy: PolicyKind,
    options: &ReportOptions,
) -> Result<PolicyView, ReplayError> {
    let report = replay(trace, policy, &options.replay, &mut |_| {})?.report;
    let line = timeline(trace, policy, &options.replay, &mut |_| {})?;
    let peak = line.peak_index();
    let map = segments_after(trace, policy, &options.replay, peak)?;
    let oom_stack = report
        .oom
        .as_ref()
        .and_then(|oom| trace.alloc_stack(alloc_ordinal(trace, oom.event_index)))
        .map(|id| StackView::of(trace, id));
    let buckets = options.buckets;
    let fragmentation = line
        .allocated
        .iter()
        .zip(&line.reserved)
        .map(|(&a, &r)| match r {
            0 => 0.0,
            r => (r.saturating_sub(a)) as f32 / r as f32,
        });
    Ok(PolicyView {
        report,
        allocated: Series::downsample(&line.allocated, buckets),
        reserved: Series::downsample(&line.reserved, buckets),
        fragmentation: Series::from_iter(line.reserved.len(), buckets, fragmentation),
        peak_map: MapView::of(map.event_index, &map.segments),
        oom_stack,
    })
}

/// How many allocs come before event `index`: the alloc there's ordinal, by which
/// [`Trace::alloc_stack`] knows it.
fn alloc_ordinal(trace: &Trace, index: usize) -> usize {
    trace.events[..index.min(trace.events.len())]
        .iter()
        .filter(|event| matches!(event, Event::Alloc { .. }))
        .count()
}

/// Where the trace's steps begin, thinned evenly to at most [`MAX_STEP_MARKS`].
fn step_marks(trace: &Trace) -> Vec<StepMark> {
    let all: Vec<StepMark> = trace
        .events
        .iter()
        .enumerate()
        .filter_map(|(event_index, e)| match *e {
            Event::Step { index } => Some(StepMark {
                event_index,
                step: index,
            }),
            _ => None,
        })
        .collect();
    let every = all.len().div_ceil(MAX_STEP_MARKS).max(1);
    all.into_iter().step_by(every).collect()
}

/// The trace's live bytes over time, and its largest live allocations at the first event
/// where live bytes peak.
fn live_bytes(trace: &Trace, buckets: usize) -> (Series<u64>, LargestLive) {
    let mut live = LiveSet::default();
    let (mut peak, mut peak_index) = (0u64, 0usize);
    let mut values = Vec::with_capacity(trace.events.len());
    for (index, event) in trace.events.iter().enumerate() {
        live.apply(event);
        let bytes = live.bytes;
        if bytes > peak {
            (peak, peak_index) = (bytes, index);
        }
        values.push(bytes);
    }
    // A second pass up to the peak: the live set there, without copying it at every new peak.
    live = LiveSet::default();
    for event in trace.events.iter().take(peak_index + 1) {
        live.apply(event);
    }
    let mut by_size: HashMap<u64, u64> = HashMap::new();
    for &(size, _) in live.blocks.values() {
        *by_size.entry(size).or_default() += 1;
    }
    let mut groups: Vec<AllocGroup> = by_size
        .into_iter()
        .map(|(size, count)| AllocGroup {
            size,
            count,
            bytes: size * count,
        })
        .collect();
    groups.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.size.cmp(&a.size)));
    groups.truncate(LARGEST_GROUPS);
    let largest = LargestLive {
        event_index: peak_index,
        live_bytes: live.bytes,
        live_count: live.blocks.len() as u64,
        groups,
        by_frame: frame_groups(trace, &live),
    };
    (Series::downsample(&values, buckets), largest)
}

/// The live allocations of `live` grouped by their innermost user frame, the groups holding
/// the most bytes first; none when the trace recorded no stacks.
fn frame_groups(trace: &Trace, live: &LiveSet) -> Vec<FrameGroup> {
    if trace.alloc_stacks.is_empty() {
        return Vec::new();
    }
    let mut top_frames: HashMap<StackId, Option<FrameView>> = HashMap::new();
    let mut groups: HashMap<Option<FrameView>, FrameGroup> = HashMap::new();
    for &(size, ordinal) in live.blocks.values() {
        let frame = trace.alloc_stack(ordinal).and_then(|id| {
            top_frames
                .entry(id)
                .or_insert_with(|| StackView::of(trace, id).frames.into_iter().next())
                .clone()
        });
        let group = groups.entry(frame.clone()).or_insert(FrameGroup {
            frame,
            count: 0,
            bytes: 0,
            largest: 0,
        });
        group.count += 1;
        group.bytes += size;
        group.largest = group.largest.max(size);
    }
    let mut groups: Vec<FrameGroup> = groups.into_values().collect();
    groups.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)));
    groups.truncate(LARGEST_GROUPS);
    groups
}

/// The live allocations while walking a trace: address → (size, alloc ordinal), and their
/// byte total (the trace is valid: readers check it).
#[derive(Default)]
struct LiveSet {
    blocks: HashMap<u64, (u64, usize)>,
    bytes: u64,
    allocs: usize,
}

impl LiveSet {
    fn apply(&mut self, event: &Event) {
        match *event {
            Event::Alloc { addr, size, .. } => {
                self.bytes += size;
                if let Some((old, _)) = self.blocks.insert(addr, (size, self.allocs)) {
                    self.bytes -= old;
                }
                self.allocs += 1;
            }
            Event::Free { addr, .. } => {
                if let Some((size, _)) = self.blocks.remove(&addr) {
                    self.bytes -= size;
                }
            }
            Event::Step { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_pool::BlockView;
    use gpumem_trace::TraceMeta;

    #[test]
    fn segment_ranges_show_holes_and_states() {
        let segment = SegmentView {
            address: 1000,
            total_size: 100,
            stream: Default::default(),
            size_class: gpumem_pool::SizeClass::Large,
            is_expandable: true,
            blocks: vec![
                BlockView {
                    address: 1010,
                    size: 20,
                    in_use: true,
                },
                BlockView {
                    address: 1030,
                    size: 30,
                    in_use: false,
                },
            ],
        };
        let draw = SegmentDraw::of(&segment);
        assert_eq!(
            draw.ranges,
            vec![
                (0, 10, RangeState::Hole),
                (10, 20, RangeState::Live),
                (30, 30, RangeState::Cached),
                (60, 40, RangeState::Hole),
            ]
        );
        assert_eq!(draw.size, 100);
    }

    #[test]
    fn largest_live_groups_by_innermost_user_frame_when_there_are_stacks() {
        let alloc = |addr, size| Event::Alloc {
            addr,
            size,
            stream: 0,
        };
        let mut trace = Trace::new(
            TraceMeta::default(),
            vec![alloc(1, 10), alloc(2, 30), alloc(3, 5), alloc(4, 7)],
        );
        let stacks = &mut trace.stacks;
        let internal = stacks.frame(
            "/usr/lib/python3/site-packages/torch/nn/functional.py",
            9,
            "linear",
        );
        let builtin = stacks.frame("none", 0, "<built-in function empty>");
        let profiled = stacks.frame("none", 0, "model.py(12): forward");
        let train = stacks.frame("train.py", 40, "main");
        let deep = stacks.stack(&[builtin, internal, profiled, train]);
        let shallow = stacks.stack(&[train]);
        let only_internal = stacks.stack(&[internal]);
        trace.alloc_stacks = vec![deep, shallow, deep, only_internal];

        let view = StackView::of(&trace, deep.unwrap());
        let place = |filename: &str, line, name: &str| FrameView {
            filename: filename.into(),
            line,
            name: name.into(),
        };
        assert_eq!(
            view.frames,
            [
                place("model.py", 12, "forward"),
                place("train.py", 40, "main")
            ],
            "the profiler's `file(line): function` is split; internal frames are left out"
        );
        assert_eq!(view.hidden, 2);

        let (_, largest) = live_bytes(&trace, 10);
        let groups: Vec<(Option<FrameView>, u64, u64, u64)> = largest
            .by_frame
            .into_iter()
            .map(|g| (g.frame, g.count, g.bytes, g.largest))
            .collect();
        assert_eq!(
            groups,
            [
                (Some(place("train.py", 40, "main")), 1, 30, 30),
                (Some(place("model.py", 12, "forward")), 2, 15, 10),
                (None, 1, 7, 7),
            ]
        );
        trace.alloc_stacks.clear();
        assert!(
            live_bytes(&trace, 10).1.by_frame.is_empty(),
            "no stacks: by size only"
        );
    }

    #[test]
    fn largest_live_groups_the_peak_by_size() {
        let alloc = |addr, size| Event::Alloc {
            addr,
            size,
            stream: 0,
        };
        let events = vec![
            alloc(1, 10),
            alloc(2, 10),
            alloc(3, 50),
            Event::Free { addr: 3, stream: 0 },
            alloc(4, 5),
            Event::Free { addr: 1, stream: 0 },
        ];
        let trace = Trace::new(TraceMeta::default(), events);
        let (series, largest) = live_bytes(&trace, 100);
        assert_eq!(series.hi, vec![10, 20, 70, 20, 25, 15]);
        assert_eq!((largest.event_index, largest.live_bytes), (2, 70));
        assert_eq!(largest.live_count, 3);
        assert_eq!(
            largest.groups,
            vec![
                AllocGroup {
                    size: 50,
                    count: 1,
                    bytes: 50
                },
                AllocGroup {
                    size: 10,
                    count: 2,
                    bytes: 20
                },
            ]
        );
    }
}
