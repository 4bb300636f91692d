//! The one error type of the crate.

use std::path::PathBuf;

/// What watching can fail with.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// NVML could not be loaded or initialised: no NVIDIA driver, or no GPU.
    #[error("no NVIDIA GPU can be watched here: {0}")]
    NoDriver(String),
    /// An NVML call failed on a device that was found.
    #[error("NVML: {what} failed on GPU {index}: {message}")]
    Nvml {
        /// The device index.
        index: u32,
        /// Which figure was asked for.
        what: &'static str,
        /// NVML's message.
        message: String,
    },
    /// A file or socket could not be used.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file, directory or socket.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// A recording has a line that is not a sample.
    #[error("{}:{line}: not a gpumem watch sample ({message}); each line must be a JSON object with time_ms, gpus and pools", path.display())]
    BadRecording {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// What was wrong.
        message: String,
    },
    /// An address to listen on that is not `HOST:PORT`.
    #[error("{addr:?} is not an address to listen on ({message}); use HOST:PORT, e.g. 127.0.0.1:9400 (port 0 picks a free port)")]
    BadListenAddress {
        /// The address given.
        addr: String,
        /// Why it was refused.
        message: String,
    },
    /// A pool endpoint answered late, too much or not a report, and was skipped: the watch
    /// goes on without its pools.
    #[error("skipped a pool endpoint: {0}")]
    SkippedEndpoint(gpumem_publish::PublishError),
    /// A recording has a sample whose figures cannot be ([`crate::Sample::check`]).
    #[error("{}:{line}: impossible sample: {message}", path.display())]
    BadSample {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// Which field is wrong, its value and what is accepted.
        message: String,
    },
    /// Publishing, or asking a publishing process, failed.
    #[error(transparent)]
    Publish(#[from] gpumem_publish::PublishError),
}

impl WatchError {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> WatchError {
        WatchError::Io {
            path: path.into(),
            source,
        }
    }
}
