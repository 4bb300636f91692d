//! (d) Reading PyTorch memory snapshots: MB/s of pickle and peak resident memory of gpumem's
//! streaming reader (`gpumem_trace::read_path`, snapshot → trace) on generated snapshots
//! pickled as PyTorch pickles them ([`gpumem_bench::snapshot_file`]), side by side with
//! serde-pickle reading the same file into a value tree (`serde_pickle::value_from_reader`,
//! what a reader that loads the whole document does). Goals: ≥ 50 MB/s of pickle on one core,
//! and a 2 GB snapshot read and replayed in under 500 MB of resident memory.
//!
//! Two snapshots of the same kind of trace: one with stack frames (PyTorch's default,
//! `_record_memory_history(stacks="python")`; frame dicts and `frames` lists shared through
//! the memo, which serde-pickle refuses as "recursive", so only gpumem reads it), and one
//! without (`context=None`), which both read. `cargo bench -p gpumem-bench --bench snapshot`
//! uses 64 MiB files; `GPUMEM_BENCH_SNAPSHOT_MB=2048` makes the snapshot with frames that
//! large. The files are generated once into the temporary directory
//! (`gpumem-bench-snapshot-<frames|no-frames>-<MB>MB.pickle`).
//!
//! Throughput is reported twice: per second of wall time (criterion's figure, which a busy
//! machine lowers) and per second of the reading thread's CPU time (`/proc/thread-self/
//! schedstat`: what "on one core" means). Peak resident memory (`VmHWM`) is measured in a
//! child process per reader, so that each figure is that reader's alone; another child also
//! replays the trace through every policy.

use std::cell::RefCell;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use gpumem_bench::report::Recorder;
use gpumem_bench::snapshot_file::{write_snapshot, Stacks};
use gpumem_pool::PolicyKind;
use gpumem_replay::{replay_all, ReplayOptions};
use gpumem_trace::ReadOptions;

const SAMPLES: usize = 10;
/// The size of the snapshot both readers read, in MiB.
const PEER_MB: u64 = 64;
/// Set in a child process: what to run on the file given as its argument.
const CHILD_ENV: &str = "GPUMEM_BENCH_SNAPSHOT_CHILD";

