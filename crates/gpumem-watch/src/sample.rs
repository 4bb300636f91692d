//! What one look at a machine sees: every GPU (from NVML) and every gpumem pool (from the
//! pools' publishing endpoints), at one instant. Views, the exporter and the diagnoses read
//! only these types, so recorded samples drive all of them exactly as live ones do.

use serde::{Deserialize, Serialize};

/// One observation of the machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Milliseconds since the Unix epoch when the sample was taken.
    pub time_ms: u64,
    /// The host's name (the exporter's `Hostname` label).
    #[serde(default)]
    pub host: String,
    /// Every GPU seen, by index.
    #[serde(default)]
    pub gpus: Vec<GpuSample>,
    /// Every gpumem pool that answered, one per process and device.
    #[serde(default)]
    pub pools: Vec<PoolSample>,
}

impl Sample {
    /// Whether the figures are possible, else what is not, naming the field (e.g.
    /// `gpus[1].gpu_util`) and what is accepted: memory totals above 0 and use within them,
    /// percentages from 0 to 100, power and CPU use finite and not negative, one entry per GPU
    /// index and per pool (process and device), and a pool's allocated bytes within its
    /// reserved ones. `time_ms` is not compared across samples: the writer's clock is the wall
    /// clock, which may be set back, and samples are used in file order.
    pub fn check(&self) -> Result<(), String> {
        for (i, gpu) in self.gpus.iter().enumerate() {
            let field = |name: &str| format!("gpus[{i}].{name}");
            if gpu.memory_total == 0 {
                return Err(format!("{} is 0; a GPU has memory", field("memory_total")));
            }
            if gpu.memory_used > gpu.memory_total {
                return Err(format!(
                    "{} is {}, above memory_total {}",
                    field("memory_used"),
                    gpu.memory_used,
                    gpu.memory_total
                ));
            }
            for (name, value) in [("gpu_util", gpu.gpu_util), ("memory_util", gpu.memory_util)] {
                if !(0.0..=100.0).contains(&value) {
                    return Err(format!(
                        "{} is {value:?}; accepted: a percentage from 0 to 100",
                        field(name)
                    ));
                }
            }
            let cpu = gpu.processes.iter().map(|p| p.cpu_percent);
            for (name, value) in std::iter::once(("power_watts", Some(gpu.power_watts)))
                .chain(cpu.map(|c| ("processes[].cpu_percent", c)))
            {
                if value.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
                    return Err(format!(
                        "{} is {:?}; accepted: a finite number, 0 or more",
                        field(name),
                        value.unwrap_or_default()
                    ));
                }
            }
            if self.gpus[..i].iter().any(|g| g.index == gpu.index) {
                return Err(format!(
                    "{} is {}, as in an earlier entry; each GPU appears once per sample",
                    field("index"),
                    gpu.index
                ));
            }
        }
        for (i, pool) in self.pools.iter().enumerate() {
            if pool.allocated > pool.reserved {
                return Err(format!(
                    "pools[{i}].allocated is {}, above reserved {}",
                    pool.allocated, pool.reserved
                ));
            }
            let key = (pool.pid, pool.device);
            if self.pools[..i].iter().any(|p| (p.pid, p.device) == key) {
                return Err(format!(
                    "pools[{i}] is a second pool of pid {} on device {}; each appears once per sample",
                    pool.pid, pool.device
                ));
            }
        }
        Ok(())
    }
}

/// One GPU's figures, as NVML reports them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    /// NVML's device index.
    pub index: u32,
    /// The device's UUID (`GPU-…`).
    #[serde(default)]
    pub uuid: String,
    /// The model name, e.g. `NVIDIA H100 80GB HBM3`.
    #[serde(default)]
    pub name: String,
    /// PCI bus id, e.g. `00000000:17:00.0`.
    #[serde(default)]
    pub pci_bus_id: String,
    /// Device memory in use by anyone, bytes.
    pub memory_used: u64,
    /// Device memory, bytes.
    pub memory_total: u64,
    /// Percent of the last sample period a kernel ran (0–100).
    #[serde(default)]
    pub gpu_util: f64,
    /// Percent of the last sample period device memory was read or written (0–100).
    #[serde(default)]
    pub memory_util: f64,
    /// PCIe bytes per second received by the GPU (host to device).
    #[serde(default)]
    pub pcie_rx_bytes_per_s: u64,
    /// PCIe bytes per second sent by the GPU (device to host).
    #[serde(default)]
    pub pcie_tx_bytes_per_s: u64,
    /// What the PCIe link can carry per direction, bytes per second, when known.
    #[serde(default)]
    pub pcie_max_bytes_per_s: Option<u64>,
    /// Power draw, watts.
    #[serde(default)]
    pub power_watts: f64,
    /// The compute processes on this GPU.
    #[serde(default)]
    pub processes: Vec<ProcessSample>,
}

impl GpuSample {
    /// Device memory not in use, bytes.
    pub fn memory_free(&self) -> u64 {
        self.memory_total.saturating_sub(self.memory_used)
    }
}

/// A process using a GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessSample {
    /// Process id (host namespace).
    pub pid: u32,
    /// Device memory the process holds on this GPU, bytes, when the driver says.
    #[serde(default)]
    pub memory: Option<u64>,
    /// The owner's user name, when it could be read.
    #[serde(default)]
    pub user: String,
    /// The command line, when it could be read.
    #[serde(default)]
    pub command: String,
    /// Host CPU the process used since the previous sample, in percent of one core (its data
    /// loading, Python, copies), when known.
    #[serde(default)]
    pub cpu_percent: Option<f64>,
}

pub use gpumem_publish::PoolSample;

/// Where samples come from: NVML, the pools' endpoints, a recording, or several at once.
pub trait SampleSource {
    /// Takes the next sample. `Ok(None)` means the source has no more (a recording's end).
    fn next_sample(&mut self) -> Result<Option<Sample>, crate::WatchError>;

    /// What went wrong since the last call without stopping the source (a pool endpoint that
    /// was skipped, each once until it answers again), for the caller to show. None by
    /// default.
    fn take_warnings(&mut self) -> Vec<crate::WatchError> {
        Vec::new()
    }
}

/// What a PCIe link of `generation` and `width` lanes carries per direction, bytes per
/// second, after line encoding (gen 1–2: 8b/10b; gen 3+: 128b/130b; gen 6 about the same
/// per-lane payload rate doubling); `None` for a generation we do not know.
pub fn pcie_bytes_per_s(generation: u32, width: u32) -> Option<u64> {
    let per_lane: u64 = match generation {
        1 => 250_000_000,
        2 => 500_000_000,
        3 => 984_615_384,
        4 => 1_969_230_769,
        5 => 3_938_461_538,
        6 => 7_876_923_077,
        _ => return None,
    };
    Some(per_lane * u64::from(width))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcie_gen4_x16_is_about_31_gb_per_second() {
        let bytes = pcie_bytes_per_s(4, 16).unwrap();
        assert!((31_000_000_000..32_000_000_000).contains(&bytes), "{bytes}");
        assert_eq!(pcie_bytes_per_s(9, 16), None);
    }
}
