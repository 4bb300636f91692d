//! Why a GPU is underused: which of five known causes hold over a window of samples, each with
//! the numbers that show it and what to change.
//!
//! Every rule looks at a window of at least [`Thresholds::min_samples`] samples and fires on
//! these thresholds (all in [`Thresholds`], defaults given):
//!
//! | finding | fires when (per GPU unless said) |
//! |---|---|
//! | [`Kind::UnusedMemory`] | peak device memory < 50 % of total and mean utilisation < 90 % |
//! | [`Kind::DataStarvation`] | utilisation < 10 % in 15–90 % of samples, in ≥ 2 separate gaps, and ≥ 80 % on average between them |
//! | [`Kind::Fragmentation`] | per pool: median reserved ≥ 1.5 × allocated and ≥ 1 GiB reserved but unallocated |
//! | [`Kind::RankImbalance`] | across ≥ 2 GPUs: peak memory differs by ≥ 20 % of the largest and ≥ 4 GiB, or mean utilisation by ≥ 25 points |
//! | [`Kind::PcieBound`] | PCIe in one direction ≥ 70 % of the link's rate in ≥ half the samples and mean utilisation < 80 % |

use std::fmt;

use gpumem_pool::Bytes;

use crate::{GpuSample, PoolSample, Sample};

