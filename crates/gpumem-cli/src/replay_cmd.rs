//! `gpumem replay`: argument parsing and printing over `gpumem_replay`.

use crate::output::{self, CommandError};
use std::path::PathBuf;

use gpumem_pool::policies::torch_settings::TorchSettings;
use gpumem_pool::policies::GpumemSettings;
use gpumem_pool::{Bytes, PolicyKind};
use gpumem_replay::request;
use gpumem_replay::{
    replay, replay_report, PolicyReport, Progress, RanksReport, ReplayOptions, ReplayReport,
    TraceInfo, EXAMPLE_TRACE,
};
use gpumem_trace::{read, read_path, Format, ReadOptions, Trace};
use indicatif::{ProgressBar, ProgressStyle};

/// Arguments of `gpumem replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Trace files: gpumem JSON lines, PyTorch snapshot pickles or RMM log CSVs (gzip or
    /// not); several are the ranks of one job, replayed side by side. Without one, a bundled
    /// real trace (GPT-2 training, 4 steps) is replayed.
    traces: Vec<PathBuf>,
    /// How the traces are read and which policies replay them.
    #[command(flatten)]
    input: ReplayInput,
    /// Also find, per policy, the smallest device (in 2 MiB steps) on which the trace runs:
    /// a few more replays each.
    #[arg(long)]
    smallest_capacity: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Write the replay's memory snapshot for PyTorch's memory_viz (pickle; JSON if the name
    /// ends in .json; gzip-compressed if it ends in .gz). Needs a single --policy.
    #[arg(long, value_name = "OUT")]
    snapshot: Option<PathBuf>,
}

/// The flags `gpumem replay` and `gpumem report` share: how traces are read, the policies
/// that replay them and those policies' settings.
#[derive(clap::Args)]
pub(crate) struct ReplayInput {
    /// Trace format: auto, native, pytorch or rmm.
    #[arg(long, default_value = "auto")]
    format: Format,
    /// For PyTorch snapshots: the device whose trace to replay (default: the first with one).
    #[arg(long)]
    device: Option<usize>,
    /// Policy to replay through, or `all`.
    #[arg(long, default_value = "all", value_parser = parse_policies, long_help = policy_help())]
    pub(crate) policy: PolicySelection,
    /// Device capacity to check for out-of-memory, e.g. 24GiB or 80G: where each policy would
    /// fail, and the allocation that fails.
    #[arg(long, value_parser = parse_capacity)]
    pub(crate) capacity: Option<u64>,
    /// PyTorch allocator options for the torch and expandable policies
    /// (PYTORCH_ALLOC_CONF syntax, e.g. max_split_size_mb:128).
    #[arg(long, value_name = "CONF")]
    pytorch_alloc_conf: Option<String>,
    /// Settings of the gpumem policy (GPUMEM_POLICY_CONF syntax, e.g.
    /// slab_max_request_kb:32,max_chunk_pages:4).
    #[arg(long, value_name = "CONF")]
    gpumem_policy_conf: Option<String>,
}

impl ReplayInput {
    /// Reads every trace of `paths` (the ranks of a job); an error names the file (once:
    /// the reader's error carries it).
    pub(crate) fn read_traces(&self, paths: &[PathBuf]) -> Result<Vec<Trace>, String> {
        let read_options = self.read_options();
        paths
            .iter()
            .map(|path| read_path(path, read_options).map_err(|e| e.to_string()))
            .collect()
    }

    /// The reader's options from `--format` and `--device`.
    fn read_options(&self) -> ReadOptions {
        ReadOptions {
            format: self.format,
            device: self.device,
        }
    }

    /// The torch and gpumem policies' settings from `--pytorch-alloc-conf` and
    /// `--gpumem-policy-conf`, PyTorch's and gpumem's defaults where not given.
    pub(crate) fn policy_settings(&self) -> Result<(TorchSettings, GpumemSettings), String> {
        request::policy_settings(
            &self.policy.0,
            self.pytorch_alloc_conf.as_deref(),
            self.gpumem_policy_conf.as_deref(),
        )
        .map_err(|e| e.to_string())
    }
}

