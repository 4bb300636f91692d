//! A caching device-memory pool for deep learning, over any [`gpumem_device::Device`].
//!
//! - [`Pool`] hands out device memory on streams, caches freed blocks, waits on stream events
//!   for cross-stream frees (`record_stream`), frees its cache and retries before failing, and
//!   fails with an [`OomError`] that explains what happened and what to try.
//! - The placement policy is chosen at run time: a built-in one ([`PolicyKind`]: `torch`,
//!   PyTorch's native caching allocator, faithfully; `expandable`, PyTorch's expandable
//!   segments; `gpumem`, our own and the default; `none`, no caching), each in its own file
//!   under [`policies`], or any other implementation of [`Policy`] passed to
//!   [`Pool::with_policy`]. A policy runs through a [`PolicyDriver`], which layers the hard
//!   limit, statistics and events over the device ([`Upstream`]).
//! - Limits, policy and its options come from the API ([`PoolConfig`]) or the environment
//!   ([`PoolConfig::from_env`]); statistics use PyTorch's `memory_stats` keys ([`MemoryStats`])
//!   and come as labelled records too ([`MemoryStats::records`]); [`Pool::status`] prints a
//!   `pool_status`-like summary with fragmentation; history can be recorded and written as a
//!   PyTorch memory snapshot ([`Pool::snapshot`]); [`PoolObserver`]s see every event; one pool
//!   per device is kept in a [`DeviceRegistry`].
//!
//! ```
//! use std::sync::Arc;
//! use gpumem_device::sim::{SimConfig, SimDevice};
//! use gpumem_device::StreamId;
//! use gpumem_pool::{Pool, PoolConfig};
//!
//! let device = Arc::new(SimDevice::new(SimConfig::host(1 << 30))?);
//! let pool = Pool::new(device, PoolConfig::from_env()?)?; // GPUMEM_POOL etc.
//! let block = pool.allocate(3 << 20, StreamId::DEFAULT)?;
//! pool.free(block.ptr)?;
//! let calls = pool.stats().device_calls.allocating();
//! let again = pool.allocate(3 << 20, StreamId::DEFAULT)?; // served from the cache
//! assert_eq!(pool.stats().device_calls.allocating(), calls);
//! println!("{}", pool.status()?);
//! # pool.free(again.ptr)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod adopt;
mod config;
mod driver;
mod events;
mod history;
mod oom;
pub mod policies;
mod policy;
mod pool;
mod registry;
mod size;
mod stats;

pub use adopt::{AdoptError, BlockToAdopt, LayoutError, SegmentToAdopt};
pub use config::{ConfigError, PolicyKind, PoolConfig, PoolOptions};
pub use driver::PolicyDriver;
pub use events::{EventSink, PoolEvent, PoolObserver};
pub use gpumem_snapshot::{Action, TraceEntry};
pub use history::History;
pub use oom::{Advice, OomError, PoolFacts};
pub use policy::{
    AllocRequest, Block, BlockHandle, BlockView, Exhausted, FreedInFlight, Policy, ReleaseTarget,
    SegmentView, Upstream, UpstreamError,
};
pub use pool::{Allocation, Pool, PoolError, PoolStatus};
pub use registry::{global_registry, DeviceRegistry};
pub use size::{
    parse_limit, Bytes, Limit, SizeParseError, ACCEPTED_BYTE_FORMS, ACCEPTED_SIZE_FORMS,
};
pub use stats::{
    DeviceCalls, MemoryStats, SizeClass, Stat, StatArray, StatRecord, SMALL_REQUEST_MAX,
};
