//! A generated PyTorch memory snapshot of any size, pickled the way PyTorch's snapshot is
//! pickled (`torch.cuda.memory._dump_snapshot`: Python's pickler, protocol 4), for measuring
//! snapshot readers on files as large as real jobs write.
//!
//! The layout follows `_cuda_memorySnapshot` (PyTorch 2.x): `segments` (with `frames` and
//! `blocks`), `device_traces` (one list per device; here device 0 records and device 1 is
//! empty) whose entries carry `action`, `addr`, `size`, `stream`, `time_us`, `frames`,
//! `compile_context` and `user_metadata`, and `allocator_settings`. As in PyTorch, the frame
//! dicts are shared objects (each is written once, then referenced by memo id), a block shares
//! its `frames` list with its `alloc` entry, the dict keys, action names and the empty string
//! are shared strings, and `compile_context` is a new string in every entry. The writer follows
//! Python's pickler: `FRAME`s of about 64 KiB, `MEMOIZE` after every string, dict, list and
//! tuple, `SETITEMS`/`APPENDS` in batches of 1000, the smallest integer opcode that fits.
//!
//! The trace is a training loop's: persistent blocks (weights) allocated first and never freed
//! (they are the segments' blocks at snapshot time), then a working set of about 2000 live
//! blocks of mixed sizes allocated and freed at random (fixed seed); each free is a
//! `free_requested` and a `free_completed` entry; every entry has its own stack of 24–48
//! frames drawn from 3000 distinct frames.

use std::collections::HashMap;
use std::io::{self, Write};

use gpumem_testkit::Rng;

/// What [`write_snapshot`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GeneratedSnapshot {
    /// Bytes of pickle written.
    pub bytes: u64,
    /// Entries in `device_traces[0]`.
    pub entries: u64,
    /// Block events a reader makes of them (`alloc` and `free_completed`).
    pub events: u64,
    /// The most bytes live at once.
    pub peak_live_bytes: u64,
    /// Bytes still live at the end (the persistent blocks).
    pub live_bytes_at_end: u64,
}

/// Persistent blocks (allocated first, never freed).
const PERSISTENT_BLOCKS: usize = 256;
/// Persistent blocks per segment.
const BLOCKS_PER_SEGMENT: usize = 8;
/// Distinct frames.
const FRAMES: usize = 3000;
/// Distinct stacks entries draw from.
const STACKS: usize = 4096;
/// Address space of one block (blocks are at most 64 MiB).
const SLOT_BYTES: u64 = 128 << 20;
const BASE_ADDRESS: u64 = 0x7f00_0000_0000;
const START_TIME_US: u64 = 1_732_233_600_000_000;

/// Whether the snapshot records stack frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stacks {
    /// Every segment, block and entry has its frames, as with
    /// `_record_memory_history(stacks="python")`.
    Recorded,
    /// Empty `frames` lists, as with `_record_memory_history(context=None)`.
    None,
}

