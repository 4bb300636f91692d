//! An O(1) index of address ranges: two-level segregated fit (TLSF) with immediate coalescing.
//!
//! The index tiles one or more *spans* (a VA reservation, or device segments) with nodes. A
//! node is a range `[offset, offset + size)` that is either handed out or free; nodes of a span
//! are linked in address order, so a freed node merges with free neighbours in O(1). Free nodes
//! also sit in one of [`BINS`] size classes, each a doubly linked list.
//!
//! Size classes work like a small floating-point number: the top level is the position of the
//! size's highest set bit (the exponent), the second level the next [`SUB_BITS`] bits (the
//! mantissa). Sizes below `2^SUB_BITS` get one class each. So every class spans at most
//! 1/16 = 6.25 % of its lower bound, and two bitmaps (one bit per exponent, one 16-bit mask per
//! exponent) find the first non-empty class at or above any class with two
//! trailing-zero counts: no loop over classes, whatever the number of free ranges.
//!
//! Allocation is *good fit*: it first looks at up to [`OWN_CLASS_SCAN`] nodes of the request's
//! own class for the smallest one that fits (catching exact fits, which matter for the
//! repetitive sizes of training steps), then takes any node of the first non-empty class whose
//! lower bound is above the request, where every node fits. The node is split exactly: the
//! front is handed out, the rest stays free.
//!
//! Nodes live in a slab ([`SlotVec`]) addressed by [`NodeId`], their links `Option<NodeId>`;
//! freed slots are recycled, so steady state allocates no heap memory. The design follows the
//! one documented in sebbbi's OffsetAllocator (and its Rust port `offset-allocator`), extended
//! to 64-bit byte offsets, several spans, and a bounded best-fit look into the request's own
//! class.

use crate::policies::slots::{SlotIndex, SlotVec};

/// Index of a node in the slab; links to no node are `None`.
pub(crate) type NodeId = SlotIndex;

/// Bits of the size that select the second-level class (the mantissa).
const SUB_BITS: u32 = 4;
/// Second-level classes per exponent.
const SUB_CLASSES: usize = 1 << SUB_BITS;
/// Exponents: 0 holds sizes below `SUB_CLASSES`; 1..=60 hold `[2^(e+3), 2^(e+4))`.
const TOP_CLASSES: usize = 64 - SUB_BITS as usize + 1;
/// All size classes.
pub(crate) const BINS: usize = TOP_CLASSES * SUB_CLASSES;
/// Nodes of the request's own class examined for a best fit before moving up a class.
const OWN_CLASS_SCAN: usize = 2;

/// What a slab slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A free range, filed in its class.
    Free,
    /// A range handed out.
    Used,
    /// Nothing: the slot waits in `spare` for reuse.
    Spare,
}

/// A slab slot: a range of a span and its links, or a spare slot.
#[derive(Clone, Copy, Debug)]
struct RangeNode {
    offset: u64,
    size: u64,
    state: State,
    /// A free node that is exactly one block handed back, merged with nothing: the hole a
    /// repeated request of that size fits exactly again.
    whole_block: bool,
    /// Neighbours in the free list of the node's class (free nodes only).
    class_prev: Option<NodeId>,
    class_next: Option<NodeId>,
    /// Neighbours in address order within the span.
    addr_prev: Option<NodeId>,
    addr_next: Option<NodeId>,
}

/// The class a free range of `size` bytes is filed under: the largest class whose lower bound
/// is at most `size`.
fn class_of(size: u64) -> usize {
    if size < SUB_CLASSES as u64 {
        return size as usize;
    }
    let top_bit = 63 - size.leading_zeros();
    let shift = top_bit - SUB_BITS;
    let mantissa = (size >> shift) as usize & (SUB_CLASSES - 1);
    (shift as usize + 1) * SUB_CLASSES + mantissa
}

/// The smallest size filed under `class`.
#[cfg(test)]
fn class_lower_bound(class: usize) -> u64 {
    let exponent = class / SUB_CLASSES;
    let mantissa = (class % SUB_CLASSES) as u64;
    if exponent == 0 {
        mantissa
    } else {
        (SUB_CLASSES as u64 + mantissa) << (exponent - 1)
    }
}

