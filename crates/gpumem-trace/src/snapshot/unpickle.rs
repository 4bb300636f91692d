//! A streaming, restricted unpickler for memory snapshots: protocols 0–5, plain data only.
//!
//! Why not serde-pickle: it loads the whole file and builds the whole tree (a snapshot of a
//! real job is gigabytes), it miscounts references into shared memoised containers (PyTorch
//! shares `frames` lists and frame dicts between blocks and events, which it reports as
//! "recursive"), and it recurses (and overflows the stack) on deeply nested input.
//!
//! Here the input is read through a fixed buffer and the snapshot's two long lists are never
//! built: each segment of `segments` and each entry of `device_traces[d]` is decoded and handed
//! to a [`SnapshotSink`] as soon as it is appended to its list (PyTorch's pickler, like every
//! pickler, appends in batches of at most 1000), and the parts gpumem does not read (unknown
//! keys, `cpp_frames`) are parsed but not built. `frames` are interned in the sink's stacks
//! as they complete: a frame dict when it is appended to its list, a `frames` list when it is
//! set in its entry or block, so an entry holds a 4-byte stack id. Which part of the snapshot a new container is
//! (its [`Role`]) follows from where it is created: the container its items go to, and the key
//! it sits under. The memo keeps only strings (not those in skipped parts or under keys gpumem
//! does not read, which PyTorch writes anew for every entry), the small free-form
//! containers, and (interned, so a few bytes each, and up to a bound) the frame dicts and
//! `frames` lists, which PyTorch shares (a block's list with its alloc entry); a memo reference to anything else reads as [`Value::NotKept`], which is an
//! error only where the reader needs the value. So memory follows the trace being built, not
//! the file. Building is iterative, and only plain data is accepted (no
//! globals, no object construction), so any input ends in the sink's result or an error
//! naming the byte offset. Containers nested deeper than [`MAX_NESTING`] are refused where the
//! limit is passed: nothing here recurses, but no snapshot is that deep, and a clear error
//! beats a puzzling one about the top level's shape.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::io::{ErrorKind, Read};
use std::rc::Rc;

use super::decode::{self, Path};
use super::document::{ContainerArena, Dict, Document, Value, MAX_NESTING};
use super::SnapshotSink;
use crate::error::{ReadError, SnapshotEncoding};
use crate::text::{excerpt, MAX_LINE_BYTES};

/// Decodes a snapshot pickle from `reader`, handing its segments and trace entries to `sink`
/// as they are read, and returns the rest of the document (the top-level dict, whose
/// `segments` and `device_traces[d]` are [`Value::Streamed`]). Errors name the byte offset of
/// the offending opcode.
pub(crate) fn unpickle(
    reader: impl Read,
    sink: &mut dyn SnapshotSink,
) -> Result<Document, ReadError> {
    let mut unpickler = Unpickler::new(reader, sink);
    let root = unpickler.run()?;
    Ok(Document::new(root, unpickler.arena))
}

/// Why an opcode failed, before the offset is attached.
enum Fault {
    /// The reader failed.
    Io(std::io::Error),
    /// The pickle is malformed or not supported; the text says how.
    Bad(String),
    /// A decoded piece does not have the snapshot's shape (already a complete error).
    Shape(ReadError),
    /// A container would nest more than [`MAX_NESTING`] deep.
    TooDeep,
}

impl From<String> for Fault {
    fn from(detail: String) -> Self {
        Self::Bad(detail)
    }
}

impl From<&str> for Fault {
    fn from(detail: &str) -> Self {
        Self::Bad(detail.to_owned())
    }
}

/// The result of one step of an opcode.
type Step<T> = Result<T, Fault>;

/// Bytes read from the underlying reader at a time.
const BUFFER_LEN: usize = 256 << 10;

/// The input: a buffer over the reader, which knows the offset of every byte.
struct Input<R> {
    reader: R,
    buffer: Vec<u8>,
    /// The next unread byte in `buffer`.
    start: usize,
    /// The end of the bytes read into `buffer`.
    end: usize,
    /// Input offset of `buffer[0]`.
    base: u64,
}

impl<R: Read> Input<R> {
    fn new(reader: R) -> Self {
        Self {
            reader,
            buffer: vec![0; BUFFER_LEN],
            start: 0,
            end: 0,
            base: 0,
        }
    }

    /// Input offset of the next unread byte.
    fn offset(&self) -> u64 {
        self.base + self.start as u64
    }

    /// The next byte, or `None` at the end of the input.
    fn next_byte(&mut self) -> Step<Option<u8>> {
        if self.start == self.end && !self.fill(1)? {
            return Ok(None);
        }
        let byte = self.buffer[self.start];
        self.start += 1;
        Ok(Some(byte))
    }

    /// The next `length` bytes.
    fn take(&mut self, length: usize) -> Step<&[u8]> {
        if self.end - self.start < length && !self.fill(length)? {
            return Err(Fault::Bad(format!(
                "needs {length} more bytes, but the input ends at byte {}",
                self.base + self.end as u64
            )));
        }
        let start = self.start;
        self.start += length;
        Ok(&self.buffer[start..start + length])
    }

    fn array<const N: usize>(&mut self) -> Step<[u8; N]> {
        let mut array = [0; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    /// The bytes up to the next newline (a text argument), without it.
    fn line(&mut self) -> Step<&[u8]> {
        let mut scanned = 0;
        loop {
            let unread = &self.buffer[self.start + scanned..self.end];
            if let Some(at) = unread.iter().position(|&byte| byte == b'\n') {
                let start = self.start;
                let length = scanned + at;
                self.start += length + 1;
                return Ok(&self.buffer[start..start + length]);
            }
            scanned = self.end - self.start;
            if scanned > MAX_LINE_BYTES {
                return Err(format!(
                    "a text argument longer than {MAX_LINE_BYTES} bytes, the most one may hold \
                     (a snapshot's are numbers and short names)"
                )
                .into());
            }
            if !self.fill(scanned + 1)? {
                return Err("a text argument without its newline: the input ends first".into());
            }
        }
    }

    /// Makes at least `wanted` unread bytes available; `false` if the input ends first. The
    /// buffer grows only as bytes arrive, so a length read from a corrupt file allocates no
    /// more than the file holds.
    fn fill(&mut self, wanted: usize) -> Step<bool> {
        self.buffer.copy_within(self.start..self.end, 0);
        self.base += self.start as u64;
        self.end -= self.start;
        self.start = 0;
        while self.end < wanted {
            if self.end == self.buffer.len() {
                let grown = self
                    .buffer
                    .len()
                    .saturating_mul(2)
                    .min(wanted.max(BUFFER_LEN));
                self.buffer.resize(grown, 0);
            }
            match self.reader.read(&mut self.buffer[self.end..]) {
                Ok(0) => return Ok(false),
                Ok(read) => self.end += read,
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) => return Err(Fault::Io(error)),
            }
        }
        Ok(true)
    }
}

/// What part of a snapshot a container is, which decides what becomes of it and of what it
/// holds (PyTorch's layout: `torch/csrc/cuda/Module.cpp`, `_cuda_memorySnapshot`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Not a container.
    Scalar,
    /// The top-level value (a dict in a snapshot).
    Root,
    /// `segments`: each segment is decoded and handed on when appended.
    Segments,
    /// A segment dict.
    Segment,
    /// A segment's `blocks`.
    Blocks,
    /// A block dict.
    Block,
    /// A legacy block's `history` (PyTorch 1.13).
    History,
    /// An entry of a block's history.
    HistoryEntry,
    /// `device_traces`: one list per device.
    DeviceTraces,
    /// `device_traces[d]`: each entry is decoded and handed on when appended.
    DeviceTrace(usize),
    /// A trace entry dict.
    Entry,
    /// Free-form data kept whole (`allocator_settings`, `segment_pool_id`), or a container
    /// whose place could not be told when it was created (built whole, read when placed).
    Kept,
    /// A `frames` list of a segment, block, history entry or trace entry; interned when set
    /// in its dict.
    Frames,
    /// A frame dict of a `frames` list; interned when appended to it.
    Frame,
    /// A part gpumem does not read (unknown keys): parsed, not built.
    Skipped,
}

