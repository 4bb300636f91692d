//! PyTorch's memory snapshots as traces: reading them (any pickle protocol or JSON) and
//! converting between a snapshot's event trace and a [`Trace`]. The model itself and its
//! writers are the `gpumem-snapshot` crate, re-exported here.
//!
//! Reading: pickle (protocols 0–5, plain data only) or JSON; unknown keys are ignored,
//! legacy blocks without `address`/`requested_size` are completed the way memory_viz does,
//! and both spellings of the pending-free state are accepted. Pickles are read as a stream
//! ([`read_trace`] holds the trace being built, never the snapshot); JSON is read whole.

mod decode;
mod document;
mod initial;
mod unpickle;

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Read};

pub use gpumem_snapshot::{
    Action, BlockState, Frame, FrameId, SegmentType, SettingValue, Snapshot, SnapshotBlock,
    SnapshotSegment, StackId, Stacks, TraceEntry,
};

use crate::error::{ReadError, SnapshotEncoding};

use self::initial::{DumpSegment, SegmentHistory};
use crate::trace::{
    saturating_sum, DeviceAllocation, Event, LiveBlocks, Trace, TraceMeta, UNKNOWN_ACTIONS_KEY,
};

/// Where a snapshot reader hands what it reads, piece by piece, in the order of the input
/// (PyTorch writes `segments` before `device_traces`, but a sink must not rely on it).
pub(crate) trait SnapshotSink {
    /// One segment of `segments`.
    fn segment(&mut self, segment: SnapshotSegment) -> Result<(), ReadError>;
    /// Entry `index` of `device_traces[device]`; a device's entries come in order, and the
    /// devices in order. `unknown_action` is the name of its action when gpumem does not
    /// know it (the entry's action is then [`Action::Unknown`]).
    fn entry(
        &mut self,
        device: usize,
        index: usize,
        entry: TraceEntry,
        unknown_action: Option<&str>,
    ) -> Result<(), ReadError>;
    /// How many devices `device_traces` has (after the last entry).
    fn devices(&mut self, count: usize);
    /// The allocator settings (after the last entry).
    fn settings(&mut self, settings: BTreeMap<String, SettingValue>);
    /// The table that the stack ids of the entries handed on are in (the reader interns the
    /// `frames` it reads here).
    fn stacks(&mut self) -> &mut Stacks;
}

/// Collecting everything makes the whole snapshot.
impl SnapshotSink for Snapshot {
    fn segment(&mut self, segment: SnapshotSegment) -> Result<(), ReadError> {
        self.segments.push(segment);
        Ok(())
    }

    fn entry(
        &mut self,
        device: usize,
        _: usize,
        entry: TraceEntry,
        _: Option<&str>,
    ) -> Result<(), ReadError> {
        if self.device_traces.len() <= device {
            self.device_traces.resize_with(device + 1, Vec::new);
        }
        self.device_traces[device].push(entry);
        Ok(())
    }

    fn devices(&mut self, count: usize) {
        self.device_traces.resize_with(count, Vec::new);
    }

    fn settings(&mut self, settings: BTreeMap<String, SettingValue>) {
        self.allocator_settings = settings;
    }

    fn stacks(&mut self) -> &mut Stacks {
        &mut self.stacks
    }
}

/// Reads a snapshot written as a pickle (protocols 0–5) or as JSON (first byte `{` or `[`).
/// A document that is not a snapshot ([`ReadError::NotASnapshot`]) or nests deeper than any
/// snapshot ([`ReadError::NestedTooDeep`]) is an error.
pub fn read(reader: impl Read) -> Result<Snapshot, ReadError> {
    let mut snapshot = Snapshot::default();
    read_into(reader, &mut snapshot)?;
    Ok(snapshot)
}

/// Reads the block trace of `device` of a snapshot (see [`to_trace`]) without holding the
/// snapshot: a pickle's entries become events as they are read, so memory follows the
/// trace's events, not the file's size.
pub fn read_trace(reader: impl Read, device: Option<usize>) -> Result<Trace, ReadError> {
    let mut builder = TraceBuilder::new(device);
    read_into(reader, &mut builder)?;
    builder.finish()
}

