//! Errors of the trace readers.

use std::path::PathBuf;

use thiserror::Error;

use crate::trace::Violation;

/// Why a trace or snapshot could not be read. Every variant names where in the input the
/// problem is and what was expected there.
#[derive(Debug, Error)]
pub enum ReadError {
    /// The underlying reader failed (including a corrupt gzip stream).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),

    /// A file-level error, wrapping the error found inside the file.
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file being read.
        path: PathBuf,
        /// What went wrong inside it.
        #[source]
        source: Box<ReadError>,
    },

    /// A line of a text format (native JSON lines, RMM CSV) does not have the expected shape.
    #[error("line {line}: expected {expected}: {detail}")]
    Malformed {
        /// 1-based line number.
        line: u64,
        /// What the line should have contained.
        expected: &'static str,
        /// What was found instead (parser message or the offending text).
        detail: String,
    },

    /// A line of a text format (native JSON lines, RMM CSV, a pickle's text argument) longer
    /// than any real one; refused once the limit is passed, before the rest is read.
    #[error(
        "line {line}: longer than {limit} bytes, the most a line may hold (real trace lines \
         are under a few kilobytes)"
    )]
    LineTooLong {
        /// 1-based line number.
        line: u64,
        /// The longest line accepted, in bytes without its newline ([`crate::MAX_LINE_BYTES`],
        /// [`crate::MAX_HEADER_BYTES`] for a native header).
        limit: usize,
    },

    /// A well-formed line describes an event that cannot follow the events before it.
    #[error("line {line}: {violation}")]
    InvalidEvent {
        /// 1-based line number.
        line: u64,
        /// What is wrong with the event.
        violation: Violation,
    },

    /// A device asked of a format that holds one device's trace (native, RMM): only a
    /// PyTorch snapshot holds one trace per device to choose from.
    #[error(
        "device {device} asked of a {format} trace, which holds one device's events; a device \
         is chosen only in a PyTorch snapshot (one trace per device)"
    )]
    DeviceOfOneDeviceTrace {
        /// The device asked for.
        device: usize,
        /// The trace's format.
        format: crate::Format,
    },

    /// The input ended before anything required was read.
    #[error("empty input: expected {expected}")]
    Empty {
        /// What the first line should have been.
        expected: &'static str,
    },

    /// A native trace of a version this build does not read.
    #[error("line 1: unsupported gpumem-trace version {found} (this build reads version 1)")]
    UnsupportedVersion {
        /// The version in the header.
        found: u64,
    },

    /// A snapshot pickle that cannot be decoded (corrupt, truncated, or holding objects
    /// rather than plain data).
    #[error("pickle byte {offset}: {detail}")]
    Pickle {
        /// Byte offset of the offending opcode.
        offset: u64,
        /// What is wrong there.
        detail: String,
    },

    /// A decoded snapshot whose structure differs from PyTorch's snapshot dict.
    #[error("snapshot {path}: expected {expected}, found {found}")]
    SnapshotShape {
        /// Where the value sits, e.g. `segments[3].blocks[0].size`.
        path: String,
        /// What PyTorch writes there.
        expected: &'static str,
        /// What was found.
        found: String,
    },

    /// The input decodes, but its top level is not a memory snapshot's: a dict with neither
    /// `segments` nor `device_traces`, a list that is not a list of segments, or a scalar.
    /// Refused rather than read as an empty trace, which would replay as a table of zeros.
    #[error(
        "the {encoding} holds {found}: not a PyTorch memory snapshot, which is a dict with \
         `segments` and/or `device_traces` (torch.cuda.memory._snapshot()) or, from PyTorch \
         1.13, a list of segment dicts (torch.cuda.memory_snapshot())"
    )]
    NotASnapshot {
        /// How the input was encoded.
        encoding: SnapshotEncoding,
        /// What its top level is, e.g. `a dict with keys a, b` or `a list of 3 integers`.
        found: String,
    },

    /// The input nests containers deeper than any memory snapshot does; refused where the
    /// limit is passed, before anything walks the nesting.
    #[error(
        "{encoding} byte {offset}: containers nested more than {limit} deep; a PyTorch memory \
         snapshot nests fewer than 10 levels, so this is not one"
    )]
    NestedTooDeep {
        /// How the input was encoded.
        encoding: SnapshotEncoding,
        /// Byte offset of the opcode (pickle) or bracket (JSON) that passes the limit.
        offset: u64,
        /// The deepest nesting accepted.
        limit: usize,
    },

    /// A snapshot event that cannot follow the events before it.
    #[error("snapshot device_traces[{device}][{index}]: {violation}")]
    InvalidSnapshotEvent {
        /// Device whose trace holds the entry.
        device: usize,
        /// Index of the entry in that device's trace.
        index: usize,
        /// What is wrong with the event.
        violation: Violation,
    },

    /// The requested device has no trace in the snapshot.
    #[error("snapshot has traces for {available} device(s); device {requested} does not exist")]
    NoSuchDevice {
        /// The device asked for.
        requested: usize,
        /// Number of device traces present.
        available: usize,
    },

    /// `--format auto` could not tell which format the input is in.
    #[error("cannot detect the trace format ({reason}); pass a format: native, pytorch or rmm")]
    UnknownFormat {
        /// What the detector saw.
        reason: String,
    },
}

/// How a snapshot document is encoded, for the errors that name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotEncoding {
    /// A pickle (`torch.cuda.memory._dump_snapshot`, or `pickle.dump` of the snapshot).
    Pickle,
    /// JSON (`json.dump` of the snapshot, or an exporter's).
    Json,
}

impl std::fmt::Display for SnapshotEncoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Pickle => "pickle",
            Self::Json => "JSON document",
        })
    }
}

impl ReadError {
    /// Wraps this error with the path of the file it was found in.
    pub(crate) fn in_file(self, path: impl Into<PathBuf>) -> Self {
        Self::InFile {
            path: path.into(),
            source: Box::new(self),
        }
    }
}