/// Where a value goes in its container.
enum Slot<'a> {
    /// Under this key of a dict.
    Key(&'a str),
    /// At this index of a list.
    Index(usize),
}

/// Which kind of container a role is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dict,
    List,
}

impl Role {
    /// The role of a container at `slot` of a container of this role; `None` where this role
    /// has no such slot (a key of a list).
    fn child(self, slot: Slot<'_>) -> Option<Role> {
        use Role::*;
        Some(match (self, slot) {
            (Kept, _) | (Scalar, _) => Kept,
            (Skipped, _) => Skipped,
            (Root, Slot::Key("segments")) => Segments,
            (Root, Slot::Key("device_traces")) => DeviceTraces,
            (Root, Slot::Key("allocator_settings")) => Kept,
            (Root, Slot::Index(_)) => Kept,
            (Segment, Slot::Key("blocks")) => Blocks,
            (Segment, Slot::Key("segment_pool_id")) => Kept,
            (Block, Slot::Key("history")) => History,
            (Segment | Block | HistoryEntry | Entry, Slot::Key("frames")) => Frames,
            (Frames, Slot::Index(_)) => Frame,
            (Frame, Slot::Key(_)) => Skipped,
            (Root | Segment | Block | HistoryEntry | Entry, Slot::Key(_)) => Skipped,
            (Segments, Slot::Index(_)) => Segment,
            (Blocks, Slot::Index(_)) => Block,
            (History, Slot::Index(_)) => HistoryEntry,
            (DeviceTraces, Slot::Index(device)) => DeviceTrace(device),
            (DeviceTrace(_), Slot::Index(_)) => Entry,
            _ => return None,
        })
    }

    /// Whether a container of `kind` can play this role.
    fn accepts(self, kind: Kind) -> bool {
        use Role::*;
        match self {
            Root | Kept | Skipped => true,
            Segment | Block | HistoryEntry | Entry | Frame => kind == Kind::Dict,
            Segments | Blocks | History | DeviceTraces | DeviceTrace(_) | Frames => {
                kind == Kind::List
            }
            Scalar => false,
        }
    }

    /// How much of the snapshot depends on the role being right: a part gpumem reads beats a
    /// free-form one, which beats a skipped one.
    fn weight(self) -> u8 {
        match self {
            Role::Skipped | Role::Scalar => 0,
            Role::Kept => 1,
            _ => 2,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::DeviceTrace(device) => write!(f, "device_traces[{device}]"),
            other => write!(f, "{other:?}"),
        }
    }
}

/// A value on the unpickler's stack, with its role.
struct Item {
    value: Value,
    role: Role,
    /// How deep the value nests (a scalar 0, `[]` 1, `[[]]` 2), counting what was added to it
    /// on the stack; a memo reference counts as deep as its container was when memoised, so
    /// this may under-count a pickle that fills containers after memoising them (every
    /// pickler does), never over-count: a real snapshot is never refused.
    depth: u32,
}

impl Item {
    fn scalar(value: Value) -> Self {
        Self {
            value,
            role: Role::Scalar,
            depth: 0,
        }
    }

    /// Records that an item `child_depth` deep goes into this container, which is then at
    /// least one deeper; an error if that passes [`MAX_NESTING`].
    fn nest(&mut self, child_depth: u32) -> Step<()> {
        let depth = child_depth.saturating_add(1);
        if depth as usize > MAX_NESTING {
            return Err(Fault::TooDeep);
        }
        self.depth = self.depth.max(depth);
        Ok(())
    }

    /// The kind of container this is, if it is one that items can be added to.
    fn kind(&self) -> Option<Kind> {
        match (&self.value, self.role) {
            (_, Role::Scalar) => None,
            (Value::Dict(_), _) => Some(Kind::Dict),
            (Value::List(_) | Value::Streamed(_), _) => Some(Kind::List),
            // A skipped container is of either kind: what goes into it is skipped too.
            _ => None,
        }
    }
}

/// Memo ids that have been assigned, as sorted disjoint ranges (picklers number them densely,
/// so this is one range; the memo itself holds only what is kept).
#[derive(Default)]
struct IdSet {
    ranges: Vec<(u64, u64)>,
    count: u64,
}

impl IdSet {
    /// Adds `id`; `false` if it was there already.
    fn insert(&mut self, id: u64) -> bool {
        if let Some(last) = self.ranges.last_mut() {
            if last.1 == id {
                last.1 += 1;
                self.count += 1;
                return true;
            }
        }
        let at = self.ranges.partition_point(|&(_, end)| end < id);
        match self.ranges.get_mut(at) {
            Some(range) if range.0 <= id && id < range.1 => return false,
            Some(range) if range.1 == id => range.1 += 1,
            Some(range) if range.0 == id + 1 => range.0 = id,
            _ => self.ranges.insert(at, (id, id + 1)),
        }
        self.count += 1;
        // Two ranges may now touch.
        if at + 1 < self.ranges.len() && self.ranges[at].1 == self.ranges[at + 1].0 {
            self.ranges[at].1 = self.ranges[at + 1].1;
            self.ranges.remove(at + 1);
        }
        true
    }

    fn contains(&self, id: u64) -> bool {
        let at = self.ranges.partition_point(|&(_, end)| end <= id);
        self.ranges.get(at).is_some_and(|&(start, _)| start <= id)
    }
}

