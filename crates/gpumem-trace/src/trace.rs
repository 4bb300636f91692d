//! The in-memory trace: allocator events plus metadata, its summary and its validation.

use std::collections::{BTreeMap, HashMap};

use gpumem_snapshot::{SegmentType, StackId, Stacks};

use thiserror::Error;

/// One allocator event of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A block of `size` bytes was handed out; `addr` identifies it until its free.
    Alloc {
        /// Address of the block; unique among live blocks.
        addr: u64,
        /// Bytes requested by the caller (before any allocator rounding).
        size: u64,
        /// Stream the block was allocated on (0 = default stream).
        stream: u64,
    },
    /// The block allocated at `addr` was freed.
    Free {
        /// Address of the block being freed; must be live.
        addr: u64,
        /// Stream the free was issued on (0 = default stream).
        stream: u64,
    },
    /// A training/inference step begins (used to count device calls per step).
    Step {
        /// Step number, as recorded by the source.
        index: u64,
    },
}

/// Where a trace came from and what it describes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceMeta {
    /// Human-readable name (e.g. the model and phase, or the file stem).
    pub name: String,
    /// Producer of the trace (e.g. `pytorch-snapshot`, `rmm-log`, a capture tool).
    pub source: String,
    /// Total memory of the device the trace was recorded on, when known.
    pub device_total: Option<u64>,
    /// Free-form facts about the trace (reader statistics, capture settings, ...).
    pub extra: BTreeMap<String, String>,
}

/// The prefix of the [`TraceMeta::extra`] keys that count what a reader read but left out of
/// the events (`skipped.<kind>` → how many), so that whoever shows a trace can say what it
/// lacks: [`TraceMeta::skipped_notes`].
pub const SKIPPED_PREFIX: &str = "skipped.";

/// The [`TraceMeta::extra`] key naming the unknown snapshot actions skipped (a comma-separated
/// list of the first few), alongside `skipped.unknown_action_entries`.
pub const UNKNOWN_ACTIONS_KEY: &str = "unknown_actions";

impl TraceMeta {
    /// Counts `count` more input items of `kind` that the reader skipped, under
    /// `skipped.<kind>` in [`TraceMeta::extra`]; nothing is recorded for 0.
    pub fn add_skipped(&mut self, kind: &str, count: u64) {
        if count == 0 {
            return;
        }
        let slot = self
            .extra
            .entry(format!("{SKIPPED_PREFIX}{kind}"))
            .or_default();
        let before: u64 = slot.parse().unwrap_or(0);
        *slot = before.saturating_add(count).to_string();
    }

    /// How many input items of `kind` the reader skipped (0 if none).
    pub fn skipped(&self, kind: &str) -> u64 {
        self.extra
            .get(&format!("{SKIPPED_PREFIX}{kind}"))
            .and_then(|count| count.parse().ok())
            .unwrap_or(0)
    }

    /// One sentence per kind of input the reader skipped (the `skipped.*` counts of
    /// [`TraceMeta::extra`]), for a report to show under the trace: what was left out and
    /// what that means for the replay. Empty when nothing was skipped.
    pub fn skipped_notes(&self) -> Vec<String> {
        let plural = |count: u64, one: &str, many: &str| {
            format!("{count} {}", if count == 1 { one } else { many })
        };
        self.extra
            .iter()
            .filter_map(|(key, count)| Some((key.strip_prefix(SKIPPED_PREFIX)?, count)))
            .filter_map(|(kind, count)| {
                let count: u64 = count.parse().ok().filter(|&count| count > 0)?;
                Some(match kind {
                    "allocate_failure_rows" => format!(
                        "{} skipped: the traced run ran out of memory there, and those failed \
                         requests are not replayed",
                        plural(
                            count,
                            "RMM `allocate failure` row",
                            "RMM `allocate failure` rows"
                        )
                    ),
                    "null_pointer_rows" => format!(
                        "{} skipped: they moved no memory",
                        plural(
                            count,
                            "RMM row with a null pointer ((nil) or 0x0)",
                            "RMM rows with a null pointer ((nil) or 0x0)"
                        )
                    ),
                    "oom_entries" => format!(
                        "{} skipped: the traced run ran out of memory there, and the failed \
                         requests are not in the trace",
                        plural(count, "snapshot `oom` entry", "snapshot `oom` entries")
                    ),
                    "unknown_action_entries" => format!(
                        "{} skipped ({})",
                        plural(
                            count,
                            "snapshot entry with an action the reader does not know",
                            "snapshot entries with actions the reader does not know"
                        ),
                        self.extra
                            .get(UNKNOWN_ACTIONS_KEY)
                            .map_or("actions not recorded", String::as_str)
                    ),
                    "other_device_entries" => format!(
                        "{} of other devices skipped: a snapshot holds one trace per device, \
                         and this is device {}'s (choose another with --device)",
                        plural(count, "snapshot entry", "snapshot entries"),
                        self.extra.get("device").map_or("?", String::as_str)
                    ),
                    other => format!("{count} skipped: {other}"),
                })
            })
            .collect()
    }
}

