//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot`) as a trace source.
//!
//! The snapshot model and its writers live in [`crate::snapshot`]; this module turns a
//! snapshot file into the block trace of one device (see [`crate::snapshot::to_trace`]),
//! streaming (see [`crate::snapshot::read_trace`]).

use std::io::Read;

use crate::error::ReadError;
use crate::trace::Trace;

/// Reads a snapshot (pickle of any protocol, or JSON) and returns the block trace of
/// `device` (default: the first device with a non-empty trace).
pub fn read_pytorch(reader: impl Read, device: Option<usize>) -> Result<Trace, ReadError> {
    crate::snapshot::read_trace(reader, device)
}

/// Whether a document starting with `head` looks like a snapshot: a pickle (protocol 2+
/// starts with the PROTO opcode 0x80, protocol 1 with EMPTY_DICT `}` or, for PyTorch 1.13's
/// list of segments, EMPTY_LIST `]`, protocol 0 with MARK `(`), a JSON object naming `device_traces` or `segments`, or a JSON list naming
/// `total_size` (PyTorch 1.13's list of segments).
pub(crate) fn looks_like_snapshot(head: &[u8]) -> bool {
    let contains = |needle: &[u8]| head.windows(needle.len()).any(|window| window == needle);
    match head.trim_ascii_start().first() {
        Some(0x80 | b'}' | b']' | b'(') => true,
        Some(b'{') => contains(b"\"device_traces\"") || contains(b"\"segments\""),
        Some(b'[') => contains(b"\"total_size\""),
        _ => false,
    }
}