/// The thresholds of the rules (see the module's table). Each says where its value comes from:
/// a published source, a measurement (with the command that repeats it), or, where neither
/// was found, that it is a judgement and why; none has been tuned on real `gpumem watch`
/// recordings, as the repository has none (`testdata/watch/demo.jsonl` is synthetic).
///
/// The utilisation figures are NVML's `utilization.gpu`, which nvidia-smi defines as the
/// "percent of time over the past sample period during which one or more kernels was
/// executing on the GPU", the period being between 1/6 s and 1 s depending on the product
/// (`nvidia-smi --help-query-gpu`). Any kernel counts, however few SMs it uses, so this figure
/// is never below DCGM's SM activity (`DCGM_FI_PROF_SM_ACTIVE`, the fraction of time a warp is
/// active, averaged over the SMs), for which the DCGM user guide (Feature Overview, Profiling
/// Metrics) says "a value of 0.8 or greater is necessary, but not sufficient, for effective
/// use of the GPU". So a utilisation below 80 % puts SM activity below that level too. (The
/// wording was checked against a second reader of the same guide: KempnerPulse's
/// `docs/classification.md` quotes the guide's 80 % line and its other one, that an SM activity
/// under 0.5 "likely indicates ineffective GPU usage"; the guide's own page,
/// docs.nvidia.com/datacenter/dcgm/latest/user-guide/feature-overview.html, was found but its
/// metrics table could not be read here.)
#[derive(Clone, Debug, PartialEq)]
pub struct Thresholds {
    /// Fewer samples than this: no rule fires (default 5). Judgement, no source: the fewest
    /// that can show a pattern (starvation needs two gaps with work between them: at least
    /// idle, busy, idle, busy, plus one), 5 s at `gpumem watch`'s default 1 s interval.
    pub min_samples: usize,
    /// Peak memory below this fraction of total is unused memory (0.5). Judgement, no source:
    /// at half the memory free, the batch (or the model replicas per GPU) could at least double
    /// before memory limits it.
    pub unused_memory_fraction: f64,
    /// Mean utilisation (%) at or above which unused memory is not worth a finding (90).
    /// Judgement above a source: DCGM's 0.8 SM activity (see above) is necessary but not
    /// sufficient, so a GPU at 80–90 % may still gain from a larger batch; 90 leaves that band
    /// to the finding.
    pub busy_enough_util: f64,
    /// Utilisation (%) below which a sample is idle (10). Judgement, read through nvidia-smi's
    /// definition (see above): under 10 % means no kernel ran for at least 90 % of the sample
    /// period (900 ms of a 1 s period).
    pub idle_util: f64,
    /// Fraction of idle samples above which starvation may hold (0.15) … Judgement, no source:
    /// below it the gaps cost less than a sixth of the time.
    pub starved_min_idle: f64,
    /// … and below which (0.9): an always idle GPU is not starved, it is unused. Judgement, no
    /// source: at 90 % idle the bursts are the exception, not the work.
    pub starved_max_idle: f64,
    /// Mean utilisation (%) of the non-idle samples for starvation (80). Source: DCGM's 0.8 SM
    /// activity (see above): between the gaps the GPU reaches the level DCGM calls necessary
    /// for effective use, so the gaps, not the work, keep it from it.
    pub starved_busy_util: f64,
    /// Median reserved / allocated for fragmentation (1.5). Measured: PyTorch's allocator
    /// (the `torch` policy, which gives PyTorch's own reserved peak to the byte) reaches peak
    /// reserved / peak allocated of 1.05–1.24 on the nine committed PyTorch traces and 1.05 and
    /// 1.16 on the two snapshots PyTorch wrote on an H200 (utilisation 81.0–95.6 %, README's
    /// policy table; `for t in testdata/traces/*.jsonl.gz; do gpumem replay $t; done`), so 1.5
    /// is above what it reaches without a problem. Those are ratios at the peak; a median over
    /// a run, with the cache kept while allocations shrink, may run higher without one.
    pub fragmentation_ratio: f64,
    /// Reserved but unallocated bytes for fragmentation (1 GiB). Measured, from the same table:
    /// at the peak PyTorch's allocator holds at most 276 MiB reserved but unallocated on those
    /// traces (TinyLlama training: 1.22 GiB live at 81.9 %), so 1 GiB is beyond them; they are
    /// small models, and the figure grows with the model. PyTorch's out-of-memory message
    /// names the same quantity ("reserved by PyTorch but unallocated", with
    /// `expandable_segments:True` as the remedy) but gives no threshold.
    pub fragmentation_bytes: u64,
    /// Peak-memory difference across GPUs, as a fraction of the largest (0.2) … Judgement, no
    /// source: data-parallel ranks run the same program on equal shares, so their peaks differ
    /// by what their inputs do; a fifth is beyond that for fixed-shape batches.
    pub imbalance_memory_fraction: f64,
    /// … and in bytes (4 GiB). Judgement, no source: keeps small models' differences, which
    /// cost nothing, out of the finding.
    pub imbalance_memory_bytes: u64,
    /// Mean-utilisation difference across GPUs, in points (25). Judgement, no source: in
    /// synchronous data parallelism the fastest rank waits for the slowest at each all-reduce,
    /// so a quarter of the time idle on one rank is the gap this flags.
    pub imbalance_util_points: f64,
    /// PCIe rate as a fraction of the link's for a sample to be near the limit (0.7).
    /// Measured: on an H200 (PCIe 5 x16, 63.0 GB/s encoded, the link rate this crate computes
    /// in `sample::pcie_bytes_per_s`) pinned copies of 16 MiB ran at 53.8 GB/s up and
    /// 54.1 GB/s down (docs/gpu.md, `cargo bench -p gpumem-bench --bench arrays -- cuda`),
    /// 85–86 % of the link's rate, the most any copy here reached; 0.7 is about 82 % of that.
    pub pcie_fraction: f64,
    /// Mean utilisation (%) below which a PCIe-bound GPU is a finding (80). Source: DCGM's 0.8
    /// SM activity (see above): at or above it the GPU does its work despite the transfers.
    pub pcie_max_util: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            min_samples: 5,
            unused_memory_fraction: 0.5,
            busy_enough_util: 90.0,
            idle_util: 10.0,
            starved_min_idle: 0.15,
            starved_max_idle: 0.9,
            starved_busy_util: 80.0,
            fragmentation_ratio: 1.5,
            fragmentation_bytes: 1 << 30,
            imbalance_memory_fraction: 0.2,
            imbalance_memory_bytes: 4 << 30,
            imbalance_util_points: 25.0,
            pcie_fraction: 0.7,
            pcie_max_util: 80.0,
        }
    }
}