/// The policies `--policy` names: one, or every built-in policy for `all`.
#[derive(Clone)]
pub(crate) struct PolicySelection(pub(crate) Vec<PolicyKind>);

/// Parses `--policy`: a policy name or `all`; the error lists what is accepted.
pub(crate) fn parse_policies(text: &str) -> Result<PolicySelection, String> {
    request::parse_policies(text)
        .map(PolicySelection)
        .map_err(|e| e.reason)
}

/// `--policy`'s long help: every policy with what it is, from the policy table.
pub(crate) fn policy_help() -> String {
    format!("A policy, or `all` for every one.\n{}", PolicyKind::help())
}

/// Parses `--capacity`: an absolute size in any form `GPUMEM_HARD_LIMIT` accepts.
pub(crate) fn parse_capacity(text: &str) -> Result<u64, String> {
    request::parse_capacity(text).map_err(|e| e.reason)
}

/// Runs `gpumem replay`.
pub fn run(args: ReplayArgs) -> Result<(), CommandError> {
    let input = &args.input;
    let traces = match args.traces.is_empty() {
        true => vec![read(EXAMPLE_TRACE, input.read_options()).map_err(|e| e.to_string())?],
        false => input.read_traces(&args.traces)?,
    };
    let (torch, gpumem) = input.policy_settings()?;
    let capacity = input.capacity;
    let policies = input.policy.0.clone();
    if args.snapshot.is_some() && policies.len() != 1 {
        return Err(format!(
            "--snapshot needs a single --policy ({})",
            PolicyKind::names()
        )
        .into());
    }
    if args.snapshot.is_some() && traces.len() != 1 {
        return Err("--snapshot needs a single trace".to_string().into());
    }
    let mut ranks = Vec::with_capacity(traces.len());
    for trace in &traces {
        let options = ReplayOptions {
            capacity,
            torch: torch.clone(),
            gpumem,
            // Each event records at most a block event and a segment event, a free two.
            history_capacity: if args.snapshot.is_some() {
                trace.events.len() * 3 + 16
            } else {
                0
            },
            smallest_capacity: args.smallest_capacity,
            placement_only: false,
        };
        let bar = progress_bar(trace.events.len() as u64);
        let mut on_progress = |p: Progress| {
            bar.set_message(p.policy.to_string());
            bar.set_position(p.done as u64);
        };
        let report = match &args.snapshot {
            // One policy (checked above), whose pool is written out.
            Some(path) => {
                let replayed = replay(trace, policies[0], &options, &mut on_progress)
                    .map_err(|e| e.to_string())?;
                replayed
                    .pool
                    .snapshot()
                    .write_path(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                ReplayReport {
                    trace: TraceInfo::of(trace),
                    capacity_bytes: capacity,
                    policies: vec![replayed.report],
                }
            }
            None => replay_report(trace, &policies, &options, &mut on_progress)
                .map_err(|e| e.to_string())?,
        };
        bar.finish_and_clear();
        ranks.push(report);
    }
    if ranks.len() == 1 {
        let report = &ranks[0];
        return match args.json {
            true => print_json(report),
            false => print_table(&report.trace, capacity, &report.policies),
        };
    }
    let job = RanksReport::new(capacity, ranks);
    if args.json {
        return print_json(&job);
    }
    for rank in &job.ranks {
        output::print(&format!("Rank {}:", rank.rank))?;
        print_table(&rank.trace, capacity, &rank.policies)?;
        output::print("")?;
    }
    let highest = &job.ranks[job.highest_rank];
    output::print(&format!(
        "Rank {} ({}) peaks highest: {} reserved.",
        job.highest_rank,
        highest.trace.name,
        Bytes(peak_reserved(&highest.policies))
    ))?;
    Ok(())
}

/// The highest peak reserved bytes of any policy.
fn peak_reserved(reports: &[PolicyReport]) -> u64 {
    reports
        .iter()
        .map(|r| r.peak_reserved_bytes)
        .max()
        .unwrap_or(0)
}

fn progress_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if let Ok(style) =
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} events ({per_sec})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Prints a report as pretty JSON.
pub(crate) fn print_json(report: &impl serde::Serialize) -> Result<(), CommandError> {
    let text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    output::print(&text)?;
    Ok(())
}

