//! Blocks and block pools: the bookkeeping PyTorch keeps in `Block` and `BlockPool`, held in a
//! slab of nodes linked by index so that an operation allocates nothing but tree nodes.

use std::collections::BTreeSet;
use std::ops::{Index, IndexMut};

use gpumem_device::{DevicePtr, StreamId};

use crate::policies::slots::{SlotIndex, SlotVec};
use crate::stats::SizeClass;

/// A range of a segment: handed out, cached, or (in an expandable segment) not backed by
/// memory. The blocks of one segment tile it and form a doubly linked list in address order.
#[derive(Clone, Copy, Debug)]
pub(super) struct BlockNode {
    /// Start address.
    pub addr: DevicePtr,
    /// Bytes.
    pub size: u64,
    /// The stream whose free set the block belongs to.
    pub stream: StreamId,
    /// Small or large pool.
    pub pool: SizeClass,
    /// The block before this one in its segment, if any.
    pub prev: Option<SlotIndex>,
    /// The block after this one in its segment, if any.
    pub next: Option<SlotIndex>,
    /// Handed out (or waiting on stream events in the pool frame).
    pub allocated: bool,
    /// Backed by device memory; only blocks of expandable segments can be unmapped.
    pub mapped: bool,
    /// Index of the expandable segment the block lies in; `None` for a cudaMalloc'd one.
    pub expandable: Option<SlotIndex>,
    /// The pool's search counter when the block was cached, for garbage-collection ages.
    pub gc_base: u64,
    /// Whether the slab slot holds a block (false once removed).
    pub live: bool,
}

impl BlockNode {
    /// A new unallocated block alone in its segment.
    pub fn new(addr: DevicePtr, size: u64, stream: StreamId, pool: SizeClass) -> BlockNode {
        BlockNode {
            addr,
            size,
            stream,
            pool,
            prev: None,
            next: None,
            allocated: false,
            mapped: true,
            expandable: None,
            gc_base: 0,
            live: true,
        }
    }

    /// Whether the block shares its segment with others (PyTorch's `is_split`): such a block
    /// cannot be given back to the device on its own.
    pub fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }

    /// Whether the block lies in an expandable segment.
    pub fn is_expandable(&self) -> bool {
        self.expandable.is_some()
    }
}

/// All blocks, addressed by index; freed slots are reused.
#[derive(Debug)]
pub(super) struct Slab {
    nodes: SlotVec<BlockNode>,
    vacant: Vec<SlotIndex>,
}

impl Default for Slab {
    fn default() -> Self {
        Slab {
            nodes: SlotVec::new(BlockNode {
                live: false,
                ..BlockNode::new(0, 0, StreamId::DEFAULT, SizeClass::Small)
            }),
            vacant: Vec::new(),
        }
    }
}

impl Slab {
    /// Stores `node` and returns its index.
    ///
    /// # Panics
    /// With `u32::MAX` blocks stored: blocks are at least 512 B and tile device memory, so
    /// that would take 2 TiB of it.
    pub fn insert(&mut self, node: BlockNode) -> SlotIndex {
        match self.vacant.pop() {
            Some(idx) => {
                self[idx] = node;
                idx
            }
            None => self
                .nodes
                .push(node)
                .expect("fewer than u32::MAX blocks: they would cover 2 TiB"),
        }
    }

    /// Frees the slot of block `idx`.
    pub fn remove(&mut self, idx: SlotIndex) {
        self[idx].live = false;
        self.vacant.push(idx);
    }

    /// Block `idx`, if the slot holds one (for indices that come back from outside, such as a
    /// block's handle).
    pub fn get_mut(&mut self, idx: SlotIndex) -> Option<&mut BlockNode> {
        self.nodes.get_mut(idx).filter(|n| n.live)
    }

    /// Every live block with its index, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (SlotIndex, &BlockNode)> {
        self.nodes.iter().filter(|(_, n)| n.live)
    }

    /// Links `idx` between `before` and `after` (either may be absent), which must be
    /// neighbours.
    pub fn splice(&mut self, idx: SlotIndex, before: Option<SlotIndex>, after: Option<SlotIndex>) {
        if let Some(before) = before {
            self[before].next = Some(idx);
        }
        if let Some(after) = after {
            self[after].prev = Some(idx);
        }
        let node = &mut self[idx];
        node.prev = before;
        node.next = after;
    }
}

impl Index<SlotIndex> for Slab {
    type Output = BlockNode;

    fn index(&self, idx: SlotIndex) -> &BlockNode {
        &self.nodes[idx]
    }
}

impl IndexMut<SlotIndex> for Slab {
    fn index_mut(&mut self, idx: SlotIndex) -> &mut BlockNode {
        &mut self.nodes[idx]
    }
}

/// Key of a cached block in its pool's free set: PyTorch's `BlockComparatorSize` order
/// (stream, size, address), so that a range lookup is best fit within the stream.
pub(super) type FreeKey = (StreamId, u64, DevicePtr, SlotIndex);

/// Key of an unmapped block: PyTorch's `BlockComparatorAddress` order (stream, address).
pub(super) type UnmappedKey = (StreamId, DevicePtr, SlotIndex);

/// One of PyTorch's two block pools.
#[derive(Debug)]
pub(super) struct BlockPool {
    /// Cached (free, mapped) blocks.
    pub free: BTreeSet<FreeKey>,
    /// Unmapped ranges of expandable segments.
    pub unmapped: BTreeSet<UnmappedKey>,
    /// Searches so far while garbage collection is on (`get_free_blocks_call_count`).
    pub searches: u64,
}

impl BlockPool {
    /// An empty pool.
    pub fn new() -> BlockPool {
        BlockPool {
            free: BTreeSet::new(),
            unmapped: BTreeSet::new(),
            searches: 0,
        }
    }

    /// The largest cached block on any stream: the last key of each stream's range.
    pub fn largest_free_block(&self) -> u64 {
        let mut largest = 0;
        let mut cursor = self.free.first().map(|k| k.0);
        while let Some(stream) = cursor {
            let mut this_stream = self
                .free
                .range(..=(stream, u64::MAX, u64::MAX, SlotIndex::MAX));
            if let Some(key) = this_stream.next_back() {
                largest = largest.max(key.1);
            }
            cursor = stream.0.checked_add(1).and_then(|next| {
                self.free
                    .range((StreamId(next), 0, 0, SlotIndex::MIN)..)
                    .next()
                    .map(|k| k.0)
            });
        }
        largest
    }
}