/// A reader under test: its name and what it does with a file (returns something to keep).
type Reader = (&'static str, fn(&Path) -> Result<u64, String>);

const GPUMEM: Reader = ("gpumem", read_gpumem);
const SERDE_PICKLE: Reader = ("serde-pickle", read_serde_pickle);

fn main() {
    if let Ok(task) = std::env::var(CHILD_ENV) {
        child(&task);
        return;
    }
    let frames_mb = std::env::var("GPUMEM_BENCH_SNAPSHOT_MB")
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .unwrap_or(PEER_MB);
    let mut c = Criterion::default()
        .sample_size(SAMPLES)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    let wall = Recorder::default();
    let cpu = Recorder::default();
    let memory = RefCell::new(Vec::new());
    let files = [
        (generated(Stacks::Recorded, frames_mb), frames_mb),
        (generated(Stacks::None, PEER_MB), PEER_MB),
    ];
    for (path, _) in &files {
        let name = path
            .file_stem()
            .and_then(|stem| stem.to_str())
            .unwrap_or("");
        let group_name = name.trim_start_matches("gpumem-bench-").to_owned();
        let bytes = std::fs::metadata(path).expect("generated snapshot").len();
        let mut group = c.benchmark_group(&group_name);
        group
            .sampling_mode(SamplingMode::Flat)
            .throughput(Throughput::Bytes(bytes));
        for (id, read) in [GPUMEM, SERDE_PICKLE] {
            // A reader that cannot read the file is reported, not timed.
            if let Err(error) = read(path) {
                memory.borrow_mut().push((
                    group_name.clone(),
                    id,
                    format!("cannot read it: {error}"),
                ));
                continue;
            }
            group.bench_function(BenchmarkId::from_parameter(id), |b| {
                b.iter_custom(|iters| {
                    let (started, cpu_started) = (Instant::now(), thread_cpu_time());
                    for _ in 0..iters {
                        black_box(read(path).ok());
                    }
                    let elapsed = started.elapsed();
                    wall.record(&group_name, id, iters, elapsed, bytes);
                    cpu.record(
                        &group_name,
                        id,
                        iters,
                        thread_cpu_time() - cpu_started,
                        bytes,
                    );
                    elapsed
                })
            });
            memory
                .borrow_mut()
                .push((group_name.clone(), id, child_peak_rss(id, path)));
        }
        group.finish();
        memory.borrow_mut().push((
            group_name.clone(),
            "gpumem read + replay (4 policies)",
            child_peak_rss("replay", path),
        ));
    }
    c.final_summary();
    println!("\nSnapshot reading, per second of wall time (median of criterion's {SAMPLES} samples; 1 M bytes/s = 1 MB/s of pickle):");
    println!("{}", wall.markdown(SAMPLES, "gpumem", "byte"));
    println!("\nThe same, per second of the reading thread's CPU time:");
    println!("{}", cpu.markdown(SAMPLES, "gpumem", "byte"));
    println!("\nPeak resident memory (VmHWM of a child process that does only this):\n");
    println!("| snapshot | reader | peak RSS |");
    println!("|---|---|---:|");
    for (file, id, peak) in memory.into_inner() {
        println!("| {file} | {id} | {peak} |");
    }
}

/// The generated snapshot of `megabytes` MiB, written on first use.
fn generated(stacks: Stacks, megabytes: u64) -> PathBuf {
    let kind = match stacks {
        Stacks::Recorded => "frames",
        Stacks::None => "no-frames",
    };
    let path =
        std::env::temp_dir().join(format!("gpumem-bench-snapshot-{kind}-{megabytes}MB.pickle"));
    if !path.exists() {
        let partial = path.with_extension("partial");
        let file = std::io::BufWriter::new(std::fs::File::create(&partial).expect("create"));
        let written = write_snapshot(file, megabytes << 20, 1, stacks).expect("write snapshot");
        std::fs::rename(&partial, &path).expect("rename");
        eprintln!("generated {}: {written:?}", path.display());
    }
    path
}

/// CPU time of the calling thread so far (the scheduler's own count, in nanoseconds).
fn thread_cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let nanos = stat
        .split_whitespace()
        .next()
        .and_then(|field| field.parse().ok());
    Duration::from_nanos(nanos.unwrap_or(0))
}

/// gpumem's reader: the snapshot's block trace; returns its events.
fn read_gpumem(path: &Path) -> Result<u64, String> {
    let trace = gpumem_trace::read_path(path, ReadOptions::default()).map_err(|e| e.to_string())?;
    Ok(trace.events.len() as u64)
}

/// serde-pickle's reader: the whole document as a value tree.
fn read_serde_pickle(path: &Path) -> Result<u64, String> {
    let file = std::io::BufReader::new(std::fs::File::open(path).map_err(|e| e.to_string())?);
    let value = serde_pickle::value_from_reader(file, serde_pickle::DeOptions::new())
        .map_err(|e| e.to_string())?;
    Ok(matches!(value, serde_pickle::Value::Dict(_)) as u64)
}

/// Runs `task` on `path` in a child process and returns its peak resident memory.
fn child_peak_rss(task: &str, path: &Path) -> String {
    let output = Command::new(std::env::current_exe().expect("own path"))
        .env(CHILD_ENV, task)
        .arg(path)
        .output()
        .expect("start child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    match stdout.lines().find_map(|line| line.strip_prefix("VmHWM:")) {
        Some(peak) if output.status.success() => peak.trim().to_owned(),
        _ => format!(
            "failed: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ),
    }
}

/// The child's side: one run of `task` on the file in the first argument, then its `VmHWM`.
fn child(task: &str) {
    let path = PathBuf::from(std::env::args().nth(1).expect("a file argument"));
    match task {
        "gpumem" => {
            read_gpumem(&path).expect("gpumem reads it");
        }
        "serde-pickle" => {
            read_serde_pickle(&path).expect("serde-pickle reads it");
        }
        "replay" => {
            let trace = gpumem_trace::read_path(&path, ReadOptions::default()).expect("read");
            let reports = replay_all(
                &trace,
                &PolicyKind::ALL,
                &ReplayOptions::default(),
                &mut |_| {},
            )
            .expect("replay");
            black_box(reports);
        }
        other => panic!("unknown child task {other}"),
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if let Some(line) = status.lines().find(|line| line.starts_with("VmHWM:")) {
        println!("{line}");
    }
}