struct Unpickler<'s, R> {
    input: Input<R>,
    stack: Vec<Item>,
    marks: Vec<usize>,
    /// The memo's kept values (strings and free-form containers), by id.
    memo: HashMap<u64, Item>,
    /// Every id the pickle memoised, kept or not.
    memo_ids: IdSet,
    /// Short strings seen so far, shared rather than allocated again (dict keys repeat in
    /// every block and event; pickles not written by Python do not memoise them).
    strings: HashSet<Rc<str>>,
    /// The one-character strings memoised in places gpumem does not read.
    singletons: HashSet<Rc<str>>,
    /// How many frame dicts the memo keeps (at most [`KEPT_FRAMES_MAX`]).
    kept_frames: usize,
    /// How many `frames` lists the memo keeps (at most [`KEPT_STACKS_MAX`]).
    kept_stacks: usize,
    /// The memo ids of the trace entry dicts the memo keeps, oldest first (at most
    /// [`KEPT_ENTRIES_MAX`]), with the dicts, to tell whether the id still holds them.
    kept_entries: VecDeque<(u64, Dict)>,
    /// Owns the containers that can be reached again, so that cycles and deep nesting drop
    /// safely.
    arena: ContainerArena,
    sink: &'s mut dyn SnapshotSink,
}

/// Strings up to this length are shared through [`Unpickler::strings`]...
const SHARED_STRING_MAX: usize = 64;
/// ...up to this many of them (bounded: a snapshot may hold a distinct string per entry).
const SHARED_STRINGS_MAX: usize = 1 << 16;
/// The most frame dicts the memo keeps (PyTorch writes each distinct frame once and refers
/// to it after; a producer that memoises a new dict per frame would otherwise pile them up):
/// beyond, a reference to a frame reads as not kept and the frame is left out of its stack.
const KEPT_FRAMES_MAX: usize = 1 << 20;
/// The most `frames` lists the memo keeps: PyTorch shares a block's list with its alloc
/// entry (blocks come first, in `segments`), but writes a new list for every other entry, so
/// keeping them all would grow the memo with the trace; beyond, an entry whose `frames` is a
/// reference to an earlier list reads without a stack.
const KEPT_STACKS_MAX: usize = 1 << 14;
/// The most trace entry dicts the memo keeps: the latest ones. A pickle may put one entry
/// dict in a trace twice, or in two devices' traces (Python's pickler then writes a memo
/// reference the second time); PyTorch's own snapshots never do, but memoise every entry,
/// so keeping them all would grow the memo with the trace. A reference to an entry further
/// back is refused, saying so.
const KEPT_ENTRIES_MAX: usize = 1 << 14;

impl<'s, R: Read> Unpickler<'s, R> {
    /// An unpickler at the start of `reader`, handing streamed pieces to `sink`.
    fn new(reader: R, sink: &'s mut dyn SnapshotSink) -> Self {
        Unpickler {
            input: Input::new(reader),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            memo_ids: IdSet::default(),
            strings: HashSet::new(),
            singletons: HashSet::new(),
            kept_frames: 0,
            kept_stacks: 0,
            kept_entries: VecDeque::new(),
            arena: ContainerArena::default(),
            sink,
        }
    }

    fn run(&mut self) -> Result<Value, ReadError> {
        loop {
            let offset = self.input.offset();
            let opcode = match self.input.next_byte() {
                Ok(Some(opcode)) => opcode,
                Ok(None) => {
                    return Err(ReadError::Pickle {
                        offset,
                        detail: "the input ends before the pickle's STOP opcode".to_owned(),
                    })
                }
                Err(fault) => return Err(self.error(fault, offset, None)),
            };
            match self.execute(opcode) {
                Ok(None) => {}
                Ok(Some(root)) => return Ok(root),
                Err(fault) => return Err(self.error(fault, offset, Some(opcode))),
            }
        }
    }

    fn error(&self, fault: Fault, offset: u64, opcode: Option<u8>) -> ReadError {
        match fault {
            Fault::Io(error) => ReadError::Io(error),
            Fault::Shape(error) => error,
            Fault::TooDeep => ReadError::NestedTooDeep {
                encoding: SnapshotEncoding::Pickle,
                offset,
                limit: MAX_NESTING,
            },
            Fault::Bad(detail) => ReadError::Pickle {
                offset,
                detail: match opcode {
                    Some(opcode) => format!("opcode {opcode:#04x}: {detail}"),
                    None => detail,
                },
            },
        }
    }

