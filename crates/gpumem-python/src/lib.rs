//! `gpumem._gpumem`, the extension module of the Python package `gpumem` (python/).
//!
//! One shared library holds four things: the libraries' calls (`plan`, `replay`, `tune`,
//! `report`, `policies`, `devices`, `selftest`), each returning its report type as JSON that the
//! package turns into typed objects (python/gpumem/_reports.py); the `gpumem` command without
//! its live watchers (`cli`, for `python -m gpumem`); Python functions over the pools
//! (`memory_stats`, `configure`, …); and — re-exported from gpumem-capi — the C entry points
//! that PyTorch's `CUDAPluggableAllocator` and CuPy's `CFunctionAllocator` load from this very
//! file. One file means one set of pools: what PyTorch allocates is what
//! `gpumem.torch.memory_stats()` reports.

use std::collections::BTreeMap;
use std::path::PathBuf;

use gpumem_capi::{api, CapiError};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use gpumem_cli::backend::Backend;
use gpumem_pool::PolicyKind;
use gpumem_replay::plan::PlanRequest;
use gpumem_replay::request;
use gpumem_replay::selftest::{selftest_policies, BUNDLED_TRACE};
use gpumem_replay::tune::{Objective, TuneOptions};
use gpumem_replay::{
    replay_report, PolicyInfo, ReplayOptions, TraceInfo, TuneResult, EXAMPLE_TRACE,
};
use gpumem_report::ReportOptions;
use gpumem_trace::{read_path, Format, ReadOptions, Trace};

create_exception!(
    gpumem,
    GpumemError,
    PyException,
    "An error from gpumem, with the Rust error's message."
);
create_exception!(
    gpumem,
    OutOfMemoryError,
    GpumemError,
    "An allocation that does not fit, even after freeing the cache; the message explains."
);
create_exception!(
    gpumem,
    PlanError,
    GpumemError,
    "A plan that cannot be made: an unknown model, GPU or setting, a value out of range, two \
     settings no run combines."
);
create_exception!(
    gpumem,
    TraceError,
    GpumemError,
    "A trace or snapshot that cannot be read: the message names the file and what it is not."
);
create_exception!(
    gpumem,
    ReplayError,
    GpumemError,
    "A replay, tune, report or selftest that failed: a bad setting, or a trace the policies \
     cannot replay."
);

fn py_error(error: CapiError) -> PyErr {
    if error.is_out_of_memory() {
        OutOfMemoryError::new_err(error.to_string())
    } else {
        GpumemError::new_err(error.to_string())
    }
}

/// Runs the `gpumem` command with `argv` (program name first); returns its exit status.
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<String>) -> i32 {
    let code = py.detach(|| gpumem_cli::run_from(argv.into_iter().map(Into::into)));
    if code == std::process::ExitCode::SUCCESS {
        0
    } else {
        2
    }
}

/// Allocates `size` bytes on `device` for `stream` (a raw cudaStream_t; 0 the default);
/// returns the address (0 for zero bytes).
#[pyfunction]
#[pyo3(signature = (size, device=0, stream=0))]
fn alloc(py: Python<'_>, size: u64, device: i64, stream: u64) -> PyResult<u64> {
    py.detach(|| api::allocate(size, device, stream))
        .map_err(py_error)
}

/// Frees `ptr` of `device`, checking the size when given.
#[pyfunction]
#[pyo3(signature = (ptr, size=None, device=0))]
fn free(py: Python<'_>, ptr: u64, size: Option<u64>, device: i64) -> PyResult<()> {
    py.detach(|| api::free(ptr, size, device, None))
        .map_err(py_error)
}

/// `device`'s statistics with `torch.cuda.memory_stats()`'s keys.
#[pyfunction]
#[pyo3(signature = (device=0))]
fn memory_stats(device: i64) -> PyResult<BTreeMap<String, u64>> {
    api::memory_stats(device).map_err(py_error)
}

