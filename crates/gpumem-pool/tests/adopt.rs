//! `Pool::adopt_segment`: a segment held before the pool began, taken over with its live
//! blocks at their offsets and the rest cached, as PyTorch's allocator had left it.

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::policies::torch_settings::TorchSettings;
use gpumem_pool::{
    AdoptError, BlockToAdopt, LayoutError, Limit, PolicyKind, Pool, PoolConfig, PoolError,
    PoolOptions, SegmentToAdopt, SizeClass,
};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn pool(policy: PolicyKind, hard_limit: Option<u64>) -> Pool {
    let device = Arc::new(SimDevice::new(SimConfig::address_only(1 << 40)).unwrap());
    let config = PoolConfig {
        policy,
        torch: TorchSettings::parse(if policy == PolicyKind::Expandable {
            "expandable_segments:True"
        } else {
            ""
        })
        .unwrap(),
        options: PoolOptions {
            hard_limit: hard_limit.map(Limit::Bytes),
            history_capacity: 64,
            ..PoolOptions::default()
        },
        ..PoolConfig::default()
    };
    Pool::new(device, config).unwrap()
}

fn block(offset: u64, requested: u64, size: Option<u64>) -> BlockToAdopt {
    BlockToAdopt {
        offset,
        requested,
        size,
    }
}

/// A 20 MiB large-pool segment: a 3 MiB block at 0 whose size the caller does not know, and
/// one of 2 MiB + 100 B at 8 MiB whose size it does (2 MiB + 512 B).
fn large_segment() -> SegmentToAdopt {
    SegmentToAdopt {
        size: 20 * MIB,
        stream: S0,
        size_class: SizeClass::Large,
        expandable: false,
        blocks: vec![
            block(0, 3 * MIB, None),
            block(8 * MIB, 2 * MIB + 100, Some(2 * MIB + 512)),
        ],
    }
}

/// (size, in use) of each block of each segment, in address order.
fn layout(pool: &Pool) -> Vec<Vec<(u64, bool)>> {
    let mut segments = pool.segments();
    segments.sort_by_key(|s| s.address);
    segments
        .iter()
        .map(|s| s.blocks.iter().map(|b| (b.size, b.in_use)).collect())
        .collect()
}

#[test]
fn the_torch_policy_takes_a_segment_over_as_it_was_laid_out() {
    for policy in [PolicyKind::Torch, PolicyKind::Expandable] {
        let pool = pool(policy, None);
        let live = pool.adopt_segment(&large_segment()).unwrap();
        let stats = pool.stats();
        assert_eq!(stats.reserved_bytes.all.current, 20 * MIB, "{policy:?}");
        assert_eq!(stats.segment.all.current, 1);
        assert_eq!(stats.device_calls.allocating(), 1, "one cudaMalloc");
        assert_eq!(stats.allocation.all.current, 2);
        assert_eq!(stats.allocated_bytes.all.current, 5 * MIB + 512);
        assert_eq!(stats.requested_bytes.all.current, 5 * MIB + 100);
        let base = live[0].ptr;
        assert_eq!(live[1].ptr, base + 8 * MIB);
        assert_eq!(live[1].size, 2 * MIB + 100);
        assert_eq!(pool.allocation(live[1].ptr), Some(live[1]));
        assert_eq!(
            layout(&pool),
            vec![vec![
                (3 * MIB, true),
                (5 * MIB, false),
                (2 * MIB + 512, true),
                (10 * MIB - 512, false),
            ]],
            "{policy:?}"
        );

        // The cached gaps serve requests as PyTorch's would: best fit, no device call.
        let reused = pool.allocate(4 * MIB, S0).unwrap();
        assert_eq!(reused.ptr, base + 3 * MIB, "{policy:?}");
        assert_eq!(pool.stats().device_calls.allocating(), 1);

        // Adopted blocks free like any other, merging with their free neighbours.
        pool.free(live[1].ptr).unwrap();
        pool.free(live[0].ptr).unwrap();
        pool.free(reused.ptr).unwrap();
        assert_eq!(layout(&pool), vec![vec![(20 * MIB, false)]]);
        assert_eq!(pool.stats().allocated_bytes.all.current, 0);
        pool.empty_cache().unwrap();
        assert_eq!(pool.stats().reserved_bytes.all.current, 0);
    }
}

