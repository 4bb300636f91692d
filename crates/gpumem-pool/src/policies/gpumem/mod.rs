//! `GPUMEM_POOL=gpumem` (the default): gpumem's own placement policy.
//!
//! Each stream gets an *arena*: one large virtual-address reservation, tiled by a TLSF index
//! ([`tlsf`]) that finds a good-fitting free range in O(1) and merges neighbours on free in
//! O(1), with physical memory mapped in granularity pages ([`pages`]) only under the bytes that
//! blocks actually touch. Because an arena is one contiguous range, free neighbours always
//! merge (PyTorch never merges across segments), and reserved memory is the set of pages blocks
//! have touched rather than whole 2 or 20 MiB segments. Requests are rounded to 512 bytes only.
//!
//! - Steady state: freed ranges stay mapped, so a repeated training step is served with no
//!   device call at all.
//! - Growth by a big block (≥ 128 MiB, e.g. logits) that fits no free range: idle chunks of the
//!   arena move under it before fresh memory is mapped, and their old range leaves the index
//!   for good — stitched once, reused from then on. A smaller growing block takes only the
//!   idle chunks of leftover holes (small, and not exactly one freed block), whose retirement
//!   displaces nothing that repeats.
//! - Pressure (device out of memory or the hard limit): an allocation that needs fresh pages
//!   takes what the device and the limit still grant, then *moves* idle chunks of any stream's
//!   arena under itself — unmap there, map here, no new memory — stitching scattered free
//!   memory into one contiguous block as GMLake does; then frees idle chunks elsewhere and
//!   maps fresh ones.
//! - Tiny requests (≤ 64 KiB) are packed into 1 MiB slabs that the stream's large arena lends
//!   as ordinary blocks and takes back, merged with its neighbours, once they empty: tiny
//!   blocks never leave sub-page slivers between large ones, and their memory is not stranded
//!   in a pool of its own. Other small-pool requests are placed in the large arena.
//! - Streams: a freed range is reused only by its own stream (cross-stream frees are delayed
//!   by the pool until their events). Memory moves between streams only as whole idle chunks,
//!   under pressure.
//! - Without VMM the same index runs over `cudaMalloc` segments sized like PyTorch's (2 MiB
//!   small, 20 MiB for 1–10 MiB requests, else the request rounded to 2 MiB); fully free
//!   segments are given back on reclaim.
//!
//! An arena's memory comes from one of three backings, each in its own module behind the
//! dispatch here: [`paged`] (an address reservation with pages mapped on demand, and the
//! stitching of idle chunks), [`malloc_segments`] (`cudaMalloc` segments, without VMM) and
//! [`slabs`] (the small arena's slabs, lent by the large arena). The sizes and thresholds
//! above are the defaults of [`GpumemSettings`].

mod deferred;
mod malloc_segments;
mod paged;
mod pages;
mod settings;
mod slabs;
mod tlsf;

pub use self::settings::GpumemSettings;

use std::collections::HashMap;

use gpumem_device::{DevicePtr, StreamId};
use gpumem_snapshot::SettingValue;

use self::deferred::DeferredUnmaps;
use self::malloc_segments::MallocSegments;
use self::paged::PagedReservation;
use self::slabs::SlabLoans;
use self::tlsf::{NodeId, Tlsf};
use crate::config::ConfigError;
use crate::policy::{
    AllocRequest, Block, BlockHandle, BlockView, Exhausted, Policy, ReleaseTarget, SegmentView,
    Upstream,
};
use crate::stats::SizeClass;

/// Every block is a multiple of this: cudaMalloc's own alignment, which callers rely on (the
/// policy hands out 512-byte-aligned addresses, as PyTorch does), not a tuning knob — the
/// design point is that it is the only rounding.
const ROUNDING: u64 = 512;

