//! Request rounding and segment sizing: PyTorch's `round_size` and `get_allocation_size`,
//! public (as `gpumem_pool::policies::torch_rounding`) so that tools reasoning about the
//! `torch` policy's options (the replay crate's tuner) use the policy's own arithmetic.
//!
//! Every function returns `None` when the result would not fit in 64 bits, so that an absurd
//! request becomes an out-of-memory error instead of an overflow.

use super::super::torch_settings::ROUNDUP_INTERVALS;

/// Every block is a multiple of this (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest request served by the small pool (`kSmallSize`); also the least remainder worth
/// splitting off a large-pool block.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size of the small pool (`kSmallBuffer`), and its expandable chunk size.
pub(super) const SMALL_BUFFER: u64 = 2 << 20;
/// Requests from here on get a segment of their own size (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Large segments are multiples of this (`kRoundLarge`).
const ROUND_LARGE: u64 = 2 << 20;

/// The block size PyTorch hands out for a request of `size` bytes: at least 512 B and a
/// multiple of 512 B, or the next of `d` equal steps between two powers of two when
/// `roundup_power2_divisions` gives `d > 1` for this size and the size exceeds `512·d`.
pub fn round_size(size: u64, divisions: &[u64; ROUNDUP_INTERVALS]) -> Option<u64> {
    if size < MIN_BLOCK_SIZE {
        return Some(MIN_BLOCK_SIZE);
    }
    let d = divisions_for(size, divisions);
    if d > 1 && size > MIN_BLOCK_SIZE.saturating_mul(d) {
        roundup_power2_next_division(size, d)
    } else {
        size.checked_next_multiple_of(MIN_BLOCK_SIZE)
    }
}

/// The divisions configured for the power-of-two interval `size` lies in.
fn divisions_for(size: u64, divisions: &[u64; ROUNDUP_INTERVALS]) -> u64 {
    divisions[roundup_interval(size)]
}

/// The entry of the `roundup_power2_divisions` table that applies to a request of `size`
/// bytes: one per power-of-two interval from 1 MiB to 64 GiB, smaller sizes use the first,
/// larger ones the last.
pub fn roundup_interval(size: u64) -> usize {
    (size.max(1).ilog2() as usize)
        .saturating_sub(20)
        .min(ROUNDUP_INTERVALS - 1)
}

/// Rounds `size` up to the next of `divisions` equal steps between the powers of two around
/// it (1200 with 4 divisions: steps 1024, 1280, 1536, 1792 → 1280). Powers of two stay.
pub(super) fn roundup_power2_next_division(size: u64, divisions: u64) -> Option<u64> {
    if size.is_power_of_two() {
        return Some(size);
    }
    let floor = 1u64 << size.ilog2();
    let step = floor >> divisions.max(1).ilog2();
    if step == 0 {
        return floor.checked_mul(2);
    }
    let rounded_down = size & !(step - 1);
    if rounded_down == size {
        Some(size)
    } else {
        rounded_down.checked_add(step)
    }
}

/// The segment PyTorch allocates when no cached block fits a rounded request: 2 MiB for the
/// small pool, `large_segment_size` (20 MiB by default) below 10 MiB, otherwise the request
/// rounded up to 2 MiB.
pub(super) fn allocation_size(size: u64, large_segment_size: u64) -> Option<u64> {
    if size <= SMALL_SIZE {
        Some(SMALL_BUFFER)
    } else if size < MIN_LARGE_ALLOC {
        Some(large_segment_size)
    } else {
        size.checked_next_multiple_of(ROUND_LARGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const OFF: [u64; ROUNDUP_INTERVALS] = [0; ROUNDUP_INTERVALS];

    #[test]
    fn rounds_to_512_bytes_without_divisions() {
        assert_eq!(round_size(1, &OFF), Some(512));
        assert_eq!(round_size(512, &OFF), Some(512));
        assert_eq!(round_size(513, &OFF), Some(1024));
        assert_eq!(round_size(1200, &OFF), Some(1536));
        assert_eq!(round_size(u64::MAX, &OFF), None);
    }

    #[test]
    fn power2_divisions_follow_the_documented_example() {
        // PyTorch's comment on roundup_power2_next_division: 1200 with 4 divisions → 1280.
        assert_eq!(roundup_power2_next_division(1200, 4), Some(1280));
        assert_eq!(roundup_power2_next_division(1024, 4), Some(1024));
        assert_eq!(roundup_power2_next_division(1280, 4), Some(1280));
        // round_size applies divisions only above 512·d bytes, so 1200 B still rounds to
        // 512-byte multiples there.
        assert_eq!(round_size(1200, &[4; ROUNDUP_INTERVALS]), Some(1536));
        assert_eq!(round_size(2100, &[4; ROUNDUP_INTERVALS]), Some(2560));
        // 84 MiB with 4 divisions lies in [64, 128) MiB with steps of 16 MiB → 96 MiB.
        assert_eq!(
            round_size(84 * MIB, &[4; ROUNDUP_INTERVALS]),
            Some(96 * MIB)
        );
    }

    #[test]
    fn divisions_table_is_indexed_by_power_of_two_interval() {
        let mut table = OFF;
        table[6] = 8; // [64 MiB, 128 MiB)
        assert_eq!(round_size(84 * MIB, &table), Some(88 * MIB));
        assert_eq!(round_size(84 * MIB + 1, &OFF), Some(84 * MIB + 512));
        // Below 1 MiB the first interval applies.
        table[0] = 2;
        assert_eq!(round_size(600 * 1024, &table), Some(768 * 1024));
    }

    #[test]
    fn segment_sizes_follow_pytorch() {
        assert_eq!(allocation_size(512, 20 * MIB), Some(2 * MIB));
        assert_eq!(allocation_size(MIB, 20 * MIB), Some(2 * MIB));
        assert_eq!(allocation_size(MIB + 512, 20 * MIB), Some(20 * MIB));
        assert_eq!(allocation_size(3 * MIB, 20 * MIB), Some(20 * MIB));
        assert_eq!(allocation_size(10 * MIB - 512, 64 * MIB), Some(64 * MIB));
        assert_eq!(allocation_size(10 * MIB, 20 * MIB), Some(10 * MIB));
        assert_eq!(allocation_size(11 * MIB, 20 * MIB), Some(12 * MIB));
        assert_eq!(allocation_size(u64::MAX - 1, 20 * MIB), None);
    }
}
