//! The backing of a stream's small arena on a device with VMM: slabs for tiny blocks, each an
//! ordinary block of the stream's large (paged) arena, lent to the small arena as one span and
//! handed back as soon as it empties — so tiny blocks share pages with large ones, never leave
//! sub-page slivers between them, and their idle memory returns to the large arena.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use gpumem_device::address_map::AddressHasher;
use gpumem_device::{DevicePtr, StreamId};

use super::tlsf::NodeId;
use super::{ArenaBacking, GpumemPolicy};
use crate::policy::{BlockView, Exhausted, Upstream};
use crate::stats::SizeClass;

/// The slabs a small arena holds, by the first node of their span there.
#[derive(Debug, Default)]
pub(super) struct SlabLoans {
    loans: HashMap<NodeId, SlabLoan, BuildHasherDefault<AddressHasher>>,
}

/// A slab lent by the stream's large arena to its slab arena.
#[derive(Clone, Copy, Debug)]
struct SlabLoan {
    /// The slab's address.
    addr: DevicePtr,
    /// The large arena's node that is the slab.
    node: NodeId,
}

impl SlabLoans {
    /// Whether no slab is lent.
    pub(super) fn is_empty(&self) -> bool {
        self.loans.is_empty()
    }
}

impl GpumemPolicy {
    /// Places `size` bytes in the slab arena `a`, taking a new slab from the stream's large
    /// arena when no slab has room; returns the block's node.
    pub(super) fn place_in_slab(
        &mut self,
        a: usize,
        size: u64,
        up: &mut Upstream<'_>,
    ) -> Result<NodeId, Exhausted> {
        if let Some(node) = self.arenas[a].index.allocate(size) {
            return Ok(node);
        }
        let slab = self.settings.slab_size;
        let large = self.arena(self.arenas[a].stream, SizeClass::Large, up)?;
        let loan = self.place_paged(large, slab, up)?;
        let addr = self.arenas[large].index.offset(loan);
        let arena = &mut self.arenas[a];
        let Some(first) = arena.index.add_span(addr, slab) else {
            self.arenas[large].index.free(loan);
            return Err(Exhausted::too_large(size, up));
        };
        if let ArenaBacking::Slabs(slabs) = &mut arena.backing {
            slabs.loans.insert(first, SlabLoan { addr, node: loan });
        }
        // The new span is filed at the head of its class, so the search finds it.
        arena
            .index
            .allocate(size)
            .ok_or_else(|| Exhausted::too_large(size, up))
    }

    /// After a free in arena `a` left the free node `merged`: if that is a whole slab, the
    /// slab goes back to `stream`'s large arena, where it merges with its neighbours.
    pub(super) fn return_empty_slab(&mut self, a: usize, merged: NodeId, stream: StreamId) {
        let arena = &mut self.arenas[a];
        let ArenaBacking::Slabs(slabs) = &mut arena.backing else {
            return;
        };
        if arena.index.size(merged) != self.settings.slab_size {
            return;
        }
        let Some(loan) = slabs.loans.remove(&merged) else {
            return;
        };
        arena.index.remove_span(merged);
        if let Some(large) = self.find_arena(stream, SizeClass::Large) {
            self.arenas[large].index.free(loan.node);
        }
    }

    /// Slab address → the small blocks tiling the slab, for every slab lent: shown in the
    /// large arena's segments in place of the slab.
    pub(super) fn slab_blocks(&self) -> HashMap<DevicePtr, Vec<BlockView>> {
        let mut slab_blocks = HashMap::new();
        for arena in &self.arenas {
            if let ArenaBacking::Slabs(slabs) = &arena.backing {
                for (&first, loan) in &slabs.loans {
                    slab_blocks.insert(loan.addr, arena.span_blocks(first).collect());
                }
            }
        }
        slab_blocks
    }
}
