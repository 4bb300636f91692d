//! Tuning PyTorch's allocator options for a trace (`gpumem tune`): a search over the
//! `PYTORCH_CUDA_ALLOC_CONF` options that change placement, replaying the trace through the
//! `torch` and `expandable` policies, ranked by an [`Objective`].
//!
//! **Candidates** come from the trace ([`search_space`]): `max_split_size_mb` just above the
//! quantiles of the requests of at least 20 MiB (PyTorch's least value), so that each value
//! splits the large requests differently; `max_non_split_rounding_mb` just above the
//! quantiles of the gaps between those sizes; `roundup_power2_divisions` globally and, per
//! power-of-two size range the trace uses, in its list form; `large_segment_size_mb` where
//! segments of that size are made; `expandable_segments` on and off. Only combinations PyTorch
//! accepts are tried (`max_split_size_mb` and `max_non_split_rounding_mb` at least
//! `large_segment_size_mb`). Values that cannot change placement on this trace are not tried,
//! and the report says why
//! ([`SearchSpace::notes`]). Never searched: `garbage_collection_threshold` (PyTorch collects
//! only under `torch.cuda.set_per_process_memory_fraction`, which a replay does not model) and
//! the options without effect on device placement (`backend`, `release_lock_on_cudamalloc`,
//! `pinned_*`, `graph_capture_record_stream_reuse`).
//!
//! **Search**: a coordinate descent from PyTorch's defaults, once with and once without
//! expandable segments, in lockstep: option by option, every value with the others held at the
//! best point so far, keeping a value only when it ranks strictly better; whole passes repeat
//! until none moves either point (at most [`MAX_PASSES`]). Each option's values are replayed in
//! parallel (rayon), every setting once. The screening replays are bounded
//! ([`TuneOptions::max_replays`]); their figures come from one replay on an unlimited device
//! (plus the steady-state repeats for [`Objective::Calls`] and a run at the capacity for
//! [`Objective::Fit`] when the peak exceeds it). The best distinct settings are then replayed
//! with [`crate::replay`] exactly as `gpumem replay` does, and ranked on those figures: what a
//! result reports is what `gpumem replay --pytorch-alloc-conf` with its [`Tuned::conf`] prints.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use gpumem_pool::policies::torch_rounding::{
    round_size, roundup_interval, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, SMALL_SIZE,
};
use gpumem_pool::policies::torch_settings::{TorchSettings, ROUNDUP_INTERVALS};
use gpumem_pool::{Bytes, PolicyKind};
use gpumem_trace::{Event, Trace};
use rayon::prelude::*;
use serde::Serialize;

use crate::{
    replay, run, PolicyReport, ReplayError, ReplayOptions, STEADY_REPEATS, UNLIMITED_CAPACITY,
};

const MIB: u64 = 1 << 20;

/// PyTorch's least `max_split_size_mb`, `max_non_split_rounding_mb` and
/// `large_segment_size_mb`: 20 MB (MiB).
const MIN_OPTION: u64 = 20 * MIB;

/// Quantiles of the large request sizes that give `max_split_size_mb` candidates.
const SPLIT_QUANTILES: usize = 8;

/// Quantiles of the gaps between large request sizes that give `max_non_split_rounding_mb`
/// candidates.
const ROUNDING_QUANTILES: usize = 4;

/// `large_segment_size_mb` values tried where the option applies: PyTorch's default and three
/// doublings (more requests of 1–10 MiB per segment, or larger expandable chunks).
const LARGE_SEGMENT_SIZES: [u64; 4] = [20 * MIB, 40 * MIB, 80 * MIB, 160 * MIB];

/// `roundup_power2_divisions` values tried, globally and per size range (0: off).
const DIVISIONS: [u64; 5] = [0, 2, 4, 8, 16];

/// The most passes of the coordinate descent.
pub const MAX_PASSES: usize = 3;

/// Replayed events a whole tuning may spend under the automatic budget, screening and final
/// replays together: about 8 s of replay on one core at the speed `gpumem replay` reaches on
/// the 10⁶-event benchmark trace (7–9 M events/s), so that such a trace is tuned in about
/// 4–5 s on two cores, half the goal of 10 s.
const TUNE_EVENTS: u64 = 60_000_000;

/// Passes over the trace one final replay makes: the run, then the steady-state measurement
/// (the whole trace, then its steps after the first [`STEADY_REPEATS`] more times).
const FINAL_PASSES: u64 = 2 + STEADY_REPEATS as u64;

/// Passes the smallest-device search adds to a final replay for [`Objective::Fit`] (a
/// bisection in 2 MiB steps over the gap between peak allocated and peak reserved).
const FIT_PASSES: u64 = 8;

/// The fewest screening replays the automatic budget allows, whatever the trace's length.
const MIN_REPLAYS: usize = 16;

/// The most screening replays the automatic budget allows: more than a complete descent
/// needs on any committed trace.
const MAX_REPLAYS: usize = 400;

