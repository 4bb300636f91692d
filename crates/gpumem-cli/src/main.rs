//! `gpumem`: a thin command line over the gpumem libraries. It parses, calls, prints.

#![deny(unsafe_code)]

mod plan_cmd;
mod policies_cmd;
mod replay_cmd;
mod tune_cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Predict, pool and replay GPU memory.
#[derive(Parser)]
#[command(name = "gpumem", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Predict peak GPU memory of a training or inference run, fit the batch size, advise.
    Plan(plan_cmd::PlanArgs),
    /// Replay an allocation trace through allocator policies and compare them.
    Replay(replay_cmd::ReplayArgs),
    /// Search PyTorch's allocator options (PYTORCH_CUDA_ALLOC_CONF) for a trace.
    Tune(tune_cmd::TuneArgs),
    /// List the built-in allocator policies and what each is.
    Policies(policies_cmd::PoliciesArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plan(args) => plan_cmd::run(args),
        Command::Replay(args) => replay_cmd::run(args),
        Command::Tune(args) => tune_cmd::run(args),
        Command::Policies(args) => policies_cmd::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("gpumem: {message}");
            ExitCode::from(2)
        }
    }
}
