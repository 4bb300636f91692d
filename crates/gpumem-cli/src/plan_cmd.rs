//! `gpumem plan`: argument parsing and printing over `gpumem_plan`.

/// Arguments of `gpumem plan`.
#[derive(clap::Args)]
pub struct PlanArgs {}

/// Runs `gpumem plan`.
pub fn run(_args: PlanArgs) -> Result<(), String> {
    Err("plan is not built yet".into())
}
