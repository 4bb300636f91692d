//! Blocks and block pools: the bookkeeping PyTorch keeps in `Block` and `BlockPool`, held in a
//! slab of nodes linked by index so that an operation allocates nothing but tree nodes.

use std::collections::BTreeSet;
use std::ops::{Index, IndexMut};

use gpumem_device::{DevicePtr, StreamId};

use crate::stats::SizeClass;

/// "No block": the end of a segment's block list, or a block outside expandable segments.
pub(super) const NIL: usize = usize::MAX;

/// A range of a segment: handed out, cached, or (in an expandable segment) not backed by
/// memory. The blocks of one segment tile it and form a doubly linked list in address order.
#[derive(Clone, Copy, Debug)]
pub(super) struct Node {
    /// Start address.
    pub addr: DevicePtr,
    /// Bytes.
    pub size: u64,
    /// The stream whose free set the block belongs to.
    pub stream: StreamId,
    /// Small or large pool.
    pub pool: SizeClass,
    /// The block before this one in its segment, or [`NIL`].
    pub prev: usize,
    /// The block after this one in its segment, or [`NIL`].
    pub next: usize,
    /// Handed out (or waiting on stream events in the pool frame).
    pub allocated: bool,
    /// Backed by device memory; only blocks of expandable segments can be unmapped.
    pub mapped: bool,
    /// Index of the expandable segment the block lies in, or [`NIL`] for a cudaMalloc'd one.
    pub expandable: usize,
    /// The pool's search counter when the block was cached, for garbage-collection ages.
    pub gc_base: u64,
    /// Whether the slab slot holds a block (false once removed).
    pub live: bool,
}

impl Node {
    /// A new unallocated block alone in its segment.
    pub fn new(addr: DevicePtr, size: u64, stream: StreamId, pool: SizeClass) -> Node {
        Node {
            addr,
            size,
            stream,
            pool,
            prev: NIL,
            next: NIL,
            allocated: false,
            mapped: true,
            expandable: NIL,
            gc_base: 0,
            live: true,
        }
    }

    /// Whether the block shares its segment with others (PyTorch's `is_split`): such a block
    /// cannot be given back to the device on its own.
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    /// Whether the block lies in an expandable segment.
    pub fn is_expandable(&self) -> bool {
        self.expandable != NIL
    }
}

/// All blocks, addressed by index; freed slots are reused.
#[derive(Debug, Default)]
pub(super) struct Slab {
    nodes: Vec<Node>,
    vacant: Vec<usize>,
}

impl Slab {
    /// Stores `node` and returns its index.
    pub fn insert(&mut self, node: Node) -> usize {
        match self.vacant.pop() {
            Some(idx) => {
                self.nodes[idx] = node;
                idx
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    /// Frees the slot of block `idx`.
    pub fn remove(&mut self, idx: usize) {
        self.nodes[idx].live = false;
        self.vacant.push(idx);
    }

    /// Block `idx`, if the slot holds one (for indices that come back from outside, such as a
    /// block's handle).
    pub fn get_mut(&mut self, idx: usize) -> Option<&mut Node> {
        self.nodes.get_mut(idx).filter(|n| n.live)
    }

    /// Every live block with its index, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes.iter().enumerate().filter(|(_, n)| n.live)
    }

    /// Links `idx` between `before` and `after` (either may be [`NIL`]), which must be
    /// neighbours.
    pub fn splice(&mut self, idx: usize, before: usize, after: usize) {
        if before != NIL {
            self.nodes[before].next = idx;
        }
        if after != NIL {
            self.nodes[after].prev = idx;
        }
        let node = &mut self.nodes[idx];
        node.prev = before;
        node.next = after;
    }
}

impl Index<usize> for Slab {
    type Output = Node;

    fn index(&self, idx: usize) -> &Node {
        &self.nodes[idx]
    }
}

impl IndexMut<usize> for Slab {
    fn index_mut(&mut self, idx: usize) -> &mut Node {
        &mut self.nodes[idx]
    }
}

/// Key of a cached block in its pool's free set: PyTorch's `BlockComparatorSize` order
/// (stream, size, address), so that a range lookup is best fit within the stream.
pub(super) type FreeKey = (StreamId, u64, DevicePtr, usize);

/// Key of an unmapped block: PyTorch's `BlockComparatorAddress` order (stream, address).
pub(super) type UnmappedKey = (StreamId, DevicePtr, usize);

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
            let mut this_stream = self.free.range(..=(stream, u64::MAX, u64::MAX, usize::MAX));
            if let Some(key) = this_stream.next_back() {
                largest = largest.max(key.1);
            }
            cursor = stream.0.checked_add(1).and_then(|next| {
                self.free
                    .range((StreamId(next), 0, 0, 0)..)
                    .next()
                    .map(|k| k.0)
            });
        }
        largest
    }
}
