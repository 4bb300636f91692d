//! Samples made up to show one situation each: the diagnoses' tests, the benchmarks and the
//! bundled demo recording (`testdata/watch/demo.jsonl`) are built from them. Deterministic:
//! the same call gives the same samples.
//!
//! The baseline is a healthy training job: every GPU busy (about 95 %), memory about 88 % used,
//! the pool's cache small and in one piece, PCIe lightly used. Each scenario changes one thing.

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::{Limit, PolicyKind, Pool, PoolConfig, PoolStatus};

use crate::{GpuSample, PoolSample, ProcessSample, Sample};

const GIB: u64 = 1 << 30;
/// The modelled GPU: an 80 GiB H100 on PCIe gen 5 x16.
const TOTAL: u64 = 80 * GIB;
const MODEL: &str = "NVIDIA H100 80GB HBM3";
/// The first sample's time: 2026-11-23 12:00:00 UTC.
const START_MS: u64 = 1_795_953_600_000;

/// A machine of `gpus` GPUs with `processes` processes each, every process with a pool, at
/// second `t` of a healthy run.
pub fn healthy_at(gpus: u32, processes: u32, t: u64) -> Sample {
    let wobble = (t % 5) as f64; // deterministic small variation
    let gpus_vec = (0..gpus)
        .map(|index| {
            let per_process = 70 * GIB / u64::from(processes.max(1));
            GpuSample {
                index,
                uuid: format!("GPU-5e3f0c1a-0000-4000-8000-{index:012x}"),
                name: MODEL.into(),
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x17 + index),
                memory_used: 70 * GIB + 512 * (1 << 20),
                memory_total: TOTAL,
                gpu_util: 93.0 + wobble,
                memory_util: 60.0 + wobble,
                pcie_rx_bytes_per_s: 2_000_000_000,
                pcie_tx_bytes_per_s: 500_000_000,
                pcie_max_bytes_per_s: crate::sample::pcie_bytes_per_s(5, 16),
                power_watts: 600.0 + 10.0 * wobble,
                processes: (0..processes)
                    .map(|p| ProcessSample {
                        pid: pid(index, p),
                        memory: Some(per_process),
                        user: "alice".into(),
                        command: format!("python train.py --rank {index}"),
                        cpu_percent: None,
                    })
                    .collect(),
            }
        })
        .collect::<Vec<_>>();
    let pools = gpus_vec
        .iter()
        .flat_map(|gpu| {
            gpu.processes.iter().map(move |p| {
                let reserved = p.memory.unwrap_or(0) - 512 * (1 << 20);
                pool(
                    "gpumem",
                    p.pid,
                    gpu.index,
                    reserved - 3 * GIB,
                    reserved,
                    2 * GIB,
                )
            })
        })
        .collect();
    Sample {
        time_ms: START_MS + t * 1000,
        host: "gpu-node-01".into(),
        gpus: gpus_vec,
        pools,
    }
}

/// `seconds` samples of a healthy run on `gpus` GPUs with one process each.
pub fn healthy(gpus: u32, seconds: u64) -> Vec<Sample> {
    (0..seconds).map(|t| healthy_at(gpus, 1, t)).collect()
}

/// Memory left unused: the job uses 24 GiB of 80 and the GPU is 55 % busy.
pub fn small_batch(seconds: u64) -> Vec<Sample> {
    adjust(healthy(1, seconds), |_, s| {
        let gpu = &mut s.gpus[0];
        gpu.memory_used = 24 * GIB;
        gpu.gpu_util = 55.0;
        gpu.processes[0].memory = Some(23 * GIB);
        s.pools[0] = pool(
            "gpumem",
            gpu.processes[0].pid,
            0,
            20 * GIB,
            22 * GIB,
            2 * GIB,
        );
    })
}

/// Data starvation: 4 s busy (98 %), then 3 s idle (2 %), over and over; in the gaps the
/// process's host CPU is busy (180 % of a core: loading and augmenting), while the GPU computes
/// it is not (30 %).
pub fn data_starved(seconds: u64) -> Vec<Sample> {
    adjust(healthy(1, seconds), |t, s| {
        let busy = t % 7 < 4;
        s.gpus[0].gpu_util = if busy { 98.0 } else { 2.0 };
        s.gpus[0].processes[0].cpu_percent = Some(if busy { 30.0 } else { 180.0 });
    })
}