fn print_table(
    trace: &TraceInfo,
    capacity: Option<u64>,
    reports: &[PolicyReport],
) -> Result<(), CommandError> {
    output::print(&trace_line(trace))?;
    let capacity_header = capacity.map_or("fits".to_string(), |c| format!("fits {}", Bytes(c)));
    // The smallest device is a column only when it was searched for.
    let searched = reports.iter().any(|r| r.smallest_capacity_bytes.is_some());
    let smallest = |r: &PolicyReport| match (searched, r.smallest_capacity_bytes) {
        (false, _) => String::new(),
        (true, Some(b)) => format!(" {:>15}", Bytes(b).to_string()),
        (true, None) => format!(" {:>15}", "not found"),
    };
    output::print(&format!(
        "{:<11} {:>13} {:>14} {:>11} {:>13} {:>17} {:>10} {:>12}{}  {}",
        "policy",
        "peak alloc",
        "peak reserved",
        "utilization",
        "device calls",
        "steady calls/step",
        "syncs/step",
        "Mevents/s",
        if searched {
            format!(" {:>15}", "smallest device")
        } else {
            String::new()
        },
        capacity_header
    ))?;
    for r in reports {
        let per_step = r
            .steady_state_alloc_calls_per_step
            .map_or("-".to_string(), |c| c.to_string());
        let syncs = r
            .steady_state_syncs_per_step
            .map_or("-".to_string(), |c| c.to_string());
        let fits = r.fits(capacity);
        output::print(&format!(
            "{:<11} {:>13} {:>14} {:>10.1}% {:>13} {:>17} {:>10} {:>12.2}{}  {}",
            r.policy,
            Bytes(r.peak_allocated_bytes).to_string(),
            Bytes(r.peak_reserved_bytes).to_string(),
            100.0 * r.utilization,
            r.device_calls,
            per_step,
            syncs,
            r.events_per_second / 1e6,
            smallest(r),
            fits
        ))?;
    }
    for r in reports.iter().filter(|r| r.hazards > 0) {
        output::print(&format!(
            "{}: {} times memory was unmapped, released or lent to another stream while queued \
             work could still use it: on a GPU, an illegal memory access or silent corruption",
            r.policy, r.hazards
        ))?;
    }
    print_initial_states(reports)
}

/// For a trace recorded mid-process, how each policy began from the memory held when the
/// recording began: the segments it took over, and why it did not take over the others.
fn print_initial_states(reports: &[PolicyReport]) -> Result<(), CommandError> {
    for r in reports {
        let Some(state) = &r.initial_state else {
            continue;
        };
        let mut line = format!(
            "{}: began from {} of the {} segments held when recording began ({} reserved)",
            r.policy,
            state.adopted_segments,
            state.segments,
            Bytes(state.adopted_bytes)
        );
        for note in &state.notes {
            line.push_str("; ");
            line.push_str(note);
        }
        output::print(&line)?;
    }
    Ok(())
}

/// The trace's name, source, length and peak live bytes, as the tables' first line, and below
/// it what the reader skipped.
pub(crate) fn trace_line(trace: &TraceInfo) -> String {
    let mut line = format!(
        "Trace {} ({}): {} events, {} steps, peak live {}",
        trace.name,
        trace.source,
        trace.events,
        trace.steps,
        Bytes(trace.peak_live_bytes)
    );
    // What the reader left out, under the trace it belongs to.
    for note in &trace.skipped {
        line.push_str(&format!("\n  {note}"));
    }
    line
}