    /// Executes one opcode; returns the result on STOP.
    fn execute(&mut self, opcode: u8) -> Step<Option<Value>> {
        match opcode {
            b'.' => return self.pop().map(|item| Some(item.value)),
            0x80 => {
                let protocol = self.input.take(1)?[0];
                if protocol > 5 {
                    return Err(format!("protocol {protocol} is newer than 5").into());
                }
            }
            0x95 => {
                self.input.take(8)?;
            }
            b'(' => self.marks.push(self.stack.len()),
            b'0' => {
                if self.stack.len() > self.floor() {
                    self.pop()?;
                } else {
                    self.pop_mark()?;
                }
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let top = self.top()?;
                if top.role != Role::Scalar && top.role != Role::Kept {
                    return Err("DUP of a snapshot container is not supported".into());
                }
                let copy = Item {
                    value: top.value.clone(),
                    role: top.role,
                    depth: top.depth,
                };
                self.stack.push(copy);
            }
            // Containers.
            b'}' => self.push_container(Kind::Dict, Vec::new())?,
            b']' | b')' | 0x8f => self.push_container(Kind::List, Vec::new())?,
            b'l' | b't' | 0x91 => {
                let items = self.pop_mark()?;
                self.push_container(Kind::List, items)?;
            }
            0x85..=0x87 => {
                let count = usize::from(opcode - 0x84);
                if self.stack.len() < count + self.floor() {
                    return Err("stack underflow".into());
                }
                let items = self.stack.split_off(self.stack.len() - count);
                self.push_container(Kind::List, items)?;
            }
            b'd' => {
                let items = self.pop_mark()?;
                self.push_container(Kind::Dict, items)?;
            }
            b'a' => {
                let item = self.pop()?;
                self.append(vec![item])?;
            }
            b'e' | 0x90 => {
                let items = self.pop_mark()?;
                self.append(items)?;
            }
            b's' => {
                let value = self.pop()?;
                let key = self.pop()?;
                self.set_items(vec![key, value])?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.set_items(items)?;
            }
            // Scalars.
            b'N' => self.push(Value::None),
            0x88 => self.push(Value::Bool(true)),
            0x89 => self.push(Value::Bool(false)),
            b'K' => {
                let byte = self.input.take(1)?[0];
                self.push(Value::Int(i64::from(byte)));
            }
            b'M' => {
                let value = u16::from_le_bytes(self.input.array()?);
                self.push(Value::Int(i64::from(value)));
            }
            b'J' => {
                let value = i32::from_le_bytes(self.input.array()?);
                self.push(Value::Int(i64::from(value)));
            }
            0x8a => {
                let length = usize::from(self.input.take(1)?[0]);
                let value = little_endian_int(self.input.take(length)?);
                self.push(value);
            }
            0x8b => {
                let length = self.length_u32()?;
                let value = little_endian_int(self.input.take(length)?);
                self.push(value);
            }
            b'I' => {
                let value = match self.line()? {
                    "00" => Value::Bool(false),
                    "01" => Value::Bool(true),
                    text => text_int(text)?,
                };
                self.push(value);
            }
            b'L' => {
                let line = self.line()?;
                let value = text_int(line.strip_suffix('L').unwrap_or(line))?;
                self.push(value);
            }
            b'G' => {
                let value = f64::from_be_bytes(self.input.array()?);
                self.push(Value::Float(value));
            }
            b'F' => {
                let line = self.line()?;
                let value = line
                    .trim()
                    .parse()
                    .map_err(|_| format!("{} is not a float", excerpt(line)))?;
                self.push(Value::Float(value));
            }
            // Strings and bytes.
            0x8c => {
                let length = usize::from(self.input.take(1)?[0]);
                self.push_str(length)?;
            }
            b'X' => {
                let length = self.length_u32()?;
                self.push_str(length)?;
            }
            0x8d => {
                let length = self.length_u64()?;
                self.push_str(length)?;
            }
            b'V' => {
                // raw-unicode-escape: Latin-1 bytes plus \u escapes.
                let line: String = self
                    .input
                    .line()?
                    .iter()
                    .map(|&byte| char::from(byte))
                    .collect();
                let text = raw_unicode_unescape(&line)?;
                self.push(Value::Str(text.into()));
            }
            // Python 2 byte strings: text if UTF-8, else bytes.
            b'U' => {
                let length = usize::from(self.input.take(1)?[0]);
                self.push_str_or_bytes(length)?;
            }
            b'T' => {
                let length = self.length_u32()?;
                self.push_str_or_bytes(length)?;
            }
            b'C' => {
                let length = usize::from(self.input.take(1)?[0]);
                self.input.take(length)?;
                self.push(Value::Bytes);
            }
            b'B' => {
                let length = self.length_u32()?;
                self.input.take(length)?;
                self.push(Value::Bytes);
            }
            0x8e | 0x96 => {
                let length = self.length_u64()?;
                self.input.take(length)?;
                self.push(Value::Bytes);
            }
            // Memo.
            b'p' => {
                let id = self.line_id()?;
                self.memoize(id)?;
            }
            b'q' => {
                let id = u64::from(self.input.take(1)?[0]);
                self.memoize(id)?;
            }
            b'r' => {
                let id = u64::from(u32::from_le_bytes(self.input.array()?));
                self.memoize(id)?;
            }
            0x94 => {
                let id = self.memo_ids.count;
                self.memoize(id)?;
            }
            b'g' => {
                let id = self.line_id()?;
                self.recall(id)?;
            }
            b'h' => {
                let id = u64::from(self.input.take(1)?[0]);
                self.recall(id)?;
            }
            b'j' => {
                let id = u64::from(u32::from_le_bytes(self.input.array()?));
                self.recall(id)?;
            }
            _ => {
                return Err(
                    "not supported: a memory snapshot holds only dicts, lists, tuples, strings, \
                     numbers, bools and None (no globals or objects)"
                        .into(),
                )
            }
        }
        Ok(None)
    }

    fn push(&mut self, value: Value) {
        self.stack.push(Item::scalar(value));
    }

    fn length_u32(&mut self) -> Step<usize> {
        Ok(u32::from_le_bytes(self.input.array()?) as usize)
    }

    fn length_u64(&mut self) -> Step<usize> {
        usize::try_from(u64::from_le_bytes(self.input.array()?))
            .map_err(|_| "length does not fit in memory".into())
    }

    /// A text argument as UTF-8.
    fn line(&mut self) -> Step<&str> {
        std::str::from_utf8(self.input.line()?).map_err(|_| "text argument is not UTF-8".into())
    }

    fn line_id(&mut self) -> Step<u64> {
        let line = self.line()?;
        line.trim()
            .parse()
            .map_err(|_| format!("memo id {} is not a number", excerpt(line)).into())
    }

    fn push_str(&mut self, length: usize) -> Step<()> {
        let bytes = self.input.take(length)?;
        let text = std::str::from_utf8(bytes).map_err(|_| "string is not UTF-8")?;
        let text = match self.strings.get(text) {
            Some(shared) => shared.clone(),
            None => {
                let text: Rc<str> = text.into();
                if length <= SHARED_STRING_MAX && self.strings.len() < SHARED_STRINGS_MAX {
                    self.strings.insert(text.clone());
                }
                text
            }
        };
        self.push(Value::Str(text));
        Ok(())
    }

    fn push_str_or_bytes(&mut self, length: usize) -> Step<()> {
        let value = match std::str::from_utf8(self.input.take(length)?) {
            Ok(text) => Value::Str(text.into()),
            Err(_) => Value::Bytes,
        };
        self.push(value);
        Ok(())
    }

    /// Stores the top of the stack under `id`: strings, numbers and free-form containers are
    /// kept; a snapshot's own containers are not (nothing refers to them again, and keeping
    /// them would keep the whole snapshot).
    fn memoize(&mut self, id: u64) -> Step<()> {
        let unneeded = self.unneeded_value();
        let top = self.top()?;
        let (role, value, depth) = (top.role, top.value.clone(), top.depth);
        let kept = match (role, &value) {
            // CPython's empty and one-character strings are singletons, shared with any
            // other place that holds the same text: the first of each is kept (a pickler that
            // memoises them anew each time would otherwise pile them up too).
            (Role::Scalar, Value::Str(text)) if unneeded && text.chars().nth(1).is_none() => {
                self.singletons.insert(text.clone()).then_some(value)
            }
            (Role::Scalar, _) if unneeded => None,
            (Role::Scalar | Role::Kept, _) => Some(value),
            // A reference to the top level from inside it is free-form data.
            (Role::Root, _) => Some(value),
            // Frame dicts and blocks' `frames` lists: interned once complete, so the memo
            // then holds a one-item container.
            (Role::Frame, _) if self.kept_frames < KEPT_FRAMES_MAX => {
                self.kept_frames += 1;
                Some(value)
            }
            (Role::Frames, _) if self.kept_stacks < KEPT_STACKS_MAX => {
                self.kept_stacks += 1;
                Some(value)
            }
            // A trace entry, memoised as it is created and filled after: the memo shares
            // the dict, so a later reference reads it whole.
            (Role::Entry, Value::Dict(dict)) => {
                self.kept_entries.push_back((id, dict.clone()));
                if self.kept_entries.len() > KEPT_ENTRIES_MAX {
                    if let Some((old_id, old)) = self.kept_entries.pop_front() {
                        let same = |item: &Item| matches!(&item.value, Value::Dict(held) if Rc::ptr_eq(held, &old));
                        if self.memo.get(&old_id).is_some_and(same) {
                            self.memo.remove(&old_id);
                        }
                    }
                }
                Some(value)
            }
            _ => None,
        };
        let new_id = self.memo_ids.insert(id);
        match kept {
            Some(value) => {
                let role = match value {
                    Value::List(_) | Value::Dict(_) => Role::Kept,
                    _ => Role::Scalar,
                };
                self.memo.insert(id, Item { value, role, depth });
            }
            None if !new_id => {
                self.memo.remove(&id);
            }
            None => {}
        }
        Ok(())
    }

