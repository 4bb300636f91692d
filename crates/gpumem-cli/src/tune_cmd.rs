//! `gpumem tune`: argument parsing and printing over `gpumem_replay::tune`.

use crate::output::{self, CommandError};
use std::ops::RangeInclusive;
use std::path::PathBuf;

use gpumem_pool::{Bytes, PolicyKind};
use gpumem_replay::tune::{
    margin_bytes, signed_bytes, tune, Objective, TuneOptions, TuneProgress, TuneReport, Tuned,
    MAX_REPLAYS_RANGE, TOP_RANGE,
};
use gpumem_replay::{PolicyReport, TraceInfo, TuneResult};
use gpumem_trace::{read_path, Format, ReadOptions};
use indicatif::{ProgressBar, ProgressStyle};

use crate::replay_cmd::{parse_capacity, print_json, trace_line};

/// What `--help` says about the options the search leaves alone.
const NOT_SEARCHED: &str = "\
Searches the PYTORCH_CUDA_ALLOC_CONF options that change placement, through the torch and \
expandable policies: expandable_segments, max_split_size_mb (just above quantiles of the \
trace's requests of 20 MiB or more), max_non_split_rounding_mb, roundup_power2_divisions \
(global, and per size range in its list form), large_segment_size_mb. Never searched: \
garbage_collection_threshold (PyTorch collects only under \
torch.cuda.set_per_process_memory_fraction, which a replay does not model) and the options \
without effect on device placement (backend, release_lock_on_cudamalloc, pinned_*, \
graph_capture_record_stream_reuse). Each result's figures are those `gpumem replay --policy P \
--pytorch-alloc-conf CONF` prints for it.";

