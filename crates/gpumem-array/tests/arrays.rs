//! DeviceArray on the simulated device: round trips, views, copies, early free, wrapping,
//! and every bad input and fault with nothing leaked.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{assert_nothing_leaked, context_on, lost_error, sim, LosableDevice, MIB};
use gpumem_array::prelude::*;
use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::{Device, StreamId};
use gpumem_pool::{PolicyKind, PoolError};

#[test]
fn upload_download_and_views_round_trip() {
    let (gpu, device) = sim(64 * MIB);
    let data: Vec<u32> = (0..24).collect();
    let mut a = DeviceArray::from_shape(&gpu, &[4, 6], &data).unwrap();
    assert_eq!((a.shape(), a.len(), a.byte_len()), (&[4, 6][..], 24, 96));
    assert_eq!(a.to_vec().unwrap(), data);
    let rows = a.slice(1..3).unwrap();
    assert_eq!(rows.shape(), &[2, 6]);
    assert_eq!(rows.to_vec().unwrap(), (6..18).collect::<Vec<u32>>());
    assert_eq!(
        rows.slice(1..2).unwrap().to_vec().unwrap(),
        (12..18).collect::<Vec<u32>>()
    );
    a.slice_mut(3..4).unwrap().copy_from_slice(&[7; 6]).unwrap();
    let mut back = vec![0u32; 24];
    a.copy_to_host(&mut back).unwrap();
    assert_eq!(&back[18..], &[7; 6]);
    assert_eq!(&back[..18], &data[..18], "only the sliced rows changed");
    let flat = a.reshaped(&[24]).unwrap();
    assert_eq!(flat.to_vec().unwrap(), back);
    drop(a);
    assert_nothing_leaked(&gpu, &device);
}

#[test]
fn device_to_device_copy_and_zeros() {
    let (gpu, device) = sim(64 * MIB);
    let src = DeviceArray::from_slice(&gpu, &[1.5f64, -2.0, 3.25]).unwrap();
    let mut dst = DeviceArray::<f64>::zeros(&gpu, &[3]).unwrap();
    assert_eq!(dst.to_vec().unwrap(), [0.0; 3]);
    dst.copy_from(&src).unwrap();
    assert_eq!(dst.to_vec().unwrap(), [1.5, -2.0, 3.25]);
    let mut wide = DeviceArray::<f64>::zeros(&gpu, &[2, 3]).unwrap();
    wide.slice_mut(1..2)
        .unwrap()
        .copy_from(&src.reshaped(&[1, 3]).unwrap())
        .unwrap();
    assert_eq!(wide.to_vec().unwrap(), [0.0, 0.0, 0.0, 1.5, -2.0, 3.25]);
    assert_eq!(
        wide.copy_from(&src),
        Err(ArrayError::CopyLengthMismatch { dst: 6, src: 3 })
    );
    let (other, _) = sim(64 * MIB);
    let foreign = DeviceArray::from_slice(&other, &[0.0f64; 3]).unwrap();
    assert!(matches!(
        dst.copy_from(&foreign),
        Err(ArrayError::DifferentDevices { .. })
    ));
    drop((src, dst, wide));
    assert_nothing_leaked(&gpu, &device);
}

#[test]
fn drop_returns_memory_to_the_pool_and_free_does_it_at_once() {
    let (gpu, device) = sim(64 * MIB);
    let a = DeviceArray::<u8>::zeros(&gpu, &[3 * MIB as usize]).unwrap();
    let allocated = || gpu.pool().stats().allocated_bytes.all.current;
    assert!(allocated() >= 3 * MIB);
    a.free().unwrap();
    assert_eq!(allocated(), 0);
    let mallocs = device.counters().malloc;
    let b = DeviceArray::<u8>::empty(&gpu, &[3 * MIB as usize]).unwrap();
    assert_eq!(device.counters().malloc, mallocs, "reused from the cache");
    drop(b);
    assert_eq!(allocated(), 0);
    assert_nothing_leaked(&gpu, &device);
}

#[test]
fn a_block_used_on_another_stream_is_reused_only_after_that_stream_ran() {
    let (gpu, device) = sim(64 * MIB);
    let other = device.create_stream().unwrap();
    let a = DeviceArray::<u8>::empty(&gpu, &[MIB as usize]).unwrap();
    let ptr = a.device_ptr();
    a.record_stream(other).unwrap();
    device.enqueue_work(other).unwrap();
    drop(a);
    let b = DeviceArray::<u8>::empty(&gpu, &[MIB as usize]).unwrap();
    assert_ne!(b.device_ptr(), ptr, "the other stream has not run yet");
    device.complete_stream(other).unwrap();
    drop(b);
    gpu.pool().synchronize().unwrap();
    let c = DeviceArray::<u8>::empty(&gpu, &[MIB as usize]).unwrap();
    drop(c);
    assert_nothing_leaked(&gpu, &device);
}

