//! Shared test setup: contexts on the simulated device and on wgpu, and a device that can be
//! lost.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gpumem_array::DeviceContext;
use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::{
    BackendCode, Device, DeviceError, DevicePtr, EventId, InFlight, MemInfo, PinnedBuffer, StreamId,
};
use gpumem_pool::{PolicyKind, Pool, PoolConfig};

pub const MIB: u64 = 1 << 20;

/// A context on a host-backed simulated device of `capacity` bytes, with the device.
pub fn sim(capacity: u64) -> (DeviceContext, Arc<SimDevice>) {
    let device = Arc::new(SimDevice::new(SimConfig::host(capacity)).unwrap());
    (context_on(device.clone(), PolicyKind::Gpumem), device)
}

/// A context over `device` with the built-in `policy`.
pub fn context_on(device: Arc<dyn Device>, policy: PolicyKind) -> DeviceContext {
    let config = PoolConfig {
        policy,
        ..PoolConfig::default()
    };
    DeviceContext::new(Arc::new(Pool::new(device, config).unwrap()))
}

/// Checks that nothing is left: no bytes allocated from the pool, and after emptying its
/// cache, no device memory in use and as many frees as mallocs.
pub fn assert_nothing_leaked(context: &DeviceContext, device: &SimDevice) {
    let stats = context.pool().stats();
    assert_eq!(
        stats.allocated_bytes.all.current, 0,
        "pool bytes still allocated"
    );
    context.pool().empty_cache().unwrap();
    assert_eq!(device.used(), 0, "device bytes still in use");
    let c = device.counters();
    assert_eq!(c.malloc - c.malloc_failed, c.free, "mallocs without a free");
    assert_eq!(device.live_events(), 0, "events never destroyed");
}

/// A wgpu device of 256 MiB; without an adapter the test fails with what to install, or,
/// when the user opted out of missing test dependencies, `None` after a `SKIPPED:` line.
pub fn wgpu() -> Option<Arc<gpumem_wgpu::WgpuDevice>> {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // Mesa's device-select layer complains on every instance without it; it only orders GPUs.
        std::env::set_var("NODEVICE_SELECT", "1");
    }
    let options = gpumem_wgpu::WgpuOptions {
        memory_limit: Some(256 * MIB),
        ..Default::default()
    };
    let opened = gpumem_wgpu::WgpuDevice::open(options);
    gpumem_testkit::deps::require(gpumem_testkit::deps::VULKAN, opened).map(Arc::new)
}

/// A simulated device that can be lost (as after a GPU reset or an Xid error): once lost,
/// every call that does work fails with a driver error until it is restored; releasing
/// events and streams still works, so that a test can check what was left behind.
pub struct LosableDevice {
    pub inner: Arc<SimDevice>,
    lost: AtomicBool,
}

impl LosableDevice {
    pub fn new(inner: Arc<SimDevice>) -> Self {
        LosableDevice {
            inner,
            lost: AtomicBool::new(false),
        }
    }

    pub fn set_lost(&self, lost: bool) {
        self.lost.store(lost, Ordering::SeqCst);
    }

    fn check(&self) -> Result<(), DeviceError> {
        if self.lost.load(Ordering::SeqCst) {
            Err(lost_error())
        } else {
            Ok(())
        }
    }
}

/// What a lost device answers: CUDA's code for a device that is no longer usable.
pub fn lost_error() -> DeviceError {
    DeviceError::from_backend(
        BackendCode::new("cuda", 46, "CUDA_ERROR_DEVICES_UNAVAILABLE", "device lost"),
        false,
    )
}

impl Device for LosableDevice {
    fn name(&self) -> String {
        format!("losable {}", self.inner.name())
    }
    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        self.check()?;
        self.inner.mem_info()
    }
    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        self.check()?;
        self.inner.malloc(size)
    }
    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.check()?;
        self.inner.free(ptr)
    }
    fn create_stream(&self) -> Result<StreamId, DeviceError> {
        self.check()?;
        self.inner.create_stream()
    }
    fn destroy_stream(&self, stream: StreamId) -> Result<(), DeviceError> {
        self.inner.destroy_stream(stream)
    }
    fn record_event(&self, stream: StreamId) -> Result<EventId, DeviceError> {
        self.check()?;
        self.inner.record_event(stream)
    }
    fn event_completed(&self, event: EventId) -> Result<bool, DeviceError> {
        self.check()?;
        self.inner.event_completed(event)
    }
    fn wait_event(&self, event: EventId) -> Result<(), DeviceError> {
        self.check()?;
        self.inner.wait_event(event)
    }
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), DeviceError> {
        self.check()?;
        self.inner.stream_wait_event(stream, event)
    }
    fn destroy_event(&self, event: EventId) -> Result<(), DeviceError> {
        self.inner.destroy_event(event)
    }
    fn synchronize(&self) -> Result<(), DeviceError> {
        self.check()?;
        self.inner.synchronize()
    }
    fn copy_to_device(&self, dst: DevicePtr, src: &[u8], s: StreamId) -> Result<(), DeviceError> {
        self.check()?;
        self.inner.copy_to_device(dst, src, s)
    }
    fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr, s: StreamId) -> Result<(), DeviceError> {
        self.check()?;
        self.inner.copy_to_host(dst, src, s)
    }
    fn copy_on_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        s: StreamId,
    ) -> Result<(), DeviceError> {
        self.check()?;
        self.inner.copy_on_device(dst, src, len, s)
    }
    fn alloc_pinned(&self, len: usize) -> Result<PinnedBuffer, DeviceError> {
        self.check()?;
        self.inner.alloc_pinned(len)
    }
    fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: PinnedBuffer,
        s: StreamId,
    ) -> Result<InFlight<'_, PinnedBuffer>, DeviceError> {
        self.check()?;
        self.inner.copy_to_device_async(dst, src, s)
    }
}