/// A sequence of allocator events with its metadata; what the replay engine consumes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// Where the trace came from.
    pub meta: TraceMeta,
    /// The events, in the order they happened.
    pub events: Vec<Event>,
    /// The stack frames the allocations were made from, when the source recorded them.
    pub stacks: Stacks,
    /// The stack of each [`Event::Alloc`], by the alloc's ordinal among the allocs (the
    /// `k`-th alloc's stack is `alloc_stacks[k]`): a side table of 4 bytes per alloc, empty
    /// when the trace has no frames; see [`Trace::alloc_stack`].
    pub alloc_stacks: Vec<Option<StackId>>,
    /// The segments that held memory when recording began (a trace recorded in a process
    /// that had already allocated), in address order, each with the blocks live in it then.
    ///
    /// Those blocks are also allocated by the first events of [`Trace::events`], one alloc per
    /// block in the same order (segment after segment, blocks in address order; see
    /// [`Trace::initial_allocs`]), so that whatever ignores this field sees them allocated at
    /// the start. A replay whose policy can take segments over places them here instead: the
    /// segments reserved as they were, the blocks at their offsets, the rest cached. Empty
    /// for a trace recorded from the start and for formats that cannot say.
    pub initial_segments: Vec<InitialSegment>,
    /// The device allocations (`cudaMalloc`) the traced allocator made, in order, each at the
    /// address the driver returned (PyTorch snapshots' `segment_alloc` entries). A best-fit
    /// allocator breaks ties between cached blocks of one size by address, so where the
    /// driver put each segment decides which block a request splits: a replay places its own
    /// device allocations of the same sizes at these addresses. Empty where the producer did
    /// not record them.
    pub device_allocations: Vec<DeviceAllocation>,
}

/// A device allocation a traced allocator made: see [`Trace::device_allocations`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAllocation {
    /// The address the driver returned.
    pub address: u64,
    /// Bytes asked of the driver.
    pub size: u64,
}

/// A segment (device allocation) that existed when a trace's recording began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InitialSegment {
    /// Base address, in the trace's addresses.
    pub address: u64,
    /// Bytes reserved from the device (PyTorch's `total_size`).
    pub size: u64,
    /// Stream the segment serves, and the stream of its blocks' allocs.
    pub stream: u64,
    /// The pool the segment serves (PyTorch's small or large pool).
    pub pool: SegmentType,
    /// Whether it is a mapped range of an expandable segment.
    pub expandable: bool,
    /// The blocks live in it when recording began, in address order.
    pub blocks: Vec<InitialBlock>,
}

/// A block that was live in an [`InitialSegment`] when recording began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitialBlock {
    /// Start address, in the trace's addresses (the address its alloc and free name).
    pub address: u64,
    /// Bytes the caller asked for: the size of its alloc among the first events.
    pub requested: u64,
    /// Bytes the block occupied in its segment, when the source recorded them; otherwise a
    /// replaying policy rounds `requested` as it would have.
    pub size: Option<u64>,
}

impl InitialBlock {
    /// The bytes the block surely occupies: its recorded size, or at least its request.
    pub fn extent(&self) -> u64 {
        self.size.unwrap_or(self.requested)
    }
}

/// Aggregate numbers of a trace, for reports and sanity checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceSummary {
    /// Number of events of every kind.
    pub events: usize,
    /// Number of [`Event::Alloc`].
    pub allocs: u64,
    /// Number of [`Event::Free`].
    pub frees: u64,
    /// Number of [`Event::Step`].
    pub steps: u64,
    /// Highest sum of live block sizes at any point.
    pub peak_live_bytes: u64,
    /// Sum of the sizes of the blocks still live after the last event.
    pub live_bytes_at_end: u64,
    /// Number of blocks still live after the last event.
    pub live_blocks_at_end: u64,
    /// Size of the largest single allocation.
    pub largest_alloc: u64,
}

