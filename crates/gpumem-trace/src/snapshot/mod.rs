//! PyTorch's memory snapshot (`torch.cuda.memory._snapshot()`), as Rust types.
//!
//! gpumem reads snapshots (their `device_traces` become a [`Trace`]) and writes them, so that
//! a pool's recorded history opens in PyTorch's memory_viz (<https://pytorch.org/memory_viz>).
//!
//! Writing: pickle protocol 3 restricted to the opcodes memory_viz's own unpickler accepts
//! (dicts, lists, a tuple, strings, ints that fit in 8 bytes, floats, bools, None; no bytes,
//! sets or globals), or JSON of the same structure. Stack frames are not modelled and are
//! written as empty lists, which the viewer shows as "allocated before recording".
//!
//! Reading: pickle (protocols 0–5, plain data only) or JSON; unknown keys are ignored,
//! legacy blocks without `address`/`requested_size` are completed the way memory_viz does,
//! and both spellings of the pending-free state are accepted.

mod decode;
mod document;
mod unpickle;

use std::collections::BTreeMap;
use std::io::{Read, Write};

use serde::ser::{SerializeMap, SerializeSeq, SerializeStruct};
use serde::{Serialize, Serializer};

use crate::error::ReadError;
use gpumem_device::AddressSet;

use crate::trace::{saturating_sum, Event, LiveBlocks, Trace, TraceMeta};

/// A memory snapshot: segments with their blocks, per-device event traces, allocator settings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Every segment (device allocation) of every device at snapshot time.
    pub segments: Vec<Segment>,
    /// The recorded allocator events, one list per device index.
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// The allocator's configuration (`PYTORCH_CUDA_ALLOC_CONF` and parsed options).
    pub allocator_settings: BTreeMap<String, SettingValue>,
}

/// One device allocation (a `cudaMalloc`, or a mapped range of an expandable segment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
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
    /// Which pool the segment serves.
    pub segment_type: SegmentType,
    /// Private pool (`MemPool`) id; `(0, 0)` for the default pool.
    pub segment_pool_id: (u64, u64),
    /// Whether this is (a mapped range of) an expandable segment.
    pub is_expandable: bool,
    /// The blocks tiling the segment, in address order.
    pub blocks: Vec<Block>,
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
pub struct Block {
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

        impl Serialize for $type {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
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
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
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

impl Snapshot {
    /// Reads a snapshot written as a pickle (protocols 0–5) or as JSON (first byte `{`).
    pub fn read(mut reader: impl Read) -> Result<Self, ReadError> {
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes)?;
        let document = if bytes.trim_ascii_start().starts_with(b"{") {
            let json = serde_json::from_slice(&bytes).map_err(|error| ReadError::Malformed {
                line: error.line() as u64,
                expected: "a JSON memory snapshot",
                detail: error.to_string(),
            })?;
            decode::from_json(json)
        } else {
            unpickle::unpickle(&bytes)?
        };
        decode::snapshot(&document.root)
    }

    /// Writes the snapshot as a protocol-3 pickle that memory_viz opens.
    pub fn write_pickle(&self, writer: impl Write) -> std::io::Result<()> {
        let mut writer = std::io::BufWriter::new(writer);
        serde_pickle::to_writer(&mut writer, self, serde_pickle::SerOptions::new()).map_err(
            |error| match error {
                serde_pickle::Error::Io(error) => error,
                other => std::io::Error::other(other),
            },
        )?;
        writer.flush()
    }

    /// Writes the snapshot as JSON of the same structure (newer memory_viz builds read it).
    pub fn write_json(&self, writer: impl Write) -> std::io::Result<()> {
        let mut writer = std::io::BufWriter::new(writer);
        serde_json::to_writer(&mut writer, self)?;
        writer.flush()
    }

    /// Writes the snapshot to a file: JSON if the name ends in `.json`, else a pickle for
    /// memory_viz (`gpumem replay --snapshot OUT.pickle`).
    pub fn write_path(&self, path: impl AsRef<std::path::Path>) -> std::io::Result<()> {
        let path = path.as_ref();
        let file = std::fs::File::create(path)?;
        if path
            .extension()
            .is_some_and(|extension| extension == "json")
        {
            self.write_json(file)
        } else {
            self.write_pickle(file)
        }
    }