/// What the tuner minimises. Every objective ranks settings that run out of memory at the
/// capacity (when one is given) after those that do not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// The lowest peak reserved bytes; ties: the fewest device calls.
    #[default]
    Reserved,
    /// The smallest device the trace runs on ([`crate::smallest_capacity`]: reclaiming as the
    /// pool does, 2 MiB steps), i.e. the largest margin below the capacity; ties: the lowest
    /// peak reserved bytes, then the fewest device calls.
    Fit,
    /// The fewest allocating device calls per step in steady state
    /// ([`PolicyReport::steady_state_alloc_calls_per_step`]; the whole trace's allocating
    /// calls for a trace with fewer than two steps); ties: the lowest peak reserved bytes.
    Calls,
}

/// The objectives, their names and what each minimises: parsing, help and errors read it.
const OBJECTIVES: [(Objective, &str, &str); 3] = [
    (
        Objective::Reserved,
        "reserved",
        "lowest peak reserved memory (ties: fewest device calls)",
    ),
    (
        Objective::Fit,
        "fit",
        "smallest device the trace runs on, reclaiming as the pool does: the largest margin below --capacity (ties: peak reserved)",
    ),
    (
        Objective::Calls,
        "calls",
        "fewest allocating device calls per step in steady state (ties: peak reserved)",
    ),
];

impl Objective {
    /// The name used on the command line.
    pub fn as_str(self) -> &'static str {
        OBJECTIVES[self as usize].1
    }

    /// Every name, comma-separated.
    pub fn names() -> String {
        OBJECTIVES.map(|o| o.1).join(", ")
    }

    /// One line per objective, `name: what it minimises`, for `--help`.
    pub fn help() -> String {
        OBJECTIVES
            .map(|(_, name, what)| format!("{name}: {what}"))
            .join("\n")
    }
}

impl FromStr for Objective {
    type Err = String;

    /// Parses an objective's name; the error lists the accepted names.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OBJECTIVES
            .iter()
            .find(|o| o.1 == s.trim())
            .map(|o| o.0)
            .ok_or_else(|| format!("one of {}", Objective::names()))
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to tune for.
#[derive(Clone, Debug, PartialEq)]
pub struct TuneOptions {
    /// What to minimise.
    pub objective: Objective,
    /// The device the trace must run on; `None` checks nothing.
    pub capacity: Option<u64>,
    /// How many settings to report, best first (at least one).
    pub top: usize,
    /// The most settings to screen; `None`: as many as keep the whole tuning within 6·10⁷
    /// replayed events (at least 16, at most 400), which keeps a 10⁶-event trace well under
    /// 10 s on two cores.
    pub max_replays: Option<usize>,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            objective: Objective::Reserved,
            capacity: None,
            top: 3,
            max_replays: None,
        }
    }
}

/// The option values worth trying on a trace, derived from its request sizes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SearchSpace {
    /// `max_split_size` values (bytes) tried besides unlimited (PyTorch's default): just above
    /// the quantiles of the requests of at least 20 MiB, and 20 MiB itself.
    pub max_split_sizes: Vec<u64>,
    /// `max_non_split_rounding` values (bytes), PyTorch's default (20 MiB) first: just above
    /// the quantiles of the gaps between the sizes of large requests. Tried only with a
    /// `max_split_size`.
    pub max_non_split_roundings: Vec<u64>,
    /// `large_segment_size` values (bytes) tried with the `torch` policy; empty when no
    /// request gets such a segment (none between 1 and 10 MiB).
    pub large_segment_sizes_torch: Vec<u64>,
    /// `large_segment_size` values (bytes) tried with `expandable`, where it is the large
    /// pool's chunk; empty when no request is above 1 MiB.
    pub large_segment_sizes_expandable: Vec<u64>,
    /// Global `roundup_power2_divisions` values (0: off, the default).
    pub divisions: Vec<u64>,
    /// The entries of the `roundup_power2_divisions` table the trace's requests use (index =
    /// log2(size) − 20, clamped to 0…15); each is searched on its own (the list form) when
    /// there are two or more.
    pub intervals: Vec<usize>,
    /// Options not searched on this trace, and why.
    pub notes: Vec<String>,
}

/// One setting the tuner reports: the exact options, and what a replay with them gives.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tuned {
    /// The settings.
    #[serde(skip)]
    pub settings: TorchSettings,
    /// The settings in `PYTORCH_CUDA_ALLOC_CONF` syntax; [`TorchSettings::parse`] reads it
    /// back to [`Tuned::settings`].
    pub conf: String,
    /// The shell line that sets them: `export PYTORCH_CUDA_ALLOC_CONF='…'`.
    pub export: String,
    /// Capacity minus the smallest device the trace runs on, when both are known.
    pub margin_bytes: Option<i64>,
    /// The replay's figures, as `gpumem replay --pytorch-alloc-conf CONF` reports them (with
    /// `--smallest-capacity` for [`Objective::Fit`]).
    pub report: PolicyReport,
}

impl Tuned {
    /// The policy the settings select: `expandable` with expandable segments, else `torch`.
    pub fn policy(&self) -> PolicyKind {
        policy_of(&self.settings)
    }
}