#[test]
fn zero_length_arrays_cost_no_device_memory() {
    let (gpu, device) = sim(64 * MIB);
    let before = device.counters();
    let mut a = DeviceArray::<f32>::from_slice(&gpu, &[]).unwrap();
    let b = DeviceArray::<f32>::zeros(&gpu, &[4, 0]).unwrap();
    assert_eq!((a.device_ptr(), a.len(), b.len()), (0, 0, 0));
    assert_eq!(a.to_vec().unwrap(), Vec::<f32>::new());
    a.copy_from(&b.reshaped(&[0]).unwrap()).unwrap();
    assert_eq!(b.slice(1..3).unwrap().shape(), &[2, 0]);
    drop((a, b));
    assert_eq!(device.counters(), before, "no device call at all");
    assert_nothing_leaked(&gpu, &device);
}

#[test]
fn bad_shapes_and_lengths_are_typed_errors_and_leak_nothing() {
    let (gpu, device) = sim(64 * MIB);
    assert_eq!(
        DeviceArray::from_shape(&gpu, &[2, 3], &[1u8; 5]).unwrap_err(),
        ArrayError::ShapeMismatch {
            shape: vec![2, 3],
            elements: 6,
            data_len: 5
        }
    );
    assert!(matches!(
        DeviceArray::<u64>::empty(&gpu, &[usize::MAX, 2]),
        Err(ArrayError::ShapeOverflow { elem_size: 8, .. })
    ));
    assert!(matches!(
        DeviceArray::<u64>::empty(&gpu, &[usize::MAX / 4]),
        Err(ArrayError::ShapeOverflow { .. })
    ));
    let mut a = DeviceArray::<u16>::zeros(&gpu, &[2, 4]).unwrap();
    assert_eq!(
        a.copy_from_slice(&[1; 7]),
        Err(ArrayError::LengthMismatch {
            expected: 8,
            got: 7
        })
    );
    let mut short = [0u16; 9];
    assert_eq!(
        a.copy_to_host(&mut short),
        Err(ArrayError::LengthMismatch {
            expected: 8,
            got: 9
        })
    );
    assert_eq!(
        a.slice(1..3).unwrap_err(),
        ArrayError::OutOfBounds {
            start: 1,
            end: 3,
            len: 2
        }
    );
    assert!(a.reshaped(&[3, 3]).is_err());
    let scalar = DeviceArray::<u16>::zeros(&gpu, &[]).unwrap();
    assert_eq!(scalar.len(), 1);
    assert!(
        scalar.slice(0..0).is_err(),
        "a scalar has no outer dimension"
    );
    let message = a.copy_from_slice(&[1; 7]).unwrap_err().to_string();
    assert_eq!(
        message,
        "host slice has 7 elements, but the device array has 8"
    );
    drop((a, scalar));
    assert_nothing_leaked(&gpu, &device);
}

#[test]
fn more_than_the_device_has_is_too_large_and_leaks_nothing() {
    let (gpu, device) = sim(64 * MIB);
    let err = DeviceArray::<f32>::empty(&gpu, &[32 * MIB as usize]).unwrap_err();
    assert!(
        matches!(err, ArrayError::TooLarge { bytes, device_total, .. } if bytes == 128 * MIB && device_total == 64 * MIB),
        "{err}"
    );
    // Fits the device but not next to what is live: the pool's explained out-of-memory.
    let big = DeviceArray::<u8>::empty(&gpu, &[40 * MIB as usize]).unwrap();
    let err = DeviceArray::<u8>::empty(&gpu, &[40 * MIB as usize]).unwrap_err();
    assert!(
        matches!(err, ArrayError::Pool(PoolError::OutOfMemory(_))),
        "{err}"
    );
    assert!(err.is_out_of_memory());
    drop(big);
    assert_nothing_leaked(&gpu, &device);
}