/// Reads a snapshot (pickle, or JSON if its first non-blank byte is `{` or `[`, neither of
/// which is a pickle opcode) into `sink`.
fn read_into(reader: impl Read, sink: &mut dyn SnapshotSink) -> Result<(), ReadError> {
    let mut reader = BufReader::new(reader);
    let json = loop {
        let head = reader.fill_buf()?;
        match head.iter().position(|byte| !byte.is_ascii_whitespace()) {
            Some(at) => break matches!(head[at], b'{' | b'['),
            None if head.is_empty() => break false,
            None => {
                let blank = head.len();
                reader.consume(blank);
            }
        }
    };
    if json {
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes)?;
        decode::deliver(
            &decode::from_json(&bytes)?.root,
            SnapshotEncoding::Json,
            sink,
        )
    } else {
        let rest = unpickle::unpickle(reader, sink)?;
        decode::deliver(&rest.root, SnapshotEncoding::Pickle, sink)
    }
}

/// A snapshot holding `trace` as the event trace of `device` (`device_traces` gets
/// `device + 1` lists); no segments, as a trace knows nothing of them, so memory_viz's
/// Active Memory Timeline applies but not its segment views (a pool's own snapshot has both).
/// A trace's [`Trace::initial_segments`] are not written: their blocks are allocated by its
/// first events, which are.
///
/// Each free becomes `free_requested` followed by `free_completed`, as PyTorch records
/// it; steps are dropped (snapshots have no step marker); `time_us` is the event's index.
/// An alloc keeps its stack (the trace's [`Trace::alloc_stacks`]) as its `frames`.
pub fn from_trace(trace: &Trace, device: usize) -> Snapshot {
    let mut live = LiveBlocks::default();
    let mut entries = Vec::with_capacity(trace.events.len() * 3 / 2);
    let mut allocs = 0;
    for (index, event) in trace.events.iter().enumerate() {
        let entry = |action, addr, size, stream, stack| TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us: index as u64,
            device_free: None,
            stack,
        };
        match *event {
            Event::Alloc { addr, size, stream } => {
                // An invalid trace is exported as it is; the snapshot shows the conflict.
                let _ = live.alloc(addr, size);
                let stack = trace.alloc_stack(allocs);
                allocs += 1;
                entries.push(entry(Action::Alloc, addr, size, stream, stack));
            }
            Event::Free { addr, stream } => {
                let size = live.free(addr).unwrap_or(0);
                entries.push(entry(Action::FreeRequested, addr, size, stream, None));
                entries.push(entry(Action::FreeCompleted, addr, size, stream, None));
            }
            Event::Step { .. } => {}
        }
    }
    let mut device_traces = vec![Vec::new(); device];
    device_traces.push(entries);
    Snapshot {
        segments: Vec::new(),
        device_traces,
        allocator_settings: BTreeMap::new(),
        stacks: trace.stacks.clone(),
    }
}

/// The block trace of one device: `alloc` → [`Event::Alloc`], `free_completed` (or a bare
/// `free`) → [`Event::Free`]; `segment_alloc`s → [`Trace::device_allocations`]; other
/// actions are ignored.
///
/// `device` defaults to the first device with a non-empty trace. A snapshot recorded in a
/// process that had allocated before (`_record_memory_history` called mid-process) starts
/// with memory the trace never created; the trace carries it as that process held it:
/// [`Trace::initial_segments`] are the segments that existed when recording began — freed or
/// unmapped by the trace without having been created by it, or in `segments` without a
/// `segment_alloc`/`segment_map` of the trace — each with the blocks live in it then: those
/// whose first mention is their free (the free's size is their request), and those still
/// allocated in `segments` that the trace never mentions (their size and request). Each such
/// block also gets its alloc synthesised at the start of the events (memory_viz shows them
/// as "initially allocated"), so that live bytes are right throughout; a block no segment
/// holds gets only that alloc. `meta.extra` holds their number and bytes
/// (`synthesized_allocs`, `synthesized_alloc_bytes`, of which `synthesized_from_segments`),
/// the initial segments and their bytes (`initial_segments`, `initial_segment_bytes`), the
/// device, its segment count and reserved bytes at the dump, and what was skipped (see
/// [`TraceMeta::skipped_notes`]): the device's `oom` entries (`skipped.oom_entries`) and its
/// entries of actions gpumem does not know (`skipped.unknown_action_entries`, their names
/// under `unknown_actions`). An alloc's `frames` become its
/// entry in [`Trace::alloc_stacks`] (synthesised allocs have none).
pub fn to_trace(snapshot: &Snapshot, device: Option<usize>) -> Result<Trace, ReadError> {
    let mut builder = TraceBuilder::new(device);
    builder.stacks = snapshot.stacks.clone();
    for segment in &snapshot.segments {
        builder.segment(segment.clone())?;
    }
    for (device, entries) in snapshot.device_traces.iter().enumerate() {
        for (index, entry) in entries.iter().enumerate() {
            builder.entry(device, index, entry.clone(), None)?;
        }
    }
    builder.devices(snapshot.device_traces.len());
    builder.finish()
}