/// The outcome of [`tune`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TuneReport {
    /// What was minimised.
    pub objective: Objective,
    /// The capacity the settings were checked against.
    pub capacity_bytes: Option<u64>,
    /// The best settings, best first; of settings that rank the same in the search (the same
    /// figures for the objective) only the first tried appears.
    pub ranked: Vec<Tuned>,
    /// The best setting without expandable segments, when none of `ranked` is one and it is
    /// not PyTorch's defaults: for programs that cannot use them.
    pub best_without_expandable: Option<Tuned>,
    /// PyTorch's defaults (`torch`, no options), for comparison.
    pub pytorch_default: Tuned,
    /// The `gpumem` policy on the same trace and capacity.
    pub gpumem: PolicyReport,
    /// What was searched.
    pub space: SearchSpace,
    /// Settings screened.
    pub replays: usize,
    /// The most settings the search could screen.
    pub budget: usize,
    /// Whether the descent ran to its end (no option moved, or [`MAX_PASSES`]) rather than
    /// stopping at the budget.
    pub complete: bool,
    /// Wall time of the whole tuning, seconds.
    pub seconds: f64,
}

/// Progress of a running [`tune`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TuneProgress {
    /// Settings screened so far.
    pub replays: usize,
    /// The most the search may screen.
    pub budget: usize,
}

/// Why a trace cannot be tuned.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// The trace allocates nothing, so no option changes anything.
    #[error("the trace allocates nothing: there is no placement to tune")]
    NothingToTune,
    /// Not even a perfect allocator fits the trace into the capacity.
    #[error(
        "capacity {} ({capacity} bytes) is below the trace's peak live bytes {} ({peak_live} bytes): no allocator setting can run it",
        Bytes(*capacity),
        Bytes(*peak_live)
    )]
    CapacityBelowPeakLive {
        /// The capacity asked for.
        capacity: u64,
        /// The most bytes the trace holds live at once.
        peak_live: u64,
    },
    /// A replay failed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

/// `capacity` minus the smallest device `report` found the trace to run on, when both are
/// known: how much the capacity could shrink (negative: grow) for the trace still to run.
pub fn margin_bytes(capacity: Option<u64>, report: &PolicyReport) -> Option<i64> {
    let (capacity, smallest) = capacity.zip(report.smallest_capacity_bytes)?;
    Some(i64::try_from(capacity).ok()? - i64::try_from(smallest).ok()?)
}

/// The policy that runs `settings`.
fn policy_of(settings: &TorchSettings) -> PolicyKind {
    if settings.expandable_segments {
        PolicyKind::Expandable
    } else {
        PolicyKind::Torch
    }
}

/// The option values worth trying on `trace` (see the module documentation).
pub fn search_space(trace: &Trace) -> Result<SearchSpace, TuneError> {
    let off = [0; ROUNDUP_INTERVALS];
    let requests: Vec<u64> = trace
        .events
        .iter()
        .filter_map(|e| match *e {
            Event::Alloc { size, .. } => Some(size),
            _ => None,
        })
        .collect();
    if requests.is_empty() {
        return Err(TuneError::NothingToTune);
    }
    // Block sizes as PyTorch rounds them without divisions; absurd sizes are left out.
    let blocks: Vec<u64> = requests
        .iter()
        .filter_map(|&r| round_size(r, &off))
        .collect();
    let mut large: Vec<u64> = blocks
        .iter()
        .copied()
        .filter(|&b| b >= MIN_OPTION)
        .collect();
    large.sort_unstable();
    let mut notes = vec![
        "garbage_collection_threshold: PyTorch collects only under torch.cuda.set_per_process_memory_fraction, which a replay does not model".to_string(),
    ];

    // A threshold just above a size keeps requests of that size splittable; 20 MiB makes
    // every large request oversize.
    let mut max_split_sizes = Vec::new();
    if large.is_empty() {
        notes.push(
            "max_split_size_mb, max_non_split_rounding_mb: no request of 20 MiB or more (the least max_split_size_mb), so neither changes placement"
                .to_string(),
        );
    } else {
        max_split_sizes.push(MIN_OPTION);
        max_split_sizes.extend(quantiles(&large, SPLIT_QUANTILES).map(just_above));
        max_split_sizes.dedup();
    }

    // A cached oversize block of size b serves a request s ≥ max_split_size when
    // b < s + max_non_split_rounding: each value just above a gap admits that gap.
    let mut max_non_split_roundings = vec![MIN_OPTION];
    let mut distinct = large.clone();
    distinct.dedup();
    let mut gaps: Vec<u64> = distinct
        .iter()
        .enumerate()
        .flat_map(|(i, &s)| distinct[i + 1..].iter().map(move |&b| b - s))
        .filter(|&gap| just_above(gap) > MIN_OPTION)
        .collect();
    gaps.sort_unstable();
    if !gaps.is_empty() {
        let mut above = quantiles(&gaps, ROUNDING_QUANTILES)
            .chain(gaps.last().copied())
            .map(just_above)
            .collect::<Vec<_>>();
        above.dedup();
        max_non_split_roundings.extend(above);
    } else if !large.is_empty() {
        notes.push(
            "max_non_split_rounding_mb: the large requests differ by at most 20 MiB (the default), so larger values change nothing"
                .to_string(),
        );
    }

    // PyTorch gives requests above 1 MiB and below 10 MiB a segment of large_segment_size.
    let mid_size = blocks
        .iter()
        .any(|&b| b > SMALL_SIZE && b < MIN_LARGE_ALLOC);
    let large_pool = blocks.iter().any(|&b| b > SMALL_SIZE);
    let large_segment_sizes_torch = match mid_size {
        true => LARGE_SEGMENT_SIZES.to_vec(),
        false => {
            notes.push(format!(
                "large_segment_size_mb with torch: no request between 1 and {} MiB, the only ones placed in such segments",
                MIN_LARGE_ALLOC / MIB
            ));
            Vec::new()
        }
    };
    let large_segment_sizes_expandable = match large_pool {
        true => LARGE_SEGMENT_SIZES.to_vec(),
        false => {
            notes.push(
                "large_segment_size_mb with expandable: no request above 1 MiB, so no large-pool chunk is mapped"
                    .to_string(),
            );
            Vec::new()
        }
    };

    // Divisions act on requests above 512 B × divisions, so from 2 divisions on above 1 KiB.
    let mut intervals: Vec<usize> = requests
        .iter()
        .filter(|&&r| r > 2 * MIN_BLOCK_SIZE)
        .map(|&r| roundup_interval(r))
        .collect();
    intervals.sort_unstable();
    intervals.dedup();
    let divisions = if intervals.is_empty() {
        notes.push("roundup_power2_divisions: no request above 1 KiB, where it acts".to_string());
        Vec::new()
    } else {
        DIVISIONS.to_vec()
    };
    if intervals.len() == 1 {
        notes.push(
            "roundup_power2_divisions list form: the requests lie in one size range, where the global value says the same"
                .to_string(),
        );
    }
    Ok(SearchSpace {
        max_split_sizes,
        max_non_split_roundings,
        large_segment_sizes_torch,
        large_segment_sizes_expandable,
        divisions,
        intervals,
        notes,
    })
}

