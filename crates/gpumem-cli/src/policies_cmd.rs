//! `gpumem policies`: the built-in allocator policies, what each is, and how to choose one.

use crate::output::{self, CommandError};
use gpumem_replay::PolicyInfo;

/// Arguments of `gpumem policies`.
#[derive(clap::Args)]
pub struct PoliciesArgs {
    /// Print one JSON array of {name, description, default} instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `gpumem policies`.
pub fn run(args: PoliciesArgs) -> Result<(), CommandError> {
    let policies = PolicyInfo::all();
    if args.json {
        let text = serde_json::to_string_pretty(&policies).map_err(|e| e.to_string())?;
        output::print(&text)?;
        return Ok(());
    }
    let width = policies.iter().map(|p| p.name.len()).max().unwrap_or(0);
    for policy in &policies {
        output::print(&format!("{:width$}  {}", policy.name, policy.description))?;
    }
    let default = policies.iter().find(|p| p.default).map_or("", |p| p.name);
    output::print(&format!(
        "\nChoose with GPUMEM_POOL=NAME for a pool, or `gpumem replay --policy NAME` (default \
         for pools: {default})."
    ))?;
    Ok(())
}
