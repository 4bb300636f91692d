//! `GPUMEM_POOL=none`: no caching. Every allocation is one device allocation and every free
//! one device free — the reference point that shows what a cache saves, and the mode for
//! memory checkers that must see every allocation.

use gpumem_device::AddressMap;

use crate::policy::{
    AllocRequest, Block, BlockHandle, BlockView, Exhausted, Policy, ReleaseTarget, SegmentView,
    Upstream,
};
use crate::stats::SizeClass;

/// Device allocations straight through, sized to 512-byte multiples like cudaMalloc's own
/// granularity.
#[derive(Debug, Default)]
pub struct PassthroughPolicy {
    live: AddressMap<Block>,
    /// Handles are allocation numbers, so that a stale block is told from the live one that
    /// now has its address.
    allocations: u64,
}

/// cudaMalloc's allocation granularity.
const ALIGNMENT: u64 = 512;

impl Policy for PassthroughPolicy {
    fn name(&self) -> &'static str {
        "none"
    }

    fn caches(&self) -> bool {
        false
    }

    fn allocate(
        &mut self,
        req: AllocRequest,
        up: &mut Upstream<'_>,
    ) -> Result<Block, Box<Exhausted>> {
        let size = req
            .size
            .checked_next_multiple_of(ALIGNMENT)
            .ok_or_else(|| Exhausted::too_large(req.size, up))?;
        let pool = SizeClass::for_request(req.size);
        let addr = up
            .malloc_segment(size, pool, req.stream)
            .map_err(|cause| Exhausted {
                attempted: size,
                cause,
            })?;
        let block = Block {
            addr,
            size,
            requested: req.size,
            stream: req.stream,
            size_class: pool,
            handle: BlockHandle::new(self.allocations),
        };
        self.allocations += 1;
        self.live.insert(addr, block);
        Ok(block)
    }

    fn free(&mut self, block: Block, up: &mut Upstream<'_>) {
        if self.live.get(&block.addr) == Some(&block) {
            self.live.remove(&block.addr);
            // The pool only hands back blocks this policy gave out, so the device knows the
            // address; a device failure here would be a backend bug with nothing to undo.
            let _ = up.free_segment(block.addr, block.size, block.size_class, block.stream);
        }
    }

    fn release_cached(&mut self, _target: ReleaseTarget, _up: &mut Upstream<'_>) -> u64 {
        0
    }

    fn segments(&self) -> Vec<SegmentView> {
        let mut blocks: Vec<&Block> = self.live.values().collect();
        blocks.sort_unstable_by_key(|b| b.addr);
        blocks
            .into_iter()
            .map(|b| SegmentView {
                address: b.addr,
                total_size: b.size,
                stream: b.stream,
                size_class: b.size_class,
                is_expandable: false,
                blocks: vec![BlockView {
                    address: b.addr,
                    size: b.size,
                    in_use: true,
                }],
            })
            .collect()
    }

    fn largest_free_block(&self) -> u64 {
        0
    }
}
