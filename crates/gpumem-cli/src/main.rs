// `gpumem`: a thin command line over the gpumem libraries. It parses, calls, prints.
// (Plain comments and no inner attributes: lib.rs includes this file; `unsafe_code` is denied
// in Cargo.toml.)

mod backend;
mod devices_cmd;
mod diagnose_cmd;
mod exporter_cmd;
mod output;
mod plan_cmd;
mod policies_cmd;
mod replay_cmd;
mod report_cmd;
mod selftest_cmd;
mod top_cmd;
mod tune_cmd;
mod watch_cmd;

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
    /// Write an HTML report of traces replayed through the policies: charts, segment maps, OOM.
    Report(report_cmd::ReportArgs),
    /// Search PyTorch's allocator options (PYTORCH_CUDA_ALLOC_CONF) for a trace.
    Tune(tune_cmd::TuneArgs),
    /// List the built-in allocator policies and what each is.
    Policies(policies_cmd::PoliciesArgs),
    /// List every device of every backend available here.
    Devices(devices_cmd::DevicesArgs),
    /// Check the pool on a device with real bytes: every policy, round trips and a real trace.
    Selftest(selftest_cmd::SelftestArgs),
    /// Record live GPU and pool samples for top, exporter and diagnose.
    Watch(watch_cmd::WatchArgs),
    /// Serve Prometheus metrics: dcgm-exporter's GPU figures plus gpumem pools.
    Exporter(exporter_cmd::ExporterArgs),
    /// Say why a GPU is underused, with the evidence and what to do.
    Diagnose(diagnose_cmd::DiagnoseArgs),
    /// A terminal UI of the GPUs and the gpumem pools inside them (keyboard only).
    Top(top_cmd::TopArgs),
}

fn main() -> ExitCode {
    run_from(std::env::args_os())
}

/// Runs `gpumem` with `args` (the program name first), as the binary does; the library target
/// (`lib.rs`) calls this for `python -m gpumem`.
pub fn run_from(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    quiet_mesa_device_select();
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Command::Plan(args) => plan_cmd::run(args),
        Command::Replay(args) => replay_cmd::run(args),
        Command::Report(args) => report_cmd::run(args),
        Command::Tune(args) => tune_cmd::run(args),
        Command::Policies(args) => policies_cmd::run(args),
        Command::Devices(args) => devices_cmd::run(args),
        Command::Selftest(args) => selftest_cmd::run(args),
        Command::Watch(args) => watch_cmd::run(args),
        Command::Exporter(args) => exporter_cmd::run(args),
        Command::Diagnose(args) => diagnose_cmd::run(args),
        Command::Top(args) => top_cmd::run(args),
    };
    match result {
        // A reader that stopped reading (`| head`) is a normal end.
        Ok(()) | Err(output::CommandError::OutputClosed) => ExitCode::SUCCESS,
        Err(output::CommandError::Failed(message)) => {
            eprintln!("gpumem: {message}");
            ExitCode::from(2)
        }
    }
}

/// Mesa's Vulkan device-select layer prints an error line for every instance when
/// `XDG_RUNTIME_DIR` is unset (containers, CI, `sudo`); it only orders GPUs, so it is turned
/// off in that case, before any thread starts, unless the user chose otherwise.
fn quiet_mesa_device_select() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none()
        && std::env::var_os("NODEVICE_SELECT").is_none()
    {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
}
