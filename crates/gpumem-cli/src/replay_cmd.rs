//! `gpumem replay`: argument parsing and printing over `gpumem_replay`.

/// Arguments of `gpumem replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {}

/// Runs `gpumem replay`.
pub fn run(_args: ReplayArgs) -> Result<(), String> {
    Err("replay is not built yet".into())
}
