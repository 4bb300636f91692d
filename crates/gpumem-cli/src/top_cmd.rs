//! `gpumem top`: the terminal UI of GPUs and gpumem pools.

use crate::output::CommandError;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use gpumem_watch::parse_interval;

/// What `gpumem top` shows.
#[derive(Args)]
pub struct TopArgs {
    /// Show a recording (one sample per interval, then its last) instead of the live machine.
    #[arg(long)]
    samples: Option<PathBuf>,
    /// Time between refreshes (e.g. 500ms, 1s, 2s; 10ms to 24h).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    interval: Duration,
}

/// Runs `gpumem top` until the user presses q.
pub fn run(args: TopArgs) -> Result<(), CommandError> {
    let (source, note) =
        gpumem_watch::open_source(args.samples.as_deref()).map_err(|e| e.to_string())?;
    Ok(gpumem_watch::top::run(source, note, args.interval).map_err(|e| e.to_string())?)
}
