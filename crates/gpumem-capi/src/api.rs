//! The library's operations as safe Rust functions: the C entry points (in `lib.rs`) and the
//! Python binding (crate gpumem-python) are thin layers over these, so both behave alike.
//! Devices are C ordinals (checked here); a function that allocates or configures makes the
//! device's pool on first use, while queries and frees on a device without one answer
//! without making it (`state::made_pool`).

use std::collections::BTreeMap;
use std::sync::Arc;

use gpumem_device::DevicePtr;
use gpumem_pool::{Pool, PoolError};

use crate::state::{self, CapiError, Change};

/// The checked ordinal and its pool (made on first use; an error if a panic left it
/// unusable).
fn pool_of(device: i64) -> Result<(usize, Arc<Pool>), CapiError> {
    let device = state::ordinal(device)?;
    Ok((device, state::device_pool(device)?))
}

fn pool_error(device: usize) -> impl FnOnce(PoolError) -> CapiError {
    move |source| CapiError::Pool { device, source }
}

/// Allocates `size` bytes on `device` for use on `stream` (a raw `cudaStream_t`, 0 for the
/// default stream); 0 for a zero-byte request. An OOM's explanation stays with the pool for
/// [`last_oom`].
pub fn allocate(size: u64, device: i64, stream: u64) -> Result<DevicePtr, CapiError> {
    state::allocating(|| {
        let (device, pool) = pool_of(device)?;
        pool.allocate(size, state::stream(device, stream))
            .map(|a| a.ptr)
            .map_err(pool_error(device))
    })
}

/// Frees `ptr` of `device`, checking its size when `size` is given and its stream (a raw
/// `cudaStream_t`) when `stream` is: a pointer of another device's pool, an unknown one, a
/// wrong size or another stream than its allocation's is an error and frees nothing. 0 is a
/// no-op.
pub fn free(
    ptr: DevicePtr,
    size: Option<u64>,
    device: i64,
    stream: Option<u64>,
) -> Result<(), CapiError> {
    if ptr == 0 {
        return Ok(());
    }
    let device = state::ordinal(device)?;
    let pool = state::made_pool(device)?;
    let Some((pool, live)) = pool.and_then(|pool| pool.allocation(ptr).map(|live| (pool, live)))
    else {
        let owner = state::all_pools()
            .into_iter()
            .find(|(d, other)| *d != device && other.allocation(ptr).is_some());
        return Err(match owner {
            Some((owner, _)) => CapiError::WrongDevice {
                ptr,
                given: device,
                owner,
            },
            None => CapiError::Pool {
                device,
                source: PoolError::UnknownPointer { ptr, what: "free" },
            },
        });
    };
    if let Some(given) = size.filter(|&s| s != live.size) {
        return Err(CapiError::SizeMismatch {
            device,
            ptr,
            allocated: live.size,
            given,
        });
    }
    if let Some(handle) = stream {
        let given = state::stream(device, handle);
        match pool.allocation_stream(ptr) {
            Some(allocated_on) if allocated_on != given => {
                return Err(CapiError::WrongStream {
                    device,
                    ptr,
                    allocated_on: allocated_on.0,
                    given: given.0,
                    handle,
                })
            }
            _ => {}
        }
    }
    pool.free(ptr).map_err(pool_error(device))
}

/// `device`'s statistics with `torch.cuda.memory_stats()`'s keys (plus `device_calls.*`).
pub fn memory_stats(device: i64) -> Result<BTreeMap<String, u64>, CapiError> {
    let stats = state::made_pool(state::ordinal(device)?)?.map(|pool| pool.stats());
    Ok(stats.unwrap_or_default().to_map())
}

/// `device`'s pool summary (`pool_status`): usage, limits, fragmentation.
pub fn pool_status(device: i64) -> Result<String, CapiError> {
    let (d, pool) = pool_of(device)?;
    let status = pool.status().map_err(pool_error(d))?;
    Ok(format!("device {d}, policy {}\n{status}", status.policy))
}

