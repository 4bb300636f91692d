//! `gpumem watch`: what the GPUs and the gpumem pools on this machine are doing, and why a
//! GPU is underused.
//!
//! - [`Sample`] is one look at the machine: per GPU ([`GpuSample`], from NVML) and per gpumem
//!   pool ([`PoolSample`], from the pools' publishing endpoints). A [`SampleSource`] yields
//!   them: `NvmlSource` (libnvidia-ml loaded at run time; no driver is an error that says
//!   so), [`PoolEndpoints`] (every process that turned [`publish`] on), `LiveSource` (both)
//!   and [`Recording`] (a JSON-lines file [`RecordingWriter`] writes), so that every view and
//!   diagnosis runs the same on recorded samples, without a GPU.
//! - `exporter`: Prometheus text exposition under dcgm-exporter's metric names and labels,
//!   plus `gpumem_pool_*`; [`diagnose`]: which known causes of an underused GPU hold, with the
//!   evidence and what to do; `top`: the terminal UI.
//!
//! # Features
//!
//! The heavy parts are optional, all on by default; without them the crate keeps the samples,
//! recordings, pool endpoints, [`synthetic`] samples and [`diagnose`] (what the Python
//! extension needs):
//!
//! - `nvml`: `NvmlSource`, and `LiveSource` and `open_source`, which read it (crate
//!   nvml-wrapper);
//! - `tui`: module `top` (crate ratatui, with crossterm);
//! - `exporter`: module `exporter` and its HTTP server (crate tiny_http).

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod diagnose;
mod error;
#[cfg(feature = "exporter")]
pub mod exporter;
#[cfg(feature = "nvml")]
mod nvml;
mod pools;
mod procinfo;
mod recording;
mod sample;
mod schedule;
pub mod synthetic;
#[cfg(feature = "tui")]
pub mod top;

/// The publishing side (crate gpumem-publish), re-exported: what a watched process runs.
pub use gpumem_publish as publish;

pub use error::WatchError;
#[cfg(feature = "nvml")]
pub use nvml::NvmlSource;
#[cfg(feature = "nvml")]
pub use pools::LiveSource;
pub use pools::PoolEndpoints;
pub use publish::{ANSWER_TIMEOUT, MAX_ANSWER_BYTES};
pub use recording::{Recording, RecordingWriter};
pub use sample::{GpuSample, PoolSample, ProcessSample, Sample, SampleSource};
pub use schedule::{
    parse_duration, parse_interval, sample_for, MAX_DURATION, MAX_INTERVAL, MIN_DURATION,
    MIN_INTERVAL,
};

/// Milliseconds since the Unix epoch, now (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// This machine's host name, as the kernel has it (empty when it cannot be read).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The samples a command shows: the recording at `samples` when given, else the live
/// machine. The second value is the plain sentence saying why no GPU is watched live, if none
/// is (no driver): the pools are still shown.
#[cfg(feature = "nvml")]
pub fn open_source(
    samples: Option<&std::path::Path>,
) -> Result<(Box<dyn SampleSource + Send>, Option<String>), WatchError> {
    match samples {
        Some(path) => Ok((Box::new(Recording::read(path)?), None)),
        None => {
            let live = LiveSource::open();
            let note = live.no_gpu().map(str::to_string);
            Ok((Box::new(live), note))
        }
    }
}