    /// Whether the top of the stack is a value gpumem never reads: one in a skipped part
    /// (PyTorch 2.0 writes new strings for every entry's `cpp_frames`), or under a key of a
    /// snapshot dict that gpumem does not read (an entry's `compile_context` or
    /// `user_metadata`, new strings in every entry). Memoising them would pile up an entry per
    /// trace entry.
    fn unneeded_value(&self) -> bool {
        let (floor, height) = (self.floor(), self.stack.len());
        let Some(parent) = floor.checked_sub(1).map(|below| &self.stack[below]) else {
            return false;
        };
        if parent.role == Role::Skipped {
            return true;
        }
        let region = height - floor;
        if region < 2 || region % 2 != 0 {
            return false;
        }
        let Value::Str(key) = &self.stack[height - 2].value else {
            return false;
        };
        match parent.role {
            Role::Entry => &**key != "action",
            Role::Segment => &**key != "segment_type",
            Role::Block => &**key != "state",
            Role::HistoryEntry => true,
            _ => false,
        }
    }

    fn recall(&mut self, id: u64) -> Step<()> {
        let item = match self.memo.get(&id) {
            Some(item) => Item {
                value: item.value.clone(),
                role: item.role,
                depth: item.depth,
            },
            None if self.memo_ids.contains(id) => Item::scalar(Value::NotKept),
            None => return Err(format!("memo id {id} was never stored").into()),
        };
        self.stack.push(item);
        Ok(())
    }

    /// The stack index of the innermost mark (0 without one): nothing below it may be popped.
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    /// Pops a value, never one below the innermost mark.
    fn pop(&mut self) -> Step<Item> {
        if self.stack.len() <= self.floor() {
            return Err("stack underflow".into());
        }
        self.stack.pop().ok_or_else(|| "stack underflow".into())
    }

    fn top(&self) -> Step<&Item> {
        if self.stack.len() <= self.floor() {
            return Err("stack underflow".into());
        }
        self.stack.last().ok_or_else(|| "stack underflow".into())
    }

    /// Pops everything above the innermost mark, and the mark.
    fn pop_mark(&mut self) -> Step<Vec<Item>> {
        let mark = self.marks.pop().ok_or("no MARK to pop to")?;
        Ok(self.stack.split_off(mark.min(self.stack.len())))
    }

    /// The role of a container created now, from where it is on the stack: an item of the
    /// list on top (APPEND without a mark), the value of the key on top of a dict (SETITEM
    /// without a mark), or an item of the container below the innermost mark (APPENDS,
    /// SETITEMS). Where several fit the kind, the one gpumem reads wins; where none does,
    /// the container is built whole ([`Role::Kept`]) and read wherever it is placed.
    fn place(&self, kind: Kind) -> Role {
        if self.stack.is_empty() && self.marks.is_empty() {
            return Role::Root;
        }
        let floor = self.floor();
        let height = self.stack.len();
        let mut best: Option<Role> = None;
        let mut consider = |role: Option<Role>| {
            if let Some(role) = role.filter(|role| role.accepts(kind)) {
                if best.is_none_or(|best| role.weight() > best.weight()) {
                    best = Some(role);
                }
            }
        };
        let above_floor = &self.stack[floor..];
        if let Some(top) = above_floor.last() {
            if top.kind() == Some(Kind::List) || top.role == Role::Skipped {
                consider(top.role.child(Slot::Index(list_len(&top.value))));
            }
        }
        if let [.., container, key] = above_floor {
            if let (Some(Kind::Dict) | None, Value::Str(key)) = (container.kind(), &key.value) {
                if container.role != Role::Scalar {
                    consider(container.role.child(Slot::Key(key)));
                }
            }
        }
        if let Some(parent) = floor.checked_sub(1).map(|below| &self.stack[below]) {
            let region = height - floor;
            match parent.kind() {
                Some(Kind::List) => consider(
                    parent
                        .role
                        .child(Slot::Index(list_len(&parent.value) + region)),
                ),
                Some(Kind::Dict) if region % 2 == 1 => {
                    if let Value::Str(key) = &self.stack[height - 1].value {
                        consider(parent.role.child(Slot::Key(key)));
                    }
                }
                _ if parent.role == Role::Skipped => consider(Some(Role::Skipped)),
                _ => {}
            }
        }
        best.unwrap_or(Role::Kept)
    }

    /// Creates a container of `kind` holding `items` and pushes it.
    fn push_container(&mut self, kind: Kind, items: Vec<Item>) -> Step<()> {
        let role = self.place(kind);
        if role == Role::Entry {
            self.hand_on_previous_entry()?;
        }
        let value = match role {
            Role::Skipped => Value::NotKept,
            Role::Segments | Role::DeviceTrace(_) => Value::Streamed(0),
            Role::Root | Role::Kept => match kind {
                Kind::List => self.arena.list(Vec::new()),
                Kind::Dict => self.arena.dict(Vec::new()),
            },
            _ => match kind {
                Kind::List => Value::List(Rc::new(RefCell::new(Vec::new()))),
                Kind::Dict => Value::Dict(Rc::new(RefCell::new(Vec::new()))),
            },
        };
        self.stack.push(Item {
            value,
            role,
            depth: 1,
        });
        match kind {
            _ if items.is_empty() => Ok(()),
            Kind::List => self.append(items),
            Kind::Dict => self.set_items(items),
        }
    }

    /// Appends `items` to the list on top of the stack: a segment or trace entry is decoded
    /// and handed to the sink, a skipped item dropped, anything else stored.
    fn append(&mut self, items: Vec<Item>) -> Step<()> {
        let floor = self.floor();
        let Self { stack, sink, .. } = self;
        if stack.len() <= floor {
            return Err("stack underflow".into());
        }
        let list = stack.last_mut().ok_or("stack underflow")?;
        for item in items {
            add_to_list(list, item, &mut **sink)?;
        }
        Ok(())
    }

