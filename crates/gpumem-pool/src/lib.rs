//! A caching device-memory pool for deep learning, over any [`gpumem_device::Device`].
//!
//! - [`Pool`] hands out device memory on streams, caches freed blocks, waits on stream events
//!   for cross-stream frees (`record_stream`), frees its cache and retries before failing, and
//!   fails with an [`OomError`] that explains what happened and what to try.
//! - The placement policy is chosen at run time ([`PolicyKind`]): `torch` (PyTorch's native
//!   caching allocator, faithfully), `expandable` (PyTorch's expandable segments), `gpumem`
//!   (our own, the default) and `none` (no caching). Each policy lives in its own file under
//!   [`policies`] and implements [`Policy`].
//! - Limits, policy and PyTorch options come from the API ([`PoolConfig`]) or the environment
//!   ([`PoolConfig::from_env`]); statistics use PyTorch's `memory_stats` keys ([`MemoryStats`]);
//!   [`Pool::status`] prints a `pool_status`-like summary with fragmentation; history can be
//!   recorded and written as a PyTorch memory snapshot ([`Pool::snapshot`]).

#![deny(unsafe_code)]

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

pub use config::{ConfigError, PolicyKind, PoolConfig, PoolOptions};
pub use driver::PolicyDriver;
pub use events::{EventSink, PoolEvent, PoolObserver};
pub use gpumem_snapshot::{Action, TraceEntry};
pub use history::History;
pub use oom::{Advice, OomError, PoolFacts};
pub use policy::{
    AllocRequest, Block, BlockHandle, BlockView, Exhausted, Policy, ReleaseTarget, SegmentView,
    Upstream, UpstreamError,
};
pub use pool::{Allocation, Pool, PoolError, PoolStatus};
pub use registry::{global_registry, DeviceRegistry};
pub use size::{parse_limit, Bytes, Limit, SizeParseError, ACCEPTED_SIZE_FORMS};
pub use stats::{
    DeviceCalls, MemoryStats, SizeClass, Stat, StatArray, StatRecord, SMALL_REQUEST_MAX,
};
