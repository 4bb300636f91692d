//! `gpumem watch record`: write live samples (NVML GPUs and published gpumem pools) to a
//! recording that `top`, `exporter` and `diagnose` read with `--samples`.

use crate::output::CommandError;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use gpumem_watch::{parse_duration, parse_interval, sample_for, LiveSource, RecordingWriter};

/// What `gpumem watch` does.
#[derive(Args)]
pub struct WatchArgs {
    #[command(subcommand)]
    command: WatchCommand,
}

#[derive(Subcommand)]
enum WatchCommand {
    /// Record live samples (GPUs from NVML, pools of processes run with GPUMEM_PUBLISH=1) as JSON lines.
    Record(RecordArgs),
}

#[derive(Args)]
struct RecordArgs {
    /// The recording to write (JSON lines, one sample per line).
    #[arg(long, short)]
    output: PathBuf,
    /// Time between samples (e.g. 500ms, 1s; 10ms to 24h).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    interval: Duration,
    /// How long to record (e.g. 60s, 10m; 1ms to 8760h).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
}

/// Runs `gpumem watch`.
pub fn run(args: WatchArgs) -> Result<(), CommandError> {
    let WatchCommand::Record(args) = args.command;
    let mut source = LiveSource::open();
    if let Some(note) = source.no_gpu() {
        eprintln!("gpumem: {note}; recording gpumem pools only");
    }
    let mut writer = RecordingWriter::create(&args.output).map_err(|e| e.to_string())?;
    let mut written = 0;
    sample_for(
        &mut source,
        args.duration,
        args.interval,
        |sample| {
            written += 1;
            writer.write(&sample)
        },
        |warning| eprintln!("gpumem: {warning}"),
    )
    .map_err(|e| e.to_string())?;
    eprintln!(
        "gpumem: wrote {written} samples to {}",
        args.output.display()
    );
    Ok(())
}