/// gpumem's policy: TLSF over per-stream address reservations with pages mapped on demand.
/// `default()` has the default settings.
#[derive(Debug, Default)]
pub struct GpumemPolicy {
    settings: GpumemSettings,
    arenas: Vec<StreamArena>,
    /// Whether the device has VMM, learnt at the first request (a policy serves one device):
    /// asked on every request, and a device query is a dynamic call.
    vmm: Option<bool>,
    /// Old addresses of moved chunks, unmapped once the work that may use them is done.
    deferred: DeferredUnmaps,
}

impl GpumemPolicy {
    /// A policy with `settings`, holding no memory yet; an error naming the setting if they
    /// are not valid ([`GpumemSettings::validate`]; those from [`GpumemSettings::parse`]
    /// always are).
    pub fn new(settings: GpumemSettings) -> Result<Self, ConfigError> {
        settings.validate()?;
        Ok(GpumemPolicy {
            settings,
            ..GpumemPolicy::default()
        })
    }

    /// The settings the policy runs with.
    pub fn settings(&self) -> &GpumemSettings {
        &self.settings
    }
}

/// The blocks of one stream and one pool kind.
#[derive(Debug)]
struct StreamArena {
    stream: StreamId,
    pool: SizeClass,
    /// Free and handed-out ranges; a block's handle names its node (see [`block_handle`]).
    index: Tlsf,
    backing: ArenaBacking,
}

/// Where an arena's memory comes from.
#[derive(Debug)]
enum ArenaBacking {
    /// One address reservation, pages mapped on demand.
    Paged(PagedReservation),
    /// `cudaMalloc` segments, when the device has no VMM.
    Segments(MallocSegments),
    /// Tiny blocks with VMM: slabs lent by the stream's large arena.
    Slabs(SlabLoans),
}

/// A block's [`Block::handle`]: its node, with bit 32 set when it lies in a slab arena (the
/// arena kind, so that a free finds the arena without recomputing where the block went).
fn block_handle(node: NodeId, arena: SizeClass) -> BlockHandle {
    BlockHandle::new(u64::from(node.get()) | u64::from(arena == SizeClass::Small) << 32)
}

/// The node and the arena kind a [`block_handle`] names (`None` for a handle no node has).
fn handle_parts(handle: BlockHandle) -> Option<(NodeId, SizeClass)> {
    let raw = handle.get();
    let arena = if raw >> 32 & 1 == 1 {
        SizeClass::Small
    } else {
        SizeClass::Large
    };
    Some((NodeId::new(raw as u32)?, arena))
}

/// The arena kind that holds a block of `size` bytes (rounded) accounted to `pool`: with VMM,
/// small-pool blocks above `slab_max_request` live in the large arena.
fn arena_pool(pool: SizeClass, size: u64, vmm: bool, slab_max_request: u64) -> SizeClass {
    if vmm && size > slab_max_request {
        SizeClass::Large
    } else {
        pool
    }
}

impl StreamArena {
    /// A new arena: an address reservation when the device has VMM (slabs for the small
    /// arena), else segments on demand.
    fn new(
        stream: StreamId,
        pool: SizeClass,
        settings: &GpumemSettings,
        up: &mut Upstream<'_>,
    ) -> Result<StreamArena, Exhausted> {
        let mut index = Tlsf::default();
        let backing = match up.granularity() {
            Some(_) if pool == SizeClass::Small => ArenaBacking::Slabs(SlabLoans::default()),
            Some(page) => ArenaBacking::Paged(PagedReservation::reserve(
                &mut index,
                page,
                settings.va_per_device_byte,
                up,
            )?),
            None => ArenaBacking::Segments(MallocSegments::default()),
        };
        Ok(StreamArena {
            stream,
            pool,
            index,
            backing,
        })
    }

    /// Whether the arena holds neither blocks nor device memory.
    fn is_empty(&self) -> bool {
        self.index.used_nodes().next().is_none()
            && match &self.backing {
                ArenaBacking::Paged(paged) => paged.is_unmapped(),
                ArenaBacking::Segments(segments) => segments.is_empty(),
                ArenaBacking::Slabs(slabs) => slabs.is_empty(),
            }
    }