/// The values at the `k`-th `n`-quantiles of the sorted `values`, k = 0…n−1 (the smallest
/// first), ascending and without repeats.
fn quantiles(values: &[u64], n: usize) -> impl Iterator<Item = u64> + '_ {
    let mut last = None;
    (0..n).filter_map(move |k| {
        let v = values[k * values.len() / n];
        (last != Some(v)).then(|| {
            last = Some(v);
            v
        })
    })
}

/// The smallest whole number of MiB strictly above `bytes`, in bytes, and at least 20 MiB: an
/// option value under which blocks of `bytes` bytes fall.
fn just_above(bytes: u64) -> u64 {
    ((bytes / MIB + 1) * MIB).max(MIN_OPTION)
}

/// An option the descent moves along.
#[derive(Clone, Copy, Debug)]
enum Knob {
    MaxSplit,
    Divisions,
    DivisionsAt(usize),
    LargeSegment,
    NonSplitRounding,
}

impl Knob {
    /// The options in the order a pass visits them: those with few values that move peaks
    /// most first, the size ranges of `roundup_power2_divisions` last.
    fn all(space: &SearchSpace) -> Vec<Knob> {
        let mut knobs = vec![
            Knob::MaxSplit,
            Knob::LargeSegment,
            Knob::Divisions,
            Knob::NonSplitRounding,
        ];
        if space.intervals.len() > 1 {
            knobs.extend(space.intervals.iter().map(|&i| Knob::DivisionsAt(i)));
        }
        knobs
    }

    /// `point` with this option set to each value worth trying there.
    fn variants(self, space: &SearchSpace, point: &TorchSettings) -> Vec<TorchSettings> {
        let with = |change: &dyn Fn(&mut TorchSettings)| {
            let mut s = point.clone();
            change(&mut s);
            canonical(s, space)
        };
        let variants: Vec<TorchSettings> = match self {
            Knob::MaxSplit => std::iter::once(u64::MAX)
                .chain(space.max_split_sizes.iter().copied())
                .map(|v| with(&|s| s.max_split_size = v))
                .collect(),
            Knob::NonSplitRounding if point.max_split_size == u64::MAX => Vec::new(),
            Knob::NonSplitRounding => space
                .max_non_split_roundings
                .iter()
                .map(|&v| with(&|s| s.max_non_split_rounding = v))
                .collect(),
            Knob::LargeSegment => large_segment_sizes(space, point.expandable_segments)
                .iter()
                .map(|&v| with(&|s| s.large_segment_size = v))
                .collect(),
            Knob::Divisions => space
                .divisions
                .iter()
                .map(|&v| with(&|s| s.roundup_power2_divisions = [v; ROUNDUP_INTERVALS]))
                .collect(),
            Knob::DivisionsAt(i) => DIVISIONS
                .iter()
                .map(|&v| with(&|s| s.roundup_power2_divisions[i] = v))
                .collect(),
        };
        variants.into_iter().filter(pytorch_accepts).collect()
    }
}

/// Whether PyTorch accepts `settings`: it refuses a `max_split_size_mb` below
/// `large_segment_size_mb` (and a `max_non_split_rounding_mb` below it, which [`canonical`]
/// raises).
fn pytorch_accepts(settings: &TorchSettings) -> bool {
    settings.max_split_size >= settings.large_segment_size
}

/// The `large_segment_size` values tried with or without expandable segments.
fn large_segment_sizes(space: &SearchSpace, expandable: bool) -> &[u64] {
    if expandable {
        &space.large_segment_sizes_expandable
    } else {
        &space.large_segment_sizes_torch
    }
}