    /// A snapshot holding `trace` as the event trace of `device` (`device_traces` gets
    /// `device + 1` lists); no segments, as a trace knows nothing of them, so memory_viz's
    /// Active Memory Timeline applies but not its segment views (a pool's own snapshot has both).
    ///
    /// Each free becomes `free_requested` followed by `free_completed`, as PyTorch records
    /// it; steps are dropped (snapshots have no step marker); `time_us` is the event's index.
    pub fn from_trace(trace: &Trace, device: usize) -> Self {
        let mut live = LiveBlocks::default();
        let mut entries = Vec::with_capacity(trace.events.len() * 3 / 2);
        for (index, event) in trace.events.iter().enumerate() {
            let entry = |action, addr, size, stream| TraceEntry {
                action,
                addr,
                size,
                stream,
                time_us: index as u64,
                device_free: None,
            };
            match *event {
                Event::Alloc { addr, size, stream } => {
                    // An invalid trace is exported as it is; the snapshot shows the conflict.
                    let _ = live.alloc(addr, size);
                    entries.push(entry(Action::Alloc, addr, size, stream));
                }
                Event::Free { addr, stream } => {
                    let size = live.free(addr).unwrap_or(0);
                    entries.push(entry(Action::FreeRequested, addr, size, stream));
                    entries.push(entry(Action::FreeCompleted, addr, size, stream));
                }
                Event::Step { .. } => {}
            }
        }
        let mut device_traces = vec![Vec::new(); device];
        device_traces.push(entries);
        Self {
            segments: Vec::new(),
            device_traces,
            allocator_settings: BTreeMap::new(),
        }
    }

    /// The block trace of one device: `alloc` → [`Event::Alloc`], `free_completed` (or a bare
    /// `free`) → [`Event::Free`]; other actions are ignored.
    ///
    /// `device` defaults to the first device with a non-empty trace. Memory allocated before
    /// recording began gets its alloc synthesised at the start, so that live bytes are right
    /// throughout: for a free of an address the trace never allocated (size from the free),
    /// and for a block still allocated in `segments` that the trace never mentions (its
    /// requested size; memory_viz shows both as "initially allocated"). `meta.extra` holds
    /// their number and bytes (`synthesized_allocs`, `synthesized_alloc_bytes`, of which
    /// `synthesized_from_segments`), the device, its segment count and reserved bytes.
    pub fn to_trace(&self, device: Option<usize>) -> Result<Trace, ReadError> {
        let device = match device {
            Some(requested) if requested >= self.device_traces.len() => {
                return Err(ReadError::NoSuchDevice {
                    requested,
                    available: self.device_traces.len(),
                })
            }
            Some(requested) => requested,
            None => self
                .device_traces
                .iter()
                .position(|entries| !entries.is_empty())
                .unwrap_or(0),
        };
        let entries = self
            .device_traces
            .get(device)
            .map_or(&[][..], Vec::as_slice);

        let mut live = LiveBlocks::default();
        let mut seen = AddressSet::default();
        let mut synthesized = Vec::new();
        let mut events = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let invalid = |violation| ReadError::InvalidSnapshotEvent {
                device,
                index,
                violation,
            };
            let (addr, size, stream) = (entry.addr, entry.size, entry.stream);
            match entry.action {
                Action::Alloc => {
                    live.alloc(addr, size).map_err(invalid)?;
                    seen.insert(addr);
                    events.push(Event::Alloc { addr, size, stream });
                }
                Action::FreeCompleted | Action::Free => {
                    if seen.insert(addr) {
                        // First sight of this address is its free: allocated before recording.
                        synthesized.push(Event::Alloc { addr, size, stream });
                    } else {
                        live.free(addr).map_err(invalid)?;
                    }
                    events.push(Event::Free { addr, stream });
                }
                _ => {}
            }
        }

        let device_segments: Vec<&Segment> = self
            .segments
            .iter()
            .filter(|segment| segment.device == device as u64)
            .collect();
        let synthesized_from_frees = synthesized.len();
        for segment in &device_segments {
            for block in &segment.blocks {
                if block.state != BlockState::Inactive && seen.insert(block.address) {
                    synthesized.push(Event::Alloc {
                        addr: block.address,
                        size: block.requested_size,
                        stream: segment.stream,
                    });
                }
            }
        }

