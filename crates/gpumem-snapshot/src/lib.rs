//! PyTorch's memory snapshot (`torch.cuda.memory._snapshot()`) as plain Rust types, and
//! (with the `write` feature) its writers.
//!
//! The model is what a pool needs to describe itself — segments with their blocks, the
//! recorded allocator events, the allocator's settings — and depends on nothing, so that a
//! pool (and a C ABI library built on it) carries no serialisation code it does not use. The
//! `write` feature adds the pickle and JSON writers whose output opens in PyTorch's memory_viz
//! (<https://pytorch.org/memory_viz>): pickle protocol 3 restricted to the opcodes memory_viz's
//! own unpickler accepts (dicts, lists, a tuple, strings, ints that fit in 8 bytes, floats,
//! bools, None; no bytes, sets or globals), or JSON of the same structure. Stack frames are kept
//! interned ([`Stacks`]): an event names its stack by a [`StackId`]; segments and blocks are
//! written with empty `frames` lists. Reading snapshots (any pickle protocol, every PyTorch version's variations) is
//! in `gpumem-trace`, which turns them into traces.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod stacks;
#[cfg(feature = "write")]
mod write;

pub use stacks::{Frame, FrameId, StackId, Stacks};

#[cfg(feature = "write")]
pub use write::write_file_atomically;

use std::collections::BTreeMap;

/// A memory snapshot: segments with their blocks, per-device event traces, allocator settings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Every segment (device allocation) of every device at snapshot time.
    pub segments: Vec<SnapshotSegment>,
    /// The recorded allocator events, one list per device index.
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// The allocator's configuration (`PYTORCH_CUDA_ALLOC_CONF` and parsed options).
    pub allocator_settings: BTreeMap<String, SettingValue>,
    /// The stacks the entries' [`TraceEntry::stack`] ids name.
    pub stacks: Stacks,
}

/// One device allocation (a `cudaMalloc`, or a mapped range of an expandable segment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotSegment {
    /// Device index.
    pub device: u64,
    /// Base address.
    pub address: u64,
    /// Bytes reserved from the device.
    pub total_size: u64,
    /// Sum of the sizes of allocated blocks.
    pub allocated_size: u64,
    /// Allocated plus pending-free bytes.
    pub active_size: u64,
    /// Sum of the requested (unrounded) sizes of active blocks.
    pub requested_size: u64,
    /// Stream the segment belongs to (the raw `cudaStream_t`; 0 = default stream).
    pub stream: u64,
    /// Which pool the segment serves; `None` when the producer did not say (PyTorch's own
    /// `_profile_to_snapshot` writes no `segment_type`).
    pub segment_type: Option<SegmentType>,
    /// Private pool (`MemPool`) id; `(0, 0)` for the default pool.
    pub segment_pool_id: (u64, u64),
    /// Whether this is (a mapped range of) an expandable segment.
    pub is_expandable: bool,
    /// The blocks tiling the segment, in address order.
    pub blocks: Vec<SnapshotBlock>,
}

/// The pool a segment serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentType {
    /// Blocks of at most 1 MiB, in 2 MiB segments.
    Small,
    /// Larger blocks.
    Large,
}

/// A piece of a segment: allocated, waiting for a stream before it can be reused, or free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotBlock {
    /// Start address.
    pub address: u64,
    /// Size after rounding (what the block occupies in its segment).
    pub size: u64,
    /// Size the caller asked for.
    pub requested_size: u64,
    /// Allocation state.
    pub state: BlockState,
}

/// The allocation state of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out to a caller.
    ActiveAllocated,
    /// Freed by the caller but still in use by a stream (record_stream); not yet reusable.
    /// Read from `active_pending_free` (what the C++ writes) or `active_awaiting_free`.
    ActivePendingFree,
    /// Free, cached in the pool.
    Inactive,
}

/// One recorded allocator event (`device_traces[d][i]`). Missing numbers read as 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: Action,
    /// Block or segment address (0 for `oom` and `snapshot`).
    pub addr: u64,
    /// Block size as requested, segment size, or for `oom` the requested (rounded) size.
    pub size: u64,
    /// Stream of the event (raw `cudaStream_t`; 0 = default stream).
    pub stream: u64,
    /// Unix-epoch microseconds (gpumem writes the event's sequence number when it has no clock).
    pub time_us: u64,
    /// For `oom`: the device's free memory at the time.
    pub device_free: Option<u64>,
    /// The stack recorded with the event (`frames`), in the snapshot's [`Snapshot::stacks`].
    pub stack: Option<StackId>,
}

/// The action of a [`TraceEntry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// A block was handed out.
    Alloc,
    /// The caller freed a block; it may still wait for stream events.
    FreeRequested,
    /// The block is back in the pool.
    FreeCompleted,
    /// A combined free (what memory_viz makes of a requested+completed pair; some exporters write it).
    Free,
    /// A segment was allocated from the device.
    SegmentAlloc,
    /// A segment was returned to the device.
    SegmentFree,
    /// Expandable segments: pages were mapped.
    SegmentMap,
    /// Expandable segments: pages were unmapped.
    SegmentUnmap,
    /// An allocation failed with out-of-memory.
    Oom,
    /// A snapshot was taken.
    Snapshot,
    /// A user annotation (newer PyTorch builds).
    UserDefined,
    /// An action this version does not know; kept so newer snapshots still read.
    Unknown,
}

/// The names PyTorch writes for the variants of a small enum, in one table per enum: used
/// both to write and to read them.
macro_rules! snapshot_names {
    ($type:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $type {
            /// Every variant, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The name PyTorch uses in snapshots.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name),+
                }
            }
        }

        #[cfg(feature = "write")]
        impl serde::Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    };
}

snapshot_names!(SegmentType { Small => "small", Large => "large" });
snapshot_names!(BlockState {
    ActiveAllocated => "active_allocated",
    ActivePendingFree => "active_pending_free",
    Inactive => "inactive",
});
snapshot_names!(Action {
    Alloc => "alloc",
    FreeRequested => "free_requested",
    FreeCompleted => "free_completed",
    Free => "free",
    SegmentAlloc => "segment_alloc",
    SegmentFree => "segment_free",
    SegmentMap => "segment_map",
    SegmentUnmap => "segment_unmap",
    Oom => "oom",
    Snapshot => "snapshot",
    UserDefined => "user_defined",
    Unknown => "unknown",
});

/// A value in `allocator_settings`: PyTorch writes strings, numbers, bools and a dict
/// (`roundup_power2_divisions`).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "write", derive(serde::Serialize))]
#[cfg_attr(feature = "write", serde(untagged))]
pub enum SettingValue {
    /// `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A list (or tuple).
    List(Vec<SettingValue>),
    /// A dict with string keys.
    Map(BTreeMap<String, SettingValue>),
}