/// Why an event cannot follow the events before it.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum Violation {
    /// A free of an address that holds no live block (never allocated, or already freed).
    #[error("free of address {addr:#x}, which is not live")]
    FreeOfNonLive {
        /// The address freed.
        addr: u64,
    },
    /// An allocation at an address that still holds a live block.
    #[error("alloc at address {addr:#x}, which is already live")]
    AllocOfLive {
        /// The address allocated.
        addr: u64,
    },
    /// A free that states a size different from the size its block was allocated with.
    #[error("free of address {addr:#x} states size {stated}, but the block was allocated with size {allocated}")]
    FreeSizeMismatch {
        /// The address freed.
        addr: u64,
        /// The size written on the free.
        stated: u64,
        /// The size of the allocation being freed.
        allocated: u64,
    },
    /// An initial segment that is empty, or that overlaps or precedes the one before it.
    #[error(
        "initial segment at {addr:#x} is empty, or overlaps or precedes the segment before it"
    )]
    InitialSegmentOverlap {
        /// The segment's address.
        addr: u64,
    },
    /// An initial block outside its segment, or that overlaps or precedes the block before it.
    #[error("initial block at {addr:#x} lies outside its segment at {segment:#x}, or overlaps or precedes the block before it")]
    InitialBlockMisplaced {
        /// The block's address.
        addr: u64,
        /// The address of the segment it is listed in.
        segment: u64,
    },
    /// An initial block that asks for no bytes, or whose recorded size is below its request.
    #[error("initial block at {addr:#x} requests no bytes, or occupies fewer than it requests")]
    InitialBlockSize {
        /// The block's address.
        addr: u64,
    },
    /// An initial segment at address 0, the null pointer, where no device allocation is: a
    /// replay placing it there would take its blocks' frees for frees of null.
    #[error(
        "initial segment at address 0: that is the null pointer, which no device allocation has"
    )]
    InitialSegmentAtNull,
    /// A device allocation ([`Trace::device_allocations`]) at address 0, the null pointer.
    #[error("device allocation {position} (of {size} bytes) at address 0: that is the null pointer, which no device allocation has")]
    DeviceAllocationAtNull {
        /// Its position in [`Trace::device_allocations`].
        position: usize,
        /// Its size.
        size: u64,
    },
    /// The event where an initial block's alloc belongs is not that alloc.
    #[error("initial block at {addr:#x}: this event should be its alloc (its address, requested size and its segment's stream)")]
    InitialAllocMissing {
        /// The block's address.
        addr: u64,
    },
}

/// An invalid event found by [`Trace::validate`], with its position.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error("event {index}: {violation}")]
pub struct ValidationError {
    /// Index of the offending event in [`Trace::events`]; for a fault of
    /// [`Trace::initial_segments`], the index of the alloc of the block at fault, or of the
    /// first block of the segment at fault (where its allocs begin).
    pub index: usize,
    /// What is wrong with it.
    pub violation: Violation,
}

impl Trace {
    /// A trace from its parts.
    pub fn new(meta: TraceMeta, events: Vec<Event>) -> Self {
        Self {
            meta,
            events,
            stacks: Stacks::default(),
            alloc_stacks: Vec::new(),
            initial_segments: Vec::new(),
            device_allocations: Vec::new(),
        }
    }

    /// How many of the first events allocate the blocks of [`Trace::initial_segments`]: the
    /// number of those blocks.
    pub fn initial_allocs(&self) -> usize {
        self.initial_segments.iter().map(|s| s.blocks.len()).sum()
    }

    /// The stack of the `ordinal`-th [`Event::Alloc`] (counting allocs only, from 0), if the
    /// trace recorded one.
    pub fn alloc_stack(&self, ordinal: usize) -> Option<StackId> {
        self.alloc_stacks.get(ordinal).copied().flatten()
    }

    /// Counts, peak live bytes and what is left live at the end.
    ///
    /// Works on invalid traces too: a free of a non-live address releases nothing and an
    /// alloc of a live address is counted but does not replace the live block.
    pub fn summary(&self) -> TraceSummary {
        let mut live = LiveBlocks::default();
        let mut summary = TraceSummary {
            events: self.events.len(),
            ..TraceSummary::default()
        };
        for event in &self.events {
            match *event {
                Event::Alloc { size, .. } => {
                    summary.allocs += 1;
                    summary.largest_alloc = summary.largest_alloc.max(size);
                }
                Event::Free { .. } => summary.frees += 1,
                Event::Step { .. } => summary.steps += 1,
            }
            // Invalid events are skipped on purpose: the summary describes what is there.
            let _ = live.apply(event);
            summary.peak_live_bytes = summary.peak_live_bytes.max(live.live_bytes());
        }
        summary.live_bytes_at_end = live.live_bytes();
        summary.live_blocks_at_end = live.live_blocks() as u64;
        summary
    }