#[test]
fn a_block_of_unknown_size_takes_the_remainder_pytorch_would_not_have_split_off() {
    let pool = pool(PolicyKind::Torch, None);
    let segment = SegmentToAdopt {
        blocks: vec![
            // Rounded to 3 MiB + 512 B; the 1 MiB - 512 B after it is too small to split.
            block(0, 3 * MIB + 1, None),
            // More than 1 MiB after it: split off, cached.
            block(4 * MIB, 2 * MIB, None),
            // The last 1 MiB - 512 B of the segment stays with the block.
            block(12 * MIB, 7 * MIB + 1, None),
        ],
        ..large_segment()
    };
    pool.adopt_segment(&segment).unwrap();
    assert_eq!(
        layout(&pool),
        vec![vec![
            (4 * MIB, true),
            (2 * MIB, true),
            (6 * MIB, false),
            (8 * MIB, true),
        ]]
    );
}

#[test]
fn the_snapshot_and_history_show_an_adopted_segment() {
    let pool = pool(PolicyKind::Torch, None);
    pool.adopt_segment(&large_segment()).unwrap();
    let snapshot = pool.snapshot();
    assert_eq!(snapshot.segments.len(), 1);
    assert_eq!(snapshot.segments[0].total_size, 20 * MIB);
    assert_eq!(snapshot.segments[0].allocated_size, 5 * MIB + 512);
    let actions: Vec<_> = pool.history().iter().map(|e| e.action).collect();
    use gpumem_pool::Action;
    assert_eq!(
        actions,
        vec![Action::SegmentAlloc, Action::Alloc, Action::Alloc]
    );
}

#[test]
fn policies_that_lay_memory_out_their_own_way_decline() {
    for policy in [PolicyKind::Gpumem, PolicyKind::None] {
        let pool = pool(policy, None);
        let error = pool.adopt_segment(&large_segment()).unwrap_err();
        assert!(
            matches!(error, AdoptError::Unsupported { .. }),
            "{policy:?}: {error}"
        );
        assert!(error.to_string().contains("cannot adopt"), "{error}");
        assert_eq!(pool.stats().reserved_bytes.all.current, 0);
    }
    let pool = pool(PolicyKind::Torch, None);
    let expandable = SegmentToAdopt {
        expandable: true,
        ..large_segment()
    };
    assert!(matches!(
        pool.adopt_segment(&expandable),
        Err(AdoptError::Unsupported { .. })
    ));
    assert_eq!(pool.stats().device_calls.allocating(), 0);
}

#[test]
fn an_impossible_layout_is_refused_before_any_device_call() {
    let pool = pool(PolicyKind::Torch, None);
    let overlapping = SegmentToAdopt {
        blocks: vec![block(0, 3 * MIB, None), block(MIB, 512, None)],
        ..large_segment()
    };
    assert_eq!(
        pool.adopt_segment(&overlapping),
        Err(AdoptError::Layout(LayoutError::Overlap { offset: MIB }))
    );
    let outside = SegmentToAdopt {
        blocks: vec![block(19 * MIB, 2 * MIB, None)],
        ..large_segment()
    };
    assert!(matches!(
        pool.adopt_segment(&outside),
        Err(AdoptError::Layout(LayoutError::OutsideSegment { .. }))
    ));
    assert_eq!(pool.stats().device_calls.allocating(), 0);
}

#[test]
fn a_segment_over_the_limit_frees_the_cache_first_then_explains() {
    let pool = pool(PolicyKind::Torch, Some(30 * MIB));
    // 20 MiB cached: freed to make room for the adopted segment.
    let cached = pool.allocate(3 * MIB, S0).unwrap();
    pool.free(cached.ptr).unwrap();
    pool.adopt_segment(&large_segment()).unwrap();
    assert_eq!(pool.stats().reserved_bytes.all.current, 20 * MIB);
    // A second one does not fit beside the first, whose blocks are live.
    let error = pool.adopt_segment(&large_segment()).unwrap_err();
    let AdoptError::Pool(PoolError::OutOfMemory(oom)) = &error else {
        panic!("expected an explained out-of-memory error, got {error}");
    };
    assert_eq!(oom.requested, 20 * MIB);
    assert_eq!(pool.stats().reserved_bytes.all.current, 20 * MIB);
}
