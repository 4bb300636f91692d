//! The decoded form of a snapshot document (pickle or JSON), or of one piece of it, before
//! its typed walk.
//!
//! Containers are shared (`Rc`): a pickle's memo refers to the same object from many places,
//! and may even make a container contain itself. Every container that can be reached again
//! (a JSON document's, a pickle's top level and free-form parts such as `allocator_settings`)
//! is registered in a [`ContainerArena`], which empties them all when it is dropped: that
//! breaks reference cycles (no leak) and makes dropping non-recursive (no stack overflow on
//! deeply nested input), because each container's children are still held by the arena while
//! it is emptied. The streaming unpickler builds segments and trace entries outside the arena
//! (nothing refers to them again, and their nesting is bounded), so they are freed as soon as
//! they are handed on.

use std::cell::RefCell;
use std::rc::Rc;

use gpumem_snapshot::{FrameId, StackId};

/// How deep containers may nest in a snapshot document (`[[]]` is 2 deep). PyTorch's nest
/// at most 9 levels (1.13: segments, segment, blocks, block, history, entry, frames, frame;
/// `allocator_settings` a few), so the limit refuses only what is no snapshot, and bounds
/// the nesting that anything walking a document (JSON's conversion) may meet.
pub(crate) const MAX_NESTING: usize = 100;

/// How many keys of a dict an error message names.
const KEYS_SHOWN: usize = 8;

/// A list (also a tuple or a set) whose items may still be appended to while unpickling.
pub(crate) type List = Rc<RefCell<Vec<Value>>>;
/// A dict as its entries in insertion order (a later entry for a key wins).
pub(crate) type Dict = Rc<RefCell<Vec<(Value, Value)>>>;

/// A decoded pickle (or JSON) value.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    /// `None` / `null`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An integer that fits in an `i64`.
    Int(i64),
    /// An integer above `i64::MAX` that fits in a `u64` (kept apart so that a value stays
    /// 16 bytes: snapshots hold millions of them).
    Unsigned(u64),
    /// An integer outside both ranges.
    HugeInt,
    /// A float.
    Float(f64),
    /// A string.
    Str(Rc<str>),
    /// A byte string (its content is never needed).
    Bytes,
    /// A list, tuple or set.
    List(List),
    /// A dict.
    Dict(Dict),
    /// A list whose items the streaming unpickler handed on as they were read (segments, a
    /// device's trace entries), with how many there were.
    Streamed(usize),
    /// A value the streaming unpickler did not keep: a container in a part of the snapshot
    /// gpumem does not read, or a memo reference to one.
    NotKept,
    /// A frame dict the streaming unpickler interned (in the sink's stacks).
    Frame(FrameId),
    /// A `frames` list the streaming unpickler interned (in the sink's stacks).
    Stack(StackId),
}