    /// Gives back idle device memory until `want` bytes are freed; returns the bytes freed.
    fn release_idle(&mut self, want: u64, up: &mut Upstream<'_>) -> u64 {
        let (pool, stream) = (self.pool, self.stream);
        match &mut self.backing {
            ArenaBacking::Paged(paged) => paged.release_idle(&self.index, want, up, pool, stream),
            // Empty slabs go back to the large arena at once: nothing idle is kept here.
            ArenaBacking::Slabs(_) => 0,
            ArenaBacking::Segments(segments) => {
                segments.release_idle(&mut self.index, want, up, pool, stream)
            }
        }
    }

    /// A node as a block view.
    fn block_view(&self, id: NodeId) -> BlockView {
        BlockView {
            address: self.index.offset(id),
            size: self.index.size(id),
            in_use: !self.index.is_free(id),
        }
    }

    /// The nodes of the span starting at `first`, in address order, as block views.
    fn span_blocks(&self, first: NodeId) -> impl Iterator<Item = BlockView> + '_ {
        std::iter::successors(Some(first), |&id| self.index.next_in_span(id))
            .map(|id| self.block_view(id))
    }

    /// A segment of this arena, as the policy shows it.
    fn segment_view(
        &self,
        address: DevicePtr,
        total_size: u64,
        is_expandable: bool,
        blocks: Vec<BlockView>,
    ) -> SegmentView {
        SegmentView {
            address,
            total_size,
            stream: self.stream,
            size_class: self.pool,
            is_expandable,
            blocks,
        }
    }

    /// The segments of this arena, with `slab_blocks` (slab address → the small blocks tiling
    /// it) shown in place of the slabs a paged arena lends to small blocks.
    fn segment_views(
        &self,
        slab_blocks: &HashMap<DevicePtr, Vec<BlockView>>,
        views: &mut Vec<SegmentView>,
    ) {
        match &self.backing {
            ArenaBacking::Paged(paged) => paged.segment_views(self, slab_blocks, views),
            // Shown inside the large arena's segments.
            ArenaBacking::Slabs(_) => {}
            ArenaBacking::Segments(segments) => segments.segment_views(self, views),
        }
    }

    /// The largest free range backed by memory right now.
    fn largest_free_block(&self) -> u64 {
        match &self.backing {
            ArenaBacking::Segments(_) | ArenaBacking::Slabs(_) => self
                .index
                .free_nodes()
                .map(|id| self.index.size(id))
                .max()
                .unwrap_or(0),
            ArenaBacking::Paged(paged) => paged.largest_free_block(&self.index),
        }
    }
}

impl GpumemPolicy {
    /// The arena of `stream` and `pool`, created on first use.
    fn arena(
        &mut self,
        stream: StreamId,
        pool: SizeClass,
        up: &mut Upstream<'_>,
    ) -> Result<usize, Exhausted> {
        if let Some(i) = self.find_arena(stream, pool) {
            return Ok(i);
        }
        self.arenas
            .push(StreamArena::new(stream, pool, &self.settings, up)?);
        Ok(self.arenas.len() - 1)
    }

    /// The arena of `stream` and `pool`, if it exists.
    fn find_arena(&self, stream: StreamId, pool: SizeClass) -> Option<usize> {
        self.arenas
            .iter()
            .position(|a| a.stream == stream && a.pool == pool)
    }

