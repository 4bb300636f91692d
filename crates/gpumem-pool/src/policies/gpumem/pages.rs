//! The physical side of a paged arena: which granularity-sized pages of its address
//! reservation are mapped, and by which physical chunk.
//!
//! A chunk is created for a run of consecutive pages wholly inside the block that needs them
//! (at most `max_chunk_pages` of [`super::GpumemSettings`]), so growing by a large block costs a
//! few device calls, not two per page; a page the block shares with a neighbour gets a chunk of
//! its own. A chunk is
//! mapped whole and can be moved whole: unmapped where it lies idle and mapped under another
//! range, which is how scattered free memory is stitched into one contiguous block under
//! pressure. Because chunks never straddle a block boundary they were made for, freeing a
//! block leaves its chunks movable. A bitmap answers "is all of this range mapped?" a word
//! (64 pages) at a time, the only question on the hot path.

use std::collections::BTreeMap;

use gpumem_device::{DeviceError, DevicePtr, PhysicalHandle, StreamId};

use crate::policy::{Upstream, UpstreamError};
use crate::stats::SizeClass;

/// A physical chunk mapped at a run of pages.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Chunk {
    /// Pages it covers.
    pub(crate) pages: u64,
    /// The physical memory.
    pub(crate) handle: PhysicalHandle,
}

/// The page table of one arena.
#[derive(Debug)]
pub(crate) struct PageMap {
    /// First address of the reservation (page 0).
    base: DevicePtr,
    /// Page size: the device's VMM granularity.
    page: u64,
    /// Bit `p` set when page `p` is mapped. Grows on demand.
    mapped: Vec<u64>,
    /// Mapped chunks by first page.
    chunks: BTreeMap<u64, Chunk>,
    /// Pages mapped now.
    mapped_pages: u64,
}

impl PageMap {
    /// An empty page table for a reservation starting at `base`, with pages of `page` bytes.
    pub(crate) fn new(base: DevicePtr, page: u64) -> Self {
        PageMap {
            base,
            page,
            mapped: Vec::new(),
            chunks: BTreeMap::new(),
            mapped_pages: 0,
        }
    }

    /// Page size in bytes.
    pub(crate) fn page_size(&self) -> u64 {
        self.page
    }

    /// Bytes mapped now.
    pub(crate) fn mapped_bytes(&self) -> u64 {
        self.mapped_pages * self.page
    }

    /// Address of page `p`.
    pub(crate) fn address(&self, p: u64) -> DevicePtr {
        self.base + p * self.page
    }

    /// The pages `[first, end)` that `[addr, addr + size)` touches.
    pub(crate) fn pages_touching(&self, addr: DevicePtr, size: u64) -> (u64, u64) {
        let first = (addr - self.base) / self.page;
        let end = (addr - self.base + size).div_ceil(self.page);
        (first, end)
    }

    /// The pages `[first, end)` lying wholly inside `[addr, addr + size)`.
    pub(crate) fn pages_inside(&self, addr: DevicePtr, size: u64) -> (u64, u64) {
        let first = (addr - self.base).div_ceil(self.page);
        let end = (addr - self.base + size) / self.page;
        (first, end.max(first))
    }

    /// Whether page `p` is mapped.
    pub(crate) fn is_mapped(&self, p: u64) -> bool {
        self.mapped
            .get((p / 64) as usize)
            .is_some_and(|word| word & (1 << (p % 64)) != 0)
    }

    /// Whether every page in `[first, end)` is mapped, a bitmap word at a time.
    pub(crate) fn all_mapped(&self, first: u64, end: u64) -> bool {
        let mut p = first;
        while p < end {
            let bit = p % 64;
            let span = (64 - bit).min(end - p);
            let mask = if span == 64 {
                u64::MAX
            } else {
                ((1u64 << span) - 1) << bit
            };
            match self.mapped.get((p / 64) as usize) {
                Some(word) if word & mask == mask => p += span,
                _ => return false,
            }
        }
        true
    }

    /// The end of the run of unmapped pages starting at `p`, at most `end`: the first mapped
    /// page found a bitmap word at a time, since a block of gigabytes asks this once per chunk
    /// it maps and a page-by-page scan made growing it quadratic in its pages.
    pub(crate) fn unmapped_run_end(&self, p: u64, end: u64) -> u64 {
        let mut q = p;
        while q < end {
            let Some(&word) = self.mapped.get((q / 64) as usize) else {
                return end;
            };
            let ahead = word >> (q % 64);
            if ahead != 0 {
                return (q + u64::from(ahead.trailing_zeros())).min(end);
            }
            q = (q / 64 + 1) * 64;
        }
        end
    }