    /// Checks that every free releases a live address and no alloc reuses a live one, and
    /// that [`Trace::initial_segments`] are laid out without overlaps, their blocks inside
    /// them and allocated, in order, by the first events.
    ///
    /// Returns the first offending event. Readers only return traces that pass this check.
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.validate_initial_segments()?;
        self.validate_device_allocations()?;
        let mut live = LiveBlocks::default();
        for (index, event) in self.events.iter().enumerate() {
            live.apply(event)
                .map_err(|violation| ValidationError { index, violation })?;
        }
        Ok(())
    }

    /// The part of [`Trace::validate`] about [`Trace::device_allocations`]: none at address
    /// 0, the null pointer (a replay hands those addresses out as device pointers). The
    /// error's index is 0: the fault is no event's.
    pub fn validate_device_allocations(&self) -> Result<(), ValidationError> {
        match self
            .device_allocations
            .iter()
            .position(|allocation| allocation.address == 0)
        {
            Some(position) => Err(ValidationError {
                index: 0,
                violation: Violation::DeviceAllocationAtNull {
                    position,
                    size: self.device_allocations[position].size,
                },
            }),
            None => Ok(()),
        }
    }

    /// The part of [`Trace::validate`] about [`Trace::initial_segments`]: none at address 0
    /// (the null pointer), laid out without overlaps, their blocks inside them, and the first
    /// events their blocks' allocs, in order. Costs one step per initial block, not per event.
    pub fn validate_initial_segments(&self) -> Result<(), ValidationError> {
        let mut index = 0;
        let mut segment_end = 0;
        for (position, segment) in self.initial_segments.iter().enumerate() {
            let fault = move |violation| ValidationError { index, violation };
            if segment.address == 0 {
                return Err(fault(Violation::InitialSegmentAtNull));
            }
            let end = segment.address.checked_add(segment.size);
            let after_previous = position == 0 || segment.address >= segment_end;
            let Some(end) = end.filter(|_| segment.size > 0 && after_previous) else {
                return Err(fault(Violation::InitialSegmentOverlap {
                    addr: segment.address,
                }));
            };
            segment_end = end;
            let mut free_from = segment.address;
            for block in &segment.blocks {
                let fault = move |violation| ValidationError { index, violation };
                if block.requested == 0 || block.size.is_some_and(|size| size < block.requested) {
                    return Err(fault(Violation::InitialBlockSize {
                        addr: block.address,
                    }));
                }
                let block_end = block.address.checked_add(block.extent());
                if block.address < free_from || block_end.is_none_or(|block_end| block_end > end) {
                    return Err(fault(Violation::InitialBlockMisplaced {
                        addr: block.address,
                        segment: segment.address,
                    }));
                }
                free_from = block_end.unwrap_or(end);
                let alloc = Event::Alloc {
                    addr: block.address,
                    size: block.requested,
                    stream: segment.stream,
                };
                if self.events.get(index) != Some(&alloc) {
                    return Err(fault(Violation::InitialAllocMissing {
                        addr: block.address,
                    }));
                }
                index += 1;
            }
        }
        Ok(())
    }
}

/// The set of live blocks while walking a trace: address → size, and their byte total.
///
/// Shared by validation, the summary, the readers (which reject invalid events as they read
/// them) and the writers that need a free's size.
#[derive(Debug, Default)]
pub(crate) struct LiveBlocks {
    sizes: HashMap<u64, u64>,
    /// Exact even for absurd inputs (sizes near `u64::MAX`), so no reader can overflow.
    live_bytes: u128,
}

