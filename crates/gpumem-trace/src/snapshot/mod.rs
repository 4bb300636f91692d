//! PyTorch's memory snapshots as traces: reading them (any pickle protocol or JSON) and
//! converting between a snapshot's event trace and a [`Trace`]. The model itself and its
//! writers are the `gpumem-snapshot` crate, re-exported here.
//!
//! Reading: pickle (protocols 0–5, plain data only) or JSON; unknown keys are ignored,
//! legacy blocks without `address`/`requested_size` are completed the way memory_viz does,
//! and both spellings of the pending-free state are accepted.

mod decode;
mod document;
mod unpickle;

use std::collections::BTreeMap;
use std::io::Read;

pub use gpumem_snapshot::{
    Action, BlockState, SegmentType, SettingValue, Snapshot, SnapshotBlock, SnapshotSegment,
    TraceEntry,
};

use crate::error::ReadError;
use gpumem_device::AddressSet;

use crate::trace::{saturating_sum, Event, LiveBlocks, Trace, TraceMeta};

/// Reads a snapshot written as a pickle (protocols 0–5) or as JSON (first byte `{`).
pub fn read(mut reader: impl Read) -> Result<Snapshot, ReadError> {
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

/// A snapshot holding `trace` as the event trace of `device` (`device_traces` gets
/// `device + 1` lists); no segments, as a trace knows nothing of them, so memory_viz's
/// Active Memory Timeline applies but not its segment views (a pool's own snapshot has both).
///
/// Each free becomes `free_requested` followed by `free_completed`, as PyTorch records
/// it; steps are dropped (snapshots have no step marker); `time_us` is the event's index.
pub fn from_trace(trace: &Trace, device: usize) -> Snapshot {
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
    Snapshot {
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
pub fn to_trace(snapshot: &Snapshot, device: Option<usize>) -> Result<Trace, ReadError> {
    let device = match device {
        Some(requested) if requested >= snapshot.device_traces.len() => {
            return Err(ReadError::NoSuchDevice {
                requested,
                available: snapshot.device_traces.len(),
            })
        }
        Some(requested) => requested,
        None => snapshot
            .device_traces
            .iter()
            .position(|entries| !entries.is_empty())
            .unwrap_or(0),
    };
    let entries = snapshot
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

    let device_segments: Vec<&SnapshotSegment> = snapshot
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
            saturating_sum(device_segments.iter().map(|segment| segment.total_size)).to_string(),
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
