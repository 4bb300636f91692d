//! The search space of [`super::tune`]: which option values are worth trying on a trace,
//! derived from its request sizes; the one form each setting is kept in; and the
//! `PYTORCH_CUDA_ALLOC_CONF` string of a setting.

use gpumem_pool::policies::torch_rounding::{
    round_size, roundup_interval, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, SMALL_SIZE,
};
use gpumem_pool::policies::torch_settings::{TorchSettings, ROUNDUP_INTERVALS};
use gpumem_trace::{Event, Trace};
use serde::Serialize;

use super::TuneError;

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
pub(super) enum Knob {
    MaxSplit,
    Divisions,
    DivisionsAt(usize),
    LargeSegment,
    NonSplitRounding,
}

impl Knob {
    /// The options in the order a pass visits them: those with few values that move peaks
    /// most first, the size ranges of `roundup_power2_divisions` last.
    pub(super) fn all(space: &SearchSpace) -> Vec<Knob> {
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
    pub(super) fn variants(self, space: &SearchSpace, point: &TorchSettings) -> Vec<TorchSettings> {
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
pub(super) fn canonical(mut settings: TorchSettings, space: &SearchSpace) -> TorchSettings {
    let default = TorchSettings::default();
    if large_segment_sizes(space, settings.expandable_segments).is_empty() {
        settings.large_segment_size = default.large_segment_size;
    }
    settings.max_non_split_rounding = match settings.max_split_size {
        // Inert without a split size: PyTorch's default.
        u64::MAX => settings.default_rounding(),
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
            let conf = settings.conf();
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
                assert!(s.max_split_size >= s.large_segment_size, "{}", s.conf());
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
            c.conf(),
            "expandable_segments:False,roundup_power2_divisions:[128:1,>:4]"
        );
    }
}