/// Fragmentation: the pool holds 66 GiB for 30 GiB of tensors, its cache in splinters.
pub fn fragmented(seconds: u64) -> Vec<Sample> {
    adjust(healthy(1, seconds), |_, s| {
        let pid = s.pools[0].pid;
        s.pools[0] = pool("gpumem", pid, 0, 30 * GIB, 66 * GIB, GIB);
    })
}

/// Rank imbalance: of four ranks, rank 3 holds 78 GiB and computes flat out; the others hold
/// 50 GiB and wait for it (60 % busy).
pub fn imbalanced(seconds: u64) -> Vec<Sample> {
    adjust(
        (0..seconds).map(|t| healthy_at(4, 1, t)).collect(),
        |_, s| {
            for gpu in &mut s.gpus {
                let lagging = gpu.index == 3;
                gpu.memory_used = if lagging { 78 * GIB } else { 50 * GIB };
                gpu.gpu_util = if lagging { 99.0 } else { 60.0 };
            }
        },
    )
}

/// PCIe-bound: host-to-device copies at 52 GB/s of the gen 5 x16 link's 63 while the GPU is
/// 40 % busy.
pub fn pcie_bound(seconds: u64) -> Vec<Sample> {
    adjust(healthy(1, seconds), |_, s| {
        s.gpus[0].pcie_rx_bytes_per_s = 52_000_000_000;
        s.gpus[0].gpu_util = 40.0;
    })
}

/// The bundled demo: two GPUs, a healthy job on GPU 0 (policy `gpumem`) and a fragmented one
/// on GPU 1 (policy `torch`) that has run out of memory once, whose last OOM explanation is
/// the one a real (simulated) pool wrote.
pub fn demo(seconds: u64) -> Vec<Sample> {
    let oom = simulated_oom();
    adjust(healthy(2, seconds), move |t, s| {
        let pid = s.gpus[1].processes[0].pid;
        s.gpus[1].processes[0].command = "python finetune.py --batch-size 48".into();
        s.gpus[1].processes[0].user = "bob".into();
        s.gpus[1].gpu_util = 70.0 + (t % 3) as f64;
        let mut fragmented = pool("torch", pid, 1, 38 * GIB, 69 * GIB, GIB);
        if t >= seconds / 2 {
            fragmented.num_ooms = 1;
            fragmented.last_oom = Some(oom.clone());
        }
        s.pools[1] = fragmented;
    })
}

/// A pool sample with the status text the pool itself prints.
fn pool(
    policy: &'static str,
    pid: u32,
    device: u32,
    allocated: u64,
    reserved: u64,
    largest_free: u64,
) -> PoolSample {
    let status = PoolStatus {
        policy,
        caches: true,
        device_used: reserved + 512 * (1 << 20),
        device_total: TOTAL,
        allocated,
        reserved,
        largest_free_block: largest_free,
        soft_limit: None,
        hard_limit: None,
    };
    PoolSample {
        pid,
        device,
        policy: status.policy.into(),
        allocated,
        reserved,
        largest_free_block: largest_free,
        num_ooms: 0,
        soft_limit: None,
        hard_limit: None,
        last_oom: None,
        status: status.to_string(),
    }
}

/// The explanation a real pool gives when a 2.5 GiB request does not fit under a 4 GiB hard
/// limit with half of it held by 300 MiB blocks.
fn simulated_oom() -> String {
    let attempt = || -> Option<String> {
        let device = Arc::new(SimDevice::new(SimConfig::address_only(TOTAL)).ok()?);
        // The sample's second pool runs PyTorch's policy: its explanation says so too.
        let mut config = PoolConfig {
            policy: PolicyKind::Torch,
            ..PoolConfig::default()
        };
        config.options.hard_limit = Some(Limit::Bytes(4 * GIB));
        let pool = Pool::new(device, config).ok()?;
        let held: Vec<_> = std::iter::from_fn(|| pool.allocate(300 << 20, StreamId::DEFAULT).ok())
            .take(64)
            .collect();
        for block in held.iter().step_by(2) {
            pool.free(block.ptr).ok()?;
        }
        pool.allocate(5 * GIB / 2, StreamId::DEFAULT).err()?;
        pool.last_oom().map(|oom| oom.to_string())
    };
    attempt().unwrap_or_else(|| "out of memory (the simulated pool did not fail)".into())
}

fn pid(gpu: u32, process: u32) -> u32 {
    4200 + 100 * gpu + process
}

fn adjust(mut samples: Vec<Sample>, change: impl Fn(u64, &mut Sample)) -> Vec<Sample> {
    for (t, sample) in samples.iter_mut().enumerate() {
        change(t as u64, sample);
    }
    samples
}
