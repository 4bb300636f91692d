//! Runs the benchmark harness once, without criterion, and prints the results as Markdown:
//! per-operation cost of every allocator side by side (ratio to offset-allocator), footprint,
//! utilisation and fragmentation, replay throughput per policy, and the goals.
//!
//! ```text
//! cargo run --release -p gpumem-bench --bin bench-report [-- OPTIONS]
//!   --quick            10³ and 10⁴ live blocks only, a 10⁵-event training trace
//!   --live LIST        live-block counts of the synthetic mixes (default 1000,10000,100000,1000000)
//!   --traces DIR       real traces (default testdata/traces)
//!   --replay-events N  events of the synthetic training trace (default 1000000)
//!   --budget SECS      give up on an allocator after this long per input (default 10)
//!   --check            check every allocation for overlaps while profiling
//!   --no-ops | --no-replay
//!   --asynchronous     replay with the model of asynchronous execution (hazard checking), as
//!                      `gpumem replay` does; without it, placement only (the engine that
//!                      tuning, the capacity search and the planner run)
//! ```

#![deny(unsafe_code)]

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use gpumem_bench::report::{
    goals_markdown, measure_ops, measure_replay, ops_markdown, replay_markdown, OpsOptions,
};
use gpumem_bench::{default_trace_dir, from_trace, load_traces, standard_mix, Allocator};
use gpumem_bench::{synthetic_training_trace, workload::MIX_LIVE_COUNTS};
use gpumem_pool::PolicyKind;
use gpumem_replay::ReplayOptions;

const USAGE: &str = "\
cargo run --release -p gpumem-bench --bin bench-report [-- OPTIONS]
  --quick            10^3 and 10^4 live blocks only, a 10^5-event training trace
  --live LIST        live-block counts of the synthetic mixes (default 1000,10000,100000,1000000)
  --traces DIR       real traces (default testdata/traces)
  --replay-events N  events of the synthetic training trace (default 1000000)
  --budget SECS      give up on an allocator after this long per input (default 10)
  --check            check every allocation for overlaps while profiling
  --no-ops | --no-replay
  --asynchronous     replay with the model of asynchronous execution (hazard checking), as
                     `gpumem replay` does; without it, placement only (the engine that
                     tuning, the capacity search and the planner run)
  --update FILE      also write the results between the markers
                     <!-- bench-report:begin --> and <!-- bench-report:end --> of FILE
                     (docs/benchmarks.md)";

struct Args {
    live: Vec<usize>,
    traces: PathBuf,
    replay_events: usize,
    ops: bool,
    replay: bool,
    opts: OpsOptions,
    update: Option<PathBuf>,
    /// Replays run the model of asynchronous execution.
    asynchronous: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        live: MIX_LIVE_COUNTS.to_vec(),
        traces: default_trace_dir(),
        replay_events: 1_000_000,
        ops: true,
        replay: true,
        opts: OpsOptions::default(),
        update: None,
        asynchronous: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--quick" => {
                a.live = vec![1_000, 10_000];
                a.replay_events = 100_000;
                a.opts.max_passes = 3;
            }
            "--live" => {
                a.live = value("--live")?
                    .split(',')
                    .map(|x| {
                        x.trim()
                            .parse::<usize>()
                            .map_err(|e| format!("--live: {e}"))
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--traces" => a.traces = PathBuf::from(value("--traces")?),
            "--replay-events" => {
                a.replay_events = value("--replay-events")?
                    .parse()
                    .map_err(|e| format!("--replay-events: {e}"))?
            }
            "--budget" => {
                let secs: f64 = value("--budget")?
                    .parse()
                    .map_err(|e| format!("--budget: {e}"))?;
                a.opts.budget = Duration::from_secs_f64(secs);
            }
            "--check" => a.opts.check_overlaps = true,
            "--update" => a.update = Some(PathBuf::from(value("--update")?)),
            "--no-ops" => a.ops = false,
            "--no-replay" => a.replay = false,
            "--asynchronous" => a.asynchronous = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    Ok(a)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpu}, {cores} cores available, {}", std::env::consts::OS)
}

/// The 1-minute load average (Linux), to judge how noisy the numbers are.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench-report: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let load_before = load();
    let real = load_traces(&args.traces);
    let real_names: Vec<String> = real.iter().map(|t| t.meta.name.clone()).collect();
    eprintln!("{} real trace(s) in {}", real.len(), args.traces.display());
    let training = synthetic_training_trace(args.replay_events);
    let mut traces = real.clone();
    traces.push(training);

    let mut ops_tables = Vec::new();
    if args.ops {
        let mut workloads: Vec<_> = traces.iter().map(from_trace).collect();
        workloads.extend(args.live.iter().map(|&n| standard_mix(n)));
        for w in &workloads {
            eprintln!("ops: {} ({} timed ops)", w.name, w.body.len());
            ops_tables.push(measure_ops(w, &Allocator::all(), &args.opts));
        }
    }
    let mut replays = Vec::new();
    if args.replay {
        for t in &traces {
            eprintln!("replay: {} ({} events)", t.meta.name, t.events.len());
            let options = ReplayOptions {
                placement_only: !args.asynchronous,
                ..ReplayOptions::default()
            };
            replays.push((
                t.meta.name.clone(),
                measure_replay(t, &PolicyKind::ALL, 3, &options),
            ));
        }
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "Measured on: {}; load average {} at the start, {} at the end; {} real trace(s) from `testdata/traces`; bench-report ran {:.0} s.\n",
        machine(),
        load_before,
        load(),
        real.len(),
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(out, "### Goals\n");
    let _ = writeln!(
        out,
        "{}",
        goals_markdown(&ops_tables, &replays, &real_names)
    );
    if !ops_tables.is_empty() {
        let _ = writeln!(
            out,
            "### (a) Per-operation cost, footprint and fragmentation (same operations for every allocator)\n"
        );
        for t in &ops_tables {
            let _ = writeln!(out, "{}", ops_markdown(t));
        }
    }
    if !replays.is_empty() {
        let _ = writeln!(
            out,
            "### (b) Replay throughput (`gpumem_replay::replay`, address-only device, best of 3)\n"
        );
        let _ = writeln!(out, "{}", replay_markdown(&replays));
    }
    print!("{out}");
    if let Some(path) = &args.update {
        if let Err(e) = update(path, &out) {
            eprintln!("bench-report: cannot update {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("updated {}", path.display());
    }
    ExitCode::SUCCESS
}

const BEGIN: &str = "<!-- bench-report:begin -->";
const END: &str = "<!-- bench-report:end -->";

/// Replaces what lies between the markers of `path` with `results`.
fn update(path: &std::path::Path, results: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let (Some(b), Some(e)) = (text.find(BEGIN), text.find(END)) else {
        return Err(format!("markers {BEGIN} … {END} not found"));
    };
    if e < b {
        return Err("the end marker comes before the begin marker".into());
    }
    let new = format!("{}{BEGIN}\n{results}{}", &text[..b], &text[e..]);
    std::fs::write(path, new).map_err(|e| e.to_string())
}