/// Which cause a finding names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// The batch leaves device memory unused.
    UnusedMemory,
    /// The GPU waits for data between bursts of work.
    DataStarvation,
    /// The pool holds much more than it hands out.
    Fragmentation,
    /// One rank of several holds more memory or computes longer than the others.
    RankImbalance,
    /// Host-device copies run near the PCIe link's limit.
    PcieBound,
}

impl Kind {
    /// A short name, e.g. `unused-memory`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::UnusedMemory => "unused-memory",
            Kind::DataStarvation => "data-starvation",
            Kind::Fragmentation => "fragmentation",
            Kind::RankImbalance => "rank-imbalance",
            Kind::PcieBound => "pcie-bound",
        }
    }
}

/// One cause that holds, with its evidence and advice.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    /// The cause.
    pub kind: Kind,
    /// What it is about, e.g. `GPU 1` or `pid 4300 on GPU 1`.
    pub subject: String,
    /// The numbers that show it.
    pub evidence: Vec<String>,
    /// What to do, most promising first.
    pub advice: Vec<String>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} — {}", self.kind.name(), self.subject)?;
        for line in &self.evidence {
            writeln!(f, "  evidence: {line}")?;
        }
        for line in &self.advice {
            writeln!(f, "  do: {line}")?;
        }
        Ok(())
    }
}

/// Every finding over `samples`, restricted to the GPUs and pools of `pid` when given. Each
/// rule looks only at GPUs and pools seen in at least [`Thresholds::min_samples`] of them (with
/// `pid`, samples where the process is on the GPU or has the pool).
pub fn diagnose(samples: &[Sample], pid: Option<u32>, thresholds: &Thresholds) -> Vec<Finding> {
    let (mut series, mut pools) = watched(samples, pid);
    series.retain(|(_, gpu)| gpu.len() >= thresholds.min_samples);
    pools.retain(|pool| pool.len() >= thresholds.min_samples);
    let mut findings = Vec::new();
    for (index, gpu) in &series {
        findings.extend(unused_memory(*index, gpu, thresholds));
        findings.extend(data_starvation(*index, gpu, thresholds));
        findings.extend(pcie_bound(*index, gpu, thresholds));
    }
    findings.extend(rank_imbalance(&series, thresholds));
    findings.extend(
        pools
            .iter()
            .filter_map(|pool| fragmentation(pool, thresholds)),
    );
    findings.sort_by_key(|f| f.kind);
    findings
}

/// Why no rule could look at anything in `samples` (for `pid` when given), or `None` when at
/// least one GPU or pool was seen in [`Thresholds::min_samples`] samples: so that "no finding"
/// is not said of what was never checked.
pub fn nothing_to_check(
    samples: &[Sample],
    pid: Option<u32>,
    thresholds: &Thresholds,
) -> Option<String> {
    let (series, pools) = watched(samples, pid);
    let most = series
        .iter()
        .map(|(_, gpu)| gpu.len())
        .chain(pools.iter().map(Vec::len))
        .max();
    let n = samples.len();
    match (most, pid) {
        (Some(most), _) if most >= thresholds.min_samples => None,
        (Some(most), _) => Some(format!(
            "each GPU and pool appears in at most {most} sample(s) of {n}; the rules need at least {}",
            thresholds.min_samples
        )),
        (None, Some(pid)) if samples.iter().any(|s| !s.gpus.is_empty() || !s.pools.is_empty()) => {
            Some(format!(
                "pid {pid} is on no GPU and has no pool in any sample ({n} read)"
            ))
        }
        (None, _) => Some(format!("no sample shows a GPU or a gpumem pool ({n} read)")),
    }
}

