//! Benchmark harness for gpumem: per-operation cost, footprint and fragmentation of each pool
//! policy side by side with the Rust offset allocators `offset-allocator`, `range-alloc` and
//! `buddy_system_allocator`, all driven by the same normalised trace; and replay throughput.
//!
//! - [`workload`]: a trace (or a synthetic mix at a fixed live count) becomes a flat list of
//!   `alloc(slot, size)` / `free(slot)` operations ([`Scenario`]).
//! - [`arena`]: one small trait ([`Arena`]) implemented for each peer over a fixed arena in
//!   512-byte units, for each gpumem policy through a [`gpumem_pool::Pool`] on the
//!   address-only simulated device, and for each policy alone (through its `Upstream`, without
//!   the pool frame).
//! - [`run`]: the hot loop ([`run::apply`]), a profiling pass ([`run::profile`]: failures,
//!   footprint, utilisation, fragmentation, overlap check) and arenas prepared for timing in
//!   turns ([`run::prepare`]).
//! - [`report`]: the Markdown tables `bench-report` prints and `docs/benchmarks.md` holds.
//! - [`snapshot_file`]: a PyTorch memory snapshot of any size, pickled as PyTorch pickles it,
//!   for the snapshot reader's benchmark.
//!
//! The criterion benchmarks (`cargo bench -p gpumem-bench`) live in `benches/`; the results
//! table comes from `cargo run --release -p gpumem-bench --bin bench-report`.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod arena;
pub mod report;
pub mod run;
pub mod snapshot_file;
pub mod workload;

pub use arena::{with_arena, Allocator, Arena, WithArena};
pub use workload::{
    from_trace, random_requests_trace, standard_mix, synthetic_training_trace, Op, Scenario,
};

use std::path::{Path, PathBuf};

use gpumem_trace::{ReadOptions, Trace};

/// Where the committed real traces live (`testdata/traces` at the workspace root).
pub fn default_trace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/traces")
}

/// The native traces (`*.jsonl`, `*.jsonl.gz`) in `dir`, sorted by name; none if the directory
/// does not exist. (The same directory holds PyTorch-snapshot and RMM fixtures of the same
/// captures, which would only repeat them.)
pub fn trace_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            p.is_file()
                && !name.starts_with('.')
                && (name.ends_with(".jsonl") || name.ends_with(".jsonl.gz"))
        })
        .collect();
    files.sort();
    files
}

/// Reads every trace in `dir`; unreadable files are reported on stderr and skipped.
pub fn load_traces(dir: &Path) -> Vec<Trace> {
    trace_files(dir)
        .into_iter()
        .filter_map(
            |p| match gpumem_trace::read_path(&p, ReadOptions::default()) {
                Ok(t) => Some(t),
                Err(e) => {
                    eprintln!("skipping {}: {e}", p.display());
                    None
                }
            },
        )
        .collect()
}
