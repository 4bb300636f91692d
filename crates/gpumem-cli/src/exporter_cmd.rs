//! `gpumem exporter`: Prometheus metrics (dcgm-exporter's names plus gpumem_pool_*) on /metrics.

use crate::output::CommandError;
use std::path::PathBuf;

use clap::Args;
use gpumem_watch::exporter::Exporter;

/// What `gpumem exporter` serves.
#[derive(Args)]
pub struct ExporterArgs {
    /// Address to listen on, HOST:PORT (port 0 picks a free one; the address is printed).
    #[arg(long, default_value = "127.0.0.1:9400")]
    listen: String,
    /// Serve a recording (one sample per scrape, then the last) instead of the live machine.
    #[arg(long)]
    samples: Option<PathBuf>,
}

/// Runs `gpumem exporter` until interrupted.
pub fn run(args: ExporterArgs) -> Result<(), CommandError> {
    let (source, note) =
        gpumem_watch::open_source(args.samples.as_deref()).map_err(|e| e.to_string())?;
    if let Some(note) = note {
        eprintln!("gpumem: {note}; exporting gpumem pools only");
    }
    let exporter = Exporter::bind(&args.listen, source).map_err(|e| e.to_string())?;
    let addr = exporter
        .local_addr()
        .map_or(args.listen.clone(), |a| a.to_string());
    eprintln!("gpumem: serving metrics on http://{addr}/metrics");
    Ok(exporter
        .serve(|warning| eprintln!("gpumem: {warning}"))
        .map_err(|e| e.to_string())?)
}