/// The TLSF index over address ranges.
#[derive(Debug)]
pub(crate) struct Tlsf {
    nodes: SlotVec<RangeNode>,
    /// Slab slots free for reuse.
    spare: Vec<NodeId>,
    /// Bit `e` set when some class of exponent `e` is non-empty.
    top_bitmap: u64,
    /// Per exponent, bit `m` set when class `(e, m)` is non-empty.
    sub_bitmaps: [u16; TOP_CLASSES],
    /// First free node of each class.
    heads: Box<[Option<NodeId>; BINS]>,
}

impl Default for Tlsf {
    fn default() -> Self {
        Tlsf {
            nodes: SlotVec::new(RangeNode {
                offset: 0,
                size: 0,
                state: State::Spare,
                whole_block: false,
                class_prev: None,
                class_next: None,
                addr_prev: None,
                addr_next: None,
            }),
            spare: Vec::new(),
            top_bitmap: 0,
            sub_bitmaps: [0; TOP_CLASSES],
            heads: Box::new([None; BINS]),
        }
    }
}

impl Tlsf {
    /// Adds a span `[offset, offset + size)` as one free node with no neighbours; returns its
    /// node, which stays the span's first node for the span's life (merges keep the lower
    /// node). `None` only if the slab is full.
    pub(crate) fn add_span(&mut self, offset: u64, size: u64) -> Option<NodeId> {
        let id = self.new_node(offset, size, None, None)?;
        self.file(id);
        Some(id)
    }

    /// Removes a span that is entirely free (its first node covers it all).
    pub(crate) fn remove_span(&mut self, first: NodeId) {
        let node = self.nodes[first];
        debug_assert!(node.state == State::Free && node.addr_prev.is_none());
        debug_assert!(node.addr_next.is_none());
        self.unfile(first);
        self.recycle(first);
    }

    /// Hands out `size` bytes (non-zero) from the best-fitting free node; `None` when no free
    /// node is large enough.
    pub(crate) fn allocate(&mut self, size: u64) -> Option<NodeId> {
        let own = class_of(size);
        let chosen = match self.best_in_class(own, size) {
            Some(id) => id,
            // A class's bit is set only while its list has a head.
            None => self.heads[self.first_class_at_or_above(own + 1)?]?,
        };
        self.unfile(chosen);
        let node = self.nodes[chosen];
        if node.size > size {
            // Without a slot for the rest, hand the whole node out rather than fail.
            if let Some(rest) = self.new_node(
                node.offset + size,
                node.size - size,
                Some(chosen),
                node.addr_next,
            ) {
                if let Some(next) = node.addr_next {
                    self.nodes[next].addr_prev = Some(rest);
                }
                let n = &mut self.nodes[chosen];
                n.addr_next = Some(rest);
                n.size = size;
                self.file(rest);
            }
        }
        self.nodes[chosen].state = State::Used;
        Some(chosen)
    }

    /// Takes back a handed-out node and merges it with free neighbours; returns the free node
    /// that now covers it.
    pub(crate) fn free(&mut self, id: NodeId) -> NodeId {
        debug_assert!(self.nodes[id].state == State::Used);
        let mut id = id;
        let mut whole_block = true;
        if let Some(next) = self.nodes[id].addr_next.filter(|&next| self.is_free(next)) {
            self.unfile(next);
            self.absorb(id, next);
            whole_block = false;
        }
        if let Some(prev) = self.nodes[id].addr_prev.filter(|&prev| self.is_free(prev)) {
            self.unfile(prev);
            self.absorb(prev, id);
            id = prev;
            whole_block = false;
        }
        self.nodes[id].whole_block = whole_block;
        self.file(id);
        id
    }

    /// Takes `[offset, offset + size)` out of the free node `id` that contains it, for good:
    /// what lies before and after stays free, but the two parts no longer touch (they become
    /// separate spans). `false`, with nothing changed, only if the slab is full.
    pub(crate) fn carve(&mut self, id: NodeId, offset: u64, size: u64) -> bool {
        let node = self.nodes[id];
        debug_assert!(node.state == State::Free && node.offset <= offset);
        debug_assert!(offset + size <= node.offset + node.size);
        let right_size = node.offset + node.size - (offset + size);
        let right = if right_size > 0 {
            match self.new_node(offset + size, right_size, None, node.addr_next) {
                Some(right) => Some(right),
                None => return false,
            }
        } else {
            None
        };
        self.unfile(id);
        if let Some(next) = node.addr_next {
            self.nodes[next].addr_prev = right;
        }
        if offset > node.offset {
            let left = &mut self.nodes[id];
            left.size = offset - node.offset;
            left.addr_next = None;
            left.whole_block = false;
            self.file(id);
        } else {
            if let Some(prev) = node.addr_prev {
                self.nodes[prev].addr_next = None;
            }
            self.recycle(id);
        }
        if let Some(right) = right {
            self.file(right);
        }
        true
    }

