use std::sync::Arc;

use gpumem_array::prelude::*;
use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::Device;
use gpumem_pool::{Pool, PoolConfig};

#[derive(ToDevice)]
struct Batch {
    tokens: HostArray<u32>,
    labels: HostArray<u32>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A simulated GPU whose copies run at 10 GB/s (or a CUDA/wgpu device: any `Device`).
    let config = SimConfig {
        copy_bandwidth: Some(10_000_000_000),
        ..SimConfig::host(1 << 30)
    };
    let device = Arc::new(SimDevice::new(config)?);
    let pool = Arc::new(Pool::new(device.clone(), PoolConfig::from_env()?)?);
    let gpu = DeviceContext::new(pool.clone()).on_stream(device.create_stream()?);

    let x = DeviceArray::from_shape(&gpu, &[2, 2], &[1.0f32, 2.0, 3.0, 4.0])?;
    assert_eq!(x.slice(1..2)?.to_vec()?, [3.0, 4.0]);
    x.free()?; // back to the pool now, not at the end of the scope

    let host = (0..8u32).map(|k| Batch {
        tokens: HostArray::new(&[64, 4096], vec![k; 64 * 4096]).unwrap(),
        labels: HostArray::from_vec(vec![k; 64]),
    });
    // Batch k+1 is uploaded while batch k is used; at most two are on the device.
    for batch in gpu.batches(host)? {
        let batch: BatchOnDevice = batch?;
        device.enqueue_timed_work(gpu.stream(), 150_000)?; // a 150 µs "training step"
        assert_eq!(
            batch.labels.to_vec()?[0],
            batch.tokens.slice(0..1)?.to_vec()?[0]
        );
    }
    device.synchronize()?;
    println!(
        "8 batches in {} µs of device time",
        device.elapsed_ns() / 1000
    );
    println!(
        "peak {} bytes allocated",
        pool.stats().allocated_bytes.all.peak
    );
    Ok(())
}