/// Builds the block trace of one device from a snapshot's pieces as they are read (see
/// [`to_trace`] for what it holds).
struct TraceBuilder {
    /// The device asked for, if one was.
    requested: Option<usize>,
    /// The device whose entries are taken: the one asked for, or the first with an entry.
    chosen: Option<usize>,
    devices: usize,
    live: LiveBlocks,
    seen: HashSet<u64>,
    /// Segments created and released, and blocks freed that the trace never allocated.
    history: SegmentHistory,
    events: Vec<Event>,
    /// The stack of each alloc of `events`, in order; empty until the first stack.
    alloc_stacks: Vec<Option<StackId>>,
    /// How many allocs `events` holds.
    allocs: usize,
    stacks: Stacks,
    segments: Vec<DumpSegment>,
    /// The chosen device's `segment_alloc`s, in order.
    device_allocations: Vec<DeviceAllocation>,
    /// The chosen device's `oom` entries (skipped: the failed requests are not in the trace).
    oom_entries: u64,
    /// The chosen device's entries whose action gpumem does not know (skipped)...
    unknown_action_entries: u64,
    /// ...and the first [`UNKNOWN_ACTIONS_SHOWN`] names of those actions.
    unknown_actions: Vec<String>,
    /// Entries of the devices not chosen (a snapshot holds one trace per device).
    other_device_entries: u64,
}

/// How many names of unknown actions a trace's metadata lists.
const UNKNOWN_ACTIONS_SHOWN: usize = 8;

impl TraceBuilder {
    fn new(requested: Option<usize>) -> Self {
        Self {
            requested,
            chosen: requested,
            devices: 0,
            live: LiveBlocks::default(),
            seen: HashSet::new(),
            history: SegmentHistory::default(),
            events: Vec::new(),
            alloc_stacks: Vec::new(),
            allocs: 0,
            stacks: Stacks::default(),
            segments: Vec::new(),
            device_allocations: Vec::new(),
            oom_entries: 0,
            unknown_action_entries: 0,
            unknown_actions: Vec::new(),
            other_device_entries: 0,
        }
    }

    fn finish(mut self) -> Result<Trace, ReadError> {
        let device = match self.requested {
            Some(requested) if requested >= self.devices => {
                return Err(ReadError::NoSuchDevice {
                    requested,
                    available: self.devices,
                })
            }
            _ => self.chosen.unwrap_or(0),
        };
        let device_segments: Vec<&DumpSegment> = self
            .segments
            .iter()
            .filter(|segment| segment.device == device as u64)
            .collect();
        let initial = self.history.resolve(&device_segments, &mut self.seen);
        let mut synthesized: Vec<Event> = initial
            .segments
            .iter()
            .flat_map(|segment| {
                segment.blocks.iter().map(|block| Event::Alloc {
                    addr: block.address,
                    size: block.requested,
                    stream: segment.stream,
                })
            })
            .collect();
        synthesized.extend(initial.orphans);
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
                initial.from_segments.to_string(),
            ),
            (
                "initial_segments".to_owned(),
                initial.segments.len().to_string(),
            ),
            (
                "initial_segment_bytes".to_owned(),
                saturating_sum(initial.segments.iter().map(|segment| segment.size)).to_string(),
            ),
        ]);
        let mut alloc_stacks = self.alloc_stacks;
        if !alloc_stacks.is_empty() {
            alloc_stacks.splice(0..0, std::iter::repeat_n(None, synthesized.len()));
        }
        let mut events = self.events;
        events.splice(0..0, synthesized);
        let mut meta = TraceMeta {
            name: String::new(),
            source: "pytorch-snapshot".to_owned(),
            device_total: None,
            extra,
        };
        meta.add_skipped("oom_entries", self.oom_entries);
        meta.add_skipped("unknown_action_entries", self.unknown_action_entries);
        meta.add_skipped("other_device_entries", self.other_device_entries);
        if !self.unknown_actions.is_empty() {
            let mut names = self.unknown_actions.join(", ");
            if self.unknown_actions.len() == UNKNOWN_ACTIONS_SHOWN {
                names.push_str(", …");
            }
            meta.extra.insert(UNKNOWN_ACTIONS_KEY.to_owned(), names);
        }
        let mut trace = Trace::new(meta, events);
        trace.stacks = self.stacks;
        trace.alloc_stacks = alloc_stacks;
        trace.initial_segments = initial.segments;
        trace.device_allocations = self.device_allocations;
        Ok(trace)
    }
}

