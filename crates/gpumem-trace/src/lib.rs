//! Allocation traces for gpumem.
//!
//! One in-memory trace type ([`Trace`]: a list of [`Event`]s plus [`TraceMeta`]) that the
//! replay engine consumes, readers and writers for the formats traces come in, and the model
//! and writer of PyTorch's memory snapshot, so that a gpumem pool's history opens in
//! PyTorch's memory_viz.
//!
//! Every reader takes any [`std::io::Read`], never panics on malformed input, and returns a
//! [`ReadError`] that names the position (line, event index or byte offset) and what was
//! expected there.

#![warn(missing_docs)]

mod error;
pub mod formats;
pub mod snapshot;
mod trace;

pub use error::ReadError;
pub use formats::{read, read_path, write, write_path, Format, ReadOptions};
pub use snapshot::Snapshot;
pub use trace::{Event, Trace, TraceMeta, TraceSummary, ValidationError, Violation};