#[test]
fn a_lost_device_fails_every_call_with_its_error_and_nothing_leaks_after_it_is_back() {
    let sim_device = Arc::new(SimDevice::new(SimConfig::host(64 * MIB)).unwrap());
    let device = Arc::new(LosableDevice::new(sim_device.clone()));
    let gpu = context_on(device.clone(), PolicyKind::Gpumem);
    let mut a = DeviceArray::from_slice(&gpu, &[1u32, 2, 3]).unwrap();
    device.set_lost(true);
    let lost = ArrayError::Device(lost_error());
    assert_eq!(a.to_vec().unwrap_err(), lost);
    assert_eq!(a.copy_from_slice(&[4, 5, 6]).unwrap_err(), lost);
    let b = DeviceArray::<u32>::empty(&gpu, &[3]).unwrap(); // served from the cache
    assert_eq!(a.copy_from(&b).unwrap_err(), lost);
    let err = DeviceArray::<u8>::empty(&gpu, &[8 * MIB as usize]).unwrap_err();
    assert_eq!(err, ArrayError::Pool(PoolError::Device(lost_error())));
    assert_eq!(
        DeviceArray::from_slice(&gpu, &[1u8; 4 * MIB as usize]).unwrap_err(),
        ArrayError::Pool(PoolError::Device(lost_error()))
    );
    assert_eq!(PinnedHostArray::<u8>::zeros(&gpu, &[4]).unwrap_err(), lost);
    drop(b);
    a.free().unwrap(); // bookkeeping in the pool: no device call
    device.set_lost(false);
    assert_nothing_leaked(&gpu, &sim_device);
}

#[test]
fn wrapped_memory_is_used_in_place_and_its_owner_dropped_with_the_array() {
    let (gpu, device) = sim(64 * MIB);
    let raw = device.malloc(4096).unwrap();
    struct Owner(Arc<SimDevice>, u64, Arc<AtomicUsize>);
    impl Drop for Owner {
        fn drop(&mut self) {
            self.0.free(self.1).unwrap();
            self.2.fetch_add(1, Ordering::SeqCst);
        }
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let owner = Owner(device.clone(), raw, drops.clone());
    let mut w = DeviceArray::<u32>::wrap(&gpu, raw, &[1024], owner).unwrap();
    assert!(w.is_wrapped());
    w.copy_from_slice(&vec![9; 1024]).unwrap();
    let mut check = [0u8; 4];
    device
        .copy_to_host(&mut check, raw, StreamId::DEFAULT)
        .unwrap();
    assert_eq!(u32::from_ne_bytes(check), 9);
    // The same bytes, or part of them, cannot be wrapped again while `w` lives.
    let twice = DeviceArray::<u8>::wrap(&gpu, raw + 100, &[8], ()).unwrap_err();
    assert_eq!(
        twice,
        ArrayError::AlreadyWrapped {
            ptr: raw + 100,
            end: raw + 108,
            other: raw,
            other_end: raw + 4096
        }
    );
    assert!(DeviceArray::<u8>::wrap(&gpu, raw - 8, &[16], ()).is_err());
    let neighbour = DeviceArray::<u8>::wrap(&gpu, raw + 4096, &[16], ()).unwrap();
    drop(neighbour);
    assert_eq!(
        DeviceArray::<u8>::wrap(&gpu, 0, &[16], ()).unwrap_err(),
        ArrayError::NullPointer { bytes: 16 }
    );
    let pool_allocated = gpu.pool().stats().allocated_bytes.all.current;
    w.free().unwrap();
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "the owner went with the array"
    );
    assert_eq!(
        gpu.pool().stats().allocated_bytes.all.current,
        pool_allocated
    );
    // Free again to wrap: the range is no longer registered.
    let raw2 = device.malloc(4096).unwrap();
    let again = DeviceArray::<u8>::wrap(
        &gpu,
        raw2,
        &[4096],
        Owner(device.clone(), raw2, drops.clone()),
    )
    .unwrap();
    drop(again);
    assert_eq!(drops.load(Ordering::SeqCst), 2);
    assert_nothing_leaked(&gpu, &device);
}

#[test]
fn pinned_host_arrays_upload_and_download() {
    let (gpu, device) = sim(64 * MIB);
    let mut pinned = PinnedHostArray::<i32>::zeros(&gpu, &[2, 2]).unwrap();
    assert!(
        !pinned.is_page_locked(),
        "the simulated device has no page-locked memory"
    );
    pinned.as_mut_slice().copy_from_slice(&[1, -2, 3, -4]);
    let d = pinned.to_device(&gpu).unwrap();
    assert_eq!(d.shape(), &[2, 2]);
    let mut back = PinnedHostArray::<i32>::zeros(&gpu, &[4]).unwrap();
    back.copy_from_device(&d.reshaped(&[4]).unwrap()).unwrap();
    assert_eq!(back.as_slice(), &[1, -2, 3, -4]);
    let host = HostArray::from_device(&d).unwrap();
    assert_eq!(host, HostArray::new(&[2, 2], vec![1, -2, 3, -4]).unwrap());
    assert_eq!(device.counters().alloc_pinned, 2);
    drop(d);
    assert_nothing_leaked(&gpu, &device);
}