impl SnapshotSink for TraceBuilder {
    fn segment(&mut self, segment: SnapshotSegment) -> Result<(), ReadError> {
        self.segments.push(DumpSegment {
            device: segment.device,
            address: segment.address,
            total_size: segment.total_size,
            stream: segment.stream,
            segment_type: segment.segment_type,
            expandable: segment.is_expandable,
            active_blocks: segment
                .blocks
                .iter()
                .filter(|block| block.state != BlockState::Inactive)
                .map(|block| (block.address, block.size, block.requested_size))
                .collect(),
        });
        Ok(())
    }

    fn entry(
        &mut self,
        device: usize,
        index: usize,
        entry: TraceEntry,
        unknown_action: Option<&str>,
    ) -> Result<(), ReadError> {
        if *self.chosen.get_or_insert(device) != device {
            self.other_device_entries += 1;
            return Ok(());
        }
        let invalid = |violation| ReadError::InvalidSnapshotEvent {
            device,
            index,
            violation,
        };
        let (addr, size, stream) = (entry.addr, entry.size, entry.stream);
        match entry.action {
            Action::Alloc => {
                self.live.alloc(addr, size).map_err(invalid)?;
                self.seen.insert(addr);
                self.events.push(Event::Alloc { addr, size, stream });
                if let Some(stack) = entry.stack {
                    self.alloc_stacks.resize(self.allocs, None);
                    self.alloc_stacks.push(Some(stack));
                } else if !self.alloc_stacks.is_empty() {
                    self.alloc_stacks.push(None);
                }
                self.allocs += 1;
            }
            Action::FreeCompleted | Action::Free => {
                if self.seen.insert(addr) {
                    // First sight of this address is its free: allocated before recording.
                    self.history.freed_unseen(addr, size, stream, index);
                } else {
                    self.live.free(addr).map_err(invalid)?;
                }
                self.events.push(Event::Free { addr, stream });
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                if entry.action == Action::SegmentAlloc {
                    self.device_allocations.push(DeviceAllocation {
                        address: addr,
                        size,
                    });
                }
                self.history.created(addr, size)
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                let unmap = entry.action == Action::SegmentUnmap;
                self.history.released(addr, size, stream, unmap, index);
            }
            Action::Oom => self.oom_entries += 1,
            Action::Unknown => {
                self.unknown_action_entries += 1;
                let name = unknown_action.unwrap_or("unknown");
                if self.unknown_actions.len() < UNKNOWN_ACTIONS_SHOWN
                    && !self.unknown_actions.iter().any(|known| known == name)
                {
                    self.unknown_actions.push(name.to_owned());
                }
            }
            // A free's request half (the block is freed by its `free_completed`), a
            // snapshot's mark and an annotation move no memory: nothing is left out.
            Action::FreeRequested | Action::Snapshot | Action::UserDefined => {}
        }
        Ok(())
    }

    fn devices(&mut self, count: usize) {
        self.devices = count;
    }

    fn settings(&mut self, _: BTreeMap<String, SettingValue>) {}

    fn stacks(&mut self) -> &mut Stacks {
        &mut self.stacks
    }
}
