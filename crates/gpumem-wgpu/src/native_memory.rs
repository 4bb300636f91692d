//! The device memory the native driver reports, which wgpu (30) does not pass on through its
//! safe API: `AdapterInfo` and `Limits` carry no memory size, and
//! `Device::generate_allocator_report` counts only this device's own allocations. wgpu-hal
//! reads the Vulkan budget itself (for `MemoryBudgetThresholds`) but keeps it private, so this
//! module asks the driver through `as_hal`:
//!
//! - the size of the largest `DEVICE_LOCAL` heap (`vkGetPhysicalDeviceMemoryProperties`,
//!   Vulkan 1.0): the device's memory;
//! - where the device enabled `VK_EXT_memory_budget` (wgpu-hal enables it whenever the driver
//!   offers it), that heap's budget and this process's usage of it
//!   (`VkPhysicalDeviceMemoryBudgetPropertiesEXT`: "an estimate of how much memory the process
//!   can allocate from that heap" and "an estimate of how much memory the process is currently
//!   using in that heap", Vulkan specification, VK_EXT_memory_budget).
//!
//! Other backends (Metal, DX12) are not asked: there the figures stay an estimate.
//!
//! The only unsafe code of the crate: `as_hal` and two Vulkan queries that read properties.

#![allow(unsafe_code)]

/// The device-local heap wgpu's device allocates from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Heap {
    /// Its index among the physical device's memory heaps.
    pub index: usize,
    /// Its size in bytes.
    pub size: u64,
    /// Whether its budget can be read (`VK_EXT_memory_budget` enabled, Vulkan 1.1).
    pub has_budget: bool,
}

/// A heap's budget and this process's usage of it, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budget {
    /// What the process may allocate from the heap in all.
    pub budget: u64,
    /// What the process uses of it now (every device and allocator of the process).
    pub usage: u64,
}

#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
mod vulkan {
    use super::{Budget, Heap};
    use wgpu::hal::api::Vulkan;
    use wgpu::hal::vulkan::Device as HalDevice;

    use ash::vk;

    /// Whether `VK_EXT_memory_budget` is enabled on the device and the instance has
    /// `vkGetPhysicalDeviceMemoryProperties2` (core in Vulkan 1.1).
    fn budget_readable(hal: &HalDevice) -> bool {
        hal.shared_instance().instance_api_version() >= vk::API_VERSION_1_1
            && hal
                .enabled_device_extensions()
                .contains(&ash::ext::memory_budget::NAME)
    }

    /// The largest device-local heap of the Vulkan device under `device`; `None` on another
    /// backend or when the driver reports no device-local heap.
    pub(crate) fn heap(device: &wgpu::Device) -> Option<Heap> {
        // SAFETY: the guard only lends the hal device; nothing here destroys or keeps any
        // handle, and both calls below only read properties.
        let hal = unsafe { device.as_hal::<Vulkan>() }?;
        let instance = hal.shared_instance().raw_instance();
        // SAFETY: the physical device is the one wgpu created this device on, enumerated from
        // this instance, which the guard keeps alive.
        let props =
            unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
        let count = (props.memory_heap_count as usize).min(vk::MAX_MEMORY_HEAPS);
        let (index, heap) = props.memory_heaps[..count]
            .iter()
            .enumerate()
            .filter(|(_, h)| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .max_by_key(|(_, h)| h.size)?;
        Some(Heap {
            index,
            size: heap.size,
            has_budget: budget_readable(&hal),
        })
    }

    /// The budget and usage of `heap` now; `None` when they cannot be read.
    pub(crate) fn budget(device: &wgpu::Device, heap: Heap) -> Option<Budget> {
        if !heap.has_budget {
            return None;
        }
        // SAFETY: as in `heap`.
        let hal = unsafe { device.as_hal::<Vulkan>() }?;
        if !budget_readable(&hal) {
            return None;
        }
        let instance = hal.shared_instance().raw_instance();
        let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        let mut props = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
        // SAFETY: as in `heap`; the instance is Vulkan 1.1 (checked above), so the core
        // function is loaded, and the device enabled VK_EXT_memory_budget, so the driver fills
        // the chained budget structure, a live local.
        unsafe {
            instance.get_physical_device_memory_properties2(hal.raw_physical_device(), &mut props)
        };
        let count = (props.memory_properties.memory_heap_count as usize).min(vk::MAX_MEMORY_HEAPS);
        (heap.index < count).then(|| Budget {
            budget: budget.heap_budget[heap.index],
            usage: budget.heap_usage[heap.index],
        })
    }
}

#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
pub(crate) use vulkan::{budget, heap};

/// No backend of this build is asked for its memory.
#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub(crate) fn heap(_device: &wgpu::Device) -> Option<Heap> {
    None
}

/// No backend of this build is asked for its memory.
#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
pub(crate) fn budget(_device: &wgpu::Device, _heap: Heap) -> Option<Budget> {
    None
}