/// `device`'s pool summary (usage, limits, fragmentation).
#[pyfunction]
#[pyo3(signature = (device=0))]
fn pool_status(device: i64) -> PyResult<String> {
    api::pool_status(device).map_err(py_error)
}

/// The explanation of `device`'s last OOM, or None.
#[pyfunction]
#[pyo3(signature = (device=0))]
fn last_oom(device: i64) -> PyResult<Option<String>> {
    api::last_oom(device).map_err(py_error)
}

/// Gives `device`'s cached memory back; returns the bytes released.
#[pyfunction]
#[pyo3(signature = (device=0))]
fn empty_cache(py: Python<'_>, device: i64) -> PyResult<u64> {
    py.detach(|| api::empty_cache(device)).map_err(py_error)
}

/// Sets every peak statistic of `device` to its current value.
#[pyfunction]
#[pyo3(signature = (device=0))]
fn reset_peak_stats(device: i64) -> PyResult<()> {
    api::reset_peak_stats(device).map_err(py_error)
}

/// Starts (capacity > 0 events) or stops (0) recording `device`'s history.
#[pyfunction]
#[pyo3(signature = (capacity, device=0))]
fn set_history(capacity: usize, device: i64) -> PyResult<()> {
    api::set_history(device, capacity).map_err(py_error)
}

/// The policy `device`'s pool runs.
#[pyfunction]
#[pyo3(signature = (device=0))]
fn policy(device: i64) -> PyResult<&'static str> {
    api::policy(device).map_err(py_error)
}

/// Writes `device`'s pool as a PyTorch memory snapshot (pickle; JSON for `.json`).
#[pyfunction]
#[pyo3(signature = (path, device=0))]
fn snapshot(py: Python<'_>, path: String, device: i64) -> PyResult<()> {
    py.detach(|| api::snapshot(device, &path)).map_err(py_error)
}

/// Configures every pool, made and to be made; None leaves a setting as it is.
#[pyfunction]
#[pyo3(signature = (policy=None, soft_limit=None, hard_limit=None, history=None))]
fn configure(
    policy: Option<&str>,
    soft_limit: Option<&str>,
    hard_limit: Option<&str>,
    history: Option<usize>,
) -> PyResult<()> {
    api::configure(policy, soft_limit, hard_limit, history).map_err(py_error)
}

/// Changes `device`'s limits now; None leaves a limit, "none" removes it.
#[pyfunction]
#[pyo3(signature = (device=0, soft_limit=None, hard_limit=None))]
fn set_limits(device: i64, soft_limit: Option<&str>, hard_limit: Option<&str>) -> PyResult<()> {
    api::set_limits(device, soft_limit, hard_limit).map_err(py_error)
}

/// Publishes this process's pools for `gpumem top`/`diagnose`/`exporter` at `<dir>/<pid>.sock`
/// (`dir` None: the directory those tools read); returns the socket's path.
#[pyfunction]
#[pyo3(signature = (dir=None))]
fn publish(dir: Option<&str>) -> PyResult<String> {
    api::publish(dir).map_err(py_error)
}

/// What `device`'s pool publishes about itself, as a JSON object (gpumem watch's pool sample:
/// pid, device, policy, allocated, reserved, largest_free_block, num_ooms, limits, …).
#[pyfunction]
#[pyo3(signature = (device=0))]
fn pool_sample_json(device: i64) -> PyResult<String> {
    let sample = api::pool_sample(device).map_err(py_error)?;
    serde_json::to_string(&sample).map_err(|e| GpumemError::new_err(e.to_string()))
}

