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
