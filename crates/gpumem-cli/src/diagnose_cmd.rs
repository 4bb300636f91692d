//! `gpumem diagnose`: which known causes of an underused GPU hold, with evidence and advice.

use crate::output::{self, CommandError};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use gpumem_watch::diagnose::{diagnose, nothing_to_check, Thresholds};
use gpumem_watch::{parse_duration, parse_interval, sample_for};

/// What `gpumem diagnose` looks at.
#[derive(Args)]
pub struct DiagnoseArgs {
    /// Only the GPUs and pools of this process.
    #[arg(long)]
    pid: Option<u32>,
    /// How long to sample the live machine (ignored with --samples; 1ms to 8760h).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Time between live samples (10ms to 24h).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    interval: Duration,
    /// Diagnose a recording instead of the live machine.
    #[arg(long)]
    samples: Option<PathBuf>,
}

/// Runs `gpumem diagnose`.
pub fn run(args: DiagnoseArgs) -> Result<(), CommandError> {
    let (mut source, note) =
        gpumem_watch::open_source(args.samples.as_deref()).map_err(|e| e.to_string())?;
    if let Some(note) = note {
        eprintln!("gpumem: {note}; diagnosing gpumem pools only");
    }
    let mut samples = Vec::new();
    if args.samples.is_none() {
        eprintln!("gpumem: sampling for {:?} …", args.duration);
        sample_for(
            &mut *source,
            args.duration,
            args.interval,
            |sample| {
                samples.push(sample);
                Ok(())
            },
            |warning| eprintln!("gpumem: {warning}"),
        )
        .map_err(|e| e.to_string())?;
    } else {
        while let Some(sample) = source.next_sample().map_err(|e| e.to_string())? {
            samples.push(sample);
        }
    }
    let thresholds = Thresholds::default();
    let findings = diagnose(&samples, args.pid, &thresholds);
    let scope = args
        .pid
        .map_or(String::new(), |pid| format!(" for pid {pid}"));
    if let Some(why) = nothing_to_check(&samples, args.pid, &thresholds) {
        output::print(&format!("Nothing could be checked{scope}: {why}."))?;
    } else if findings.is_empty() {
        output::print(&format!(
            "No known cause of an underused GPU holds{scope} over {} samples \
             (checked: unused memory, data starvation, fragmentation, rank imbalance, PCIe-bound).",
            samples.len()
        ))?;
    } else {
        output::print(&format!(
            "{} finding(s){scope} over {} samples:\n",
            findings.len(),
            samples.len()
        ))?;
        for finding in &findings {
            output::print(&format!("{finding}"))?;
        }
    }
    Ok(())
}
