//! Stack frames, interned: each distinct string, frame and stack is stored once and named by
//! a small id, so that millions of events recorded with the same few thousand stacks cost a
//! 4-byte [`StackId`] each.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::Arc;

/// One stack frame as PyTorch records it: source file, line and function name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Source file (`filename`).
    pub filename: Arc<str>,
    /// Line in the file (`line`).
    pub line: u64,
    /// Function name (`name`).
    pub name: Arc<str>,
}

/// Names one frame of a [`Stacks`] table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FrameId(u32);

/// Names one stack of a [`Stacks`] table (non-zero, so that `Option<StackId>` is 4 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(NonZeroU32);

impl StackId {
    fn index(self) -> usize {
        self.0.get() as usize - 1
    }
}

/// The interned frames and stacks of a snapshot or trace; a stack lists its frames innermost
/// first, as PyTorch's `frames` lists do.
#[derive(Clone, Debug, Default)]
pub struct Stacks {
    strings: HashSet<Arc<str>>,
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, FrameId>,
    stacks: Vec<Arc<[FrameId]>>,
    stack_ids: HashMap<Arc<[FrameId]>, StackId>,
}

impl Stacks {
    /// The id of the frame `filename:line` in `name`, added if new.
    pub fn frame(&mut self, filename: &str, line: u64, name: &str) -> FrameId {
        let frame = Frame {
            filename: self.string(filename),
            line,
            name: self.string(name),
        };
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        let id = FrameId(u32::try_from(self.frames.len()).unwrap_or(u32::MAX));
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame, id);
        id
    }

    /// The id of the stack of `frames` (innermost first), added if new; `None` for no frames.
    pub fn stack(&mut self, frames: &[FrameId]) -> Option<StackId> {
        if frames.is_empty() {
            return None;
        }
        if let Some(&id) = self.stack_ids.get(frames) {
            return Some(id);
        }
        let id = StackId(NonZeroU32::new(u32::try_from(self.stacks.len() + 1).ok()?)?);
        let frames: Arc<[FrameId]> = frames.into();
        self.stacks.push(frames.clone());
        self.stack_ids.insert(frames, id);
        Some(id)
    }

    /// The frames of `stack`, innermost first (none for an id of another table).
    pub fn frames(&self, stack: StackId) -> impl ExactSizeIterator<Item = &Frame> + '_ {
        self.stacks
            .get(stack.index())
            .map_or(&[][..], |frames| &frames[..])
            .iter()
            .map(|id| &self.frames[id.0 as usize])
    }

    /// Number of distinct stacks.
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    /// Whether the table holds no stack.
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    fn string(&mut self, text: &str) -> Arc<str> {
        if let Some(shared) = self.strings.get(text) {
            return shared.clone();
        }
        let shared: Arc<str> = text.into();
        self.strings.insert(shared.clone());
        shared
    }
}

/// Two tables are equal when they hold the same stacks under the same ids.
impl PartialEq for Stacks {
    fn eq(&self, other: &Self) -> bool {
        self.stacks.len() == other.stacks.len()
            && self.stacks.iter().zip(&other.stacks).all(|(mine, theirs)| {
                mine.len() == theirs.len()
                    && mine
                        .iter()
                        .zip(theirs.iter())
                        .all(|(a, b)| self.frames[a.0 as usize] == other.frames[b.0 as usize])
            })
    }
}

impl Eq for Stacks {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_stacks_share_one_id() {
        let mut stacks = Stacks::default();
        let inner = stacks.frame("model.py", 10, "forward");
        let outer = stacks.frame("train.py", 3, "main");
        let first = stacks.stack(&[inner, outer]).unwrap();
        assert_eq!(stacks.frame("model.py", 10, "forward"), inner);
        assert_eq!(stacks.stack(&[inner, outer]), Some(first));
        assert_ne!(stacks.stack(&[outer, inner]), Some(first));
        assert_eq!(stacks.stack(&[]), None);
        let names: Vec<&str> = stacks.frames(first).map(|frame| &*frame.name).collect();
        assert_eq!(names, ["forward", "main"]);
        assert_eq!(stacks.len(), 2);
    }
}