impl LiveBlocks {
    /// Records an allocation; fails if `addr` is live.
    pub(crate) fn alloc(&mut self, addr: u64, size: u64) -> Result<(), Violation> {
        match self.sizes.entry(addr) {
            std::collections::hash_map::Entry::Occupied(_) => Err(Violation::AllocOfLive { addr }),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(size);
                self.live_bytes += u128::from(size);
                Ok(())
            }
        }
    }

    /// Records a free and returns the size the block was allocated with; fails if `addr`
    /// is not live.
    pub(crate) fn free(&mut self, addr: u64) -> Result<u64, Violation> {
        let size = self
            .sizes
            .remove(&addr)
            .ok_or(Violation::FreeOfNonLive { addr })?;
        self.live_bytes -= u128::from(size);
        Ok(size)
    }

    /// Like [`free`](Self::free), but also checks the size a source wrote on the free.
    pub(crate) fn free_sized(&mut self, addr: u64, stated: Option<u64>) -> Result<u64, Violation> {
        let allocated = *self
            .sizes
            .get(&addr)
            .ok_or(Violation::FreeOfNonLive { addr })?;
        if let Some(stated) = stated.filter(|&stated| stated != allocated) {
            return Err(Violation::FreeSizeMismatch {
                addr,
                stated,
                allocated,
            });
        }
        self.free(addr)
    }

    /// Applies any event (steps change nothing).
    pub(crate) fn apply(&mut self, event: &Event) -> Result<(), Violation> {
        match *event {
            Event::Alloc { addr, size, .. } => self.alloc(addr, size),
            Event::Free { addr, .. } => self.free(addr).map(drop),
            Event::Step { .. } => Ok(()),
        }
    }

    /// Sum of the sizes of the live blocks (saturating at `u64::MAX`).
    pub(crate) fn live_bytes(&self) -> u64 {
        u64::try_from(self.live_bytes).unwrap_or(u64::MAX)
    }

    /// Number of live blocks.
    pub(crate) fn live_blocks(&self) -> usize {
        self.sizes.len()
    }
}

/// The sum of byte counts, saturating at `u64::MAX` (inputs may be absurd; sums must not
/// overflow).
pub(crate) fn saturating_sum(values: impl IntoIterator<Item = u64>) -> u64 {
    values.into_iter().fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(addr: u64, size: u64) -> Event {
        Event::Alloc {
            addr,
            size,
            stream: 0,
        }
    }

    fn free(addr: u64) -> Event {
        Event::Free { addr, stream: 0 }
    }

    #[test]
    fn summary_tracks_peak_and_what_is_left() {
        let trace = Trace::new(
            TraceMeta::default(),
            vec![
                Event::Step { index: 0 },
                alloc(0x1000, 100),
                alloc(0x2000, 300),
                free(0x1000),
                alloc(0x1000, 50),
                Event::Step { index: 1 },
                free(0x2000),
            ],
        );
        assert_eq!(
            trace.summary(),
            TraceSummary {
                events: 7,
                allocs: 3,
                frees: 2,
                steps: 2,
                peak_live_bytes: 400,
                live_bytes_at_end: 50,
                live_blocks_at_end: 1,
                largest_alloc: 300,
            }
        );
        assert_eq!(trace.validate(), Ok(()));
    }

    #[test]
    fn validate_reports_free_of_non_live_with_index() {
        let trace = Trace::new(TraceMeta::default(), vec![alloc(1, 8), free(1), free(1)]);
        assert_eq!(
            trace.validate(),
            Err(ValidationError {
                index: 2,
                violation: Violation::FreeOfNonLive { addr: 1 }
            })
        );
    }

    #[test]
    fn validate_reports_alloc_of_live_with_index() {
        let trace = Trace::new(
            TraceMeta::default(),
            vec![alloc(7, 8), Event::Step { index: 0 }, alloc(7, 16)],
        );
        let error = trace.validate().unwrap_err();
        assert_eq!(error.index, 2);
        assert_eq!(error.violation, Violation::AllocOfLive { addr: 7 });
        assert_eq!(
            error.to_string(),
            "event 2: alloc at address 0x7, which is already live"
        );
    }

    #[test]
    fn summary_of_invalid_trace_ignores_bad_events() {
        let trace = Trace::new(
            TraceMeta::default(),
            vec![free(5), alloc(1, 10), alloc(1, 20)],
        );
        let summary = trace.summary();
        assert_eq!(summary.peak_live_bytes, 10);
        assert_eq!(summary.allocs, 2);
        assert_eq!(summary.frees, 1);
    }

    #[test]
    fn absurd_sizes_saturate_instead_of_overflowing() {
        let trace = Trace::new(
            TraceMeta::default(),
            vec![alloc(1, u64::MAX), alloc(2, u64::MAX), free(1)],
        );
        let summary = trace.summary();
        assert_eq!(summary.peak_live_bytes, u64::MAX);
        assert_eq!(summary.live_bytes_at_end, u64::MAX);
    }

    #[test]
    fn free_sized_checks_the_stated_size() {
        let mut live = LiveBlocks::default();
        live.alloc(0x40, 64).unwrap();
        assert_eq!(
            live.free_sized(0x40, Some(32)),
            Err(Violation::FreeSizeMismatch {
                addr: 0x40,
                stated: 32,
                allocated: 64
            })
        );
        assert_eq!(live.live_blocks(), 1);
        assert_eq!(live.free_sized(0x40, Some(64)), Ok(64));
        assert_eq!(live.live_bytes(), 0);
    }
}
