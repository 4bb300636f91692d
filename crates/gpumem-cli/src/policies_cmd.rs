//! `gpumem policies`: the built-in allocator policies, what each is, and how to choose one.

use crate::output::{self, CommandError};
use gpumem_pool::PolicyKind;

/// Arguments of `gpumem policies`.
#[derive(clap::Args)]
pub struct PoliciesArgs {
    /// Print one JSON array of {name, description, default} instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `gpumem policies`.
pub fn run(args: PoliciesArgs) -> Result<(), CommandError> {
    let default = gpumem_pool::PoolConfig::default().policy;
    if args.json {
        let list: Vec<serde_json::Value> = PolicyKind::ALL
            .iter()
            .map(|kind| {
                serde_json::json!({
                    "name": kind.as_str(),
                    "description": kind.description(),
                    "default": *kind == default,
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&list).map_err(|e| e.to_string())?;
        output::print(&text)?;
        return Ok(());
    }
    let width = PolicyKind::ALL
        .iter()
        .map(|kind| kind.as_str().len())
        .max()
        .unwrap_or(0);
    for kind in PolicyKind::ALL {
        output::print(&format!("{:width$}  {}", kind.as_str(), kind.description()))?;
    }
    output::print(&format!(
        "\nChoose with GPUMEM_POOL=NAME for a pool, or `gpumem replay --policy NAME` (default \
         for pools: {default})."
    ))?;
    Ok(())
}
