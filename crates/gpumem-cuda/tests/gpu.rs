//! The CUDA backend on a real GPU: memory, copies, streams and events, VMM, and a
//! `gpumem_pool::Pool` over it with every built-in policy (the scenarios are in
//! `common/mod.rs`). Every test needs an NVIDIA GPU and driver and is ignored otherwise;
//! `scripts/gpu-check.sh` runs them (`cargo test -p gpumem-cuda -- --include-ignored`). They
//! use device 0, or the device `GPUMEM_CUDA_DEVICE` names.

mod common;

use std::sync::Arc;

use gpumem_cuda::CudaDevice;

fn open() -> Arc<CudaDevice> {
    let ordinal = std::env::var("GPUMEM_CUDA_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    match CudaDevice::open(ordinal) {
        Ok(dev) => {
            eprintln!("{}", dev.info());
            Arc::new(dev)
        }
        Err(e) => panic!("this test needs an NVIDIA GPU and driver: {e}"),
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn malloc_free_and_mem_info() {
    common::malloc_free_and_mem_info(&open());
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn copies_round_trip_sync_and_async() {
    common::copies_round_trip_sync_and_async(&open());
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn streams_and_events_order_the_work() {
    common::streams_and_events_order_the_work(&open(), true);
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn a_foreign_stream_is_used_once_adopted_and_left_to_its_owner() {
    common::a_foreign_stream_is_used_once_adopted_and_left_to_its_owner(&open());
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn vmm_chunks_show_the_same_bytes_through_two_mappings() {
    common::vmm_chunks_show_the_same_bytes_through_two_mappings(&open());
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn a_pool_over_the_gpu_runs_every_policy() {
    common::a_pool_over_the_gpu_runs_every_policy(&open());
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn device_out_of_memory_makes_the_pool_reclaim_and_retry() {
    common::device_out_of_memory_makes_the_pool_reclaim_and_retry(&open());
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn every_device_opens_and_describes_itself() {
    common::every_device_opens_and_describes_itself();
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn managed_memory_round_trips_with_prefetch_and_advice() {
    use gpumem_device::{Device, DeviceError, ManagedAdvice, MemoryLocation, StreamId};
    let dev = open();
    if !dev.info().managed_memory {
        let err = dev.alloc_managed(4096).unwrap_err();
        assert!(matches!(err, DeviceError::Unsupported { .. }), "{err}");
        return;
    }
    let len = 8 << 20;
    let ptr = dev.alloc_managed(len).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 13 % 251) as u8).collect();
    dev.copy_to_device(ptr, &data, StreamId::DEFAULT).unwrap();
    dev.advise_managed(ptr, len, ManagedAdvice::ReadMostly)
        .unwrap();
    dev.advise_managed(
        ptr,
        len,
        ManagedAdvice::PreferredLocation(MemoryLocation::Device),
    )
    .unwrap();
    dev.advise_managed(ptr, len, ManagedAdvice::AccessedBy(MemoryLocation::Host))
        .unwrap();
    let s = dev.create_stream().unwrap();
    dev.prefetch_managed(ptr, len, MemoryLocation::Device, s)
        .unwrap();
    dev.prefetch_managed(ptr, len / 2, MemoryLocation::Host, s)
        .unwrap();
    dev.synchronize_stream(s).unwrap();
    let mut back = vec![0u8; len as usize];
    dev.copy_to_host(&mut back, ptr, StreamId::DEFAULT).unwrap();
    assert_eq!(back, data);
    assert!(dev
        .prefetch_managed(ptr, len + 1, MemoryLocation::Device, s)
        .is_err());
    dev.free_managed(ptr).unwrap();
    assert!(dev.free_managed(ptr).is_err());
    dev.destroy_stream(s).unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn a_stream_waits_for_an_event_of_another() {
    use gpumem_device::{Device, StreamId};
    let dev = open();
    let len = 64usize << 20;
    let (copy, compute) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let (a, b) = (
        dev.malloc(len as u64).unwrap(),
        dev.malloc(len as u64).unwrap(),
    );
    let mut staging = dev.alloc_pinned(len).unwrap();
    staging.fill(0x5a);
    let upload = dev.copy_to_device_async(a, staging, copy).unwrap();
    let uploaded = dev.record_event(copy).unwrap();
    dev.stream_wait_event(compute, uploaded).unwrap();
    let copied = dev.copy_on_device_async(b, a, len as u64, compute).unwrap();
    dev.wait_event(copied).unwrap();
    let mut back = vec![0u8; len];
    dev.copy_to_host(&mut back, b, StreamId::DEFAULT).unwrap();
    assert!(
        back.iter().all(|&x| x == 0x5a),
        "the device copy ran after the upload"
    );
    drop(upload.wait().unwrap());
    for e in [uploaded, copied] {
        dev.destroy_event(e).unwrap();
    }
    dev.free(a).unwrap();
    dev.free(b).unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn the_conformance_suite_passes_on_the_gpu() {
    common::the_conformance_suite_passes(&open());
}