/// The explanation of `device`'s last OOM, if one happened: the pool's record, worded as the
/// allocation's error was.
pub fn last_oom(device: i64) -> Result<Option<String>, CapiError> {
    let device = state::ordinal(device)?;
    let Some(pool) = state::made_pool(device)? else {
        return Ok(None);
    };
    Ok(pool.last_oom().map(|oom| {
        let source = PoolError::OutOfMemory(Box::new(oom));
        CapiError::Pool { device, source }.to_string()
    }))
}

/// Gives `device`'s cached memory back; returns the bytes released.
pub fn empty_cache(device: i64) -> Result<u64, CapiError> {
    let d = state::ordinal(device)?;
    match state::made_pool(d)? {
        Some(pool) => pool.empty_cache().map_err(pool_error(d)),
        None => Ok(0),
    }
}

/// Sets every peak statistic of `device` to its current value.
pub fn reset_peak_stats(device: i64) -> Result<(), CapiError> {
    if let Some(pool) = state::made_pool(state::ordinal(device)?)? {
        pool.reset_peak_stats();
    }
    Ok(())
}

/// Starts (`capacity` > 0 events) or stops (0) recording `device`'s history.
pub fn set_history(device: i64, capacity: usize) -> Result<(), CapiError> {
    pool_of(device)?.1.set_history_capacity(capacity);
    Ok(())
}

/// The policy `device`'s pool runs.
pub fn policy(device: i64) -> Result<&'static str, CapiError> {
    Ok(pool_of(device)?.1.policy_name())
}

/// Writes `device`'s pool as a PyTorch memory snapshot to `path` (pickle; JSON for `.json`).
pub fn snapshot(device: i64, path: &str) -> Result<(), CapiError> {
    pool_of(device)?
        .1
        .snapshot()
        .write_path(path)
        .map_err(|source| CapiError::Io {
            path: path.to_string(),
            source,
        })
}

fn limits_change(soft: Option<&str>, hard: Option<&str>) -> Result<Change, CapiError> {
    Ok(Change {
        soft_limit: soft.map(|s| state::limit("soft limit", s)).transpose()?,
        hard_limit: hard.map(|h| state::limit("hard limit", h)).transpose()?,
        ..Change::default()
    })
}

/// Configures every pool, made and to be made: policy (only while a pool has no live
/// allocations), soft and hard limits (`GPUMEM_*_LIMIT` forms, `none` for no limit) and
/// history capacity; `None` leaves a setting as it is. Checked whole before anything changes.
pub fn configure(
    policy: Option<&str>,
    soft_limit: Option<&str>,
    hard_limit: Option<&str>,
    history: Option<usize>,
) -> Result<(), CapiError> {
    let mut change = limits_change(soft_limit, hard_limit)?;
    change.policy = policy.map(state::policy).transpose()?;
    change.history = history;
    state::configure(&change, None)
}

/// Changes `device`'s limits now (`None` leaves a limit as it is, `none` removes it).
pub fn set_limits(
    device: i64,
    soft_limit: Option<&str>,
    hard_limit: Option<&str>,
) -> Result<(), CapiError> {
    let change = limits_change(soft_limit, hard_limit)?;
    state::configure(&change, Some(state::ordinal(device)?))
}

/// Publishes this process's pools for the watching tools, at `dir` (their default directory
/// when `None`); returns the socket's path. See [`crate::gpumem_publish`].
pub fn publish(dir: Option<&str>) -> Result<String, CapiError> {
    state::publish(dir.map(std::path::Path::new)).map(|path| path.display().to_string())
}

/// What `device`'s pool publishes about itself (allocated, reserved, largest free block,
/// fragmentation, policy, limits, OOMs), as `gpumem top` and `diagnose` see it.
pub fn pool_sample(device: i64) -> Result<gpumem_publish::PoolSample, CapiError> {
    let (d, pool) = pool_of(device)?;
    Ok(gpumem_publish::pool_sample(std::process::id(), d, &pool)?)
}