/// `settings` in the one form the search keeps among those that place this trace's requests
/// alike: options that cannot act at their defaults, `max_non_split_rounding` at least
/// `large_segment_size` (PyTorch's floor for it, and its default when `large_segment_size_mb`
/// is set), and the divisions table filled across the size ranges without requests from the
/// ranges below, with 1 (off) for 0 in a list and all-off written as the default.
fn canonical(mut settings: TorchSettings, space: &SearchSpace) -> TorchSettings {
    let default = TorchSettings::default();
    if large_segment_sizes(space, settings.expandable_segments).is_empty() {
        settings.large_segment_size = default.large_segment_size;
    }
    settings.max_non_split_rounding = match settings.max_split_size {
        u64::MAX => default.max_non_split_rounding,
        _ => settings
            .max_non_split_rounding
            .max(settings.large_segment_size),
    };
    let table = &mut settings.roundup_power2_divisions;
    if let Some(&first) = space.intervals.first() {
        let mut fill = table[first];
        for (i, d) in table.iter_mut().enumerate() {
            if space.intervals.contains(&i) {
                fill = *d;
            } else {
                *d = fill;
            }
        }
    }
    if table.iter().all(|&d| d <= 1) || space.intervals.is_empty() {
        *table = default.roundup_power2_divisions;
    } else {
        table.iter_mut().filter(|d| **d == 0).for_each(|d| *d = 1);
    }
    settings
}

/// `settings` in `PYTORCH_CUDA_ALLOC_CONF` syntax, `expandable_segments` first and options at
/// their defaults left out; [`TorchSettings::parse`] reads it back to `settings` when every
/// size is a whole number of MiB (as every parsed or tuned setting's is).
fn alloc_conf(settings: &TorchSettings) -> String {
    let default = TorchSettings::default();
    let mib = |bytes: u64| bytes / MIB;
    let mut options = vec![format!(
        "expandable_segments:{}",
        if settings.expandable_segments {
            "True"
        } else {
            "False"
        }
    )];
    if settings.max_split_size != default.max_split_size {
        options.push(format!(
            "max_split_size_mb:{}",
            mib(settings.max_split_size)
        ));
    }
    if settings.max_non_split_rounding != default.max_non_split_rounding {
        options.push(format!(
            "max_non_split_rounding_mb:{}",
            mib(settings.max_non_split_rounding)
        ));
    }
    if settings.large_segment_size != default.large_segment_size {
        options.push(format!(
            "large_segment_size_mb:{}",
            mib(settings.large_segment_size)
        ));
    }
    if let Some(threshold) = settings.garbage_collection_threshold {
        options.push(format!("garbage_collection_threshold:{threshold}"));
    }
    if settings.roundup_power2_divisions != default.roundup_power2_divisions {
        options.push(format!(
            "roundup_power2_divisions:{}",
            divisions_conf(&settings.roundup_power2_divisions)
        ));
    }
    options.join(",")
}

/// A divisions table as PyTorch's option reads it: one value for a uniform table, else the
/// list form (keys in MB; the first key's value also covers the ranges below it, `>` the
/// ranges after the last key), listing only where values change.
fn divisions_conf(table: &[u64; ROUNDUP_INTERVALS]) -> String {
    let first_end = table.iter().position(|&d| d != table[0]);
    let Some(first_end) = first_end else {
        return table[0].to_string();
    };
    let last = table[ROUNDUP_INTERVALS - 1];
    let last_start = (0..ROUNDUP_INTERVALS)
        .rev()
        .find(|&i| table[i] != last)
        .map_or(0, |i| i + 1);
    let mut entries: Vec<String> = (first_end - 1..last_start)
        .map(|i| format!("{}:{}", 1u64 << i, table[i]))
        .collect();
    entries.push(format!(">:{last}"));
    format!("[{}]", entries.join(","))
}

/// One setting screened, in the order tried.
struct Screened {
    settings: TorchSettings,
    key: RankKey,
}

/// Lexicographic rank of a setting under an objective: smaller is better.
type RankKey = [u64; 4];

/// `report`'s rank under `objective`; `fails` says whether it runs out of memory at the
/// capacity.
fn rank_key(objective: Objective, report: &PolicyReport, fails: bool) -> RankKey {
    let fails = u64::from(fails);
    match objective {
        Objective::Reserved => [fails, report.peak_reserved_bytes, report.device_calls, 0],
        Objective::Fit => [
            fails,
            report.smallest_capacity_bytes.unwrap_or(u64::MAX),
            report.peak_reserved_bytes,
            report.device_calls,
        ],
        Objective::Calls => [
            fails,
            report
                .steady_state_alloc_calls_per_step
                .unwrap_or(report.device_alloc_calls),
            report.peak_reserved_bytes,
            0,
        ],
    }
}

/// The state of one search: every setting screened, and the budget.
struct Search<'a> {
    trace: &'a Trace,
    options: &'a TuneOptions,
    space: &'a SearchSpace,
    tried: Vec<Screened>,
    index: HashMap<String, usize>,
    budget: usize,
    exhausted: bool,
    done: AtomicUsize,
    progress: &'a (dyn Fn(TuneProgress) + Sync),
}

