//! GPU figures from NVML (libnvidia-ml, loaded at run time by nvml-wrapper).

use nvml_wrapper::enum_wrappers::device::PcieUtilCounter;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::collections::HashMap;
use std::time::Instant;

use crate::{GpuSample, ProcessSample, Sample, SampleSource, WatchError};

/// Samples every GPU NVML sees.
pub struct NvmlSource {
    nvml: Nvml,
    /// Each process's CPU ticks at the previous sample, for its CPU use in between.
    cpu_before: HashMap<u32, (u64, Instant)>,
}

impl NvmlSource {
    /// Loads and initialises NVML. Without an NVIDIA driver this is
    /// [`WatchError::NoDriver`], whose message says so in one sentence; never a panic.
    pub fn open() -> Result<NvmlSource, WatchError> {
        match Nvml::init() {
            Ok(nvml) => Ok(NvmlSource {
                nvml,
                cpu_before: HashMap::new(),
            }),
            Err(NvmlError::LibloadingError(e)) => Err(WatchError::NoDriver(format!(
                "the NVIDIA driver's NVML library (libnvidia-ml.so.1) could not be loaded ({e}); \
                 to look at recorded samples use --samples FILE"
            ))),
            Err(e) => Err(WatchError::NoDriver(format!(
                "NVML did not start ({e}); is the NVIDIA driver loaded?"
            ))),
        }
    }

    /// One sample of every GPU (pools empty).
    pub fn sample(&mut self) -> Result<Sample, WatchError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| WatchError::NoDriver(format!("NVML could not count GPUs ({e})")))?;
        let mut gpus: Vec<GpuSample> = (0..count)
            .map(|index| self.gpu(index))
            .collect::<Result<_, _>>()?;
        let now = Instant::now();
        let mut cpu_now = HashMap::new();
        for process in gpus.iter_mut().flat_map(|g| g.processes.iter_mut()) {
            let Some(ticks) = crate::procinfo::cpu_ticks(process.pid) else {
                continue;
            };
            if let Some(&(before, then)) = self.cpu_before.get(&process.pid) {
                let seconds = now.duration_since(then).as_secs_f64();
                if seconds > 0.0 {
                    let used =
                        ticks.saturating_sub(before) as f64 / crate::procinfo::TICKS_PER_SECOND;
                    process.cpu_percent = Some(100.0 * used / seconds);
                }
            }
            cpu_now.insert(process.pid, (ticks, now));
        }
        self.cpu_before = cpu_now;
        Ok(Sample {
            time_ms: crate::now_ms(),
            host: crate::host_name(),
            gpus,
            pools: Vec::new(),
        })
    }

    fn gpu(&self, index: u32) -> Result<GpuSample, WatchError> {
        let fail = |what: &'static str| {
            move |e: NvmlError| WatchError::Nvml {
                index,
                what,
                message: e.to_string(),
            }
        };
        let device = self.nvml.device_by_index(index).map_err(fail("open"))?;
        let memory = device.memory_info().map_err(fail("memory_info"))?;
        // Figures a device may not support are reported as absent (0), not as failures.
        let utilization = device.utilization_rates().ok();
        let kb = |counter| {
            device
                .pcie_throughput(counter)
                .map_or(0, |kb_per_s| u64::from(kb_per_s) * 1024)
        };
        let pcie_max_bytes_per_s = match (device.max_pcie_link_gen(), device.max_pcie_link_width())
        {
            (Ok(generation), Ok(width)) => crate::sample::pcie_bytes_per_s(generation, width),
            _ => None,
        };
        let processes = device
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .map(|p| {
                let (user, command) = crate::procinfo::user_and_command(p.pid);
                ProcessSample {
                    pid: p.pid,
                    memory: match p.used_gpu_memory {
                        UsedGpuMemory::Used(bytes) => Some(bytes),
                        UsedGpuMemory::Unavailable => None,
                    },
                    user,
                    command,
                    cpu_percent: None,
                }
            })
            .collect();
        Ok(GpuSample {
            index,
            uuid: device.uuid().unwrap_or_default(),
            name: device.name().unwrap_or_default(),
            pci_bus_id: device.pci_info().map(|p| p.bus_id).unwrap_or_default(),
            memory_used: memory.used,
            memory_total: memory.total,
            gpu_util: utilization.as_ref().map_or(0.0, |u| f64::from(u.gpu)),
            memory_util: utilization.as_ref().map_or(0.0, |u| f64::from(u.memory)),
            pcie_rx_bytes_per_s: kb(PcieUtilCounter::Receive),
            pcie_tx_bytes_per_s: kb(PcieUtilCounter::Send),
            pcie_max_bytes_per_s,
            power_watts: device
                .power_usage()
                .map_or(0.0, |mw| f64::from(mw) / 1000.0),
            processes,
        })
    }
}

impl SampleSource for NvmlSource {
    fn next_sample(&mut self) -> Result<Option<Sample>, WatchError> {
        self.sample().map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_opening_nvml_is_a_sentence_not_a_panic() {
        if std::path::Path::new("/dev/nvidiactl").exists() {
            return; // a driver is here: the GPU tests cover it
        }
        let error = NvmlSource::open().err().expect("no driver, no NVML");
        let message = error.to_string();
        assert!(
            message.starts_with("no NVIDIA GPU can be watched here"),
            "{message}"
        );
        assert!(message.contains("libnvidia-ml"), "{message}");
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU and driver (scripts/gpu-check.sh runs it)"]
    fn nvml_sees_every_gpu_with_memory_and_a_uuid() {
        let sample = NvmlSource::open().unwrap().sample().unwrap();
        assert!(!sample.gpus.is_empty());
        for gpu in &sample.gpus {
            assert!(gpu.memory_total > 0 && gpu.memory_used <= gpu.memory_total);
            assert!(gpu.uuid.starts_with("GPU-"), "{}", gpu.uuid);
            assert!((0.0..=100.0).contains(&gpu.gpu_util));
        }
    }
}