    /// Chunks lying wholly inside `[addr, addr + size)`, as (first page, chunk): the chunks an
    /// idle range can give away.
    pub(crate) fn chunks_inside(
        &self,
        addr: DevicePtr,
        size: u64,
    ) -> impl Iterator<Item = (u64, Chunk)> + '_ {
        let (first, end) = self.pages_inside(addr, size);
        self.chunks
            .range(first..end)
            .filter(move |(&p, c)| p + c.pages <= end)
            .map(|(&p, &c)| (p, c))
    }

    /// Maximal runs `(first page, end page)` of mapped pages, in address order.
    pub(crate) fn mapped_runs(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (&p, c) in &self.chunks {
            match runs.last_mut() {
                Some(run) if run.1 == p => run.1 = p + c.pages,
                _ => runs.push((p, p + c.pages)),
            }
        }
        runs
    }

    /// Maps a new chunk of `pages` pages at page `p`: reserved memory grows by as much.
    pub(crate) fn map_fresh(
        &mut self,
        p: u64,
        pages: u64,
        up: &mut Upstream<'_>,
        pool: SizeClass,
        stream: StreamId,
    ) -> Result<(), UpstreamError> {
        let handle = up.map_new(self.address(p), pages * self.page, pool, stream)?;
        self.insert(p, Chunk { pages, handle });
        Ok(())
    }

    /// Maps a chunk taken from elsewhere (see [`PageMap::take`]) at page `p`: no new memory.
    pub(crate) fn map_moved(
        &mut self,
        p: u64,
        chunk: Chunk,
        up: &mut Upstream<'_>,
    ) -> Result<(), UpstreamError> {
        up.map_existing(self.address(p), chunk.handle)?;
        self.insert(p, chunk);
        Ok(())
    }

    /// Unmaps the idle chunk starting at page `p` and hands it over for
    /// [`PageMap::map_moved`]; reserved memory is unchanged.
    pub(crate) fn take(&mut self, p: u64, up: &mut Upstream<'_>) -> Result<Chunk, UpstreamError> {
        let chunk = self.chunk(p)?;
        up.unmap(self.address(p), chunk.pages * self.page)?;
        self.remove(p, chunk);
        Ok(chunk)
    }

    /// Takes the idle chunk starting at page `p` out of the table but leaves it mapped, for a
    /// caller that maps it elsewhere now and unmaps it here once the work that may still use
    /// it has completed; reserved memory is unchanged.
    pub(crate) fn detach(&mut self, p: u64) -> Result<Chunk, UpstreamError> {
        let chunk = self.chunk(p)?;
        self.remove(p, chunk);
        Ok(chunk)
    }

    /// Unmaps the idle chunk starting at page `p` and releases it: reserved memory shrinks by
    /// its size, which is returned.
    pub(crate) fn release(
        &mut self,
        p: u64,
        up: &mut Upstream<'_>,
        pool: SizeClass,
        stream: StreamId,
    ) -> Result<u64, UpstreamError> {
        let chunk = self.chunk(p)?;
        let bytes = chunk.pages * self.page;
        up.unmap_release(self.address(p), bytes, chunk.handle, pool, stream)?;
        self.remove(p, chunk);
        Ok(bytes)
    }

    fn chunk(&self, p: u64) -> Result<Chunk, UpstreamError> {
        self.chunks.get(&p).copied().ok_or_else(|| {
            UpstreamError::Device(DeviceError::InvalidAddress {
                ptr: self.address(p),
                what: "gpumem page table: no chunk starts at this page".into(),
            })
        })
    }

    fn insert(&mut self, p: u64, chunk: Chunk) {
        self.chunks.insert(p, chunk);
        self.mapped_pages += chunk.pages;
        self.set_bits(p, chunk.pages, true);
    }

    fn remove(&mut self, p: u64, chunk: Chunk) {
        self.chunks.remove(&p);
        self.mapped_pages -= chunk.pages;
        self.set_bits(p, chunk.pages, false);
    }

    fn set_bits(&mut self, first: u64, pages: u64, mapped: bool) {
        let last_word = ((first + pages - 1) / 64) as usize;
        if self.mapped.len() <= last_word {
            self.mapped.resize(last_word + 1, 0);
        }
        for p in first..first + pages {
            let word = &mut self.mapped[(p / 64) as usize];
            if mapped {
                *word |= 1 << (p % 64);
            } else {
                *word &= !(1 << (p % 64));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unmapped_run_ends_at_the_next_mapped_page_across_words() {
        let mut pages = PageMap::new(0, 1);
        pages.set_bits(3, 1, true);
        pages.set_bits(130, 2, true);
        assert_eq!(pages.unmapped_run_end(0, 500), 3);
        assert_eq!(pages.unmapped_run_end(4, 500), 130);
        assert_eq!(pages.unmapped_run_end(4, 100), 100, "capped at the end");
        assert_eq!(pages.unmapped_run_end(132, 500), 500, "past the bitmap");
        assert_eq!(pages.unmapped_run_end(3, 500), 3, "starts on a mapped page");
    }
}