impl Search<'_> {
    /// The screening figures of `settings` and whether it fails at the capacity: one replay
    /// on an unlimited device (with the steady-state repeats for [`Objective::Calls`]). Over
    /// the capacity counts as failing, except for [`Objective::Fit`], which replays at the
    /// capacity to see whether reclaiming saves it; the figures stay the unlimited ones, so
    /// that settings that fit still differ in how much they need.
    fn screen(&self, settings: &TorchSettings) -> Result<(PolicyReport, bool), ReplayError> {
        let kind = policy_of(settings);
        let options = ReplayOptions {
            torch: settings.clone(),
            ..ReplayOptions::default()
        };
        let mut quiet = |_| {};
        let report = match self.options.objective {
            Objective::Calls => replay(self.trace, kind, &options, &mut quiet)?.report,
            Objective::Reserved | Objective::Fit => {
                run(self.trace, &kind, UNLIMITED_CAPACITY, &options, &mut quiet)?
                    .report(&kind, self.trace, None)
            }
        };
        let fails = match self.options.capacity {
            Some(c) if report.peak_reserved_bytes > c => match self.options.objective {
                Objective::Fit => run(self.trace, &kind, c, &options, &mut quiet)?
                    .oom
                    .is_some(),
                Objective::Reserved | Objective::Calls => true,
            },
            _ => false,
        };
        let replays = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        (self.progress)(TuneProgress {
            replays,
            budget: self.budget,
        });
        Ok((report, fails))
    }

    /// Screens, in parallel, those of `candidates` not screened yet, as many as the budget
    /// leaves (the first ones).
    fn try_all(&mut self, candidates: Vec<TorchSettings>) -> Result<(), ReplayError> {
        let mut fresh: Vec<(String, TorchSettings)> = Vec::new();
        for settings in candidates {
            let conf = alloc_conf(&settings);
            if !self.index.contains_key(&conf) && fresh.iter().all(|(c, _)| *c != conf) {
                fresh.push((conf, settings));
            }
        }
        let left = self.budget - self.tried.len();
        if fresh.len() > left {
            fresh.truncate(left);
            self.exhausted = true;
        }
        let this = &*self;
        let screened = fresh
            .par_iter()
            .map(|(_, settings)| this.screen(settings))
            .collect::<Result<Vec<_>, _>>()?;
        for ((conf, settings), (report, fails)) in fresh.into_iter().zip(screened) {
            self.index.insert(conf, self.tried.len());
            self.tried.push(Screened {
                key: rank_key(self.options.objective, &report, fails),
                settings,
            });
        }
        Ok(())
    }

    /// The best screened of `current` and `candidates`; `current` unless one ranks strictly
    /// better (it was tried first).
    fn best_of(&self, current: &TorchSettings, candidates: &[TorchSettings]) -> TorchSettings {
        std::iter::once(current)
            .chain(candidates)
            .filter_map(|s| self.index.get(&alloc_conf(s)).copied())
            .min_by_key(|&i| (self.tried[i].key, i))
            .map_or_else(|| current.clone(), |i| self.tried[i].settings.clone())
    }

    /// The coordinate descent from PyTorch's defaults, without and with expandable segments.
    fn descend(&mut self) -> Result<(), ReplayError> {
        let starts = [false, true].map(|expandable| {
            canonical(
                TorchSettings {
                    expandable_segments: expandable,
                    ..TorchSettings::default()
                },
                self.space,
            )
        });
        let mut bests = starts.to_vec();
        self.try_all(bests.clone())?;
        let knobs = Knob::all(self.space);
        for _ in 0..MAX_PASSES {
            let before = bests.clone();
            for &knob in &knobs {
                let per_point: Vec<Vec<TorchSettings>> =
                    bests.iter().map(|b| knob.variants(self.space, b)).collect();
                self.try_all(interleave(&per_point))?;
                for (best, variants) in bests.iter_mut().zip(&per_point) {
                    *best = self.best_of(best, variants);
                }
                if self.exhausted {
                    return Ok(());
                }
            }
            if bests == before {
                break;
            }
        }
        Ok(())
    }
}

/// The first of each list, then the second of each, and so on.
fn interleave(lists: &[Vec<TorchSettings>]) -> Vec<TorchSettings> {
    let longest = lists.iter().map(Vec::len).max().unwrap_or(0);
    (0..longest)
        .flat_map(|i| lists.iter().filter_map(move |l| l.get(i).cloned()))
        .collect()
}

/// The screening replays that keep a whole tuning within [`TUNE_EVENTS`] replayed events,
/// given the final replays of `finalists` settings, PyTorch's defaults, the best without
/// expandable segments and the gpumem policy; at least [`MIN_REPLAYS`], at most
/// [`MAX_REPLAYS`].
fn automatic_budget(trace: &Trace, objective: Objective, finalists: usize) -> usize {
    let (screen_passes, final_passes) = match objective {
        Objective::Reserved => (1, FINAL_PASSES),
        Objective::Fit => (1, FINAL_PASSES + FIT_PASSES),
        Objective::Calls => (FINAL_PASSES, FINAL_PASSES),
    };
    let events = (trace.events.len() as u64).max(1);
    let finals = (finalists as u64 + 3) * final_passes * events;
    let left = TUNE_EVENTS.saturating_sub(finals);
    usize::try_from(left / (events * screen_passes))
        .unwrap_or(MAX_REPLAYS)
        .clamp(MIN_REPLAYS, MAX_REPLAYS)
}

