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
//! and the report says why ([`SearchSpace::notes`]). Never searched:
//! `garbage_collection_threshold` (PyTorch collects only under
//! `torch.cuda.set_per_process_memory_fraction`, which a replay does not model) and the options
//! without effect on device placement (`backend`, `release_lock_on_cudamalloc`, `pinned_*`,
//! `graph_capture_record_stream_reuse`).
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

mod space;

use std::collections::HashMap;
use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use gpumem_pool::policies::torch_settings::TorchSettings;
use gpumem_pool::{Bytes, PolicyKind};
use gpumem_trace::Trace;
use rayon::prelude::*;
use serde::Serialize;

use self::space::{canonical, Knob};
pub use self::space::{search_space, SearchSpace};
use crate::{
    replay, run, PolicyReport, ReplayError, ReplayOptions, STEADY_REPEATS, UNLIMITED_CAPACITY,
};

/// The most passes of the coordinate descent.
pub const MAX_PASSES: usize = 3;

/// Replayed events a whole tuning may spend under the automatic budget, screening and final
/// replays together: 6–9 s of replay on one core at the speed `gpumem replay` reaches on the
/// 10⁶-event benchmark trace (7–10 M events/s), so that such a trace is tuned in 3–4.5 s on
/// two cores, under half the goal of 10 s (docs/benchmarks.md).
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
    /// How many settings to report, best first (within [`TOP_RANGE`]).
    pub top: usize,
    /// The most settings to screen (within [`MAX_REPLAYS_RANGE`]); `None`: as many as keep the
    /// whole tuning within 6·10⁷
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
    /// An option outside what the tuner accepts.
    #[error("{option} {value}: accepted: {} to {}", accepted.start(), accepted.end())]
    OutOfRange {
        /// The option (`top`, `max_replays`).
        option: &'static str,
        /// The value given.
        value: usize,
        /// The values accepted.
        accepted: RangeInclusive<usize>,
    },
    /// A replay failed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

/// The settings [`TuneOptions::top`] may ask for.
pub const TOP_RANGE: RangeInclusive<usize> = 1..=100;

/// The budgets [`TuneOptions::max_replays`] may set: two replays at least, to compare.
pub const MAX_REPLAYS_RANGE: RangeInclusive<usize> = 2..=100_000;

/// `value` of `option` when it lies in `accepted`, else the error naming both.
fn in_range(
    option: &'static str,
    value: usize,
    accepted: RangeInclusive<usize>,
) -> Result<usize, TuneError> {
    if accepted.contains(&value) {
        Ok(value)
    } else {
        Err(TuneError::OutOfRange {
            option,
            value,
            accepted,
        })
    }
}

/// `capacity` minus the smallest device `report` found the trace to run on, when both are
/// known: how much the capacity could shrink (negative: grow) for the trace still to run.
pub fn margin_bytes(capacity: Option<u64>, report: &PolicyReport) -> Option<i64> {
    let (capacity, smallest) = capacity.zip(report.smallest_capacity_bytes)?;
    Some(i64::try_from(capacity).ok()? - i64::try_from(smallest).ok()?)
}

/// A byte difference (a [`margin_bytes`], a change of peak) with its sign, e.g. `-12.00 MiB`.
pub fn signed_bytes(bytes: i64) -> String {
    let sign = if bytes < 0 { "-" } else { "+" };
    format!("{sign}{}", Bytes(bytes.unsigned_abs()))
}

/// The policy that runs `settings`.
fn policy_of(settings: &TorchSettings) -> PolicyKind {
    if settings.expandable_segments {
        PolicyKind::Expandable
    } else {
        PolicyKind::Torch
    }
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
            placement_only: true,
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
            let conf = settings.conf();
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
            .filter_map(|s| self.index.get(&s.conf()).copied())
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
    let top = in_range("top", options.top, TOP_RANGE)?;
    let max_replays = options
        .max_replays
        .map(|n| in_range("max_replays", n, MAX_REPLAYS_RANGE))
        .transpose()?;
    let finalists_wanted = match options.objective {
        // The smallest device is only known after the final replays: one more to rank.
        Objective::Fit => top + 1,
        Objective::Reserved | Objective::Calls => top,
    };
    let budget =
        max_replays.unwrap_or_else(|| automatic_budget(trace, options.objective, finalists_wanted));
    let mut search = Search {
        trace,
        options,
        space: &space,
        tried: Vec::new(),
        index: HashMap::new(),
        budget,
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
                ..ReplayOptions::default()
            };
            replay(trace, kind, &replay_options, &mut |_| {}).map(|r| r.report)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let gpumem = reports.pop().expect("the gpumem replay");
    let tuned = |settings: &TorchSettings, report: PolicyReport| {
        let conf = settings.conf();
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