/// Arguments of `gpumem tune`.
#[derive(clap::Args)]
#[command(after_help = NOT_SEARCHED)]
pub struct TuneArgs {
    /// Trace file: gpumem JSON lines, a PyTorch snapshot pickle or an RMM log CSV (gzip or
    /// not).
    trace: PathBuf,
    /// Trace format: auto, native, pytorch or rmm.
    #[arg(long, default_value = "auto")]
    format: Format,
    /// For PyTorch snapshots: the device whose trace to tune for (default: the first with one).
    #[arg(long)]
    device: Option<usize>,
    /// Device capacity the settings must run on, e.g. 24GiB or 80G; settings that run out of
    /// memory there rank last.
    #[arg(long, value_parser = parse_capacity)]
    capacity: Option<u64>,
    /// What to minimise: reserved, fit or calls.
    #[arg(long, default_value = "reserved", long_help = objective_help())]
    objective: Objective,
    /// How many settings to show, best first.
    #[arg(long, default_value_t = 3, value_parser = range_of(TOP_RANGE))]
    top: u64,
    /// The most settings to try (default: as many as keep a 10^6-event trace under 10 s on
    /// two cores, at most 400).
    #[arg(long, value_parser = range_of(MAX_REPLAYS_RANGE))]
    max_replays: Option<u64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// A parser of whole numbers within `accepted`, one of the tuner's ranges.
fn range_of(accepted: RangeInclusive<usize>) -> clap::builder::RangedU64ValueParser {
    clap::value_parser!(u64).range(*accepted.start() as u64..=*accepted.end() as u64)
}

/// `value` beside `reference` in words: `4.00 MiB (5.9 %) below the best setting's`, or
/// `the same as …`.
fn compared(value: u64, reference: u64, what: &str) -> String {
    let share = |difference: u64| 100.0 * difference as f64 / reference.max(1) as f64;
    match value.cmp(&reference) {
        std::cmp::Ordering::Equal => format!("the same as {what}"),
        std::cmp::Ordering::Less => {
            let d = reference - value;
            format!("{} ({:.1} %) below {what}", Bytes(d), share(d))
        }
        std::cmp::Ordering::Greater => {
            let d = value - reference;
            format!("{} ({:.1} %) above {what}", Bytes(d), share(d))
        }
    }
}

/// `--objective`'s long help: every objective with what it minimises.
fn objective_help() -> String {
    format!(
        "What to minimise; settings that run out of memory at --capacity rank last.\n{}",
        Objective::help()
    )
}

/// Runs `gpumem tune`.
pub fn run(args: TuneArgs) -> Result<(), CommandError> {
    let read_options = ReadOptions {
        format: args.format,
        device: args.device,
    };
    let trace = read_path(&args.trace, read_options).map_err(|e| e.to_string())?;
    let options = TuneOptions {
        objective: args.objective,
        capacity: args.capacity,
        top: args.top as usize,
        max_replays: args.max_replays.map(|n| n as usize),
    };
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template("tuning [{bar:40}] {pos}/{len} settings") {
        bar.set_style(style.progress_chars("=> "));
    }
    let on_progress = |p: TuneProgress| {
        bar.set_length(p.budget as u64);
        bar.set_position(p.replays as u64);
    };
    let report = tune(&trace, &options, &on_progress).map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    let result = TuneResult {
        trace: TraceInfo::of(&trace),
        tune: report,
    };
    match args.json {
        true => print_json(&result),
        false => print_table(&result.trace, &result.tune),
    }
}

fn print_table(trace: &TraceInfo, report: &TuneReport) -> Result<(), CommandError> {
    output::print(&trace_line(trace))?;
    output::print(&format!(
        "Objective: {}. {} settings replayed in {:.2} s ({}).",
        report.objective,
        report.replays,
        report.seconds,
        if report.complete {
            "search complete".to_string()
        } else {
            format!(
                "stopped at the budget of {}; raise --max-replays",
                report.budget
            )
        }
    ))?;
    let fit = report.objective == Objective::Fit;
    let capacity = report.capacity_bytes;
    let fits_header = capacity.map_or("fits".to_string(), |c| format!("fits {}", Bytes(c)));
    output::print(&format!(
        "\n{:<3} {:<11} {:>14} {:>12} {:>13} {:>17} {:>10}{}  {}",
        "#",
        "policy",
        "peak reserved",
        "utilization",
        "device calls",
        "steady calls/step",
        "syncs/step",
        if fit {
            format!(" {:>15} {:>12}", "smallest device", "margin")
        } else {
            String::new()
        },
        fits_header
    ))?;
    let row = |rank: &str, name: &str, r: &PolicyReport, margin: Option<i64>| {
        let per_step = r
            .steady_state_alloc_calls_per_step
            .map_or("-".to_string(), |c| c.to_string());
        let syncs = r
            .steady_state_syncs_per_step
            .map_or("-".to_string(), |c| c.to_string());
        let fit_cells = match fit {
            false => String::new(),
            true => format!(
                " {:>15} {:>12}",
                r.smallest_capacity_bytes
                    .map_or("not found".to_string(), |b| Bytes(b).to_string()),
                margin.map_or("-".to_string(), signed_bytes)
            ),
        };
        output::print(&format!(
            "{:<3} {:<11} {:>14} {:>11.1}% {:>13} {:>17} {:>10}{}  {}",
            rank,
            name,
            Bytes(r.peak_reserved_bytes).to_string(),
            100.0 * r.utilization,
            r.device_calls,
            per_step,
            syncs,
            fit_cells,
            r.fits(capacity)
        ))
    };
    let tuned_row = |rank: &str, t: &Tuned| {
        row(rank, t.policy().as_str(), &t.report, t.margin_bytes)?;
        output::print(&format!("    {}", t.export))
    };
    for (i, t) in report.ranked.iter().enumerate() {
        tuned_row(&(i + 1).to_string(), t)?;
    }
    output::print("\nFor comparison:")?;
    if let Some(t) = &report.best_without_expandable {
        tuned_row("-", t)?;
        output::print("    (the best without expandable segments)")?;
    }
    tuned_row("-", &report.pytorch_default)?;
    output::print("    (PyTorch's defaults)")?;
    let gpumem = &report.gpumem;
    row(
        "-",
        PolicyKind::Gpumem.as_str(),
        gpumem,
        margin_bytes(capacity, gpumem),
    )?;
    output::print("    GPUMEM_POOL=gpumem (gpumem's own policy)")?;
    if let Some(best) = report.ranked.first() {
        let best_reserved = best.report.peak_reserved_bytes;
        output::print(&format!(
            "\nThe gpumem policy's peak reserved is {}.",
            compared(
                gpumem.peak_reserved_bytes,
                best_reserved,
                "the best setting's"
            )
        ))?;
    }
    output::print("\nNot searched on this trace:")?;
    for note in &report.space.notes {
        output::print(&format!("  {note}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::compared;

    #[test]
    fn a_comparison_says_below_above_or_the_same() {
        const MIB: u64 = 1 << 20;
        assert_eq!(
            compared(64 * MIB, 68 * MIB, "the best setting's"),
            "4.00 MiB (5.9 %) below the best setting's"
        );
        assert_eq!(
            compared(68 * MIB, 64 * MIB, "x"),
            "4.00 MiB (6.2 %) above x"
        );
        assert_eq!(compared(5, 5, "x"), "the same as x");
    }
}