#[test]
fn unified_arrays_round_trip_with_hints_and_free_their_memory() {
    use gpumem_device::{DeviceError, ManagedAdvice, MemoryLocation};
    let (gpu, device) = sim(64 * MIB);
    let mut u = UnifiedArray::from_shape(&gpu, &[2, 2], &[1u64, 2, 3, 4]).unwrap();
    u.prefetch(MemoryLocation::Device).unwrap();
    u.advise(ManagedAdvice::PreferredLocation(MemoryLocation::Host))
        .unwrap();
    u.slice_mut(1..2).unwrap().copy_from_slice(&[7, 8]).unwrap();
    assert_eq!(u.to_vec().unwrap(), [1, 2, 7, 8]);
    let d = DeviceArray::from_slice(&gpu, &[9u64; 4]).unwrap();
    u.copy_from(&d.reshaped(&[2, 2]).unwrap()).unwrap();
    assert_eq!(u.to_vec().unwrap(), [9; 4]);
    let c = device.counters();
    assert_eq!(
        (c.alloc_managed, c.prefetch_managed, c.advise_managed),
        (1, 1, 1)
    );
    assert_eq!(
        UnifiedArray::from_shape(&gpu, &[3], &[1u8; 2])
            .map(drop)
            .unwrap_err(),
        ArrayError::ShapeMismatch {
            shape: vec![3],
            elements: 3,
            data_len: 2
        }
    );
    let empty = UnifiedArray::<f32>::zeros(&gpu, &[0]).unwrap();
    empty.prefetch(MemoryLocation::Host).unwrap();
    drop(empty);
    assert_eq!(
        device.counters().alloc_managed,
        1,
        "an empty array allocates nothing"
    );
    u.free().unwrap();
    drop(d);
    assert_nothing_leaked(&gpu, &device);
    // A backend without managed memory says so.
    let plain = context_on(Arc::new(NoManaged(device.clone())), PolicyKind::Gpumem);
    let err = UnifiedArray::<u8>::zeros(&plain, &[4])
        .map(drop)
        .unwrap_err();
    assert!(
        matches!(err, ArrayError::Device(DeviceError::Unsupported { .. })),
        "{err}"
    );
}

/// A device that implements only memory: no managed memory, no copies.
struct NoManaged(Arc<SimDevice>);

impl Device for NoManaged {
    fn name(&self) -> String {
        "memory only".into()
    }
    fn mem_info(&self) -> Result<gpumem_device::MemInfo, gpumem_device::DeviceError> {
        self.0.mem_info()
    }
    fn malloc(&self, size: u64) -> Result<u64, gpumem_device::DeviceError> {
        self.0.malloc(size)
    }
    fn free(&self, ptr: u64) -> Result<(), gpumem_device::DeviceError> {
        self.0.free(ptr)
    }
}

#[test]
fn a_copy_between_streams_waits_for_the_source_stream() {
    let (gpu, device) = sim(64 * MIB);
    let (s1, s2) = (
        device.create_stream().unwrap(),
        device.create_stream().unwrap(),
    );
    let (on1, on2) = (gpu.on_stream(s1), gpu.on_stream(s2));
    let src = DeviceArray::from_slice(&on1, &[5u8; 64]).unwrap();
    let mut dst = DeviceArray::<u8>::zeros(&on2, &[64]).unwrap();
    let before = device.counters().stream_wait_event;
    dst.copy_from(&src).unwrap();
    assert_eq!(
        device.counters().stream_wait_event,
        before + 1,
        "s2 waited for s1"
    );
    assert_eq!(dst.to_vec().unwrap(), [5; 64]);
    let mut same = DeviceArray::<u8>::zeros(&on1, &[64]).unwrap();
    same.copy_from(&src).unwrap();
    assert_eq!(
        device.counters().stream_wait_event,
        before + 1,
        "one stream: no wait"
    );
    drop((src, dst, same));
    assert_nothing_leaked(&gpu, &device);
}
