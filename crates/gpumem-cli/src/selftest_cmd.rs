//! `gpumem selftest`: every policy checked on a device with real bytes (see
//! `gpumem_replay::selftest`).

use crate::output::{self, CommandError};
use std::path::PathBuf;

use gpumem_pool::Bytes;
use gpumem_replay::selftest::{selftest_policies, SelftestReport, SkippedPolicy, BUNDLED_TRACE};
use gpumem_trace::{read, read_path, ReadOptions};

use crate::backend::Backend;
use crate::replay_cmd::{parse_policies, policy_help, PolicySelection};

/// Arguments of `gpumem selftest`.
#[derive(clap::Args)]
pub struct SelftestArgs {
    /// The backend to test.
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    backend: Backend,
    /// The device ordinal within the backend.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// The policy to test, or `all`.
    #[arg(long, default_value = "all", value_parser = parse_policies, long_help = policy_help())]
    policy: PolicySelection,
    /// A trace to replay with real bytes instead of the bundled one (any format `gpumem
    /// replay` reads).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Bytes of each block written and verified (its start and end beyond that); every byte
    /// when not given.
    #[arg(long, value_name = "BYTES")]
    bytes_per_block: Option<u64>,
    /// Print one JSON array of reports instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `gpumem selftest`; fails (exit status 2) when a check fails.
pub fn run(args: SelftestArgs) -> Result<(), CommandError> {
    let trace = match &args.trace {
        Some(path) => read_path(path, ReadOptions::default()),
        None => read(BUNDLED_TRACE, ReadOptions::default()),
    }
    .map_err(|e| e.to_string())?;
    let device = args.backend.open(args.device)?;
    let bytes = args.bytes_per_block.unwrap_or(u64::MAX);
    let mut printed = Ok(());
    let mut print = |made: Result<&SelftestReport, &SkippedPolicy>| {
        if args.json || printed.is_err() {
            return;
        }
        printed = match made {
            Ok(report) => print_report(report),
            Err(skipped) => output::print(&format!(
                "{}: skipped — {}\n",
                skipped.policy, skipped.reason
            )),
        };
    };
    let run = selftest_policies(device, &args.policy.0, &trace, bytes, &mut print)
        .map_err(|e| e.to_string())?;
    printed?;
    if args.json {
        let text = serde_json::to_string_pretty(&run).map_err(|e| e.to_string())?;
        output::print(&text)?;
    }
    let failed: Vec<&str> = run
        .reports
        .iter()
        .filter(|r| !r.passed())
        .map(|r| r.policy.as_str())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("selftest failed for {}", failed.join(", ")).into())
    }
}

fn print_report(report: &SelftestReport) -> Result<(), CommandError> {
    output::print(&format!("{} on {}:", report.policy, report.device))?;
    for check in &report.checks {
        let mark = if check.passed { "ok  " } else { "FAIL" };
        output::print(&format!("  {mark} {}: {}", check.name, check.detail))?;
    }
    output::print(&format!(
        "  {} verified, {} allocating and {} freeing device calls, {:.2} s\n",
        Bytes(report.bytes_verified),
        report.device_alloc_calls,
        report.device_free_calls,
        report.seconds
    ))
}