    /// Puts a range taken out by [`Tlsf::carve`] back: it is linked to the nodes that end where
    /// it starts and start where it ends (if they border a carved gap) and merged with them if
    /// free. Scans the whole slab: for the rare case of an exhausted address space. `false`
    /// only if the slab is full.
    pub(crate) fn restore(&mut self, offset: u64, size: u64) -> bool {
        let (mut before, mut after) = (None, None);
        for (i, node) in self.nodes.iter() {
            if node.state == State::Spare {
                continue;
            }
            if node.offset + node.size == offset && node.addr_next.is_none() {
                before = Some(i);
            }
            if node.offset == offset + size && node.addr_prev.is_none() {
                after = Some(i);
            }
        }
        let Some(id) = self.new_node(offset, size, before, after) else {
            return false;
        };
        if let Some(before) = before {
            self.nodes[before].addr_next = Some(id);
        }
        if let Some(after) = after {
            self.nodes[after].addr_prev = Some(id);
        }
        // Handed out for a moment, then freed: the free path merges and files it.
        self.nodes[id].state = State::Used;
        let merged = self.free(id);
        self.nodes[merged].whole_block = false;
        true
    }

    /// Whether a free node is exactly one block handed back, merged with nothing.
    pub(crate) fn is_whole_block(&self, id: NodeId) -> bool {
        self.nodes[id].whole_block
    }

    /// Start of a node's range.
    pub(crate) fn offset(&self, id: NodeId) -> u64 {
        self.nodes[id].offset
    }

    /// Bytes of a node's range.
    pub(crate) fn size(&self, id: NodeId) -> u64 {
        self.nodes[id].size
    }

    /// Whether a node is free (cached) rather than handed out.
    pub(crate) fn is_free(&self, id: NodeId) -> bool {
        self.nodes[id].state == State::Free
    }

    /// Whether `id` is a handed-out node starting at `offset`: a check on a node id that
    /// came back from outside (a block's handle).
    pub(crate) fn is_used_at(&self, id: NodeId, offset: u64) -> bool {
        self.nodes
            .get(id)
            .is_some_and(|n| n.state == State::Used && n.offset == offset)
    }

