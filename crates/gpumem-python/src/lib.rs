//! `gpumem._gpumem`, the extension module of the Python package `gpumem` (python/).
//!
//! One shared library holds three things: the `gpumem` command (`cli`, for `python -m gpumem`
//! and for `gpumem.plan`/`gpumem.replay`, which run it and read its JSON), Python functions
//! over the pools (`memory_stats`, `configure`, …), and — re-exported from gpumem-capi — the C
//! entry points that PyTorch's `CUDAPluggableAllocator` and CuPy's `CFunctionAllocator` load
//! from this very file. One file means one set of pools: what PyTorch allocates is what
//! `gpumem.torch.memory_stats()` reports.

use std::collections::BTreeMap;

use gpumem_capi::{api, CapiError};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

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

/// The module `gpumem._gpumem`.
#[pymodule]
fn _gpumem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("GpumemError", py.get_type::<GpumemError>())?;
    m.add("OutOfMemoryError", py.get_type::<OutOfMemoryError>())?;
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
