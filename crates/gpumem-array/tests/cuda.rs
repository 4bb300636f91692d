//! Arrays, the batch iterator and managed memory on a real NVIDIA GPU. Every test needs a GPU
//! and driver and is ignored otherwise; `scripts/gpu-check.sh` runs them. They use device 0,
//! or the device `GPUMEM_CUDA_DEVICE` names.

mod common;

use std::sync::Arc;

use common::{context_on, MIB};
use gpumem_array::prelude::*;
use gpumem_cuda::CudaDevice;
use gpumem_device::{Device, ManagedAdvice, MemoryLocation};
use gpumem_pool::PolicyKind;

fn open() -> Arc<CudaDevice> {
    let ordinal = std::env::var("GPUMEM_CUDA_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    match CudaDevice::open(ordinal) {
        Ok(dev) => Arc::new(dev),
        Err(e) => panic!("this test needs an NVIDIA GPU and driver: {e}"),
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn arrays_round_trip_on_the_gpu() {
    let device = open();
    for policy in [PolicyKind::Torch, PolicyKind::Gpumem, PolicyKind::None] {
        let gpu = context_on(device.clone(), policy);
        let data: Vec<f32> = (0..3 * MIB as usize).map(|i| i as f32).collect();
        let a = DeviceArray::from_shape(&gpu, &[3, MIB as usize], &data).unwrap();
        assert_eq!(
            a.slice(2..3).unwrap().to_vec().unwrap(),
            &data[2 * MIB as usize..]
        );
        let mut b = DeviceArray::<f32>::zeros(&gpu, &[3 * MIB as usize]).unwrap();
        b.copy_from(&a.reshaped(&[3 * MIB as usize]).unwrap())
            .unwrap();
        assert_eq!(b.to_vec().unwrap(), data);
        drop((a, b));
        assert_eq!(gpu.pool().stats().allocated_bytes.all.current, 0);
        gpu.pool().empty_cache().unwrap();
    }
}

#[derive(ToDevice)]
struct Batch {
    tokens: HostArray<u32>,
    mask: HostArray<u8>,
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn batches_upload_on_a_copy_stream_on_the_gpu() {
    let device = open();
    let compute = device.create_stream().unwrap();
    let gpu = context_on(device.clone(), PolicyKind::Gpumem).on_stream(compute);
    let n = 4 * MIB as usize;
    let host = (0..16u32).map(|k| Batch {
        tokens: HostArray::from_vec(vec![k; n]),
        mask: HostArray::from_vec(vec![k as u8; 1000]),
    });
    for (k, batch) in gpu.batches(host).unwrap().enumerate() {
        let batch = batch.unwrap();
        let tokens = batch.tokens.to_vec().unwrap();
        assert!(tokens.iter().all(|&t| t == k as u32), "batch {k}");
        assert_eq!(batch.mask.to_vec().unwrap(), vec![k as u8; 1000]);
    }
    let stats = gpu.pool().stats();
    assert!(
        stats.allocated_bytes.all.peak <= 2 * (4 * n as u64 + 4096),
        "two batches at most"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; scripts/gpu-check.sh runs them"]
fn unified_arrays_on_the_gpu() {
    let device = open();
    let gpu = context_on(device.clone(), PolicyKind::Gpumem);
    if !device.info().managed_memory {
        assert!(UnifiedArray::<u8>::zeros(&gpu, &[4]).is_err());
        return;
    }
    let data: Vec<u32> = (0..MIB as u32).collect();
    let u = UnifiedArray::from_shape(&gpu, &[1024, 1024], &data).unwrap();
    u.advise(ManagedAdvice::ReadMostly).unwrap();
    u.prefetch(MemoryLocation::Device).unwrap();
    let mut d = DeviceArray::<u32>::zeros(&gpu, &[1024, 1024]).unwrap();
    d.copy_from(&u).unwrap();
    assert_eq!(d.to_vec().unwrap(), data);
    u.prefetch(MemoryLocation::Host).unwrap();
    assert_eq!(u.slice(1..2).unwrap().to_vec().unwrap(), &data[1024..2048]);
    u.free().unwrap();
}
