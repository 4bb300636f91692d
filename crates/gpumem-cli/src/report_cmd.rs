//! `gpumem report`: argument parsing over `gpumem_report`; writes one self-contained HTML page.

use crate::output::{self, CommandError};
use std::path::PathBuf;

use gpumem_replay::tune::{Objective, TuneOptions};
use gpumem_replay::ReplayOptions;
use gpumem_report::{build, render, write_atomically, ReportOptions, DEFAULT_BUCKETS};
use gpumem_trace::Format;

use crate::replay_cmd::{
    parse_capacity, parse_policies, policy_help, policy_settings, read_traces, PolicySelection,
};

/// Arguments of `gpumem report`.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// Trace files: gpumem JSON lines, PyTorch snapshot pickles or RMM log CSVs (gzip or
    /// not); several are the ranks of one job, shown side by side.
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// The HTML file to write (self-contained: it opens offline in any browser).
    #[arg(short, long, value_name = "OUT")]
    output: PathBuf,
    /// Trace format: auto, native, pytorch or rmm.
    #[arg(long, default_value = "auto")]
    format: Format,
    /// For PyTorch snapshots: the device whose trace to show (default: the first with one).
    #[arg(long)]
    device: Option<usize>,
    /// Policy to replay through, or `all`.
    #[arg(long, default_value = "all", value_parser = parse_policies, long_help = policy_help())]
    policy: PolicySelection,
    /// Device capacity to check for out-of-memory, e.g. 24GiB or 80G: the report shows where
    /// each policy would fail and the allocation that fails.
    #[arg(long, value_parser = parse_capacity)]
    capacity: Option<u64>,
    /// PyTorch allocator options for the torch and expandable policies
    /// (PYTORCH_ALLOC_CONF syntax, e.g. max_split_size_mb:128).
    #[arg(long, value_name = "CONF")]
    pytorch_alloc_conf: Option<String>,
    /// Settings of the gpumem policy (GPUMEM_POLICY_CONF syntax).
    #[arg(long, value_name = "CONF")]
    gpumem_policy_conf: Option<String>,
    /// Also search PyTorch's allocator options (as `gpumem tune` does, minimising peak
    /// reserved) and show the best settings.
    #[arg(long)]
    tune: bool,
}

/// Runs `gpumem report`.
pub fn run(args: ReportArgs) -> Result<(), CommandError> {
    let traces = read_traces(&args.traces, args.format, args.device)?;
    let (torch, gpumem) = policy_settings(
        args.pytorch_alloc_conf.as_deref(),
        args.gpumem_policy_conf.as_deref(),
    )?;
    let options = ReportOptions {
        policies: args.policy.0,
        replay: ReplayOptions {
            capacity: args.capacity,
            torch,
            gpumem,
            ..ReplayOptions::default()
        },
        tune: args.tune.then_some(TuneOptions {
            objective: Objective::Reserved,
            capacity: args.capacity,
            top: 3,
            max_replays: None,
        }),
        buckets: DEFAULT_BUCKETS,
    };
    let report = build(&traces, &options).map_err(|e| e.to_string())?;
    write_atomically(&args.output, render(&report).as_bytes()).map_err(|e| e.to_string())?;
    let highest = &report.ranks[report.highest_rank];
    match report.ranks.len() {
        1 => output::print(&format!(
            "Wrote {} ({}).",
            args.output.display(),
            highest.trace.name
        ))?,
        n => output::print(&format!(
            "Wrote {} ({n} ranks; rank {} ({}) peaks highest).",
            args.output.display(),
            report.highest_rank,
            highest.trace.name
        ))?,
    }
    Ok(())
}
