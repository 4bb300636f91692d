//! Typed device arrays over a gpumem [`Pool`](gpumem_pool::Pool), on any backend (the
//! simulated device, CUDA, wgpu).
//!
//! - [`DeviceArray<T>`] for plain-old-data `T` ([`bytemuck::Pod`]) with a shape: upload
//!   ([`DeviceArray::from_slice`], [`DeviceArray::from_shape`]), [`DeviceArray::zeros`],
//!   download ([`DeviceRead::to_vec`], [`DeviceRead::copy_to_host`]), device-to-device copies
//!   ([`DeviceWrite::copy_from`]), borrowing views ([`DeviceRead::slice`],
//!   [`DeviceWrite::slice_mut`], [`DeviceRead::reshaped`]), memory back to the pool on drop
//!   (stream-ordered) or at a precise point ([`DeviceArray::free`]), and memory the pool does
//!   not own ([`DeviceArray::wrap`]).
//! - [`HostArray<T>`] and [`PinnedHostArray<T>`] (page-locked) on the host, and
//!   [`UnifiedArray<T>`] in managed memory (CUDA; host memory on the simulated device).
//! - Structure-preserving upload: [`ToDevice`] / [`ToHost`] for arrays, `Vec`, `Option`,
//!   tuples and your own structs (`#[derive(ToDevice)]`), so a batch `{tokens, mask, labels}`
//!   becomes the same batch of device arrays, and back.
//! - [`DeviceContext::batches`]: a double-buffered iterator ([`Batches`]) that uploads batch
//!   k+1 on a copy stream from pinned staging while batch k is in use, with at most two
//!   batches on the device.
//!
//! Arrays are made in a [`DeviceContext`]: a pool and the stream their work is ordered on.
//! Every failure is an [`ArrayError`] that names what was wrong.
//!
//! ```
//! use std::sync::Arc;
//! use gpumem_array::prelude::*;
//! use gpumem_device::sim::{SimConfig, SimDevice};
//! use gpumem_pool::{Pool, PoolConfig};
//!
//! let device = Arc::new(SimDevice::new(SimConfig::host(1 << 30))?);
//! let gpu = DeviceContext::new(Arc::new(Pool::new(device, PoolConfig::default())?));
//! let x = DeviceArray::from_shape(&gpu, &[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;
//! assert_eq!(x.slice(1..2)?.to_vec()?, [4.0, 5.0, 6.0]);
//! let mut y = DeviceArray::<f32>::zeros(&gpu, &[3, 2])?;
//! y.copy_from(&x.reshaped(&[3, 2])?)?;
//! assert_eq!(y.to_vec()?, x.to_vec()?);
//! x.free()?; // back to the pool now; `y` goes back when dropped
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod access;
mod adapt;
mod array;
mod batches;
mod context;
mod error;
mod host;
mod shape;
mod unified;

pub use access::{ArrayView, ArrayViewMut, DeviceRead, DeviceWrite, Memory};
pub use adapt::{upload, ToDevice, ToHost, Uploader};
pub use array::DeviceArray;
pub use batches::Batches;
pub use context::DeviceContext;
pub use error::ArrayError;
/// `#[derive(ToDevice)]`: see [`ToDevice`] and the gpumem-array-derive crate.
pub use gpumem_array_derive::ToDevice;
pub use host::{HostArray, PinnedHostArray};
pub use unified::UnifiedArray;

/// The types and traits most code needs: `use gpumem_array::prelude::*`.
pub mod prelude {
    pub use crate::{
        upload, ArrayError, DeviceArray, DeviceContext, DeviceRead, DeviceWrite, HostArray,
        PinnedHostArray, ToDevice, ToHost, UnifiedArray,
    };
}
