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