/// The settings that, replayed as `gpumem replay` does, rank best on `trace` under
/// `options`, with PyTorch's defaults and the `gpumem` policy for comparison.
pub fn tune(
    trace: &Trace,
    options: &TuneOptions,
    progress: &(dyn Fn(TuneProgress) + Sync),
) -> Result<TuneReport, TuneError> {
    let started = Instant::now();
    let space = search_space(trace)?;
    let peak_live = trace.summary().peak_live_bytes;
    if let Some(capacity) = options.capacity.filter(|&c| c < peak_live) {
        return Err(TuneError::CapacityBelowPeakLive {
            capacity,
            peak_live,
        });
    }
    let top = options.top.max(1);
    let finalists_wanted = match options.objective {
        // The smallest device is only known after the final replays: one more to rank.
        Objective::Fit => top + 1,
        Objective::Reserved | Objective::Calls => top,
    };
    let budget = options
        .max_replays
        .unwrap_or_else(|| automatic_budget(trace, options.objective, finalists_wanted));
    let mut search = Search {
        trace,
        options,
        space: &space,
        tried: Vec::new(),
        index: HashMap::new(),
        budget: budget.max(2),
        exhausted: false,
        done: AtomicUsize::new(0),
        progress,
    };
    search.descend()?;

    // The best distinct outcomes, in rank order (ties: the first tried).
    let mut order: Vec<usize> = (0..search.tried.len()).collect();
    order.sort_by_key(|&i| (search.tried[i].key, i));
    let mut finalists: Vec<&Screened> = Vec::new();
    for screened in order.iter().map(|&i| &search.tried[i]) {
        if finalists.len() == finalists_wanted {
            break;
        }
        if finalists.iter().all(|f| f.key != screened.key) {
            finalists.push(screened);
        }
    }
    // The best setting without expandable segments too, unless it is a finalist already or
    // PyTorch's defaults (replayed anyway).
    let pytorch_default = canonical(TorchSettings::default(), &space);
    let best_torch = order
        .iter()
        .map(|&i| &search.tried[i])
        .find(|s| !s.settings.expandable_segments)
        .filter(|s| s.settings != pytorch_default)
        .filter(|_| finalists.iter().all(|f| f.settings.expandable_segments));

    let mut to_replay: Vec<(PolicyKind, &TorchSettings)> = finalists
        .iter()
        .chain(&best_torch)
        .map(|f| (policy_of(&f.settings), &f.settings))
        .collect();
    to_replay.push((PolicyKind::Torch, &pytorch_default));
    to_replay.push((PolicyKind::Gpumem, &pytorch_default));
    let mut reports = to_replay
        .par_iter()
        .map(|&(kind, settings)| {
            let replay_options = ReplayOptions {
                capacity: options.capacity,
                torch: settings.clone(),
                history_capacity: 0,
                smallest_capacity: options.objective == Objective::Fit,
            };
            replay(trace, kind, &replay_options, &mut |_| {}).map(|r| r.report)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let gpumem = reports.pop().expect("the gpumem replay");
    let tuned = |settings: &TorchSettings, report: PolicyReport| {
        let conf = alloc_conf(settings);
        Tuned {
            settings: settings.clone(),
            export: format!("export PYTORCH_CUDA_ALLOC_CONF='{conf}'"),
            conf,
            margin_bytes: margin_bytes(options.capacity, &report),
            report,
        }
    };
    let pytorch_default = tuned(
        &pytorch_default,
        reports.pop().expect("the default's replay"),
    );
    let best_torch = best_torch.map(|s| tuned(&s.settings, reports.pop().expect("its replay")));
    let mut ranked: Vec<(RankKey, usize, Tuned)> = finalists
        .iter()
        .zip(reports)
        .enumerate()
        .map(|(order, (f, report))| {
            let key = rank_key(options.objective, &report, report.oom.is_some());
            (key, order, tuned(&f.settings, report))
        })
        .collect();
    ranked.sort_by_key(|(key, order, _)| (*key, *order));
    let mut ranked: Vec<Tuned> = ranked.into_iter().map(|(_, _, t)| t).collect();
    let cut = ranked.split_off(top.min(ranked.len()));
    let best_without_expandable = match ranked.iter().any(|t| !t.settings.expandable_segments) {
        true => None,
        false => cut
            .into_iter()
            .find(|t| !t.settings.expandable_segments)
            .or(best_torch),
    };
    Ok(TuneReport {
        objective: options.objective,
        capacity_bytes: options.capacity,
        ranked,
        best_without_expandable,
        pytorch_default,
        gpumem,
        replays: search.tried.len(),
        budget: search.budget,
        complete: !search.exhausted,
        space,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_trace::TraceMeta;

    /// A trace that allocates and frees `sizes` in turn, one step each.
    fn trace_of(sizes: &[u64]) -> Trace {
        let mut events = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            let addr = (i as u64 + 1) << 40;
            events.push(Event::Step { index: i as u64 });
            events.push(Event::Alloc {
                addr,
                size,
                stream: 0,
            });
            events.push(Event::Free { addr, stream: 0 });
        }
        Trace::new(TraceMeta::default(), events)
    }

    #[test]
    fn max_split_candidates_sit_just_above_the_quantiles_of_large_requests() {
        let sizes: Vec<u64> = [1, 5, 12, 25, 25, 40, 100, 300]
            .iter()
            .map(|mb| mb * MIB + 100)
            .collect();
        let space = search_space(&trace_of(&sizes)).unwrap();
        // Large requests: 25, 25, 40, 100, 300 MiB (+100 B); quantile k/8 of 5 values.
        assert_eq!(
            space.max_split_sizes,
            [20, 26, 41, 101, 301].map(|mb| mb * MIB)
        );
        // Gaps: 15, 75, 275, 60, 260, 200 MiB; above 20 MiB: 60, 75, 200, 260, 275.
        assert_eq!(
            space.max_non_split_roundings,
            [20, 61, 76, 201, 261, 276].map(|mb| mb * MIB)
        );
        assert_eq!(space.intervals, [0, 2, 3, 4, 5, 6, 8]);
        assert_eq!(space.large_segment_sizes_torch, LARGE_SEGMENT_SIZES);
    }

    #[test]
    fn small_traces_say_what_is_not_searched() {
        let space = search_space(&trace_of(&[4096, 65536])).unwrap();
        assert!(space.max_split_sizes.is_empty());
        assert!(space.large_segment_sizes_torch.is_empty());
        assert!(space.large_segment_sizes_expandable.is_empty());
        let notes = space.notes.join("\n");
        for needle in [
            "garbage_collection_threshold",
            "max_split_size_mb",
            "large_segment_size_mb with torch",
            "list form",
        ] {
            assert!(notes.contains(needle), "{needle}: {notes}");
        }
        assert!(matches!(
            search_space(&trace_of(&[])),
            Err(TuneError::NothingToTune)
        ));
    }

    #[test]
    fn conf_strings_read_back_to_the_same_settings() {
        let space = search_space(&trace_of(&[3 * MIB, 30 * MIB, 300 * MIB])).unwrap();
        let mut table = [1; ROUNDUP_INTERVALS];
        table[5] = 8;
        table[8] = 2;
        let mut all = vec![
            TorchSettings::default(),
            TorchSettings {
                expandable_segments: true,
                max_split_size: 64 * MIB,
                max_non_split_rounding: 100 * MIB,
                large_segment_size: 40 * MIB,
                garbage_collection_threshold: Some(0.7),
                roundup_power2_divisions: {
                    let mut t = table;
                    t[15] = 16;
                    t
                },
            },
            TorchSettings {
                roundup_power2_divisions: [4; ROUNDUP_INTERVALS],
                ..TorchSettings::default()
            },
        ];
        // Every candidate the descent can produce from either start.
        for expandable in [false, true] {
            let start = TorchSettings {
                expandable_segments: expandable,
                max_split_size: 64 * MIB,
                ..TorchSettings::default()
            };
            for knob in Knob::all(&space) {
                all.extend(knob.variants(&space, &start));
            }
        }
        for settings in all {
            let conf = alloc_conf(&settings);
            assert_eq!(TorchSettings::parse(&conf).unwrap(), settings, "{conf}");
        }
        // What the descent tries, PyTorch accepts: max_split_size_mb and
        // max_non_split_rounding_mb at least large_segment_size_mb.
        let start = TorchSettings {
            max_split_size: 30 * MIB,
            ..TorchSettings::default()
        };
        let mut seen = 0;
        for knob in Knob::all(&space) {
            for s in knob.variants(&space, &start) {
                seen += 1;
                assert!(
                    s.max_split_size >= s.large_segment_size,
                    "{}",
                    alloc_conf(&s)
                );
                if s.max_split_size != u64::MAX {
                    assert!(s.max_non_split_rounding >= s.large_segment_size);
                }
            }
        }
        let lss = Knob::LargeSegment.variants(&space, &start);
        assert_eq!(
            lss.len(),
            1,
            "only 20 MiB segments stay below a 30 MiB max_split_size"
        );
        assert!(seen > 10);
        assert_eq!(divisions_conf(&table), "[16:1,32:8,64:1,128:1,256:2,>:1]");
    }

    #[test]
    fn canonical_settings_fill_unused_ranges_and_drop_inert_options() {
        let space = search_space(&trace_of(&[3 * MIB, 300 * MIB])).unwrap();
        assert_eq!(space.intervals, [1, 8]);
        let mut s = TorchSettings {
            max_non_split_rounding: 64 * MIB,
            ..TorchSettings::default()
        };
        s.roundup_power2_divisions[8] = 4;
        let c = canonical(s, &space);
        assert_eq!(c.max_non_split_rounding, 20 * MIB);
        assert_eq!(
            alloc_conf(&c),
            "expandable_segments:False,roundup_power2_divisions:[128:1,>:4]"
        );
    }

    #[test]
    fn objectives_parse_by_name() {
        for o in [Objective::Reserved, Objective::Fit, Objective::Calls] {
            assert_eq!(o.as_str().parse::<Objective>(), Ok(o));
        }
        assert_eq!(
            "speed".parse::<Objective>(),
            Err("one of reserved, fit, calls".to_string())
        );
    }
}
