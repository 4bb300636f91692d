//! The backends the CLI can open by name (`--backend sim|cuda|wgpu`), and what `gpumem
//! devices` lists of each.

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::Device;

/// A backend named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The simulated device, host-backed (always available).
    Sim,
    /// NVIDIA GPUs through the CUDA driver.
    Cuda,
    /// Any GPU through wgpu (Vulkan, Metal, DX12; Mesa's lavapipe without one).
    Wgpu,
}

/// Capacity of the simulated device the CLI opens: room for the bundled traces' peaks.
const SIM_CAPACITY: u64 = 4 << 30;

impl Backend {
    /// Opens device `ordinal` of this backend; the error says why it is not available.
    pub fn open(self, ordinal: usize) -> Result<Arc<dyn Device>, String> {
        match self {
            Backend::Sim => {
                if ordinal != 0 {
                    return Err(format!(
                        "the simulated backend has one device, 0; --device {ordinal} was given"
                    ));
                }
                let sim =
                    SimDevice::new(SimConfig::host(SIM_CAPACITY)).map_err(|e| e.to_string())?;
                Ok(Arc::new(sim))
            }
            Backend::Cuda => gpumem_cuda::CudaDevice::open(ordinal)
                .map(|d| Arc::new(d) as Arc<dyn Device>)
                .map_err(|e| format!("cuda:{ordinal}: {e}")),
            Backend::Wgpu => open_wgpu(ordinal),
        }
    }
}

/// Opens wgpu adapter `ordinal`.
#[cfg(feature = "wgpu")]
fn open_wgpu(ordinal: usize) -> Result<Arc<dyn Device>, String> {
    let options = gpumem_wgpu::WgpuOptions {
        adapter: gpumem_wgpu::AdapterChoice::Index(ordinal),
        ..Default::default()
    };
    gpumem_wgpu::WgpuDevice::open(options)
        .map(|d| Arc::new(d) as Arc<dyn Device>)
        .map_err(|e| format!("wgpu:{ordinal}: {e}"))
}

/// Why a build without the `wgpu` feature opens no wgpu device.
#[cfg(not(feature = "wgpu"))]
const WGPU_NOT_BUILT: &str = "the wgpu backend is not in this build (the Python package \
     leaves it out); the `gpumem` command built with its default features has it";

/// A build without the `wgpu` feature: the error says so.
#[cfg(not(feature = "wgpu"))]
fn open_wgpu(ordinal: usize) -> Result<Arc<dyn Device>, String> {
    Err(format!("wgpu:{ordinal}: {WGPU_NOT_BUILT}"))
}

/// What `gpumem devices` answers: the devices here, and for each backend with none a
/// sentence saying why.
#[derive(serde::Serialize)]
pub struct DeviceList {
    /// Every device of every backend here.
    pub devices: Vec<Listed>,
    /// For each backend without a device, why.
    pub absent: Vec<String>,
}

/// One device as `gpumem devices` lists it.
#[derive(serde::Serialize)]
pub struct Listed {
    /// `sim`, `cuda` or `wgpu`.
    pub backend: &'static str,
    /// The device's ordinal within its backend.
    pub ordinal: usize,
    /// One line describing it.
    pub description: String,
    /// Device memory in bytes.
    pub total_bytes: u64,
    /// Free device memory in bytes, when it could be asked.
    pub free_bytes: Option<u64>,
    /// The VMM granularity, or `None` without virtual memory management.
    pub vmm_granularity: Option<u64>,
    /// Whether it runs on the CPU (the simulated device, a software Vulkan driver).
    pub software: bool,
    /// Where the memory figures come from: `simulated`, `driver` (CUDA), or for wgpu `limit`,
    /// `budget` (the driver's memory budget), `heap size` (the driver's heap, no budget) or
    /// `estimate` (a guess: the backend gives nothing); `unavailable` when the device could not
    /// be opened to ask.
    pub memory_source: &'static str,
}

/// Every device of every backend here, and for each backend with none a sentence saying why.
pub fn list() -> DeviceList {
    let mut devices = Vec::new();
    let mut absent = Vec::new();
    if let Ok(sim) = Backend::Sim.open(0) {
        let info = sim.mem_info().ok();
        devices.push(Listed {
            backend: "sim",
            ordinal: 0,
            description: format!("{} — always available, for tests and replays", sim.name()),
            total_bytes: info.map_or(SIM_CAPACITY, |i| i.total),
            free_bytes: info.map(|i| i.free),
            vmm_granularity: sim.vmm().map(|v| v.granularity()),
            software: true,
            memory_source: "simulated",
        });
    }
    match gpumem_cuda::devices() {
        Ok(found) if found.is_empty() => absent.push("CUDA: the driver sees no GPU.".to_string()),
        Ok(found) => {
            for info in found {
                let free = gpumem_cuda::CudaDevice::open(info.ordinal)
                    .ok()
                    .and_then(|d| d.mem_info().ok())
                    .map(|m| m.free);
                devices.push(Listed {
                    backend: "cuda",
                    ordinal: info.ordinal,
                    description: info.to_string(),
                    total_bytes: info.total_memory,
                    free_bytes: free,
                    vmm_granularity: info.vmm_granularity,
                    software: false,
                    memory_source: "driver",
                });
            }
        }
        Err(e) => absent.push(format!("CUDA: no usable driver here ({e}).")),
    }
    list_wgpu(&mut devices, &mut absent);
    DeviceList { devices, absent }
}

/// Adds the wgpu adapters to `devices`, or why there is none to `absent`.
#[cfg(feature = "wgpu")]
fn list_wgpu(devices: &mut Vec<Listed>, absent: &mut Vec<String>) {
    let adapters = gpumem_wgpu::WgpuDevice::adapters();
    if adapters.is_empty() {
        absent.push(format!(
            "wgpu: no adapter ({})",
            gpumem_wgpu::NO_ADAPTER_HINT
        ));
    }
    for adapter in adapters {
        let options = gpumem_wgpu::WgpuOptions {
            adapter: gpumem_wgpu::AdapterChoice::Index(adapter.index),
            ..Default::default()
        };
        let memory = gpumem_wgpu::WgpuDevice::open(options)
            .ok()
            .map(|d| d.memory());
        let info = memory.map(|m| m.info);
        devices.push(Listed {
            backend: "wgpu",
            ordinal: adapter.index,
            description: format!(
                "{} ({}, {}, {} {})",
                adapter.name,
                adapter.backend,
                adapter.device_type,
                adapter.driver,
                adapter.driver_info
            ),
            total_bytes: info.map_or(0, |i| i.total),
            free_bytes: info.map(|i| i.free),
            vmm_granularity: None,
            software: adapter.device_type == "cpu",
            memory_source: memory.map_or("unavailable", |m| match m.source {
                gpumem_wgpu::MemorySource::Limit => "limit",
                gpumem_wgpu::MemorySource::Budget => "budget",
                gpumem_wgpu::MemorySource::HeapSize => "heap size",
                gpumem_wgpu::MemorySource::Estimate => "estimate",
            }),
        });
    }
}

/// A build without the `wgpu` feature lists no adapter, and says why.
#[cfg(not(feature = "wgpu"))]
fn list_wgpu(_devices: &mut [Listed], absent: &mut Vec<String>) {
    absent.push(format!("wgpu: {WGPU_NOT_BUILT}."));
}