/// The findings of `gpumem diagnose`'s rules over `samples_json` (a JSON list of samples in
/// the `gpumem watch record` format), restricted to process `pid` when given: a JSON list of
/// objects with kind, subject, evidence, advice and text.
#[pyfunction]
#[pyo3(signature = (samples_json, pid=None))]
fn diagnose_json(samples_json: &str, pid: Option<u32>) -> PyResult<String> {
    let samples: Vec<gpumem_watch::Sample> = serde_json::from_str(samples_json).map_err(|e| {
        GpumemError::new_err(format!(
            "not a list of gpumem watch samples ({e}); each must be an object with time_ms, \
             gpus and pools"
        ))
    })?;
    let thresholds = gpumem_watch::diagnose::Thresholds::default();
    let findings: Vec<serde_json::Value> =
        gpumem_watch::diagnose::diagnose(&samples, pid, &thresholds)
            .iter()
            .map(|f| {
                serde_json::json!({
                    "kind": f.kind.name(),
                    "subject": f.subject,
                    "evidence": f.evidence,
                    "advice": f.advice,
                    "text": f.to_string(),
                })
            })
            .collect();
    Ok(serde_json::Value::from(findings).to_string())
}

/// Serializes a report for the Python side.
fn to_json(report: &impl serde::Serialize) -> PyResult<String> {
    serde_json::to_string(report).map_err(|e| GpumemError::new_err(e.to_string()))
}

/// The plan of `request` (a JSON object of `gpumem plan`'s settings by name) as the JSON of
/// `gpumem plan --json`.
#[pyfunction]
fn plan(py: Python<'_>, request: &str) -> PyResult<String> {
    let report = py.detach(|| {
        PlanRequest::from_json(request).and_then(|request| gpumem_replay::plan::plan(&request))
    });
    to_json(&report.map_err(|e| PlanError::new_err(e.to_string()))?)
}

/// The buffers CUDA's column sum of a contiguous `rows × cols` tensor allocates inside the
/// kernel on a GPU with these cores (`gpumem_plan::column_sum_staging`: the blocks' fp32
/// partial sums and their semaphores, each rounded to 512 bytes; empty when one block sums the
/// rows), so that `gpumem.torch.trace` records what the planner plans.
#[pyfunction]
fn column_sum_staging(
    rows: u64,
    cols: u64,
    multiprocessors: u64,
    threads_per_multiprocessor: u64,
    amd: bool,
) -> Vec<u64> {
    let cores = gpumem_plan::Cores {
        multiprocessors,
        threads_per_multiprocessor,
        amd,
        // The reduction does not depend on TF32.
        tf32: !amd,
    };
    gpumem_plan::column_sum_staging(rows, cols, &cores).map_or_else(Vec::new, Vec::from)
}

/// A trace to read: a file's path, or a file's bytes.
#[derive(FromPyObject)]
enum Source {
    /// A path (str or os.PathLike).
    Path(PathBuf),
    /// The bytes of a file (a pickled snapshot, a gzip, …).
    Bytes(Vec<u8>),
}

/// Reads `source` as `format` (`auto`, `native`, `pytorch`, `rmm`), device `device` of a
/// snapshot; a trace read from bytes without a name of its own is called `name`.
fn read_trace(source: &Source, format: &str, device: Option<usize>, name: &str) -> PyResult<Trace> {
    let format: Format =
        format
            .parse()
            .map_err(|e: gpumem_trace::formats::UnknownFormatName| {
                TraceError::new_err(e.to_string())
            })?;
    let options = ReadOptions { format, device };
    let read = match source {
        Source::Path(path) => read_path(path, options),
        Source::Bytes(bytes) => gpumem_trace::read(bytes.as_slice(), options).map(|mut trace| {
            if trace.meta.name.is_empty() {
                trace.meta.name = name.to_string();
            }
            trace
        }),
    };
    read.map_err(|e| TraceError::new_err(e.to_string()))
}

/// A replay setting refused, as the Python exception.
fn request_error(e: gpumem_replay::request::RequestError) -> PyErr {
    ReplayError::new_err(e.to_string())
}