    /// Before a new trace entry is built, hands on the entry before it if it is still on the
    /// stack: it is complete (nothing can add to it while a sibling is above it), and a
    /// pickler that appends a whole list at once (PyTorch's C++ pickler) would otherwise keep
    /// every entry of a device on the stack until the end of its list.
    fn hand_on_previous_entry(&mut self) -> Step<()> {
        let floor = self.floor();
        let in_trace = floor
            .checked_sub(1)
            .is_some_and(|below| matches!(self.stack[below].role, Role::DeviceTrace(_)));
        // The item on top is a complete entry: one built here, or a memo reference to one
        // (a dict kept whole). Then everything above the mark is the trace's items, in order.
        let previous_is_entry = self.stack.len() > floor
            && self.stack.last().is_some_and(|top| {
                top.role == Role::Entry
                    || (top.role == Role::Kept && matches!(top.value, Value::Dict(_)))
            });
        if !(in_trace && previous_is_entry) {
            return Ok(());
        }
        let items = self.stack.split_off(floor);
        let Self { stack, sink, .. } = self;
        let trace = &mut stack[floor - 1];
        for item in items {
            add_to_list(trace, item, &mut **sink)?;
        }
        Ok(())
    }

    /// Sets the key-value pairs `items` (keys and values alternating) in the dict on top of
    /// the stack; a skipped container is dropped (its key stays, as not kept).
    fn set_items(&mut self, items: Vec<Item>) -> Step<()> {
        if !items.len().is_multiple_of(2) {
            return Err("odd number of items for a dict".into());
        }
        let floor = self.floor();
        let Self { stack, sink, .. } = self;
        if stack.len() <= floor {
            return Err("stack underflow".into());
        }
        let dict = stack.last_mut().ok_or("stack underflow")?;
        let deepest = items.iter().map(|item| item.depth).max();
        if let Some(deepest) = deepest {
            dict.nest(deepest)?;
        }
        let dict = &*dict;
        let entries = match &dict.value {
            Value::Dict(entries) => entries,
            Value::NotKept if dict.role == Role::Skipped => return Ok(()),
            other => {
                return Err(format!("sets an item of {}, not a dict", other.type_name()).into())
            }
        };
        let mut entries = entries.borrow_mut();
        let mut items = items.into_iter();
        while let (Some(key), Some(value)) = (items.next(), items.next()) {
            let name = match &key.value {
                Value::Str(name) => name,
                _ => "",
            };
            let place = dict
                .role
                .child(Slot::Key(name))
                .ok_or("sets an item of a list")?;
            check_place(&value, place)?;
            if place == Role::Skipped && value.role != Role::Scalar {
                // The key stays, so that an error can name it (a dict that is no snapshot).
                entries.push((key.value, Value::NotKept));
                continue;
            }
            if place == Role::Frames {
                let path = Path::Key(&Path::Root, "frames");
                let stack =
                    decode::stack(&value.value, &path, sink.stacks()).map_err(Fault::Shape)?;
                if let Some(stack) = stack {
                    compact(&value.value, || Value::Stack(stack));
                    entries.push((key.value, Value::Stack(stack)));
                }
                continue;
            }
            entries.push((key.value, value.value));
        }
        Ok(())
    }
}

/// Adds `item` to the list `list`: a segment or trace entry is decoded and handed to the
/// sink, an item of a skipped list dropped, anything else stored.
fn add_to_list(list: &mut Item, item: Item, sink: &mut dyn SnapshotSink) -> Step<()> {
    list.nest(item.depth)?;
    let index = match &list.value {
        Value::List(items) => items.borrow().len(),
        Value::Streamed(count) => *count,
        Value::NotKept if list.role == Role::Skipped => return Ok(()),
        other => return Err(format!("appends to {}, not a list", other.type_name()).into()),
    };
    let place = list
        .role
        .child(Slot::Index(index))
        .ok_or("appends to a dict")?;
    check_place(&item, place)?;
    match (&mut list.value, list.role) {
        (Value::Streamed(count), Role::Segments) => {
            let path = Path::Key(&Path::Root, "segments");
            let segment =
                decode::segment(&item.value, &Path::Index(&path, index)).map_err(Fault::Shape)?;
            sink.segment(segment).map_err(Fault::Shape)?;
            *count += 1;
        }
        (Value::Streamed(count), Role::DeviceTrace(device)) => {
            let traces = Path::Key(&Path::Root, "device_traces");
            let trace = Path::Index(&traces, device);
            let (entry, unknown) =
                decode::trace_entry(&item.value, &Path::Index(&trace, index), sink.stacks())
                    .map_err(Fault::Shape)?;
            sink.entry(device, index, entry, unknown.as_deref())
                .map_err(Fault::Shape)?;
            *count += 1;
        }
        (Value::List(items), Role::Frames) => {
            let path = Path::Index(&Path::Key(&Path::Root, "frames"), index);
            if let Some(frame) =
                decode::frame(&item.value, &path, sink.stacks()).map_err(Fault::Shape)?
            {
                compact(&item.value, || Value::Frame(frame));
                items.borrow_mut().push(Value::Frame(frame));
            }
        }
        (Value::List(items), _) => items.borrow_mut().push(item.value),
        _ => return Err("appends to a list of an unknown kind".into()),
    }
    Ok(())
}

/// Replaces the content of an interned frame dict or `frames` list that the memo also holds
/// by its id (one item), which is what a later memo reference reads.
fn compact(value: &Value, interned: impl FnOnce() -> Value) {
    match value {
        Value::Dict(entries) if Rc::strong_count(entries) > 1 => {
            *entries.borrow_mut() = vec![(interned(), Value::None)];
        }
        Value::List(items) if Rc::strong_count(items) > 1 => {
            *items.borrow_mut() = vec![interned()];
        }
        _ => {}
    }
}

/// The number of items in a list value so far.
fn list_len(value: &Value) -> usize {
    match value {
        Value::List(items) => items.borrow().len(),
        Value::Streamed(count) => *count,
        _ => 0,
    }
}

/// Checks that a container lands where its role said it would (or was built whole): a
/// container built as one part of the snapshot cannot become another, as its content went
/// where that part's content goes.
fn check_place(item: &Item, place: Role) -> Step<()> {
    match item.role {
        Role::Scalar | Role::Kept => Ok(()),
        role if role == place => Ok(()),
        role => Err(format!(
            "a container read as {role} is placed as {place}: pickles whose containers are \
             created after their content are not supported"
        )
        .into()),
    }
}

/// A two's-complement little-endian integer (LONG1/LONG4).
fn little_endian_int(bytes: &[u8]) -> Value {
    let negative = bytes.last().is_some_and(|&byte| byte & 0x80 != 0);
    let fill = if negative { 0xff } else { 0 };
    let (low, high) = bytes.split_at(bytes.len().min(16));
    // Bytes beyond 16 must be sign extension, and byte 15 must carry the same sign.
    let fits = high.is_empty()
        || (high.iter().all(|&byte| byte == fill) && (low[15] & 0x80 != 0) == negative);
    if !fits {
        return Value::HugeInt;
    }
    let mut buffer = [fill; 16];
    buffer[..low.len()].copy_from_slice(low);
    Value::int(i128::from_le_bytes(buffer))
}

