//! PyTorch's own allocator on a real GPU, against its replay. `testdata/traces/h200-*.pickle.gz`
//! are snapshots that PyTorch 2.11 (CUDA 13) wrote with `torch.cuda.memory._snapshot()` after
//! recording its allocation history from the start of a process that trained a model for 8
//! steps on an NVIDIA H200 (`python/checks/torch_gpu.py`: a GPT-2-shaped decoder and a
//! ResNet-18-shaped network, AdamW). The same process reported `torch.cuda.max_memory_reserved()`
//! and `max_memory_allocated()`: the `torch` policy's replay of the snapshot must give that
//! reserved peak to the byte.
//!
//! `h200-llama-train-torch-policy.snapshot.pickle.gz` is the first 14 000 entries (every
//! segment of the run) of the snapshot that gpumem's `torch` policy wrote under PyTorch 2.11
//! through `gpumem.torch.use()` on an H200 (2026-11-28, `python/checks/allocators_gpu.py`'s
//! `llama-train`: a 400 M-parameter Llama-shaped decoder, bf16 autocast, fused AdamW, 8 × 1024
//! tokens): that run and PyTorch's own allocator in the same workload both peaked at the
//! reserved and allocated bytes below. Its segments carry the addresses the driver returned,
//! top-down and not in one order; the replay must hand them out again, because the policy
//! breaks ties between cached blocks of one size by address.

use gpumem_pool::PolicyKind;
use gpumem_replay::{replay_peaks, ReplayOptions};
use gpumem_trace::{read_path, ReadOptions};
use std::path::PathBuf;

/// (snapshot, PyTorch's max_memory_reserved, its max_memory_allocated), as the process that
/// wrote the snapshot reported them.
const MEASURED: [(&str, u64, u64); 3] = [
    (
        "h200-gpt2-train.snapshot.pickle.gz",
        857_735_168,
        820_022_272,
    ),
    (
        "h200-resnet-train.snapshot.pickle.gz",
        436_207_616,
        375_296_512,
    ),
    (
        "h200-llama-train-torch-policy.snapshot.pickle.gz",
        18_446_548_992,
        17_232_732_160,
    ),
];

fn read(name: &str) -> gpumem_trace::Trace {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/traces")
        .join(name);
    read_path(&path, ReadOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Without the driver's addresses (the sim's own, in one order), the replay splits other
/// blocks than the run did and ends a whole 1000 MiB segment (fp32 logits of 8 × 1024 tokens
/// × 32 000) below PyTorch: the addresses are what makes the replay exact.
#[test]
fn the_drivers_addresses_decide_the_torch_policys_ties() {
    let (name, reserved, _) = MEASURED[2];
    let mut trace = read(name);
    assert_eq!(trace.device_allocations.len(), 327, "{name}: segments");
    trace.device_allocations.clear();
    let without = replay_peaks(&trace, PolicyKind::Torch, &ReplayOptions::default()).unwrap();
    assert_eq!(reserved - without.peak_reserved_bytes, 1_048_576_000);
}

#[test]
fn replaying_a_gpu_snapshot_gives_pytorchs_own_reserved_peak() {
    for (name, reserved, allocated) in MEASURED {
        let trace = read(name);
        let torch = replay_peaks(&trace, PolicyKind::Torch, &ReplayOptions::default()).unwrap();
        assert_eq!(torch.peak_reserved_bytes, reserved, "{name}: reserved");
        // Allocated is PyTorch's rounded block sizes; the recorded history misses at most a
        // few small blocks that PyTorch made before it started (16 KiB on the GPT-2 run).
        let missed = allocated.abs_diff(torch.peak_allocated_bytes);
        assert!(
            missed <= 64 << 10,
            "{name}: allocated {} vs {allocated}",
            torch.peak_allocated_bytes
        );
        // gpumem's own policy holds less than PyTorch on both runs.
        let gpumem = replay_peaks(&trace, PolicyKind::Gpumem, &ReplayOptions::default()).unwrap();
        assert!(
            gpumem.peak_reserved_bytes < reserved,
            "{name}: gpumem {}",
            gpumem.peak_reserved_bytes
        );
        println!(
            "{name}: torch policy {} B (PyTorch {reserved} B), gpumem policy {} B",
            torch.peak_reserved_bytes, gpumem.peak_reserved_bytes
        );
    }
}
