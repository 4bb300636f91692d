//! `gpumem report`: argument parsing over `gpumem_report`; writes one self-contained HTML page.

use crate::output::{self, CommandError};
use std::path::PathBuf;

use gpumem_replay::tune::{Objective, TuneOptions};
use gpumem_replay::ReplayOptions;
use gpumem_report::{
    build, check_output, render, write_atomically, ReportOptions, DEFAULT_BUCKETS,
};

use crate::replay_cmd::ReplayInput;

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
    /// How the traces are read and which policies replay them.
    #[command(flatten)]
    input: ReplayInput,
    /// Also search PyTorch's allocator options (as `gpumem tune` does, minimising peak
    /// reserved) and show the best settings.
    #[arg(long)]
    tune: bool,
}

/// Runs `gpumem report`.
pub fn run(args: ReportArgs) -> Result<(), CommandError> {
    // Before the work: a page that could not be written, or would replace a trace.
    check_output(&args.output, &args.traces).map_err(|e| e.to_string())?;
    let traces = args.input.read_traces(&args.traces)?;
    let (torch, gpumem) = args.input.policy_settings()?;
    let capacity = args.input.capacity;
    let options = ReportOptions {
        policies: args.input.policy.0,
        replay: ReplayOptions {
            capacity,
            torch,
            gpumem,
            ..ReplayOptions::default()
        },
        tune: args.tune.then_some(TuneOptions {
            objective: Objective::Reserved,
            capacity,
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