        let synthesized_bytes = saturating_sum(synthesized.iter().map(|event| match event {
            Event::Alloc { size, .. } => *size,
            _ => 0,
        }));
        let extra = BTreeMap::from([
            ("device".to_owned(), device.to_string()),
            ("segments".to_owned(), device_segments.len().to_string()),
            (
                "reserved_bytes".to_owned(),
                saturating_sum(device_segments.iter().map(|segment| segment.total_size))
                    .to_string(),
            ),
            (
                "synthesized_allocs".to_owned(),
                synthesized.len().to_string(),
            ),
            (
                "synthesized_alloc_bytes".to_owned(),
                synthesized_bytes.to_string(),
            ),
            (
                "synthesized_from_segments".to_owned(),
                (synthesized.len() - synthesized_from_frees).to_string(),
            ),
        ]);
        synthesized.append(&mut events);
        Ok(Trace::new(
            TraceMeta {
                name: String::new(),
                source: "pytorch-snapshot".to_owned(),
                device_total: None,
                extra,
            },
            synthesized,
        ))
    }
}

/// An integer as Python pickles it: values that fit in an `i64` as such (serde-pickle then
/// writes at most 8 bytes, which memory_viz's unpickler decodes into a JavaScript number; its
/// `u64` encoding always takes 9 bytes, which the viewer turns into a BigInt that breaks its
/// address arithmetic).
struct PyInt(u64);

impl Serialize for PyInt {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match i64::try_from(self.0) {
            Ok(value) => serializer.serialize_i64(value),
            Err(_) => serializer.serialize_u64(self.0),
        }
    }
}

/// The `frames` list memory_viz expects on segments, blocks and events; gpumem records none.
struct NoFrames;

impl Serialize for NoFrames {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_seq(Some(0))?.end()
    }
}

impl Serialize for Snapshot {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_struct("Snapshot", 3)?;
        map.serialize_field("segments", &self.segments)?;
        map.serialize_field("device_traces", &self.device_traces)?;
        map.serialize_field("allocator_settings", &self.allocator_settings)?;
        map.end()
    }
}

impl Serialize for Segment {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_struct("Segment", 12)?;
        map.serialize_field("device", &PyInt(self.device))?;
        map.serialize_field("address", &PyInt(self.address))?;
        map.serialize_field("total_size", &PyInt(self.total_size))?;
        map.serialize_field("allocated_size", &PyInt(self.allocated_size))?;
        map.serialize_field("active_size", &PyInt(self.active_size))?;
        map.serialize_field("requested_size", &PyInt(self.requested_size))?;
        map.serialize_field("stream", &PyInt(self.stream))?;
        map.serialize_field("segment_type", &self.segment_type)?;
        let (pool_high, pool_low) = self.segment_pool_id;
        map.serialize_field("segment_pool_id", &(PyInt(pool_high), PyInt(pool_low)))?;
        map.serialize_field("is_expandable", &self.is_expandable)?;
        map.serialize_field("frames", &NoFrames)?;
        map.serialize_field("blocks", &self.blocks)?;
        map.end()
    }
}

impl Serialize for Block {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_struct("Block", 5)?;
        map.serialize_field("address", &PyInt(self.address))?;
        map.serialize_field("size", &PyInt(self.size))?;
        map.serialize_field("requested_size", &PyInt(self.requested_size))?;
        map.serialize_field("state", &self.state)?;
        map.serialize_field("frames", &NoFrames)?;
        map.end()
    }
}

impl Serialize for TraceEntry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Like PyTorch: an `oom` entry carries `device_free` in place of `addr`.
        let mut map = serializer.serialize_map(Some(6))?;
        map.serialize_entry("action", &self.action)?;
        match (self.action, self.device_free) {
            (Action::Oom, device_free) => {
                map.serialize_entry("device_free", &PyInt(device_free.unwrap_or(0)))?
            }
            (_, _) => map.serialize_entry("addr", &PyInt(self.addr))?,
        }
        map.serialize_entry("size", &PyInt(self.size))?;
        map.serialize_entry("stream", &PyInt(self.stream))?;
        map.serialize_entry("time_us", &PyInt(self.time_us))?;
        map.serialize_entry("frames", &NoFrames)?;
        map.end()
    }
}
