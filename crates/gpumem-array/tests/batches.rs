//! The batch iterator on the simulated device's virtual clocks: the upload of the next batch
//! hides behind the compute of this one, and at most two batches are on the device.

mod common;

use std::sync::Arc;

use common::{assert_nothing_leaked, context_on, sim, LosableDevice, MIB};
use gpumem_array::prelude::*;
use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::Device;
use gpumem_pool::PolicyKind;

#[derive(ToDevice, Clone)]
struct Batch {
    tokens: HostArray<u32>,
    labels: HostArray<u32>,
}

/// Batch `k`: 1 MiB of tokens and 1 MiB of labels, all holding `k`.
fn batch(k: u32) -> Batch {
    let n = (MIB / 4) as usize;
    Batch {
        tokens: HostArray::new(&[256, n / 256], vec![k; n]).unwrap(),
        labels: HostArray::from_vec(vec![k + 1; n]),
    }
}

const BATCH_BYTES: u64 = 2 * MIB;
const BATCHES: u32 = 8;
/// 1 GB/s: a batch's upload takes 2.1 ms.
const BANDWIDTH: u64 = 1_000_000_000;

/// The consumer's check downloads 16 bytes of each batch: 16 ns at that speed.
const CHECK_NS: u64 = 16;

fn copy_ns() -> u64 {
    BATCH_BYTES * 1_000_000_000 / BANDWIDTH
}

/// A device whose copies take time, and a context on a stream of its own (the compute
/// stream).
fn timed_device() -> (DeviceContext, Arc<SimDevice>) {
    let config = SimConfig {
        copy_bandwidth: Some(BANDWIDTH),
        ..SimConfig::host(64 * MIB)
    };
    let device = Arc::new(SimDevice::new(config).unwrap());
    let gpu = context_on(device.clone(), PolicyKind::Gpumem);
    let compute = device.create_stream().unwrap();
    (gpu.on_stream(compute), device)
}

/// Runs `BATCHES` batches with `compute_ns` of work each, checking every batch's contents;
/// returns the virtual time it took.
fn run(gpu: &DeviceContext, device: &SimDevice, compute_ns: u64, prefetch: bool) -> u64 {
    let start = device.elapsed_ns();
    let consume = |k: u32, b: BatchOnDevice| {
        assert_eq!(b.tokens.shape(), &[256, 1024]);
        device.enqueue_timed_work(gpu.stream(), compute_ns).unwrap();
        assert_eq!(b.labels.slice(0..4).unwrap().to_vec().unwrap(), [k + 1; 4]);
    };
    if prefetch {
        for (k, b) in gpu.batches((0..BATCHES).map(batch)).unwrap().enumerate() {
            consume(k as u32, b.unwrap());
        }
    } else {
        for k in 0..BATCHES {
            consume(k, upload(gpu, &batch(k)).unwrap());
        }
    }
    device.synchronize().unwrap();
    device.elapsed_ns() - start
}

#[test]
fn the_upload_hides_behind_compute_and_two_batches_are_on_the_device() {
    let copy = copy_ns();
    for kernel in [copy / 2, copy, 3 * copy] {
        let compute = kernel + CHECK_NS;
        let (gpu, device) = timed_device();
        let serial = run(&gpu, &device, kernel, false);
        assert_eq!(
            serial,
            u64::from(BATCHES) * (copy + compute),
            "without prefetch: the sum"
        );
        let (gpu, device) = timed_device();
        let overlapped = run(&gpu, &device, kernel, true);
        // The first upload (or the last compute) alone, then max(copy, compute) per batch.
        let expected = copy.min(compute) + u64::from(BATCHES) * copy.max(compute);
        assert_eq!(overlapped, expected, "compute {compute} ns, copy {copy} ns");
        assert!(overlapped < serial);
        let stats = gpu.pool().stats();
        assert_eq!(
            stats.allocated_bytes.all.peak,
            2 * BATCH_BYTES,
            "two batches at most"
        );
        assert_eq!(
            device.counters().alloc_pinned,
            4,
            "two batches of two staging buffers, reused"
        );
        assert_nothing_leaked(&gpu, &device);
    }
}

#[test]
fn batches_arrive_in_order_with_their_contents_and_empty_sources_end_at_once() {
    let (gpu, device) = sim(64 * MIB);
    let seen: Vec<u32> = gpu
        .batches((0..5).map(batch))
        .unwrap()
        .map(|b| b.unwrap().tokens.to_vec().unwrap()[7])
        .collect();
    assert_eq!(seen, [0, 1, 2, 3, 4]);
    assert_eq!(gpu.batches(Vec::<Batch>::new()).unwrap().count(), 0);
    // Stopping early leaves nothing behind either.
    let mut it = gpu.batches((0..5).map(batch)).unwrap();
    let first = it.next().unwrap().unwrap();
    drop(it);
    drop(first);
    assert_nothing_leaked(&gpu, &device);
}

#[test]
fn an_error_is_yielded_once_then_the_iterator_ends_and_nothing_leaks() {
    let inner = Arc::new(SimDevice::new(SimConfig::host(5 * MIB)).unwrap());
    let device = Arc::new(LosableDevice::new(inner.clone()));
    let gpu = context_on(device.clone(), PolicyKind::Gpumem);
    // Two batches fit, not three: the consumer keeps every batch, so the third fails.
    let mut kept = Vec::new();
    let mut results = gpu.batches((0..4).map(batch)).unwrap();
    kept.push(results.next().unwrap().unwrap());
    let err = results.next().unwrap().map(drop).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(results.next().is_none());
    drop(results);
    drop(kept);
    assert_nothing_leaked(&gpu, &inner);
    // A device lost in the middle: its error comes through.
    let mut results = gpu.batches((0..4).map(batch)).unwrap();
    drop(results.next().unwrap().unwrap());
    device.set_lost(true);
    let err = results.next().unwrap().map(drop).unwrap_err();
    assert_eq!(err, ArrayError::Device(common::lost_error()));
    assert!(results.next().is_none());
    device.set_lost(false);
    drop(results);
    assert_nothing_leaked(&gpu, &inner);
}
