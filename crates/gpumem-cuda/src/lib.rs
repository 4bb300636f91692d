//! The CUDA backend of gpumem: [`CudaDevice`] implements [`gpumem_device::Device`] and
//! [`gpumem_device::VirtualMemory`] over the CUDA driver API.
//!
//! The driver is reached through [cudarc](https://docs.rs/cudarc)'s raw bindings
//! (`cudarc::driver::sys`) with dynamic loading: `libcuda` is opened at run time, so the crate
//! builds on every machine, with no CUDA toolkit, and a machine without a driver gets a typed
//! [`gpumem_device::DeviceError`] from [`CudaDevice::open`] and [`CudaDevice::count`], never a
//! link failure or a panic:
//! - no driver library (or one without a function this crate calls):
//!   `DeviceError::Unsupported { backend: "cuda", .. }`, whose message names the library files
//!   tried;
//! - a driver that fails to initialise: its `CUresult` in a `DeviceError::Driver`
//!   (`CUDA_ERROR_NO_DEVICE`, 100, on a machine with a driver and no GPU).
//!
//! Every other driver error goes through [`gpumem_device::DeviceError::from_backend`] with its
//! code, `cuGetErrorName` and `cuGetErrorString`; `CUDA_ERROR_OUT_OF_MEMORY` (2), and only it,
//! is out of memory, which makes a pool free its cache and retry.
//!
//! # What is implemented
//!
//! - one device per ordinal through its **primary context** (`cuDevicePrimaryCtxRetain`, the
//!   context the CUDA runtime and PyTorch use), made current on the calling thread before
//!   every call and the caller's context restored after; [`CudaDevice::count`], [`devices`] and
//!   [`DeviceInfo`] enumerate the GPUs (name, memory, compute capability, VMM and granularity,
//!   managed memory, unified addressing, driver version);
//! - memory: `cuMemAlloc`, `cuMemFree`, `cuMemGetInfo`;
//! - streams and events: `cuStreamCreate` (non-blocking), `cuStreamSynchronize`,
//!   `cuEventCreate`/`Record`/`Query`/`Synchronize`/`Destroy`, `cuCtxSynchronize`; a
//!   [`gpumem_device::StreamId`] is the raw `CUstream` value (0: the legacy default stream), an
//!   [`gpumem_device::EventId`] the raw `CUevent` value;
//! - copies host↔device and device↔device: synchronous ones with the driver's synchronous
//!   calls after synchronising the stream (pageable memory is staged by the driver itself),
//!   asynchronous ones on the stream from page-locked memory (`cuMemHostAlloc`, freed with
//!   `cuMemFreeHost`), through pinned staging when the buffer given is not page-locked;
//! - VMM: `cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`,
//!   `cuMemRelease`, `cuMemAddressFree`, granularity from `cuMemGetAllocationGranularity`;
//!   where the device or driver lacks VMM
//!   (`CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`), `Device::vmm` is `None` and
//!   the pool's policies fall back as they do on a simulated device without VMM.
//!
//! **None of the GPU paths has ever run on a GPU**: no NVIDIA GPU was available where this
//! crate was written. What runs everywhere: the no-driver path, the error mapping, and every
//! GPU scenario against a mock driver (`tests/mock/libcuda.c`: host memory, copies done at once,
//! VMM through memfd mappings; it checks the context is current on every call), which tests
//! this crate's own logic but not CUDA's behaviour. The tests that need a GPU are `#[ignore]`d
//! and `scripts/gpu-check.sh` runs them on a machine with one.
//!
//! # Unsafe code
//!
//! All of it is in one private module (`ffi`), each block with its safety argument; the rest
//! of the crate is `#![deny(unsafe_code)]`. It keeps driver calls behind proof that the
//! library is loaded, handles from being used after they are destroyed, and page-locked
//! memory from being read, written or freed while an asynchronous copy may still use it.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod device;
mod error;
mod ffi;

pub use device::{devices, driver_version, CudaDevice, DeviceInfo};
pub use error::{BACKEND, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_OUT_OF_MEMORY};