/// Writes a snapshot of at least `target_bytes` bytes of pickle (it stops at the first batch
/// of entries past it, then frees the working set) to `out`; the same `seed` writes the same
/// file.
pub fn write_snapshot(
    out: impl Write,
    target_bytes: u64,
    seed: u64,
    stacks_recorded: Stacks,
) -> io::Result<GeneratedSnapshot> {
    let mut random = Rng::new(seed);
    let frames: Vec<Frame> = (0..FRAMES)
        .map(|index| Frame {
            filename: format!(
                "/usr/lib/python3.11/site-packages/torch/nn/modules/module_{}.py",
                index % 97
            ),
            name: format!("forward_{index}"),
            line: (index * 7 % 1000) as u64,
        })
        .collect();
    let stacks: Vec<Vec<usize>> = (0..STACKS)
        .map(|_| {
            let depth = match stacks_recorded {
                Stacks::Recorded => 24 + random.below(25) as usize,
                Stacks::None => 0,
            };
            // Outer frames are shared by most stacks, inner ones vary, as in a real model.
            (0..depth)
                .map(|level| match level {
                    0..8 => level,
                    _ => random.below(FRAMES as u64) as usize,
                })
                .collect()
        })
        .collect();

    let mut pickle = Pickler::new(out);
    let mut generated = GeneratedSnapshot::default();
    let mut trace = TraceState::default();

    // The persistent blocks, allocated first: the entries come before the segments in time,
    // but the segments come first in the file.
    let persistent: Vec<(u64, u64, usize)> = (0..PERSISTENT_BLOCKS)
        .map(|_| {
            let size = 512 << random.below(18);
            let slot = trace.take_slot();
            (slot, size, random.below(STACKS as u64) as usize)
        })
        .collect();

    pickle.empty_dict();
    pickle.mark();
    // segments
    pickle.key("segments");
    pickle.empty_list();
    let mut block_frames: HashMap<u64, u32> = HashMap::new();
    let segments: Vec<&[(u64, u64, usize)]> = persistent.chunks(BLOCKS_PER_SEGMENT).collect();
    pickle.batched(segments.len(), |pickle, index| {
        let blocks = segments[index];
        let total: u64 = blocks.iter().map(|&(_, size, _)| size).sum();
        pickle.empty_dict();
        pickle.mark();
        pickle.key("device");
        pickle.int(0);
        pickle.key("address");
        pickle.int(blocks[0].0 as i64);
        pickle.key("total_size");
        pickle.int((SLOT_BYTES * blocks.len() as u64) as i64);
        for name in ["allocated_size", "active_size", "requested_size"] {
            pickle.key(name);
            pickle.int(total as i64);
        }
        pickle.key("stream");
        pickle.int(0);
        pickle.key("segment_type");
        pickle.shared_str("large");
        pickle.key("segment_pool_id");
        pickle.int(0);
        pickle.int(0);
        pickle.op(&[0x86]);
        pickle.memoize();
        pickle.key("is_expandable");
        pickle.op(&[0x89]);
        pickle.key("frames");
        pickle.empty_list();
        pickle.key("blocks");
        pickle.empty_list();
        pickle.batched(blocks.len(), |pickle, index| {
            let (address, size, stack) = blocks[index];
            pickle.empty_dict();
            pickle.mark();
            pickle.key("address");
            pickle.int(address as i64);
            pickle.key("size");
            pickle.int(size as i64);
            pickle.key("requested_size");
            pickle.int(size as i64);
            pickle.key("state");
            pickle.shared_str("active_allocated");
            pickle.key("frames");
            let id = pickle.stack(&stacks[stack], &frames);
            block_frames.insert(address, id);
            pickle.op(b"u");
        });
        pickle.op(b"u");
    });

    // device_traces
    pickle.key("device_traces");
    pickle.empty_list();
    pickle.mark();
    pickle.empty_list();
    let mut pending: Vec<Entry> = persistent
        .iter()
        .map(|&(addr, size, stack)| Entry {
            action: "alloc",
            addr,
            size,
            stack,
            shared_frames: block_frames.get(&addr).copied(),
        })
        .collect();
    loop {
        while pending.len() < 1000 {
            trace.next_entries(&mut random, &mut pending);
        }
        let batch: Vec<Entry> = pending.drain(..1000).collect();
        write_entries(
            &mut pickle,
            &batch,
            &stacks,
            &frames,
            &mut trace,
            &mut generated,
        );
        if pickle.written >= target_bytes {
            break;
        }
    }
    pending.extend(trace.drain());
    for chunk in pending.chunks(1000) {
        write_entries(
            &mut pickle,
            chunk,
            &stacks,
            &frames,
            &mut trace,
            &mut generated,
        );
    }
    pickle.empty_list(); // device 1 recorded nothing
    pickle.op(b"e");

    pickle.key("allocator_settings");
    pickle.empty_dict();
    pickle.mark();
    pickle.key("PYTORCH_CUDA_ALLOC_CONF");
    pickle.new_str("");
    pickle.key("max_split_size");
    pickle.int(-1);
    pickle.key("garbage_collection_threshold");
    pickle.op(b"G");
    pickle.op(&0.0f64.to_be_bytes());
    pickle.key("expandable_segments");
    pickle.op(&[0x89]);
    pickle.key("roundup_power2_divisions");
    pickle.empty_dict();
    pickle.op(b"u");
    pickle.op(b"u");
    pickle.op(b".");
    generated.bytes = pickle.finish()?;
    generated.live_bytes_at_end = trace.live_bytes;
    Ok(generated)
}

/// One frame of a stack.
struct Frame {
    filename: String,
    name: String,
    line: u64,
}

/// One trace entry to write.
struct Entry {
    action: &'static str,
    addr: u64,
    size: u64,
    stack: usize,
    /// The memo id of a `frames` list already written (a block's, shared with its alloc).
    shared_frames: Option<u32>,
}

