//! Arrays on the wgpu backend (lavapipe without a GPU): the same round trips as on the
//! simulated device, through real buffers. Without a Vulkan adapter they fail with what to
//! install, or skip when the user opted out (`gpumem_testkit::deps`).

mod common;

use common::{context_on, wgpu};
use gpumem_array::prelude::*;
use gpumem_pool::PolicyKind;

#[test]
fn arrays_round_trip_through_wgpu_buffers() {
    let Some(device) = wgpu() else { return };
    let gpu = context_on(device.clone(), PolicyKind::Gpumem);
    // Odd element sizes and offsets: wgpu copies in 4-byte words, arrays do not care.
    let data: Vec<u8> = (0..1001u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut a = DeviceArray::from_shape(&gpu, &[7, 143], &data).unwrap();
    assert_eq!(a.to_vec().unwrap(), data);
    assert_eq!(
        a.slice(3..5).unwrap().to_vec().unwrap(),
        &data[3 * 143..5 * 143]
    );
    a.slice_mut(1..2)
        .unwrap()
        .copy_from_slice(&[5; 143])
        .unwrap();
    let mut b = DeviceArray::<u8>::zeros(&gpu, &[7, 143]).unwrap();
    b.copy_from(&a).unwrap();
    let back = b.to_vec().unwrap();
    assert_eq!(&back[143..286], &[5; 143]);
    assert_eq!(&back[286..], &data[286..]);
    let floats = DeviceArray::from_slice(&gpu, &[1.0f32, 2.5, -3.0]).unwrap();
    assert_eq!(floats.to_vec().unwrap(), [1.0, 2.5, -3.0]);
    drop((a, b, floats));
    assert_eq!(gpu.pool().stats().allocated_bytes.all.current, 0);
    gpu.pool().empty_cache().unwrap();
    assert_eq!(device.live_allocations(), 0, "every buffer destroyed");
}

#[derive(ToDevice)]
struct Batch {
    tokens: HostArray<u32>,
    mask: Option<HostArray<u8>>,
}

#[test]
fn batches_and_derived_structs_through_wgpu() {
    let Some(device) = wgpu() else { return };
    let gpu = context_on(device.clone(), PolicyKind::Torch);
    let host = |k: u32| Batch {
        tokens: HostArray::new(&[3, 5], (0..15).map(|i| i * k).collect()).unwrap(),
        mask: (!k.is_multiple_of(2)).then(|| HostArray::from_vec(vec![k as u8; 7])),
    };
    let mut seen = 0;
    for (k, batch) in gpu.batches((0..6).map(host)).unwrap().enumerate() {
        let batch = batch.unwrap();
        let k = k as u32;
        assert_eq!(
            batch.tokens.to_vec().unwrap(),
            (0..15).map(|i| i * k).collect::<Vec<_>>()
        );
        assert_eq!(
            batch.mask.map(|m| m.to_vec().unwrap()),
            (!k.is_multiple_of(2)).then(|| vec![k as u8; 7])
        );
        seen += 1;
    }
    assert_eq!(seen, 6);
    let stats = gpu.pool().stats();
    assert_eq!(stats.allocated_bytes.all.current, 0);
    // torch rounds every small request up to 512 bytes; two consecutive batches hold three
    // arrays (every other one has a mask): two batches at most.
    assert_eq!(
        stats.allocated_bytes.all.peak,
        3 * 512,
        "two batches at most"
    );
    let back = upload(&gpu, &host(3)).unwrap().to_host().unwrap();
    assert_eq!(back.tokens, host(3).tokens);
}