/// Each watched GPU's samples over time, by index, and each watched pool's, by process and
/// device; with `pid`, only the GPUs where it runs or has a pool (in those samples) and its
/// pools.
#[allow(clippy::type_complexity)]
fn watched(
    samples: &[Sample],
    pid: Option<u32>,
) -> (Vec<(u32, Vec<&GpuSample>)>, Vec<Vec<&PoolSample>>) {
    let mut series: Vec<(u32, Vec<&GpuSample>)> = Vec::new();
    let mut pools: Vec<Vec<&PoolSample>> = Vec::new();
    for sample in samples {
        for gpu in &sample.gpus {
            let watched = pid.is_none_or(|pid| {
                gpu.processes.iter().any(|p| p.pid == pid)
                    || sample
                        .pools
                        .iter()
                        .any(|p| p.pid == pid && p.device == gpu.index)
            });
            if !watched {
                continue;
            }
            match series.iter_mut().find(|(i, _)| *i == gpu.index) {
                Some((_, list)) => list.push(gpu),
                None => series.push((gpu.index, vec![gpu])),
            }
        }
        for pool in sample
            .pools
            .iter()
            .filter(|p| pid.is_none_or(|pid| pid == p.pid))
        {
            match pools
                .iter_mut()
                .find(|list| (list[0].pid, list[0].device) == (pool.pid, pool.device))
            {
                Some(list) => list.push(pool),
                None => pools.push(vec![pool]),
            }
        }
    }
    pools.sort_by_key(|list| (list[0].pid, list[0].device));
    (series, pools)
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

fn mean_util(gpu: &[&GpuSample]) -> f64 {
    mean(gpu.iter().map(|g| g.gpu_util))
}

fn peak_memory(gpu: &[&GpuSample]) -> u64 {
    gpu.iter().map(|g| g.memory_used).max().unwrap_or(0)
}

fn unused_memory(index: u32, gpu: &[&GpuSample], t: &Thresholds) -> Option<Finding> {
    let total = gpu.iter().map(|g| g.memory_total).max().unwrap_or(0);
    let peak = peak_memory(gpu);
    let util = mean_util(gpu);
    if total == 0
        || peak as f64 >= t.unused_memory_fraction * total as f64
        || util >= t.busy_enough_util
    {
        return None;
    }
    let factor = 0.9 * total as f64 / peak.max(1) as f64;
    Some(Finding {
        kind: Kind::UnusedMemory,
        subject: format!("GPU {index}"),
        evidence: vec![
            format!(
                "peak memory {} of {} ({:.0} %) over {} samples",
                Bytes(peak),
                Bytes(total),
                100.0 * peak as f64 / total as f64,
                gpu.len()
            ),
            format!("mean utilisation {util:.0} %"),
        ],
        advice: vec![
            format!(
                "raise the batch size: memory allows up to about ×{factor:.1} (activations grow with the batch; weights and optimizer state do not)"
            ),
            format!(
                "for the exact batch, with your model and sequence length: gpumem plan --model MODEL --mode train --seq SEQ --fit batch --gpu {}GiB",
                total >> 30
            ),
        ],
    })
}

fn data_starvation(index: u32, gpu: &[&GpuSample], t: &Thresholds) -> Option<Finding> {
    let idle: Vec<bool> = gpu.iter().map(|g| g.gpu_util < t.idle_util).collect();
    let idle_count = idle.iter().filter(|&&i| i).count();
    let idle_fraction = idle_count as f64 / gpu.len() as f64;
    let gaps = idle.windows(2).filter(|w| !w[0] && w[1]).count() + usize::from(idle[0]);
    let busy_util = mean(
        gpu.iter()
            .filter(|g| g.gpu_util >= t.idle_util)
            .map(|g| g.gpu_util),
    );
    if idle_fraction < t.starved_min_idle
        || idle_fraction > t.starved_max_idle
        || gaps < 2
        || busy_util < t.starved_busy_util
    {
        return None;
    }
    let mut evidence = vec![
        format!(
            "idle (< {:.0} %) in {idle_count} of {} samples, in {gaps} separate gaps",
            t.idle_util,
            gpu.len()
        ),
        format!("{busy_util:.0} % busy between the gaps: the GPU is fast, its input is not"),
    ];
    evidence.extend(host_work_in_gaps(gpu, &idle));
    Some(Finding {
        kind: Kind::DataStarvation,
        subject: format!("GPU {index}"),
        evidence,
        advice: vec![
            "more data-loader workers (DataLoader(num_workers=…), persistent_workers=True)".into(),
            "pinned host memory (pin_memory=True) and non_blocking copies".into(),
            "prefetch the next batch while this one computes (prefetch_factor, or gpumem's batch iterator)".into(),
        ],
    })
}

/// Whether the gaps line up with the host's work: each process's CPU use in the idle samples
/// against the busy ones, when the samples have it.
fn host_work_in_gaps(gpu: &[&GpuSample], idle: &[bool]) -> Vec<String> {
    let mut pids: Vec<u32> = gpu
        .iter()
        .flat_map(|g| g.processes.iter().map(|p| p.pid))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids.into_iter()
        .filter_map(|pid| {
            let cpu = |want_idle: bool| {
                let values: Vec<f64> = gpu
                    .iter()
                    .zip(idle)
                    .filter(|(_, &i)| i == want_idle)
                    .filter_map(|(g, _)| g.processes.iter().find(|p| p.pid == pid)?.cpu_percent)
                    .collect();
                (!values.is_empty()).then(|| mean(values.into_iter()))
            };
            let (in_gaps, computing) = (cpu(true)?, cpu(false)?);
            Some(format!(
                "pid {pid} uses {in_gaps:.0} % of a CPU core in the gaps and {computing:.0} % while the GPU computes{}",
                if in_gaps > computing { ": the gaps are the host's work" } else { "" }
            ))
        })
        .collect()
}

fn pcie_bound(index: u32, gpu: &[&GpuSample], t: &Thresholds) -> Option<Finding> {
    let link = gpu.iter().find_map(|g| g.pcie_max_bytes_per_s)?;
    let near = gpu
        .iter()
        .filter(|g| {
            g.pcie_rx_bytes_per_s.max(g.pcie_tx_bytes_per_s) as f64 >= t.pcie_fraction * link as f64
        })
        .count();
    let util = mean_util(gpu);
    if (near as f64) < 0.5 * gpu.len() as f64 || util >= t.pcie_max_util {
        return None;
    }
    let rx = mean(gpu.iter().map(|g| g.pcie_rx_bytes_per_s as f64));
    let tx = mean(gpu.iter().map(|g| g.pcie_tx_bytes_per_s as f64));
    Some(Finding {
        kind: Kind::PcieBound,
        subject: format!("GPU {index}"),
        evidence: vec![
            format!(
                "PCIe at ≥ {:.0} % of the link ({:.1} GB/s per direction) in {near} of {} samples; mean rx {:.1} GB/s, tx {:.1} GB/s",
                100.0 * t.pcie_fraction,
                link as f64 / 1e9,
                gpu.len(),
                rx / 1e9,
                tx / 1e9
            ),
            format!("mean utilisation {util:.0} %"),
        ],
        advice: vec![
            "copy less: keep tensors on the GPU between steps, move data once (datasets that fit in device memory)".into(),
            "copy from pinned memory with non_blocking=True so that copies overlap compute".into(),
            "send smaller types (uint8 images, fp16/bf16) and convert on the GPU".into(),
        ],
    })
}

fn rank_imbalance(series: &[(u32, Vec<&GpuSample>)], t: &Thresholds) -> Option<Finding> {
    if series.len() < 2 {
        return None;
    }
    let peaks: Vec<(u32, u64)> = series.iter().map(|(i, g)| (*i, peak_memory(g))).collect();
    let utils: Vec<(u32, f64)> = series.iter().map(|(i, g)| (*i, mean_util(g))).collect();
    let (max_mem_gpu, max_mem) = *peaks.iter().max_by_key(|(_, m)| *m)?;
    let (min_mem_gpu, min_mem) = *peaks.iter().min_by_key(|(_, m)| *m)?;
    let by_util = |a: &&(u32, f64), b: &&(u32, f64)| a.1.total_cmp(&b.1);
    let (max_util_gpu, max_util) = *utils.iter().max_by(by_util)?;
    let (min_util_gpu, min_util) = *utils.iter().min_by(by_util)?;
    let spread = max_mem - min_mem;
    let memory = spread as f64 >= t.imbalance_memory_fraction * max_mem as f64
        && spread >= t.imbalance_memory_bytes;
    let compute = max_util - min_util >= t.imbalance_util_points;
    if !memory && !compute {
        return None;
    }
    let mut evidence = Vec::new();
    if memory {
        evidence.push(format!(
            "peak memory GPU {max_mem_gpu} {} vs GPU {min_mem_gpu} {} ({} apart)",
            Bytes(max_mem),
            Bytes(min_mem),
            Bytes(spread)
        ));
    }
    if compute {
        evidence.push(format!(
            "mean utilisation GPU {max_util_gpu} {max_util:.0} % vs GPU {min_util_gpu} {min_util:.0} %: the others wait for it"
        ));
    }
    let lagging = if memory { max_mem_gpu } else { max_util_gpu };
    Some(Finding {
        kind: Kind::RankImbalance,
        subject: format!("GPU {lagging} of {}", series.len()),
        evidence,
        advice: vec![
            format!("check what rank {lagging} does beyond the others (logging, evaluation, metrics, the embedding or loss shard it owns)"),
            "balance the shards: equal sequence lengths per rank (bucketing), even pipeline stages or ZeRO partitions".into(),
            "if memory differs only: the rank with the most memory sets the batch everyone can use".into(),
        ],
    })
}

fn fragmentation(pools: &[&PoolSample], t: &Thresholds) -> Option<Finding> {
    let mut by_ratio: Vec<&PoolSample> = pools.to_vec();
    let ratio = |p: &PoolSample| p.reserved as f64 / p.allocated.max(1) as f64;
    by_ratio.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    let median = by_ratio[by_ratio.len() / 2];
    if ratio(median) < t.fragmentation_ratio || median.cached() < t.fragmentation_bytes {
        return None;
    }
    let scattered = median.fragmentation() >= 0.5;
    let mut advice = Vec::new();
    if scattered {
        advice.push(format!(
            "the cache is in splinters (largest free block {}): use a policy that does not split segments for good — GPUMEM_POOL=gpumem or expandable (PyTorch: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
            Bytes(median.largest_free_block)
        ));
    } else {
        advice.push("the cache is in one piece: set GPUMEM_SOFT_LIMIT so the pool gives back what it does not use, or empty the cache after phases that peak".into());
    }
    advice.push(
        "record a trace and let `gpumem tune TRACE` pick the allocator settings for it".into(),
    );
    Some(Finding {
        kind: Kind::Fragmentation,
        subject: format!("pid {} on GPU {}", median.pid, median.device),
        evidence: vec![format!(
            "median over {} samples: {} reserved {}, {} reserved but unallocated, fragmentation {:.0} %, policy {}",
            pools.len(),
            Bytes(median.reserved),
            match median.allocated {
                0 => "with nothing allocated".to_string(),
                allocated => format!("for {} allocated (×{:.1})", Bytes(allocated), ratio(median)),
            },
            Bytes(median.cached()),
            100.0 * median.fragmentation(),
            median.policy
        )],
        advice,
    })
}