/// Writes a batch of entries (at most 1000) of a device's trace list: they go in one
/// `APPENDS` (one `APPEND` when alone), as Python batches them.
fn write_entries(
    pickle: &mut Pickler<impl Write>,
    batch: &[Entry],
    stacks: &[Vec<usize>],
    frames: &[Frame],
    trace: &mut TraceState,
    generated: &mut GeneratedSnapshot,
) {
    if batch.len() > 1 {
        pickle.mark();
    }
    for entry in batch {
        trace.time_us += 1 + entry.size / 4096 % 50;
        trace.record(entry, generated);
        pickle.empty_dict();
        pickle.mark();
        pickle.key("action");
        pickle.shared_str(entry.action);
        pickle.key("addr");
        pickle.int(entry.addr as i64);
        pickle.key("size");
        pickle.int(entry.size as i64);
        pickle.key("stream");
        pickle.int(0);
        pickle.key("time_us");
        pickle.int((START_TIME_US + trace.time_us) as i64);
        pickle.key("frames");
        match entry.shared_frames {
            Some(id) => pickle.get(id),
            None => {
                pickle.stack(&stacks[entry.stack], frames);
            }
        }
        pickle.key("compile_context");
        pickle.new_str("N/A");
        pickle.key("user_metadata");
        // CPython's empty string is one object: written once, then referenced.
        pickle.shared_str("");
        pickle.op(b"u");
        pickle.boundary();
    }
    pickle.op(if batch.len() > 1 { b"e" } else { b"a" });
}

/// The simulated allocator state behind the entries.
#[derive(Default)]
struct TraceState {
    /// Live working-set blocks: address, size, stack.
    live: Vec<(u64, u64, usize)>,
    free_slots: Vec<u64>,
    next_slot: u64,
    live_bytes: u64,
    time_us: u64,
}

impl TraceState {
    fn take_slot(&mut self) -> u64 {
        self.free_slots.pop().unwrap_or_else(|| {
            self.next_slot += 1;
            BASE_ADDRESS + (self.next_slot - 1) * SLOT_BYTES
        })
    }

    /// Appends the entries of the next alloc or free of the working set.
    fn next_entries(&mut self, random: &mut Rng, out: &mut Vec<Entry>) {
        let stack = random.below(STACKS as u64) as usize;
        if self.live.len() < 1000 || (self.live.len() < 3000 && random.below(2) == 0) {
            let size = 512 << random.below(17);
            let addr = self.take_slot();
            self.live.push((addr, size, stack));
            out.push(entry("alloc", addr, size, stack));
        } else {
            let index = random.below(self.live.len() as u64) as usize;
            let (addr, size, _) = self.live.swap_remove(index);
            self.free_slots.push(addr);
            out.push(entry("free_requested", addr, size, stack));
            out.push(entry("free_completed", addr, size, stack));
        }
    }

    /// The frees of the whole working set.
    fn drain(&mut self) -> Vec<Entry> {
        self.live
            .drain(..)
            .flat_map(|(addr, size, stack)| {
                [
                    entry("free_requested", addr, size, stack),
                    entry("free_completed", addr, size, stack),
                ]
            })
            .collect()
    }

    /// Counts an entry as written.
    fn record(&mut self, entry: &Entry, generated: &mut GeneratedSnapshot) {
        generated.entries += 1;
        match entry.action {
            "alloc" => {
                generated.events += 1;
                self.live_bytes += entry.size;
                generated.peak_live_bytes = generated.peak_live_bytes.max(self.live_bytes);
            }
            "free_completed" => {
                generated.events += 1;
                self.live_bytes -= entry.size;
            }
            _ => {}
        }
    }
}

fn entry(action: &'static str, addr: u64, size: u64, stack: usize) -> Entry {
    Entry {
        action,
        addr,
        size,
        stack,
        shared_frames: None,
    }
}

/// Python's pickler (protocol 4), for the values a snapshot holds.
struct Pickler<W> {
    out: W,
    /// The current frame.
    frame: Vec<u8>,
    written: u64,
    next_memo: u32,
    /// Memo ids of the shared strings (dict keys, action names).
    strings: HashMap<&'static str, u32>,
    /// Memo ids of the frame dicts written so far.
    frame_ids: HashMap<usize, u32>,
    error: Option<io::Error>,
}

/// Python's frame size target.
const FRAME_TARGET: usize = 64 << 10;

impl<W: Write> Pickler<W> {
    /// A pickler whose first frame follows the protocol opcode (PROTO 4), as in Python.
    fn new(out: W) -> Self {
        let mut frame = Vec::with_capacity(2 * FRAME_TARGET);
        frame.extend_from_slice(&[0x80, 4]);
        Self {
            out,
            frame,
            written: 0,
            next_memo: 0,
            strings: HashMap::new(),
            frame_ids: HashMap::new(),
            error: None,
        }
    }

    fn op(&mut self, bytes: &[u8]) {
        self.frame.extend_from_slice(bytes);
    }

    fn mark(&mut self) {
        self.op(b"(");
    }

