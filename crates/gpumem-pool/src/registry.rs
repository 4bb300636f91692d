//! "The pool of device N": one shared pool per device ordinal, as RMM keeps a per-device
//! resource, so that entry points that only know a device number (the C ABI's
//! `alloc(size, device, stream)`, a monitor, a Python binding) reach the same pool.
//!
//! A [`DeviceRegistry`] is a plain value for code that wants its own; [`global_registry`] is
//! the process-wide one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::pool::{Pool, PoolError};

/// Pools by device ordinal.
#[derive(Default)]
pub struct DeviceRegistry {
    pools: Mutex<BTreeMap<usize, Arc<Pool>>>,
}

impl DeviceRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        DeviceRegistry::default()
    }

    /// The pool of `device`, if one is set.
    pub fn get(&self, device: usize) -> Option<Arc<Pool>> {
        self.lock().get(&device).cloned()
    }

    /// Makes `pool` the pool of `device`; returns the one it replaces. Memory allocated from
    /// the old pool stays valid while anyone holds it.
    pub fn set(&self, device: usize, pool: Arc<Pool>) -> Option<Arc<Pool>> {
        self.lock().insert(device, pool)
    }

    /// The pool of `device`, made by `init` if there is none yet. `init` runs at most once per
    /// device even when threads race (under the registry's lock, so it must not use the
    /// registry); its error is returned and nothing is registered.
    pub fn get_or_try_init(
        &self,
        device: usize,
        init: impl FnOnce() -> Result<Pool, PoolError>,
    ) -> Result<Arc<Pool>, PoolError> {
        let mut pools = self.lock();
        if let Some(pool) = pools.get(&device) {
            return Ok(pool.clone());
        }
        let pool = Arc::new(init()?);
        pools.insert(device, pool.clone());
        Ok(pool)
    }

    /// Removes and returns the pool of `device`.
    pub fn remove(&self, device: usize) -> Option<Arc<Pool>> {
        self.lock().remove(&device)
    }

    /// The devices that have a pool, in order.
    pub fn devices(&self) -> Vec<usize> {
        self.lock().keys().copied().collect()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<usize, Arc<Pool>>> {
        // The map is never left half-updated, so a panic elsewhere leaves it usable.
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The process-wide registry.
pub fn global_registry() -> &'static DeviceRegistry {
    static GLOBAL: OnceLock<DeviceRegistry> = OnceLock::new();
    GLOBAL.get_or_init(DeviceRegistry::new)
}
