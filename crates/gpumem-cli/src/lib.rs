//! The `gpumem` command as a library: [`run_from`] runs it with the arguments given (the
//! binary's `main`, and the Python package's `python -m gpumem`), and [`backend`] opens the
//! devices the commands name. Each command parses its flags, calls a library and renders the
//! report type that library returns.
//!
//! Features: `watch` (on by default) adds the live commands — `watch`, `top`, `exporter`,
//! `diagnose` — with NVML, the terminal UI and the HTTP exporter; `wgpu` (on by default) the
//! wgpu backend. The Python package builds without either.

pub mod backend;
mod devices_cmd;
#[cfg(feature = "watch")]
mod diagnose_cmd;
#[cfg(feature = "watch")]
mod exporter_cmd;
mod output;
mod plan_cmd;
mod policies_cmd;
mod replay_cmd;
mod report_cmd;
mod selftest_cmd;
#[cfg(feature = "watch")]
mod top_cmd;
mod tune_cmd;
#[cfg(feature = "watch")]
mod watch_cmd;

use clap::{Parser, Subcommand};
use std::ffi::OsString;
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
    #[cfg(feature = "watch")]
    Watch(watch_cmd::WatchArgs),
    /// Serve Prometheus metrics: dcgm-exporter's GPU figures plus gpumem pools.
    #[cfg(feature = "watch")]
    Exporter(exporter_cmd::ExporterArgs),
    /// Say why a GPU is underused, with the evidence and what to do.
    #[cfg(feature = "watch")]
    Diagnose(diagnose_cmd::DiagnoseArgs),
    /// A terminal UI of the GPUs and the gpumem pools inside them (keyboard only).
    #[cfg(feature = "watch")]
    Top(top_cmd::TopArgs),
}

/// The live commands, which a build without the `watch` feature leaves out.
const LIVE_COMMANDS: [&str; 4] = ["watch", "exporter", "diagnose", "top"];

/// Runs `gpumem` with `args` (the program name first), as the binary does; returns the exit
/// status (0, or 2 after printing `gpumem: <message>` to standard error).
pub fn run_from(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    quiet_mesa_device_select();
    let args: Vec<OsString> = args.into_iter().collect();
    if let Some(missing) = live_command_not_built(&args) {
        eprintln!(
            "gpumem: `gpumem {missing}` is not in this build (the Python package's command \
             leaves out the live watchers: NVML, the terminal UI, the HTTP exporter); install \
             the full command with `cargo install --path crates/gpumem-cli`"
        );
        return ExitCode::from(2);
    }
    let cli = Cli::parse_from(args);
    let result = match cli.command {
        Command::Plan(args) => plan_cmd::run(args),
        Command::Replay(args) => replay_cmd::run(args),
        Command::Report(args) => report_cmd::run(args),
        Command::Tune(args) => tune_cmd::run(args),
        Command::Policies(args) => policies_cmd::run(args),
        Command::Devices(args) => devices_cmd::run(args),
        Command::Selftest(args) => selftest_cmd::run(args),
        #[cfg(feature = "watch")]
        Command::Watch(args) => watch_cmd::run(args),
        #[cfg(feature = "watch")]
        Command::Exporter(args) => exporter_cmd::run(args),
        #[cfg(feature = "watch")]
        Command::Diagnose(args) => diagnose_cmd::run(args),
        #[cfg(feature = "watch")]
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

/// The live command `args` asks for when this build lacks the `watch` feature.
fn live_command_not_built(args: &[OsString]) -> Option<&'static str> {
    if cfg!(feature = "watch") {
        return None;
    }
    let asked = args.get(1)?.to_str()?;
    LIVE_COMMANDS.into_iter().find(|name| *name == asked)
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
