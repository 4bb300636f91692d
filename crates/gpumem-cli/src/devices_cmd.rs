//! `gpumem devices`: every device of every backend available here.

use crate::output::{self, CommandError};
use gpumem_pool::Bytes;

use crate::backend;

/// Arguments of `gpumem devices`.
#[derive(clap::Args)]
pub struct DevicesArgs {
    /// Print one JSON object {devices, absent} instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `gpumem devices`.
pub fn run(args: DevicesArgs) -> Result<(), CommandError> {
    let list = backend::list();
    if args.json {
        let text = serde_json::to_string_pretty(&list).map_err(|e| e.to_string())?;
        output::print(&text)?;
        return Ok(());
    }
    for d in &list.devices {
        let vmm = d
            .vmm_granularity
            .map_or("no VMM".to_string(), |g| format!("VMM {}", Bytes(g)));
        let free = d
            .free_bytes
            .map_or(String::new(), |f| format!(", {} free", Bytes(f)));
        // Figures the driver or the simulation gives need no note; the others say where
        // they come from (a limit, a budget, a heap size, a guess).
        let source = match d.memory_source {
            "driver" | "simulated" => String::new(),
            other => format!(" ({other})"),
        };
        output::print(&format!(
            "{}:{}  {}  [{}{source}{free}, {vmm}]",
            d.backend,
            d.ordinal,
            d.description,
            Bytes(d.total_bytes)
        ))?;
    }
    for line in &list.absent {
        output::print(line)?;
    }
    if list.devices.iter().all(|d| d.software) {
        output::print(
            "No GPU is usable here: every device above runs on the CPU (plan, replay and \
             selftest work without a GPU).",
        )?;
    }
    Ok(())
}
