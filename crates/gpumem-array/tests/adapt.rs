//! Structure-preserving upload and download: derived structs, tuples, Option, Vec.

mod common;

use common::{assert_nothing_leaked, sim, MIB};
use gpumem_array::prelude::*;

#[derive(ToDevice, Clone, Debug, PartialEq)]
struct Batch {
    tokens: HostArray<u32>,
    mask: HostArray<u8>,
    labels: Option<HostArray<i64>>,
    extra: Vec<HostArray<f32>>,
}

#[derive(ToDevice, Debug, PartialEq)]
#[gpumem(device = "PairOnGpu")]
pub struct Pair(pub HostArray<u16>, pub (HostArray<u8>, HostArray<u8>));

#[derive(ToDevice)]
#[gpumem(upload_only)]
struct Staged {
    pinned: PinnedHostArray<f32>,
}

fn batch(seed: u32) -> Batch {
    Batch {
        tokens: HostArray::new(&[2, 3], (0..6).map(|i| i * seed).collect()).unwrap(),
        mask: HostArray::from_vec(vec![1, 0, 1]),
        labels: seed
            .is_multiple_of(2)
            .then(|| HostArray::from_vec(vec![seed as i64, -1])),
        extra: vec![HostArray::from_vec(vec![0.5; 4]); (seed % 3) as usize],
    }
}

#[test]
fn a_derived_struct_uploads_into_its_twin_and_back() {
    let (gpu, device) = sim(64 * MIB);
    for seed in 1..4 {
        let host = batch(seed);
        let on_device: BatchOnDevice = upload(&gpu, &host).unwrap();
        assert_eq!(on_device.tokens.shape(), &[2, 3]);
        assert_eq!(on_device.labels.is_some(), seed.is_multiple_of(2));
        assert_eq!(on_device.extra.len(), (seed % 3) as usize);
        assert_eq!(on_device.to_host().unwrap(), host);
    }
    let pair = Pair(
        HostArray::from_vec(vec![7, 8]),
        (HostArray::from_vec(vec![1]), HostArray::from_vec(vec![])),
    );
    let on_gpu: PairOnGpu = upload(&gpu, &pair).unwrap();
    assert_eq!(on_gpu.1 .0.to_vec().unwrap(), [1]);
    assert_eq!(on_gpu.to_host().unwrap(), pair);
    let mut pinned = PinnedHostArray::<f32>::zeros(&gpu, &[3]).unwrap();
    pinned.as_mut_slice().copy_from_slice(&[1.0, 2.0, 3.0]);
    let staged: StagedOnDevice = upload(&gpu, &Staged { pinned }).unwrap();
    assert_eq!(staged.pinned.to_vec().unwrap(), [1.0, 2.0, 3.0]);
    drop((on_gpu, staged));
    assert_nothing_leaked(&gpu, &device);
}

#[test]
fn slices_tuples_and_options_upload_directly() {
    let (gpu, device) = sim(64 * MIB);
    let (a, b, none) = upload(
        &gpu,
        &(
            HostArray::from_vec(vec![1u8, 2]),
            vec![HostArray::from_vec(vec![3.0f64])],
            None::<HostArray<u8>>,
        ),
    )
    .unwrap();
    assert_eq!(a.to_vec().unwrap(), [1, 2]);
    assert_eq!(b[0].to_vec().unwrap(), [3.0]);
    assert!(none.is_none());
    let from_slice = upload(&gpu, &[4i16, 5, 6][..]).unwrap();
    assert_eq!(
        from_slice.to_host().unwrap(),
        HostArray::from_vec(vec![4, 5, 6])
    );
    drop((a, b, from_slice));
    assert_nothing_leaked(&gpu, &device);
}

#[test]
fn a_failed_upload_frees_what_it_had_uploaded() {
    let (gpu, device) = sim(16 * MIB);
    let big = HostArray::from_vec(vec![0u8; 10 * MIB as usize]);
    let err = upload(&gpu, &vec![big.clone(), big]).map(drop).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_nothing_leaked(&gpu, &device);
}