    /// Places a request in its stream's arena of its kind, growing it as needed.
    fn place(&mut self, req: AllocRequest, up: &mut Upstream<'_>) -> Result<Block, Box<Exhausted>> {
        let pool = SizeClass::for_request(req.size);
        let size = req
            .size
            .checked_next_multiple_of(ROUNDING)
            .ok_or_else(|| Exhausted::too_large(req.size, up))?;
        let vmm = *self.vmm.get_or_insert_with(|| up.granularity().is_some());
        let kind = arena_pool(pool, size, vmm, self.settings.slab_max_request);
        let a = self.arena(req.stream, kind, up)?;
        let node = match self.arenas[a].backing {
            ArenaBacking::Paged(_) => self.place_paged(a, size, up)?,
            ArenaBacking::Segments(_) => self.place_in_segment(a, size, up)?,
            ArenaBacking::Slabs(_) => self.place_in_slab(a, size, up)?,
        };
        Ok(Block {
            addr: self.arenas[a].index.offset(node),
            size,
            requested: req.size,
            stream: req.stream,
            size_class: pool,
            handle: block_handle(node, kind),
        })
    }

    /// Frees idle memory across all arenas until `want` bytes are given back. Old addresses
    /// of moved chunks are unmapped first (waiting for their work), so that the memory
    /// released is really given back.
    fn release_idle(&mut self, want: u64, up: &mut Upstream<'_>) -> u64 {
        if !self.deferred.is_empty() {
            self.deferred.settle(true, up);
        }
        let mut released = 0;
        for arena in &mut self.arenas {
            if released >= want {
                break;
            }
            released += arena.release_idle(want - released, up);
        }
        released
    }
}

