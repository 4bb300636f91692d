//! Allocation traces for gpumem.
//!
//! One in-memory trace type ([`Trace`]: a list of [`Event`]s plus [`TraceMeta`]) that the
//! replay engine consumes, and readers and writers for the formats traces come in: our JSON
//! lines, RMM's logging-resource CSV and PyTorch's memory snapshot ([`snapshot`], whose model
//! and memory_viz writers are the `gpumem-snapshot` crate, re-exported there).
//!
//! Every reader takes any [`std::io::Read`], never panics on malformed input, and returns a
//! [`ReadError`] that names the position (line, event index or byte offset) and what was
//! expected there.
//!
//! ```
//! use gpumem_trace::{read, snapshot, write, Format, ReadOptions};
//!
//! let text = "{\"gpumem_trace\": 1, \"name\": \"demo\"}\n\
//!             {\"op\": \"alloc\", \"addr\": 4096, \"size\": 512}\n";
//! let trace = read(text.as_bytes(), ReadOptions::default())?; // format detected
//! assert_eq!(trace.summary().peak_live_bytes, 512);
//!
//! let mut rmm_log = Vec::new();
//! write(&trace, &mut rmm_log, Format::Rmm)?;
//! let mut for_memory_viz = Vec::new();
//! snapshot::from_trace(&trace, 0).write_pickle(&mut for_memory_viz)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod error;
pub mod formats;
pub mod snapshot;
mod text;
mod trace;

pub use error::{ReadError, SnapshotEncoding};
pub use formats::{read, read_path, write, write_path, Format, ReadOptions};
pub use snapshot::{Frame, SegmentType, Snapshot, StackId, Stacks};
pub use text::{MAX_HEADER_BYTES, MAX_LINE_BYTES};
pub use trace::{
    DeviceAllocation, Event, InitialBlock, InitialSegment, Trace, TraceMeta, TraceSummary,
    ValidationError, Violation, SKIPPED_PREFIX, UNKNOWN_ACTIONS_KEY,
};