    /// Every handed-out node, in slab order (not a hot path: reclaim, status and snapshots).
    pub(crate) fn used_nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes
            .iter()
            .filter(|(_, n)| n.state == State::Used)
            .map(|(id, _)| id)
    }

    /// The node after `id` in address order within its span.
    pub(crate) fn next_in_span(&self, id: NodeId) -> Option<NodeId> {
        self.nodes[id].addr_next
    }

    /// Every free node, class by class (not a hot path: reclaim, status and snapshots).
    pub(crate) fn free_nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.heads.iter().flat_map(move |&head| {
            std::iter::successors(head, move |&id| self.nodes[id].class_next)
        })
    }

    /// The smallest of the first [`OWN_CLASS_SCAN`] nodes of `class` that holds `size` bytes.
    fn best_in_class(&self, class: usize, size: u64) -> Option<NodeId> {
        let mut best: Option<NodeId> = None;
        let mut next = self.heads[class];
        for _ in 0..OWN_CLASS_SCAN {
            let Some(id) = next else {
                break;
            };
            let node = &self.nodes[id];
            if node.size == size {
                return Some(id);
            }
            if node.size > size && best.is_none_or(|b| node.size < self.nodes[b].size) {
                best = Some(id);
            }
            next = node.class_next;
        }
        best
    }

    /// The first non-empty class at or above `class`.
    fn first_class_at_or_above(&self, class: usize) -> Option<usize> {
        if class >= BINS {
            return None;
        }
        let top = class / SUB_CLASSES;
        let subs = self.sub_bitmaps[top] & (u16::MAX << (class % SUB_CLASSES));
        if subs != 0 {
            return Some(top * SUB_CLASSES + subs.trailing_zeros() as usize);
        }
        let tops = self.top_bitmap & (u64::MAX << (top + 1));
        if tops == 0 {
            return None;
        }
        let top = tops.trailing_zeros() as usize;
        Some(top * SUB_CLASSES + self.sub_bitmaps[top].trailing_zeros() as usize)
    }

    fn new_node(
        &mut self,
        offset: u64,
        size: u64,
        addr_prev: Option<NodeId>,
        addr_next: Option<NodeId>,
    ) -> Option<NodeId> {
        let node = RangeNode {
            offset,
            size,
            state: State::Free,
            whole_block: false,
            class_prev: None,
            class_next: None,
            addr_prev,
            addr_next,
        };
        if let Some(id) = self.spare.pop() {
            self.nodes[id] = node;
            return Some(id);
        }
        self.nodes.push(node)
    }

    /// `left` takes over its address neighbour `right`, whose slot is recycled.
    fn absorb(&mut self, left: NodeId, right: NodeId) {
        let r = self.nodes[right];
        let l = &mut self.nodes[left];
        l.size += r.size;
        l.addr_next = r.addr_next;
        if let Some(next) = r.addr_next {
            self.nodes[next].addr_prev = Some(left);
        }
        self.recycle(right);
    }

    /// Returns a slot to the slab for reuse.
    fn recycle(&mut self, id: NodeId) {
        self.nodes[id].state = State::Spare;
        self.spare.push(id);
    }

    /// Marks a node free and puts it at the head of its class.
    fn file(&mut self, id: NodeId) {
        let class = class_of(self.nodes[id].size);
        let head = self.heads[class];
        let node = &mut self.nodes[id];
        node.state = State::Free;
        node.class_prev = None;
        node.class_next = head;
        if let Some(head) = head {
            self.nodes[head].class_prev = Some(id);
        }
        self.heads[class] = Some(id);
        self.top_bitmap |= 1 << (class / SUB_CLASSES);
        self.sub_bitmaps[class / SUB_CLASSES] |= 1 << (class % SUB_CLASSES);
    }

    /// Takes a free node out of its class list.
    fn unfile(&mut self, id: NodeId) {
        let node = self.nodes[id];
        let class = class_of(node.size);
        match node.class_prev {
            Some(prev) => self.nodes[prev].class_next = node.class_next,
            None => self.heads[class] = node.class_next,
        }
        if let Some(next) = node.class_next {
            self.nodes[next].class_prev = node.class_prev;
        }
        if self.heads[class].is_none() {
            let top = class / SUB_CLASSES;
            self.sub_bitmaps[top] &= !(1 << (class % SUB_CLASSES));
            if self.sub_bitmaps[top] == 0 {
                self.top_bitmap &= !(1 << top);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Tlsf {
        fn free_bytes(&self) -> u64 {
            self.free_nodes().map(|id| self.size(id)).sum()
        }

        /// Checks every structural invariant; panics with what is broken.
        fn check(&self, spans: &[(NodeId, u64, u64)]) {
            let free_listed: std::collections::HashSet<NodeId> = self.free_nodes().collect();
            let mut free_bytes = 0;
            for &(first, start, len) in spans {
                let mut at = start;
                let mut prev_free = false;
                let mut id = Some(first);
                while let Some(n) = id {
                    let node = self.nodes[n];
                    assert_eq!(node.offset, at, "nodes tile the span");
                    assert!(node.size > 0);
                    assert_ne!(node.state, State::Spare, "spans link no spare slot");
                    let free = self.is_free(n);
                    assert!(!(prev_free && free), "free neighbours are merged");
                    assert_eq!(free, free_listed.contains(&n));
                    if free {
                        free_bytes += node.size;
                    }
                    prev_free = free;
                    at += node.size;
                    id = self.next_in_span(n);
                }
                assert_eq!(at, start + len, "nodes cover the span");
            }
            assert_eq!(free_bytes, self.free_bytes());
            for (class, &head) in self.heads.iter().enumerate() {
                let top = class / SUB_CLASSES;
                let listed = self.sub_bitmaps[top] & (1 << (class % SUB_CLASSES)) != 0;
                assert_eq!(listed, head.is_some(), "bitmap matches class {class}");
                let mut next = head;
                while let Some(id) = next {
                    assert_eq!(class_of(self.nodes[id].size), class);
                    next = self.nodes[id].class_next;
                }
            }
            for top in 0..TOP_CLASSES {
                assert_eq!(
                    self.top_bitmap & (1 << top) != 0,
                    self.sub_bitmaps[top] != 0
                );
            }
        }
    }

    #[test]
    fn classes_are_monotone_and_bound_their_sizes() {
        let mut previous = 0;
        for size in (1..5000u64).chain([1 << 20, (1 << 20) + 1, 80 << 30, u64::MAX]) {
            let class = class_of(size);
            assert!(class < BINS);
            assert!(class >= previous || size > 5000);
            previous = class;
            assert!(class_lower_bound(class) <= size);
            if class + 1 < BINS {
                assert!(class_lower_bound(class + 1) > size);
            }
        }
        // A class spans at most 1/16 of its lower bound.
        for class in SUB_CLASSES..BINS - 1 {
            let lo = class_lower_bound(class);
            assert!(class_lower_bound(class + 1) - lo <= lo / 16);
        }
    }

    #[test]
    fn allocates_front_to_back_and_coalesces_both_sides() {
        let mut t = Tlsf::default();
        let span = t.add_span(1000, 10_000).unwrap();
        let a = t.allocate(100).unwrap();
        let b = t.allocate(200).unwrap();
        let c = t.allocate(300).unwrap();
        assert_eq!((t.offset(a), t.offset(b), t.offset(c)), (1000, 1100, 1300));
        assert_eq!(t.free_bytes(), 10_000 - 600);
        t.check(&[(span, 1000, 10_000)]);
        t.free(a);
        t.free(c); // merges with the tail
        t.check(&[(span, 1000, 10_000)]);
        let merged = t.free(b); // merges with both sides
        assert_eq!((t.offset(merged), t.size(merged)), (1000, 10_000));
        assert_eq!(merged, span, "the span keeps its first node");
        t.check(&[(span, 1000, 10_000)]);
    }

    #[test]
    fn prefers_an_exact_fit_in_the_requests_own_class() {
        let mut t = Tlsf::default();
        let span = t.add_span(0, 1 << 30).unwrap();
        let blocks: Vec<_> = [1000u64, 50, 1010, 50, 1020, 50]
            .iter()
            .map(|&s| t.allocate(s).unwrap())
            .collect();
        // Free the three ~1000-byte blocks: holes of 1000, 1010, 1020 in one class.
        for &i in &[0, 2, 4] {
            t.free(blocks[i]);
        }
        let exact = t.allocate(1010).unwrap();
        assert_eq!(t.offset(exact), t.offset(blocks[2]));
        let smallest_fit = t.allocate(1001).unwrap();
        assert_eq!(t.offset(smallest_fit), t.offset(blocks[4]));
        t.check(&[(span, 0, 1 << 30)]);
    }

    #[test]
    fn a_larger_class_serves_when_the_own_class_cannot() {
        let mut t = Tlsf::default();
        let span = t.add_span(0, 4096).unwrap();
        let a = t.allocate(1024).unwrap();
        let _keep = t.allocate(1024).unwrap();
        t.free(a);
        // 2048 free at the end, 1024 free at the front: 1500 must come from the end.
        let b = t.allocate(1500).unwrap();
        assert_eq!(t.offset(b), 2048);
        assert!(t.allocate(1025).is_none(), "no hole of 1025 is left");
        t.check(&[(span, 0, 4096)]);
    }

    #[test]
    fn spans_never_merge_and_can_be_removed_when_free() {
        let mut t = Tlsf::default();
        let s1 = t.add_span(0, 1000).unwrap();
        let s2 = t.add_span(1000, 1000).unwrap();
        assert!(
            t.allocate(1500).is_none(),
            "adjacent spans are not one range"
        );
        let a = t.allocate(1000).unwrap();
        t.check(&[(s1, 0, 1000), (s2, 1000, 1000)]);
        t.free(a);
        t.remove_span(s1);
        t.remove_span(s2);
        assert_eq!(t.free_bytes(), 0);
        assert!(t.allocate(1).is_none());
        assert_eq!(t.free_nodes().count(), 0);
    }

    #[test]
    fn carving_splits_a_free_range_into_parts_that_never_merge_again() {
        let mut t = Tlsf::default();
        let span = t.add_span(0, 10_000).unwrap();
        let a = t.allocate(1000).unwrap();
        let b = t.allocate(1000).unwrap();
        t.free(a);
        let free = t.free(b);
        assert!(t.carve(free, 3000, 2000));
        assert_eq!(t.free_bytes(), 8000);
        let right_span = t.free_nodes().find(|&id| t.offset(id) == 5000).unwrap();
        t.check(&[(span, 0, 3000), (right_span, 5000, 5000)]);
        let right = t.allocate(5000).unwrap();
        assert_eq!(t.offset(right), 5000);
        t.free(right);
        assert!(
            t.allocate(5001).is_none(),
            "the parts are separate ranges now"
        );
        let left = t.allocate(3000).unwrap();
        let left = t.free(left);
        assert!(t.carve(left, 0, 3000), "a whole node can be carved");
        assert_eq!(t.free_bytes(), 5000);
    }

    #[test]
    fn a_freed_block_merged_with_nothing_is_a_whole_block_until_merged_or_split() {
        let mut t = Tlsf::default();
        t.add_span(0, 10_000).unwrap();
        let [a, b, c] = [1000, 1000, 1000].map(|n| t.allocate(n).unwrap());
        let hole = t.free(b);
        assert!(t.is_whole_block(hole), "between two live blocks");
        let tail = t.free_nodes().find(|&id| t.offset(id) == 3000).unwrap();
        assert!(!t.is_whole_block(tail), "the rest of a split");
        let merged = t.free(a);
        assert!(!t.is_whole_block(merged), "two blocks merged");
        let again = t.allocate(2000).unwrap();
        assert_eq!(t.offset(again), 0);
        t.free(c);
        let freed = t.free(again);
        assert!(!t.is_whole_block(freed), "merged with the free tail");
    }

    #[test]
    fn restoring_carved_ranges_makes_one_range_again() {
        let mut t = Tlsf::default();
        let span = t.add_span(0, 10_000).unwrap();
        let keep = t.allocate(1000).unwrap();
        let free = t.allocate(9000).map(|id| t.free(id)).unwrap();
        assert!(t.carve(free, 4000, 1000));
        let right = t.free_nodes().find(|&id| t.offset(id) == 5000).unwrap();
        assert!(t.carve(right, 5000, 1000));
        assert!(t.restore(5000, 1000));
        assert!(t.restore(4000, 1000));
        t.check(&[(span, 0, 10_000)]);
        t.free(keep);
        assert_eq!(t.allocate(10_000).map(|id| t.offset(id)), Some(0));
    }

    #[test]
    fn random_operations_keep_the_invariants() {
        let mut t = Tlsf::default();
        let span = t.add_span(4096, 1 << 24).unwrap();
        let mut live: Vec<NodeId> = Vec::new();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for step in 0..20_000 {
            let r = next();
            if r % 3 != 0 || live.is_empty() {
                let size = 1 + ((next() % 20_000) >> (next() % 8));
                if let Some(id) = t.allocate(size) {
                    assert_eq!(t.size(id), size);
                    live.push(id);
                }
            } else {
                let i = (next() % live.len() as u64) as usize;
                t.free(live.swap_remove(i));
            }
            if step % 997 == 0 {
                t.check(&[(span, 4096, 1 << 24)]);
                let mut used: Vec<NodeId> = t.used_nodes().collect();
                used.sort_unstable();
                let mut expected = live.clone();
                expected.sort_unstable();
                assert_eq!(used, expected, "the handed-out nodes are the live ones");
                assert!(live.iter().all(|&id| t.is_used_at(id, t.offset(id))));
                assert!(!t.is_used_at(span, 4095));
                assert!(!t.is_used_at(NodeId::new(u32::MAX - 1).unwrap(), 0));
            }
        }
        for id in live.drain(..) {
            t.free(id);
        }
        t.check(&[(span, 4096, 1 << 24)]);
        assert_eq!(t.free_bytes(), 1 << 24);
        assert!(
            t.nodes.iter().count() - t.spare.len() == 1,
            "one node is left"
        );
    }
}