impl Policy for GpumemPolicy {
    fn name(&self) -> &'static str {
        "gpumem"
    }

    fn settings(&self) -> Vec<(String, SettingValue)> {
        let options = self.settings.options();
        let conf = options
            .iter()
            .map(|(key, value)| format!("{key}:{value}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut out = vec![("GPUMEM_POLICY_CONF".to_string(), SettingValue::Str(conf))];
        out.extend(
            options
                .into_iter()
                .map(|(key, value)| (key.to_string(), SettingValue::Str(value))),
        );
        out
    }

    fn allocate(
        &mut self,
        req: AllocRequest,
        up: &mut Upstream<'_>,
    ) -> Result<Block, Box<Exhausted>> {
        if !self.deferred.is_empty() {
            self.deferred.settle(false, up);
        }
        let block = self.place(req, up);
        self.deferred.close();
        block
    }

    fn free(&mut self, block: Block, _up: &mut Upstream<'_>) {
        let Some((node, kind)) = handle_parts(block.handle) else {
            return;
        };
        let Some(a) = self.find_arena(block.stream, kind) else {
            return;
        };
        let arena = &mut self.arenas[a];
        if !arena.index.is_used_at(node, block.addr) {
            return;
        }
        let merged = arena.index.free(node);
        self.return_empty_slab(a, merged, block.stream);
    }

    fn release_cached(&mut self, target: ReleaseTarget, up: &mut Upstream<'_>) -> u64 {
        let want = match target {
            ReleaseTarget::All => u64::MAX,
            ReleaseTarget::AtLeast(n) => n,
        };
        let released = self.release_idle(want, up);
        if target == ReleaseTarget::All {
            // Arenas left with nothing give their address space back too.
            self.arenas.retain(|arena| {
                if !arena.is_empty() {
                    return true;
                }
                match &arena.backing {
                    ArenaBacking::Paged(paged) => !paged.release(up),
                    ArenaBacking::Segments(_) | ArenaBacking::Slabs(_) => false,
                }
            });
        }
        released
    }

    fn segments(&self) -> Vec<SegmentView> {
        let slab_blocks = self.slab_blocks();
        let mut views = Vec::new();
        for arena in &self.arenas {
            arena.segment_views(&slab_blocks, &mut views);
        }
        views
    }

    fn largest_free_block(&self) -> u64 {
        self.arenas
            .iter()
            .map(StreamArena::largest_free_block)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use gpumem_device::sim::{SimConfig, SimDevice};

    use super::*;
    use crate::driver::PolicyDriver;

    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;

    /// Allocates `sizes` on stream 0 of a fresh device with a policy of settings `conf`;
    /// returns the blocks, the policy's segments and the device's allocating calls.
    fn run(conf: &str, device: SimConfig, sizes: &[u64]) -> (Vec<Block>, Vec<SegmentView>, u64) {
        let device = Arc::new(SimDevice::new(device).unwrap());
        let policy = GpumemPolicy::new(GpumemSettings::parse(conf).unwrap()).unwrap();
        let mut driver = PolicyDriver::new(device.clone(), Box::new(policy), None);
        let blocks = sizes
            .iter()
            .map(|&size| {
                let req = AllocRequest {
                    size,
                    stream: StreamId::DEFAULT,
                };
                driver.allocate(req).unwrap()
            })
            .collect();
        let calls = device.counters().allocating_calls();
        (blocks, driver.policy().segments(), calls)
    }

    /// (size, in use) of every block of `segments`.
    fn tiling(segments: &[SegmentView]) -> Vec<(u64, bool)> {
        let blocks = segments.iter().flat_map(|s| &s.blocks);
        blocks.map(|b| (b.size, b.in_use)).collect()
    }

    #[test]
    fn a_smaller_slab_limit_sends_a_32_kib_request_to_the_large_arena() {
        let vmm = SimConfig::address_only(1 << 30);
        let (blocks, segments, _) = run("", vmm.clone(), &[32 * KIB]);
        assert_eq!(handle_parts(blocks[0].handle).unwrap().1, SizeClass::Small);
        assert_eq!(
            tiling(&segments),
            [(32 * KIB, true), (MIB - 32 * KIB, false), (MIB, false)],
            "by default it lies in a 1 MiB slab"
        );
        let (blocks, segments, _) = run("slab_max_request_kb:16", vmm, &[32 * KIB]);
        assert_eq!(handle_parts(blocks[0].handle).unwrap().1, SizeClass::Large);
        assert_eq!(
            tiling(&segments),
            [(32 * KIB, true), (2 * MIB - 32 * KIB, false)]
        );
    }

    #[test]
    fn the_slab_size_and_the_chunk_limit_shape_what_is_mapped() {
        let vmm = SimConfig::address_only(1 << 30);
        let (_, segments, _) = run("slab_size_kb:256", vmm.clone(), &[4 * KIB]);
        assert_eq!(tiling(&segments)[1], (256 * KIB - 4 * KIB, false));
        // A 16 MiB block is 8 pages: chunks of 2 pages by default, one chunk of 8 here.
        let (_, _, calls) = run("", vmm.clone(), &[16 * MIB]);
        let (_, _, fewer) = run("max_chunk_pages:8", vmm, &[16 * MIB]);
        assert_eq!((calls - fewer) / 2, 3, "each chunk is a create and a map");
    }

    #[test]
    fn without_vmm_the_segment_sizes_follow_the_settings() {
        let no_vmm = SimConfig {
            granularity: None,
            ..SimConfig::address_only(1 << 30)
        };
        let sizes = [4 * KIB, 3 * MIB, 30 * MIB - KIB];
        let (_, segments, _) = run("", no_vmm.clone(), &sizes);
        let totals: Vec<u64> = segments.iter().map(|s| s.total_size).collect();
        assert_eq!(totals, [2 * MIB, 20 * MIB, 30 * MIB]);
        let conf = "small_segment_mb:4,mid_segment_mb:8,large_request_mb:4,segment_rounding_mb:8";
        let (_, segments, _) = run(conf, no_vmm, &sizes);
        let totals: Vec<u64> = segments.iter().map(|s| s.total_size).collect();
        assert_eq!(totals, [4 * MIB, 8 * MIB, 32 * MIB]);
    }

    #[test]
    fn invalid_settings_are_refused() {
        let error = GpumemPolicy::new(GpumemSettings {
            max_chunk_pages: 0,
            ..GpumemSettings::default()
        })
        .expect_err("zero pages per chunk");
        assert!(error.to_string().contains("max_chunk_pages"), "{error}");
    }
}