impl Value {
    /// A short name of the value's type, for error messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Self::None => "None",
            Self::Bool(_) => "a bool",
            Self::Int(_) | Self::Unsigned(_) => "an integer",
            Self::HugeInt => "an integer too large for 64 bits",
            Self::Float(_) => "a float",
            Self::Str(_) => "a string",
            Self::Bytes => "bytes",
            Self::List(_) => "a list",
            Self::Dict(_) => "a dict",
            Self::Streamed(_) => "a list",
            Self::NotKept => {
                "a memo reference to a part the streaming reader does not keep (a part it \
                 skips, a whole list of segments or of a device's entries, or an entry more \
                 than 16384 entries back)"
            }
            Self::Frame(_) => "a dict",
            Self::Stack(_) => "a list",
        }
    }

    /// The plural of [`Self::type_name`], for describing a list's items.
    fn plural_type_name(&self) -> &'static str {
        match self {
            Self::None => "Nones",
            Self::Bool(_) => "bools",
            Self::Int(_) | Self::Unsigned(_) | Self::HugeInt => "integers",
            Self::Float(_) => "floats",
            Self::Str(_) => "strings",
            Self::Bytes => "byte strings",
            Self::List(_) | Self::Streamed(_) | Self::Stack(_) => "lists",
            Self::Dict(_) | Self::Frame(_) => "dicts",
            Self::NotKept => "values the reader did not keep",
        }
    }

    /// What the value is, with a look one level inside a container (`a dict with keys a, b`,
    /// `a list of 3 integers`), for the error saying a document is not a snapshot.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Dict(entries) => {
                let entries = entries.borrow();
                if entries.is_empty() {
                    return "an empty dict".to_owned();
                }
                format!("a dict with {}", keys(&entries))
            }
            Self::List(items) => {
                let items = items.borrow();
                let mut kinds: Vec<&str> = Vec::new();
                for item in items.iter() {
                    if !kinds.contains(&item.plural_type_name()) {
                        kinds.push(item.plural_type_name());
                    }
                }
                let first_dict = match items.first() {
                    Some(Self::Dict(entries)) if !entries.borrow().is_empty() => {
                        format!(", the first with {}", keys(&entries.borrow()))
                    }
                    _ => String::new(),
                };
                match (items.as_slice(), kinds.as_slice()) {
                    ([], _) => "an empty list".to_owned(),
                    // A dict's description does not look further in: no recursion.
                    ([only @ Self::Dict(_)], _) => {
                        format!("a list of one item, {}", only.describe())
                    }
                    ([only], _) => format!("a list of one item, {}", only.type_name()),
                    (_, [kind]) => format!("a list of {} {kind}{first_dict}", items.len()),
                    (_, kinds) => format!(
                        "a list of {} items ({}){first_dict}",
                        items.len(),
                        kinds.join(", ")
                    ),
                }
            }
            other => other.type_name().to_owned(),
        }
    }

    /// An integer value, in the narrowest variant that holds it.
    pub(crate) fn int(number: i128) -> Self {
        if let Ok(signed) = i64::try_from(number) {
            Self::Int(signed)
        } else if let Ok(unsigned) = u64::try_from(number) {
            Self::Unsigned(unsigned)
        } else {
            Self::HugeInt
        }
    }
}

/// The keys of a dict's entries, for [`Value::describe`]: `keys a, b` (the first
/// [`KEYS_SHOWN`], then how many more), a key that is not a string by its type.
fn keys(entries: &[(Value, Value)]) -> String {
    let names: Vec<&str> = entries
        .iter()
        .take(KEYS_SHOWN)
        .map(|(key, _)| match key {
            Value::Str(name) => name,
            other => other.type_name(),
        })
        .collect();
    let more = match entries.len().saturating_sub(KEYS_SHOWN) {
        0 => String::new(),
        more => format!(" and {more} more"),
    };
    let noun = if entries.len() == 1 { "key" } else { "keys" };
    format!("{noun} {}{more}", names.join(", "))
}

/// Owns every container of a document and empties them all when dropped (see the module
/// documentation).
#[derive(Default)]
pub(crate) struct ContainerArena {
    lists: Vec<List>,
    dicts: Vec<Dict>,
}

impl ContainerArena {
    /// A new list value, registered in the arena.
    pub(crate) fn list(&mut self, items: Vec<Value>) -> Value {
        let list = Rc::new(RefCell::new(items));
        self.lists.push(list.clone());
        Value::List(list)
    }

    /// A new dict value, registered in the arena.
    pub(crate) fn dict(&mut self, entries: Vec<(Value, Value)>) -> Value {
        let dict = Rc::new(RefCell::new(entries));
        self.dicts.push(dict.clone());
        Value::Dict(dict)
    }
}

impl Drop for ContainerArena {
    fn drop(&mut self) {
        for list in &self.lists {
            // The items are dropped here; a container among them is still held by the arena.
            drop(std::mem::take(&mut *list.borrow_mut()));
        }
        for dict in &self.dicts {
            drop(std::mem::take(&mut *dict.borrow_mut()));
        }
    }
}

/// A decoded document: its root value and the arena that owns its containers.
pub(crate) struct Document {
    /// The top-level value.
    pub(crate) root: Value,
    /// Declared after `root`, so it is dropped after it.
    _arena: ContainerArena,
}

impl Document {
    /// A document from its root and the arena its containers were registered in.
    pub(crate) fn new(root: Value, arena: ContainerArena) -> Self {
        Self {
            root,
            _arena: arena,
        }
    }
}

impl std::fmt::Debug for Document {
    /// Shallow: a document may contain itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Document")
            .field("root", &self.root.type_name())
            .finish_non_exhaustive()
    }
}