/// The policies named: one name, `all`, or a list of names; each policy once, in the order
/// first named.
fn policy_list(policies: Vec<String>) -> PyResult<Vec<PolicyKind>> {
    if policies.is_empty() {
        return Err(ReplayError::new_err(format!(
            "no policy given; accepted: all, or one or more of {}",
            PolicyKind::names()
        )));
    }
    let mut kinds = Vec::new();
    for name in &policies {
        for kind in request::parse_policies(name).map_err(request_error)? {
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
    }
    Ok(kinds)
}

/// The capacity given, parsed as `--capacity` is.
fn capacity(capacity: Option<&str>) -> PyResult<Option<u64>> {
    capacity
        .map(request::parse_capacity)
        .transpose()
        .map_err(request_error)
}

/// `source` (None: the bundled GPT-2 training trace) replayed through `policies` as
/// `gpumem replay --json` reports it.
#[pyfunction]
#[pyo3(signature = (source, *, format, device, name, policies, capacity, pytorch_alloc_conf, gpumem_policy_conf, smallest_capacity))]
#[allow(clippy::too_many_arguments)]
fn replay(
    py: Python<'_>,
    source: Option<Source>,
    format: &str,
    device: Option<usize>,
    name: &str,
    policies: Vec<String>,
    capacity: Option<&str>,
    pytorch_alloc_conf: Option<&str>,
    gpumem_policy_conf: Option<&str>,
    smallest_capacity: bool,
) -> PyResult<String> {
    let source = source.unwrap_or_else(|| Source::Bytes(EXAMPLE_TRACE.to_vec()));
    let trace = read_trace(&source, format, device, name)?;
    let policies = policy_list(policies)?;
    let (torch, gpumem) =
        request::policy_settings(&policies, pytorch_alloc_conf, gpumem_policy_conf)
            .map_err(request_error)?;
    let options = ReplayOptions {
        capacity: self::capacity(capacity)?,
        torch,
        gpumem,
        smallest_capacity,
        ..ReplayOptions::default()
    };
    let report = py
        .detach(|| replay_report(&trace, &policies, &options, &mut |_| {}))
        .map_err(|e| ReplayError::new_err(e.to_string()))?;
    to_json(&report)
}

/// PyTorch's allocator options searched for `source`, as `gpumem tune --json` reports it.
#[pyfunction]
#[pyo3(signature = (source, *, format, device, name, capacity, objective, top, max_replays))]
#[allow(clippy::too_many_arguments)]
fn tune(
    py: Python<'_>,
    source: Source,
    format: &str,
    device: Option<usize>,
    name: &str,
    capacity: Option<&str>,
    objective: &str,
    top: usize,
    max_replays: Option<usize>,
) -> PyResult<String> {
    let trace = read_trace(&source, format, device, name)?;
    let objective: Objective = objective.parse().map_err(|accepted| {
        ReplayError::new_err(format!("objective {objective:?}: accepted: {accepted}"))
    })?;
    let options = TuneOptions {
        objective,
        capacity: self::capacity(capacity)?,
        top,
        max_replays,
    };
    let report = py
        .detach(|| gpumem_replay::tune::tune(&trace, &options, &|_| {}))
        .map_err(|e| ReplayError::new_err(e.to_string()))?;
    to_json(&TuneResult {
        trace: TraceInfo::of(&trace),
        tune: report,
    })
}

/// The HTML report of `sources` (the ranks of a job) replayed through `policies`, as
/// `gpumem report` writes it.
#[pyfunction]
#[pyo3(signature = (sources, *, format, device, policies, capacity, pytorch_alloc_conf, gpumem_policy_conf, tune))]
#[allow(clippy::too_many_arguments)]
fn report(
    py: Python<'_>,
    sources: Vec<Source>,
    format: &str,
    device: Option<usize>,
    policies: Vec<String>,
    capacity: Option<&str>,
    pytorch_alloc_conf: Option<&str>,
    gpumem_policy_conf: Option<&str>,
    tune: bool,
) -> PyResult<String> {
    let traces = sources
        .iter()
        .enumerate()
        .map(|(rank, source)| read_trace(source, format, device, &format!("rank {rank}")))
        .collect::<PyResult<Vec<_>>>()?;
    let capacity = self::capacity(capacity)?;
    let policies = policy_list(policies)?;
    let (torch, gpumem) =
        request::policy_settings(&policies, pytorch_alloc_conf, gpumem_policy_conf)
            .map_err(request_error)?;
    let options = ReportOptions {
        policies,
        replay: ReplayOptions {
            capacity,
            torch,
            gpumem,
            ..ReplayOptions::default()
        },
        tune: tune.then_some(TuneOptions {
            objective: Objective::Reserved,
            capacity,
            top: 3,
            max_replays: None,
        }),
        buckets: gpumem_report::DEFAULT_BUCKETS,
    };
    let built = py
        .detach(|| gpumem_report::build(&traces, &options))
        .map_err(|e| ReplayError::new_err(e.to_string()))?;
    Ok(gpumem_report::render(&built))
}

/// The built-in allocator policies as `gpumem policies --json` lists them.
#[pyfunction]
fn policies() -> PyResult<String> {
    to_json(&PolicyInfo::all())
}

/// Every device of every backend built in, as `gpumem devices --json` lists them.
#[pyfunction]
fn devices(py: Python<'_>) -> PyResult<String> {
    to_json(&py.detach(gpumem_cli::backend::list))
}

/// Every policy of `policies` checked on device `device` of `backend` with real bytes, as
/// `gpumem selftest --json` reports it; `trace` replaces the bundled trace.
#[pyfunction]
#[pyo3(signature = (*, backend, device, policies, trace, bytes_per_block))]
fn selftest(
    py: Python<'_>,
    backend: &str,
    device: usize,
    policies: Vec<String>,
    trace: Option<Source>,
    bytes_per_block: Option<u64>,
) -> PyResult<String> {
    let backend = <Backend as clap::ValueEnum>::from_str(backend, true).map_err(|_| {
        ReplayError::new_err(format!("backend {backend:?}: accepted: sim, cuda, wgpu"))
    })?;
    let policies = policy_list(policies)?;
    let trace = match &trace {
        Some(source) => read_trace(source, "auto", None, "trace")?,
        None => gpumem_trace::read(BUNDLED_TRACE, ReadOptions::default())
            .map_err(|e| TraceError::new_err(e.to_string()))?,
    };
    let bytes = bytes_per_block.unwrap_or(u64::MAX);
    let run = py.detach(|| {
        let device = backend.open(device)?;
        selftest_policies(device, &policies, &trace, bytes, &mut |_| {}).map_err(|e| e.to_string())
    });
    to_json(&run.map_err(ReplayError::new_err)?)
}

/// The module `gpumem._gpumem`.
#[pymodule]
fn _gpumem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("GpumemError", py.get_type::<GpumemError>())?;
    m.add("OutOfMemoryError", py.get_type::<OutOfMemoryError>())?;
    m.add("PlanError", py.get_type::<PlanError>())?;
    m.add("TraceError", py.get_type::<TraceError>())?;
    m.add("ReplayError", py.get_type::<ReplayError>())?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(column_sum_staging, m)?)?;
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    m.add_function(wrap_pyfunction!(tune, m)?)?;
    m.add_function(wrap_pyfunction!(report, m)?)?;
    m.add_function(wrap_pyfunction!(policies, m)?)?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(selftest, m)?)?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(alloc, m)?)?;
    m.add_function(wrap_pyfunction!(free, m)?)?;
    m.add_function(wrap_pyfunction!(memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(pool_status, m)?)?;
    m.add_function(wrap_pyfunction!(last_oom, m)?)?;
    m.add_function(wrap_pyfunction!(empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(reset_peak_stats, m)?)?;
    m.add_function(wrap_pyfunction!(set_history, m)?)?;
    m.add_function(wrap_pyfunction!(policy, m)?)?;
    m.add_function(wrap_pyfunction!(snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(set_limits, m)?)?;
    m.add_function(wrap_pyfunction!(publish, m)?)?;
    m.add_function(wrap_pyfunction!(pool_sample_json, m)?)?;
    m.add_function(wrap_pyfunction!(diagnose_json, m)?)?;
    Ok(())
}