    /// Ends a frame once it holds the target size (Python checks between values).
    fn boundary(&mut self) {
        if self.frame.len() >= FRAME_TARGET {
            self.flush_frame();
        }
    }

    fn flush_frame(&mut self) {
        if self.frame.is_empty() || self.error.is_some() {
            return;
        }
        // The first "frame" is the protocol opcode alone, written outside any frame.
        let (head, body) = match self.written {
            0 => self.frame.split_at(2),
            _ => self.frame.split_at(0),
        };
        let mut header = [0x95; 9];
        header[1..].copy_from_slice(&(body.len() as u64).to_le_bytes());
        let result = self
            .out
            .write_all(head)
            .and_then(|()| self.out.write_all(&header))
            .and_then(|()| self.out.write_all(body));
        if let Err(error) = result {
            self.error = Some(error);
        }
        self.written += (head.len() + header.len() + body.len()) as u64;
        self.frame.clear();
    }

    /// Writes the last frame; returns the bytes written in all.
    fn finish(mut self) -> io::Result<u64> {
        self.flush_frame();
        match self.error.take() {
            Some(error) => Err(error),
            None => self.out.flush().map(|()| self.written),
        }
    }

    fn memoize(&mut self) -> u32 {
        self.op(&[0x94]);
        self.next_memo += 1;
        self.next_memo - 1
    }

    fn get(&mut self, id: u32) {
        match u8::try_from(id) {
            Ok(small) => self.op(&[b'h', small]),
            Err(_) => {
                self.op(b"j");
                self.op(&id.to_le_bytes());
            }
        }
    }

    fn empty_dict(&mut self) -> u32 {
        self.op(b"}");
        self.memoize()
    }

    fn empty_list(&mut self) -> u32 {
        self.op(b"]");
        self.memoize()
    }

    /// A string object written (and memoised) anew.
    fn new_str(&mut self, text: &str) -> u32 {
        match u8::try_from(text.len()) {
            Ok(length) => self.op(&[0x8c, length]),
            Err(_) => {
                self.op(b"X");
                self.op(&(text.len() as u32).to_le_bytes());
            }
        }
        self.op(text.as_bytes());
        self.memoize()
    }

    /// A string object shared throughout the snapshot: written once, then referenced.
    fn shared_str(&mut self, text: &'static str) {
        match self.strings.get(text) {
            Some(&id) => self.get(id),
            None => {
                let id = self.new_str(text);
                self.strings.insert(text, id);
            }
        }
    }

    fn key(&mut self, name: &'static str) {
        self.shared_str(name);
    }

    /// The smallest of Python's integer encodings that holds `value`.
    fn int(&mut self, value: i64) {
        match value {
            0..=0xff => self.op(&[b'K', value as u8]),
            0x100..=0xffff => {
                self.op(b"M");
                self.op(&(value as u16).to_le_bytes());
            }
            _ if i32::try_from(value).is_ok() => {
                self.op(b"J");
                self.op(&(value as i32).to_le_bytes());
            }
            _ => {
                // LONG1: two's complement, little-endian, as few bytes as keep the sign.
                let bytes = value.to_le_bytes();
                let mut length = 8;
                while length > 1 {
                    let top = bytes[length - 1];
                    let next_sign = bytes[length - 2] & 0x80;
                    if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                        length -= 1;
                    } else {
                        break;
                    }
                }
                self.op(&[0x8a, length as u8]);
                self.op(&bytes[..length]);
            }
        }
    }

    /// Items of a list just opened, in Python's batches of 1000.
    fn batched(&mut self, count: usize, mut item: impl FnMut(&mut Self, usize)) {
        for start in (0..count).step_by(1000) {
            let end = (start + 1000).min(count);
            if end - start > 1 {
                self.mark();
            }
            for index in start..end {
                item(self, index);
                self.boundary();
            }
            self.op(if end - start > 1 { b"e" } else { b"a" });
        }
    }

    /// A new `frames` list of the frame dicts of `stack`; returns its memo id.
    fn stack(&mut self, stack: &[usize], frames: &[Frame]) -> u32 {
        let id = self.empty_list();
        self.batched(stack.len(), |pickle, index| {
            let frame = stack[index];
            match pickle.frame_ids.get(&frame) {
                Some(&id) => pickle.get(id),
                None => {
                    let id = pickle.empty_dict();
                    pickle.mark();
                    pickle.key("name");
                    pickle.new_str(&frames[frame].name);
                    pickle.key("filename");
                    pickle.new_str(&frames[frame].filename);
                    pickle.key("line");
                    pickle.int(frames[frame].line as i64);
                    pickle.op(b"u");
                    pickle.frame_ids.insert(frame, id);
                }
            }
        });
        id
    }
}