/// A decimal integer argument of the text opcodes.
fn text_int(text: &str) -> Step<Value> {
    let text = text.trim();
    match text.parse::<i128>() {
        Ok(value) => Ok(Value::int(value)),
        Err(_)
            if !text.is_empty()
                && text
                    .trim_start_matches(['-', '+'])
                    .bytes()
                    .all(|b| b.is_ascii_digit()) =>
        {
            Ok(Value::HugeInt)
        }
        Err(_) => Err(format!("{} is not an integer", excerpt(text)).into()),
    }
}

/// Python's `raw-unicode-escape` decoding (protocol 0 strings): `\uXXXX` and `\UXXXXXXXX`.
fn raw_unicode_unescape(text: &str) -> Step<String> {
    let mut decoded = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(backslash) = rest.find('\\') {
        decoded.push_str(&rest[..backslash]);
        let after = &rest[backslash + 1..];
        let digits = match after.as_bytes().first() {
            Some(b'u') => 4,
            Some(b'U') => 8,
            _ => {
                decoded.push('\\');
                rest = after;
                continue;
            }
        };
        let hex = after
            .get(1..1 + digits)
            .ok_or("truncated \\u escape in a string")?;
        let character = u32::from_str_radix(hex, 16)
            .ok()
            .and_then(char::from_u32)
            .ok_or_else(|| format!("invalid escape \\u{hex} in a string"))?;
        decoded.push(character);
        rest = &after[1 + digits..];
    }
    decoded.push_str(rest);
    Ok(decoded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{SettingValue, Snapshot};

    /// Unpickles `pickle`, returning what was kept of it.
    fn unpickle_bytes(pickle: &[u8]) -> Result<Document, ReadError> {
        unpickle(pickle, &mut Snapshot::default())
    }

    fn int(value: &Value) -> i128 {
        match *value {
            Value::Int(signed) => i128::from(signed),
            Value::Unsigned(unsigned) => i128::from(unsigned),
            ref other => panic!("not an int: {other:?}"),
        }
    }

    #[test]
    fn integers_of_every_encoding() {
        let cases: [(&[u8], i128); 7] = [
            (b"K\x05.", 5),
            (b"M\x01\x02.", 0x0201),
            (b"J\xff\xff\xff\xff.", -1),
            (b"\x8a\x06\x00\x00\x00\x00\x00\x7f.", 0x7f00_0000_0000),
            (
                b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.",
                u64::MAX as i128,
            ),
            (b"I-17\n.", -17),
            (b"L12345678901234567890L\n.", 12_345_678_901_234_567_890),
        ];
        for (pickle, expected) in cases {
            assert_eq!(
                int(&unpickle_bytes(pickle).unwrap().root),
                expected,
                "{pickle:?}"
            );
        }
        let huge = b"\x8a\x11\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01.";
        assert!(matches!(unpickle_bytes(huge).unwrap().root, Value::HugeInt));
        assert!(matches!(
            unpickle_bytes(b"I01\n.").unwrap().root,
            Value::Bool(true)
        ));
    }

    #[test]
    fn shared_memoised_free_form_containers_stay_shared() {
        // d = {}; x = [d, d] with d memoised and fetched again.
        let document = unpickle_bytes(b"\x80\x02](}q\x00h\x00e.").unwrap();
        let Value::List(list) = &document.root else {
            panic!()
        };
        let list = list.borrow();
        let (Value::Dict(first), Value::Dict(second)) = (&list[0], &list[1]) else {
            panic!()
        };
        assert!(Rc::ptr_eq(first, second));
    }

    #[test]
    fn errors_name_offset_and_opcode() {
        let message = unpickle_bytes(b"\x80\x02cos\nsystem\n.")
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("pickle byte 2: opcode 0x63: not supported"),
            "{message}"
        );
        let message = unpickle_bytes(b"\x80\x02X\xff\x00\x00\x00ab.")
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "pickle byte 2: opcode 0x58: needs 255 more bytes, but the input ends at byte 10"
        );
        assert!(unpickle_bytes(b"").is_err());
        assert!(unpickle_bytes(b"a.").is_err());
        assert!(unpickle_bytes(b"(K\x01u.").is_err());
        assert!(unpickle_bytes(b"h\x07.").is_err());
        assert!(unpickle_bytes(b"\x80\x06.").is_err());
    }

    /// `depth` nested lists in protocol 0 (MARK ... LIST).
    fn nested_lists(depth: usize) -> Vec<u8> {
        let mut pickle = vec![b'('; depth];
        pickle.extend(std::iter::repeat_n(b'l', depth));
        pickle.push(b'.');
        pickle
    }

    #[test]
    fn nesting_past_the_limit_is_refused_where_it_passes() {
        assert!(unpickle_bytes(&nested_lists(MAX_NESTING)).is_ok());
        let depth = 1_000_000;
        let error = unpickle_bytes(&nested_lists(depth)).unwrap_err();
        let ReadError::NestedTooDeep { offset, limit, .. } = error else {
            panic!("{error}")
        };
        // The LIST opcode that makes the 101st level: after the MARKs and 100 LISTs.
        assert_eq!((offset, limit), ((depth + MAX_NESTING) as u64, MAX_NESTING));
    }

    #[test]
    fn nesting_built_through_the_memo_drops_without_recursion() {
        // x = [] (memo 0); then a million times: y = [], memo i, y.append(<memo i - 1>),
        // pop y: each list is counted 2 deep (what it held when memoised, plus one), though
        // the chain is a million deep; dropping it must not recurse.
        let depth = 1_000_000u32;
        let mut pickle = b"\x80\x02]r\x00\x00\x00\x000".to_vec();
        for id in 1..depth {
            pickle.push(b']');
            pickle.push(b'r');
            pickle.extend(id.to_le_bytes());
            pickle.push(b'j');
            pickle.extend((id - 1).to_le_bytes());
            pickle.extend(b"a0");
        }
        pickle.push(b'j');
        pickle.extend((depth - 1).to_le_bytes());
        pickle.push(b'.');
        let document = unpickle_bytes(&pickle).unwrap();
        let Value::List(root) = &document.root else {
            panic!()
        };
        let (weak, first) = (Rc::downgrade(root), root.borrow()[0].clone());
        drop(document);
        drop(first);
        assert!(weak.upgrade().is_none(), "the chain was freed");
    }

    #[test]
    fn a_list_that_contains_itself_is_freed() {
        // x = []; x.append(x)
        let document = unpickle_bytes(b"\x80\x02]q\x00h\x00a.").unwrap();
        let Value::List(list) = &document.root else {
            panic!()
        };
        let weak = Rc::downgrade(list);
        drop(document);
        assert!(
            weak.upgrade().is_none(),
            "the cycle was broken and the list freed"
        );
    }

    #[test]
    fn protocol_0_strings_unescape() {
        let Value::Str(text) = &unpickle_bytes(b"Va\\u00e9b\\\\c\xe9\n.").unwrap().root else {
            panic!()
        };
        assert_eq!(&**text, "a\u{e9}b\\\\c\u{e9}");
    }

    /// Counts what it is handed.
    #[derive(Default)]
    struct Counting {
        segments: usize,
        entries: usize,
        stacks: crate::snapshot::Stacks,
        entry_stacks: Vec<Option<crate::snapshot::StackId>>,
    }

    impl SnapshotSink for Counting {
        fn segment(&mut self, _: crate::snapshot::SnapshotSegment) -> Result<(), ReadError> {
            self.segments += 1;
            Ok(())
        }

        fn entry(
            &mut self,
            _: usize,
            _: usize,
            entry: crate::snapshot::TraceEntry,
            _: Option<&str>,
        ) -> Result<(), ReadError> {
            self.entries += 1;
            self.entry_stacks.push(entry.stack);
            Ok(())
        }

        fn devices(&mut self, _: usize) {}

        fn settings(&mut self, _: std::collections::BTreeMap<String, SettingValue>) {}

        fn stacks(&mut self) -> &mut crate::snapshot::Stacks {
            &mut self.stacks
        }
    }

    #[test]
    fn entries_are_handed_on_before_their_list_ends() {
        // PyTorch's C++ pickler appends a device's whole trace with one APPENDS at its end;
        // cut just before it, every entry but the last has been handed on already.
        let bytes = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/torch2.0_cpp.pickle"
        ))
        .unwrap();
        let end_of_trace = bytes.windows(6).rposition(|w| w == b"ue](ee").unwrap() + 1;
        let mut sink = Counting::default();
        assert!(unpickle(&bytes[..end_of_trace], &mut sink).is_err());
        assert_eq!((sink.segments, sink.entries), (2, 11));
        let mut sink = Counting::default();
        unpickle(bytes.as_slice(), &mut sink).unwrap();
        assert_eq!((sink.segments, sink.entries), (2, 12));
    }

    /// A pickle opcode pushing the short string `text` (SHORT_BINUNICODE).
    fn text(text: &str) -> Vec<u8> {
        [&[0x8c, text.len() as u8][..], text.as_bytes()].concat()
    }

    /// A snapshot pickle whose one device trace holds `count` alloc entries (memoised dicts
    /// `{"action": "alloc", "addr": i + 1, "size": 1, ...}`); `extra` writes each entry's
    /// further key/value pairs.
    fn alloc_entries_pickle(count: u32, extra: impl Fn(u32, &mut Vec<u8>)) -> Vec<u8> {
        let mut pickle = [
            &b"\x80\x04}\x94"[..],
            &text("device_traces"),
            b"]\x94]\x94(",
        ]
        .concat();
        for index in 0..count {
            pickle.extend_from_slice(b"}\x94(");
            pickle.extend(text("action"));
            pickle.extend(text("alloc"));
            pickle.extend(text("addr"));
            pickle.push(b'J');
            pickle.extend((index + 1).to_le_bytes());
            pickle.extend(text("size"));
            pickle.extend(b"K\x01");
            extra(index, &mut pickle);
            pickle.push(b'u');
        }
        pickle.extend_from_slice(b"eas.");
        pickle
    }

    #[test]
    fn the_memo_does_not_grow_with_the_entries() {
        // device_traces = [[{"action": "alloc", "addr": ..., "size": 1,
        //   "compile_context": <a new "N/A">, "user_metadata": <a new "">}, ...]]
        let count = KEPT_ENTRIES_MAX as u32 + 1000;
        let pickle = alloc_entries_pickle(count, |_, pickle| {
            pickle.extend(text("compile_context"));
            pickle.extend(text("N/A"));
            pickle.push(0x94);
            pickle.extend(text("user_metadata"));
            pickle.extend(text(""));
            pickle.push(0x94);
        });
        let mut sink = Counting::default();
        let mut unpickler = Unpickler::new(pickle.as_slice(), &mut sink);
        unpickler.run().unwrap();
        assert_eq!(unpickler.memo_ids.count, 3 + 3 * u64::from(count));
        // The top level, the first "" (CPython shares it) and the latest KEPT_ENTRIES_MAX
        // entries; no earlier entry, no "N/A" or later "".
        assert_eq!(unpickler.memo.len(), 2 + KEPT_ENTRIES_MAX);
        assert_eq!(unpickler.kept_entries.len(), KEPT_ENTRIES_MAX);
        assert_eq!(sink.entries, count as usize);
    }

    #[test]
    fn frames_are_interned_and_the_memo_keeps_only_shared_frames() {
        // device_traces = [[{"action": "alloc", "addr": i, "size": 1,
        //   "frames": [<frame dict, written once, then memo id 5>]}, ...]]: each entry's
        // `frames` list is new (and memoised), its frame dict shared, as PyTorch writes them.
        let pickle = alloc_entries_pickle(1000, |index, pickle| {
            pickle.extend(text("frames"));
            pickle.extend(b"]\x94(");
            if index == 0 {
                pickle.extend(b"}\x94(");
                pickle.extend(text("filename"));
                pickle.extend(text("train.py"));
                pickle.extend(text("line"));
                pickle.extend(b"K\x2a");
                pickle.extend(text("name"));
                pickle.extend(text("step"));
                pickle.push(b'u');
            } else {
                pickle.extend(b"h\x05");
            }
            pickle.extend(b"e");
        });
        let mut sink = Counting::default();
        let mut unpickler = Unpickler::new(pickle.as_slice(), &mut sink);
        unpickler.run().unwrap();
        // The top level, the frame dict, the `frames` lists (each interned to one item,
        // up to KEPT_STACKS_MAX of them) and the entries (up to KEPT_ENTRIES_MAX).
        assert_eq!(unpickler.memo.len(), 2 + 1000 + 1000);
        let interned = |item: &Item| match &item.value {
            Value::List(items) => matches!(items.borrow().as_slice(), [Value::Stack(_)]),
            Value::Dict(entries) => matches!(entries.borrow().as_slice(), [(Value::Frame(_), _)]),
            _ => false,
        };
        assert_eq!(
            unpickler
                .memo
                .values()
                .filter(|item| interned(item))
                .count(),
            1001
        );
        assert_eq!(sink.entries, 1000);
        assert_eq!(sink.stacks.len(), 1);
        let stack = sink.entry_stacks[0].expect("the first entry has its stack");
        assert!(sink.entry_stacks.iter().all(|&id| id == Some(stack)));
        let frames: Vec<_> = sink.stacks.frames(stack).collect();
        assert_eq!(
            (&*frames[0].filename, frames[0].line, &*frames[0].name),
            ("train.py", 42, "step")
        );
    }

    #[test]
    fn memo_ids_are_tracked_as_ranges() {
        let mut ids = IdSet::default();
        for id in [0, 1, 2, 7, 5, 6, 4, 3, 3] {
            ids.insert(id);
        }
        assert_eq!(ids.ranges, vec![(0, 8)]);
        assert_eq!(ids.count, 8);
        ids.insert(10);
        assert!(ids.contains(7) && ids.contains(10) && !ids.contains(8) && !ids.contains(11));
    }
}
