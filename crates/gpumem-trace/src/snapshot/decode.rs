//! From a decoded document (JSON, or what the streaming unpickler kept) to the pieces of a
//! [`Snapshot`](super::Snapshot) handed to a [`SnapshotSink`]: a typed walk over the fields
//! gpumem uses. Unknown keys are never visited, so their size and shape do not matter; an
//! entry's `frames` are interned in the sink's [`Stacks`]. Errors name the path of the
//! offending value (`segments[3].blocks[0].size`).

use std::cell::Ref;
use std::collections::BTreeMap;
use std::fmt;

use super::document::{ContainerArena, Document, Value, MAX_NESTING};
use super::{
    Action, BlockState, FrameId, SegmentType, SettingValue, SnapshotBlock, SnapshotSegment,
    SnapshotSink, StackId, Stacks, TraceEntry,
};
use crate::error::{ReadError, SnapshotEncoding};
use crate::text::{clip, excerpt};
use crate::trace::saturating_sum;

/// How deep and how large an `allocator_settings` value may be (PyTorch's is two levels
/// and a dozen entries); bounds the walk on cyclic or exponentially shared input.
const MAX_SETTING_DEPTH: usize = 16;
const MAX_SETTING_NODES: usize = 100_000;

/// Where a value sits in the snapshot, built only when an error is reported.
#[derive(Clone, Copy)]
pub(super) enum Path<'a> {
    /// The top level.
    Root,
    /// A key of the dict at the path.
    Key(&'a Path<'a>, &'a str),
    /// An item of the list at the path.
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Root => f.write_str("the top level"),
            Self::Key(Self::Root, key) => f.write_str(key),
            Self::Key(parent, key) => write!(f, "{parent}.{key}"),
            Self::Index(Self::Root, index) => write!(f, "[{index}]"),
            Self::Index(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

/// The error for the value at `path`; the path (which may hold a key from the input) and
/// what was found are cut to a short excerpt.
fn shape_error(path: &Path<'_>, expected: &'static str, found: String) -> ReadError {
    ReadError::SnapshotShape {
        path: clip(path.to_string()),
        expected,
        found: clip(found),
    }
}

/// The entries of a dict value.
fn dict<'v>(value: &'v Value, path: &Path<'_>) -> Result<Ref<'v, Vec<(Value, Value)>>, ReadError> {
    match value {
        Value::Dict(entries) => Ok(entries.borrow()),
        other => Err(shape_error(path, "a dict", other.type_name().to_owned())),
    }
}

/// The items of a list (or tuple) value.
fn list<'v>(value: &'v Value, path: &Path<'_>) -> Result<Ref<'v, Vec<Value>>, ReadError> {
    match value {
        Value::List(items) => Ok(items.borrow()),
        other => Err(shape_error(path, "a list", other.type_name().to_owned())),
    }
}

fn unsigned(value: &Value, path: &Path<'_>) -> Result<u64, ReadError> {
    const EXPECTED: &str = "a non-negative 64-bit integer (0 to 18446744073709551615)";
    match *value {
        Value::Unsigned(number) => Ok(number),
        Value::Int(number) => {
            u64::try_from(number).map_err(|_| shape_error(path, EXPECTED, number.to_string()))
        }
        // JSON integers beyond 64 bits reach here as floats (serde_json parses them so).
        Value::Float(number) if number.fract() == 0.0 && !(-TWO_63..TWO_64).contains(&number) => {
            Err(shape_error(
                path,
                EXPECTED,
                format!("a number too large for 64 bits ({number})"),
            ))
        }
        ref other => Err(shape_error(path, EXPECTED, other.type_name().to_owned())),
    }
}

/// 2⁶³ and 2⁶⁴, the bounds of the 64-bit integers, as floats.
const TWO_63: f64 = 9_223_372_036_854_775_808.0;
const TWO_64: f64 = 18_446_744_073_709_551_616.0;

/// An address that a device allocation can have: not 0, the null pointer (a segment placed
/// there would make its blocks' frees frees of null, which release nothing).
fn segment_address(value: &Value, path: &Path<'_>) -> Result<u64, ReadError> {
    match unsigned(value, path)? {
        0 => Err(shape_error(
            path,
            "the address of a device allocation, which is never 0 (the null pointer)",
            "0".to_owned(),
        )),
        address => Ok(address),
    }
}

fn string<'v>(value: &'v Value, path: &Path<'_>) -> Result<&'v str, ReadError> {
    match value {
        Value::Str(text) => Ok(text),
        other => Err(shape_error(path, "a string", other.type_name().to_owned())),
    }
}

/// The fields of one dict, looked up by key (the last entry for a key wins, as in Python).
struct DictFields<'v, 'p> {
    entries: Ref<'v, Vec<(Value, Value)>>,
    path: &'p Path<'p>,
}

impl<'v, 'p> DictFields<'v, 'p> {
    fn of(value: &'v Value, path: &'p Path<'p>) -> Result<Self, ReadError> {
        Ok(Self {
            entries: dict(value, path)?,
            path,
        })
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.entries
            .iter()
            .rev()
            .find(|(name, _)| matches!(name, Value::Str(name) if &**name == key))
            .map(|(_, value)| value)
    }

    /// Runs `read` on the field's value, or fails naming the missing field.
    fn required<T>(
        &self,
        key: &'static str,
        read: impl FnOnce(&Value, &Path<'_>) -> Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        let path = Path::Key(self.path, key);
        let value = self.get(key).ok_or_else(|| {
            shape_error(
                &path,
                "a value (the field is required)",
                "no such key".to_owned(),
            )
        })?;
        read(value, &path)
    }

    /// Like [`Self::required`], for a field that entries of `action` must carry: missing or
    /// None is an error naming the field and the action.
    fn required_for<T>(
        &self,
        key: &'static str,
        action: Action,
        read: impl FnOnce(&Value, &Path<'_>) -> Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        let path = Path::Key(self.path, key);
        match self.get(key) {
            None => Err(ReadError::SnapshotShape {
                path: clip(path.to_string()),
                expected: "a non-negative 64-bit integer (PyTorch writes it on every entry of \
                           this action)",
                found: format!("no `{key}` on an entry with action `{}`", action.as_str()),
            }),
            Some(Value::None) => Err(ReadError::SnapshotShape {
                path: clip(path.to_string()),
                expected: "a non-negative 64-bit integer (PyTorch writes it on every entry of \
                           this action)",
                found: format!("None on an entry with action `{}`", action.as_str()),
            }),
            Some(value) => read(value, &path),
        }
    }

    /// Runs `read` on the field's value if the field is there and not None.
    fn optional<T>(
        &self,
        key: &'static str,
        read: impl FnOnce(&Value, &Path<'_>) -> Result<T, ReadError>,
    ) -> Result<Option<T>, ReadError> {
        match self.get(key) {
            None | Some(Value::None) => Ok(None),
            Some(value) => read(value, &Path::Key(self.path, key)).map(Some),
        }
    }

    /// Reads every item of a list field (absent or None: no items).
    fn each<T>(
        &self,
        key: &'static str,
        mut read: impl FnMut(&Value, &Path<'_>) -> Result<T, ReadError>,
    ) -> Result<Vec<T>, ReadError> {
        let path = Path::Key(self.path, key);
        match self.get(key) {
            None | Some(Value::None) => Ok(Vec::new()),
            Some(value) => list(value, &path)?
                .iter()
                .enumerate()
                .map(|(index, item)| read(item, &Path::Index(&path, index)))
                .collect(),
        }
    }
}

/// The keys by which a top-level dict is a snapshot (either will do: a snapshot with
/// `device_traces` alone is a trace, one with `segments` alone the memory at one moment).
const SNAPSHOT_KEYS: [&str; 2] = ["segments", "device_traces"];
/// The keys by which a dict is a segment (the first item of a PyTorch 1.13 snapshot).
const SEGMENT_KEYS: [&str; 3] = ["address", "total_size", "blocks"];

/// Whether `entries` has a string key among `names`.
fn has_key(entries: &[(Value, Value)], names: &[&str]) -> bool {
    entries
        .iter()
        .any(|(key, _)| matches!(key, Value::Str(key) if names.contains(&&**key)))
}

/// Refuses a document whose top level is not a snapshot's: a dict needs `segments` or
/// `device_traces`; a list (PyTorch 1.13's segments) needs a segment dict first, or no items
/// (1.13 writes an empty list when no memory is reserved).
fn check_is_snapshot(root: &Value, encoding: SnapshotEncoding) -> Result<(), ReadError> {
    let is_snapshot = match root {
        Value::Dict(entries) => has_key(&entries.borrow(), &SNAPSHOT_KEYS),
        Value::List(items) => match items.borrow().first() {
            None => true,
            Some(Value::Dict(segment)) => has_key(&segment.borrow(), &SEGMENT_KEYS),
            Some(_) => false,
        },
        _ => false,
    };
    if is_snapshot {
        Ok(())
    } else {
        Err(ReadError::NotASnapshot {
            encoding,
            found: clip(root.describe()),
        })
    }
}

/// Hands the snapshot in `root` to `sink`: its segments, the entries of each device's trace
/// (in order), the number of devices and the allocator settings; a list at the top level is
/// the segments alone (PyTorch 1.13). Lists the streaming
/// unpickler already handed on ([`Value::Streamed`]) are passed over. A top level that is not
/// a snapshot's is an error ([`ReadError::NotASnapshot`], naming `encoding`).
pub(super) fn deliver(
    root: &Value,
    encoding: SnapshotEncoding,
    sink: &mut dyn SnapshotSink,
) -> Result<(), ReadError> {
    check_is_snapshot(root, encoding)?;
    if let Value::List(items) = root {
        // PyTorch 1.13's `memory_snapshot()`: the segments alone, no trace.
        let mut devices = 0;
        for (index, item) in items.borrow().iter().enumerate() {
            let segment = segment(item, &Path::Index(&Path::Root, index))?;
            devices = devices.max(segment.device.saturating_add(1));
            sink.segment(segment)?;
        }
        sink.devices(usize::try_from(devices).unwrap_or(usize::MAX));
        sink.settings(BTreeMap::new());
        return Ok(());
    }
    let fields = DictFields::of(root, &Path::Root)?;
    let segments_path = Path::Key(&Path::Root, "segments");
    match fields.get("segments") {
        None | Some(Value::None | Value::Streamed(_)) => {}
        Some(value) => {
            for (index, item) in list(value, &segments_path)?.iter().enumerate() {
                sink.segment(segment(item, &Path::Index(&segments_path, index))?)?;
            }
        }
    }
    let traces_path = Path::Key(&Path::Root, "device_traces");
    let devices = match fields.get("device_traces") {
        None | Some(Value::None) => 0,
        Some(value) => {
            let traces = list(value, &traces_path)?;
            for (device, trace) in traces.iter().enumerate() {
                let trace_path = Path::Index(&traces_path, device);
                if let Value::Streamed(_) = trace {
                    continue;
                }
                for (index, entry) in list(trace, &trace_path)?.iter().enumerate() {
                    let (entry, unknown) =
                        trace_entry(entry, &Path::Index(&trace_path, index), sink.stacks())?;
                    sink.entry(device, index, entry, unknown.as_deref())?;
                }
            }
            traces.len()
        }
    };
    sink.devices(devices);
    let settings = match fields.get("allocator_settings") {
        None | Some(Value::None) => BTreeMap::new(),
        Some(value) => {
            let path = Path::Key(&Path::Root, "allocator_settings");
            let mut budget = MAX_SETTING_NODES;
            match setting(value, &path, 0, &mut budget)? {
                SettingValue::Map(map) => map,
                _ => return Err(shape_error(&path, "a dict", value.type_name().to_owned())),
            }
        }
    };
    sink.settings(settings);
    Ok(())
}

/// Reads one segment dict.
pub(super) fn segment(value: &Value, path: &Path<'_>) -> Result<SnapshotSegment, ReadError> {
    let fields = DictFields::of(value, path)?;
    let address = fields.required("address", segment_address)?;
    // Legacy blocks have no address: it follows from the segment base and the sizes before.
    let mut next_address = address;
    let blocks = fields.each("blocks", |value, path| {
        let block = block(value, path, next_address)?;
        next_address = block.address.wrapping_add(block.size);
        Ok(block)
    })?;
    let sum = |keep: fn(&SnapshotBlock) -> bool, size: fn(&SnapshotBlock) -> u64| {
        saturating_sum(blocks.iter().filter(|block| keep(block)).map(size))
    };
    let pool_id = fields.optional("segment_pool_id", |value, path| {
        let items = list(value, path)?;
        match items.as_slice() {
            [high, low] => Ok((unsigned(high, path)?, unsigned(low, path)?)),
            _ => Err(shape_error(
                path,
                "a pair (int, int)",
                format!("{} items", items.len()),
            )),
        }
    })?;
    Ok(SnapshotSegment {
        device: fields.optional("device", unsigned)?.unwrap_or(0),
        address,
        total_size: fields.required("total_size", unsigned)?,
        allocated_size: fields
            .optional("allocated_size", unsigned)?
            .unwrap_or_else(|| {
                sum(
                    |block| block.state == BlockState::ActiveAllocated,
                    |block| block.size,
                )
            }),
        active_size: fields
            .optional("active_size", unsigned)?
            .unwrap_or_else(|| {
                sum(
                    |block| block.state != BlockState::Inactive,
                    |block| block.size,
                )
            }),
        requested_size: fields
            .optional("requested_size", unsigned)?
            .unwrap_or_else(|| {
                sum(
                    |block| block.state != BlockState::Inactive,
                    |block| block.requested_size,
                )
            }),
        stream: fields.optional("stream", unsigned)?.unwrap_or(0),
        segment_type: fields.optional("segment_type", |value, path| {
            named(
                value,
                path,
                SegmentType::ALL,
                SegmentType::as_str,
                "\"small\" or \"large\"",
            )
        })?,
        segment_pool_id: pool_id.unwrap_or((0, 0)),
        is_expandable: fields
            .optional("is_expandable", |value, path| match value {
                Value::Bool(flag) => Ok(*flag),
                other => Err(shape_error(path, "a bool", other.type_name().to_owned())),
            })?
            .unwrap_or(false),
        blocks,
    })
}

fn block(value: &Value, path: &Path<'_>, implied_address: u64) -> Result<SnapshotBlock, ReadError> {
    let fields = DictFields::of(value, path)?;
    let size = fields.required("size", unsigned)?;
    // Legacy blocks keep the requested size in `history[0].real_size`.
    let legacy_requested = || {
        let history = fields.each("history", |entry, path| {
            DictFields::of(entry, path)?.optional("real_size", unsigned)
        })?;
        Ok::<_, ReadError>(history.into_iter().next().flatten())
    };
    let requested_size = match fields.optional("requested_size", unsigned)? {
        Some(requested) => requested,
        None => legacy_requested()?.unwrap_or(size),
    };
    Ok(SnapshotBlock {
        address: fields
            .optional("address", unsigned)?
            .unwrap_or(implied_address),
        size,
        requested_size,
        state: fields.required("state", |value, path| {
            let name = string(value, path)?;
            // The C++ writes active_pending_free; the docstring and some exporters say
            // active_awaiting_free.
            if name == "active_awaiting_free" {
                return Ok(BlockState::ActivePendingFree);
            }
            named(
                value,
                path,
                BlockState::ALL,
                BlockState::as_str,
                "active_allocated, active_pending_free or inactive",
            )
        })?,
    })
}

/// Reads one trace entry dict; its `frames` are interned in `stacks`. With it, the name of
/// its action when gpumem does not know it ([`Action::Unknown`]).
pub(super) fn trace_entry(
    value: &Value,
    path: &Path<'_>,
    stacks: &mut Stacks,
) -> Result<(TraceEntry, Option<String>), ReadError> {
    let fields = DictFields::of(value, path)?;
    let (action, unknown) = fields.required("action", |value, path| {
        let name = string(value, path)?;
        Ok(
            match Action::ALL.iter().find(|action| action.as_str() == name) {
                Some(&action) => (action, None),
                None => (Action::Unknown, Some(excerpt(name))),
            },
        )
    })?;
    // PyTorch writes `addr` and `size` on every entry but `oom` (`device_free` instead of
    // `addr`); the actions that move a block or a segment need both, and a segment's address
    // is never null. Other actions (`oom`, `snapshot`, annotations, unknown ones) carry
    // nothing the trace uses: what they lack reads as 0.
    let (addr, size) = match action {
        Action::Alloc | Action::FreeRequested | Action::FreeCompleted | Action::Free => (
            fields.required_for("addr", action, unsigned)?,
            fields.required_for("size", action, unsigned)?,
        ),
        Action::SegmentAlloc | Action::SegmentFree | Action::SegmentMap | Action::SegmentUnmap => (
            fields.required_for("addr", action, segment_address)?,
            fields.required_for("size", action, unsigned)?,
        ),
        Action::Oom | Action::Snapshot | Action::UserDefined | Action::Unknown => (
            fields.optional("addr", unsigned)?.unwrap_or(0),
            fields.optional("size", unsigned)?.unwrap_or(0),
        ),
    };
    let entry = TraceEntry {
        action,
        addr,
        size,
        stream: fields.optional("stream", unsigned)?.unwrap_or(0),
        time_us: fields.optional("time_us", unsigned)?.unwrap_or(0),
        device_free: fields.optional("device_free", unsigned)?,
        stack: fields
            .optional("frames", |value, path| stack(value, path, stacks))?
            .flatten(),
    };
    Ok((entry, unknown))
}

/// Interns a `frames` list (innermost first); `None` for an empty one. Frames the streaming
/// unpickler did not keep (memo references to parts it passed over) are left out.
pub(super) fn stack(
    value: &Value,
    path: &Path<'_>,
    stacks: &mut Stacks,
) -> Result<Option<StackId>, ReadError> {
    match value {
        Value::Stack(id) => return Ok(Some(*id)),
        Value::NotKept => return Ok(None),
        _ => {}
    }
    let items = list(value, path)?;
    if let [Value::Stack(id)] = items.as_slice() {
        return Ok(Some(*id));
    }
    let mut frames = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        if let Some(id) = frame(item, &Path::Index(path, index), stacks)? {
            frames.push(id);
        }
    }
    Ok(stacks.stack(&frames))
}

/// Interns one frame dict (`filename`, `line`, `name`; a missing one reads as empty or 0);
/// `None` for a frame the streaming unpickler did not keep.
pub(super) fn frame(
    value: &Value,
    path: &Path<'_>,
    stacks: &mut Stacks,
) -> Result<Option<FrameId>, ReadError> {
    match value {
        Value::Frame(id) => return Ok(Some(*id)),
        Value::NotKept => return Ok(None),
        _ => {}
    }
    let fields = DictFields::of(value, path)?;
    if let [(Value::Frame(id), _)] = fields.entries.as_slice() {
        return Ok(Some(*id));
    }
    let shared_string = |value: &Value, path: &Path<'_>| match value {
        Value::Str(text) => Ok(text.clone()),
        other => Err(shape_error(path, "a string", other.type_name().to_owned())),
    };
    let filename = fields.optional("filename", shared_string)?;
    let name = fields.optional("name", shared_string)?;
    let line = fields.optional("line", unsigned)?.unwrap_or(0);
    Ok(Some(stacks.frame(
        filename.as_deref().unwrap_or(""),
        line,
        name.as_deref().unwrap_or(""),
    )))
}

/// One of a fixed set of named values.
fn named<T: Copy>(
    value: &Value,
    path: &Path<'_>,
    all: &[T],
    name_of: fn(T) -> &'static str,
    expected: &'static str,
) -> Result<T, ReadError> {
    let name = string(value, path)?;
    all.iter()
        .copied()
        .find(|candidate| name_of(*candidate) == name)
        .ok_or_else(|| shape_error(path, expected, excerpt(name)))
}

fn setting(
    value: &Value,
    path: &Path<'_>,
    depth: usize,
    budget: &mut usize,
) -> Result<SettingValue, ReadError> {
    *budget = budget
        .checked_sub(1)
        .ok_or_else(|| shape_error(path, "a small settings value", "too many nodes".to_owned()))?;
    if depth > MAX_SETTING_DEPTH {
        return Err(shape_error(
            path,
            "a settings value nested at most 16 deep",
            "deeper nesting".to_owned(),
        ));
    }
    Ok(match value {
        Value::None => SettingValue::None,
        Value::Bool(flag) => SettingValue::Bool(*flag),
        Value::Int(number) => SettingValue::Int(*number),
        Value::Unsigned(_) | Value::HugeInt => {
            return Err(shape_error(
                path,
                "a 64-bit integer",
                "a larger one".to_owned(),
            ))
        }
        Value::Float(number) => SettingValue::Float(*number),
        Value::Str(text) => SettingValue::Str(text.to_string()),
        Value::Bytes | Value::Streamed(_) | Value::NotKept | Value::Frame(_) | Value::Stack(_) => {
            return Err(shape_error(
                path,
                "a settings value",
                value.type_name().to_owned(),
            ))
        }
        Value::List(items) => SettingValue::List(
            items
                .borrow()
                .iter()
                .enumerate()
                .map(|(index, item)| setting(item, &Path::Index(path, index), depth + 1, budget))
                .collect::<Result<_, _>>()?,
        ),
        Value::Dict(entries) => SettingValue::Map(
            entries
                .borrow()
                .iter()
                .map(|(key, item)| {
                    let key = match key {
                        Value::Str(text) => text.to_string(),
                        Value::Int(number) => number.to_string(),
                        Value::Unsigned(number) => number.to_string(),
                        other => {
                            return Err(shape_error(
                                path,
                                "string keys",
                                other.type_name().to_owned(),
                            ))
                        }
                    };
                    let item = setting(item, &Path::Key(path, &key), depth + 1, budget)?;
                    Ok((key, item))
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// The same document model from the JSON text `bytes`. Nesting deeper than [`MAX_NESTING`]
/// is refused before parsing (serde_json's own limit, 128, would otherwise answer with a
/// message that says nothing of snapshots).
pub(super) fn from_json(bytes: &[u8]) -> Result<Document, ReadError> {
    if let Some(offset) = nesting_passes_limit(bytes, MAX_NESTING) {
        return Err(ReadError::NestedTooDeep {
            encoding: SnapshotEncoding::Json,
            offset: offset as u64,
            limit: MAX_NESTING,
        });
    }
    let value = serde_json::from_slice(bytes).map_err(|error| ReadError::Malformed {
        line: error.line() as u64,
        expected: "a JSON memory snapshot",
        detail: clip(error.to_string()),
    })?;
    let mut arena = ContainerArena::default();
    let root = json_value(value, &mut arena);
    Ok(Document::new(root, arena))
}

/// The offset of the first `[` or `{` of the JSON text `bytes` that opens a container nested
/// more than `limit` deep; `None` if none does. Brackets in strings do not count; any other
/// syntax error is left to the parser.
fn nesting_passes_limit(bytes: &[u8], limit: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (offset, &byte) in bytes.iter().enumerate() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Some(offset);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// One JSON value (the nesting, and so this recursion, is at most [`MAX_NESTING`] deep).
fn json_value(value: serde_json::Value, arena: &mut ContainerArena) -> Value {
    match value {
        serde_json::Value::Null => Value::None,
        serde_json::Value::Bool(flag) => Value::Bool(flag),
        serde_json::Value::Number(number) => match (number.as_i64(), number.as_u64()) {
            (Some(signed), _) => Value::Int(signed),
            (None, Some(unsigned)) => Value::Unsigned(unsigned),
            (None, None) => Value::Float(number.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(text) => Value::Str(text.into()),
        serde_json::Value::Array(items) => {
            let items = items
                .into_iter()
                .map(|item| json_value(item, arena))
                .collect();
            arena.list(items)
        }
        serde_json::Value::Object(entries) => {
            let entries = entries
                .into_iter()
                .map(|(key, item)| (Value::Str(key.into()), json_value(item, arena)))
                .collect();
            arena.dict(entries)
        }
    }
}
