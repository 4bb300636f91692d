//! "The pool of device N": one shared pool per device ordinal, as RMM keeps a per-device
//! resource, so that entry points that only know a device number (the C ABI's
//! `alloc(size, device, stream)`, a monitor, a Python binding) reach the same pool.
//!
//! A pool that a panic struck while its state was locked may be half-updated; the registry
//! says so ([`DeviceRegistry::unusable`]) so that those entry points refuse it with the reason
//! instead of going on with state nobody can vouch for.
//!
//! A [`DeviceRegistry`] is a plain value for code that wants its own; [`global_registry`] is
//! the process-wide one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::pool::Pool;

/// Why a pool is unusable when a panic struck while its state was locked but nobody recorded
/// where (a caller that does not catch panics, or catches them without telling the registry).
const UNRECORDED_PANIC: &str = "a panic that struck while its state was locked";

/// One device's pool and, once it cannot be trusted, why.
struct Entry {
    pool: Arc<Pool>,
    unusable: Option<String>,
}

/// Pools by device ordinal.
#[derive(Default)]
pub struct DeviceRegistry {
    pools: Mutex<BTreeMap<usize, Entry>>,
}

impl DeviceRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        DeviceRegistry::default()
    }

    /// The pool of `device`, if one is set.
    pub fn get(&self, device: usize) -> Option<Arc<Pool>> {
        self.lock().get(&device).map(|entry| entry.pool.clone())
    }

    /// Makes `pool` the pool of `device`; returns the one it replaces (and, with it, any
    /// record of the old pool being unusable). Memory allocated from the old pool stays valid
    /// while anyone holds it.
    pub fn set(&self, device: usize, pool: Arc<Pool>) -> Option<Arc<Pool>> {
        let entry = Entry {
            pool,
            unusable: None,
        };
        self.lock().insert(device, entry).map(|old| old.pool)
    }

    /// The pool of `device`, made by `init` if there is none yet. `init` runs at most once per
    /// device even when threads race (under the registry's lock, so it must not use the
    /// registry); its error is returned and nothing is registered.
    pub fn get_or_try_init<E>(
        &self,
        device: usize,
        init: impl FnOnce() -> Result<Pool, E>,
    ) -> Result<Arc<Pool>, E> {
        let mut pools = self.lock();
        if let Some(entry) = pools.get(&device) {
            return Ok(entry.pool.clone());
        }
        let pool = Arc::new(init()?);
        let entry = Entry {
            pool: pool.clone(),
            unusable: None,
        };
        pools.insert(device, entry);
        Ok(pool)
    }

    /// Removes and returns the pool of `device`.
    pub fn remove(&self, device: usize) -> Option<Arc<Pool>> {
        self.lock().remove(&device).map(|entry| entry.pool)
    }

    /// The devices that have a pool, in order.
    pub fn devices(&self) -> Vec<usize> {
        self.lock().keys().copied().collect()
    }

    /// Why the pool of `device` must not be used any more: what
    /// [`DeviceRegistry::mark_poisoned`] recorded or, when a panic struck while the pool's
    /// state was locked ([`Pool::is_poisoned`]) and nobody recorded it, "a panic that struck
    /// while its state was locked".
    /// `None` for a usable pool and for a device without one.
    pub fn unusable(&self, device: usize) -> Option<String> {
        let pools = self.lock();
        let entry = pools.get(&device)?;
        entry.unusable.clone().or_else(|| {
            entry
                .pool
                .is_poisoned()
                .then(|| UNRECORDED_PANIC.to_string())
        })
    }

    /// Records `reason` (say, "an internal error in gpumem_alloc: …") for every pool that a
    /// panic struck while its state was locked and that has no reason yet; returns those
    /// devices. A caller that has just caught a panic calls this to tell the pools it broke
    /// from those it left alone.
    pub fn mark_poisoned(&self, reason: &str) -> Vec<usize> {
        let mut pools = self.lock();
        let mut marked = Vec::new();
        for (&device, entry) in pools.iter_mut() {
            if entry.unusable.is_none() && entry.pool.is_poisoned() {
                entry.unusable = Some(reason.to_string());
                marked.push(device);
            }
        }
        marked
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<usize, Entry>> {
        // The map is never left half-updated, so a panic elsewhere leaves it usable.
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The process-wide registry.
pub fn global_registry() -> &'static DeviceRegistry {
    static GLOBAL: OnceLock<DeviceRegistry> = OnceLock::new();
    GLOBAL.get_or_init(DeviceRegistry::new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{PoolEvent, PoolObserver};
    use crate::PoolConfig;
    use gpumem_device::sim::{SimConfig, SimDevice};
    use gpumem_device::StreamId;

    fn pool() -> Arc<Pool> {
        let sim = SimDevice::new(SimConfig::address_only(64 << 20)).unwrap();
        Arc::new(Pool::new(Arc::new(sim), PoolConfig::default()).unwrap())
    }

    /// Panics at the first event it sees: a panic inside the pool, under its lock.
    struct Bomb;

    impl PoolObserver for Bomb {
        fn on_event(&mut self, _: &PoolEvent) {
            panic!("bomb");
        }
    }

    #[test]
    fn a_pool_a_panic_struck_under_its_lock_is_unusable_with_the_recorded_reason() {
        let registry = DeviceRegistry::new();
        let (broken, intact) = (pool(), pool());
        registry.set(0, broken.clone());
        registry.set(1, intact.clone());
        assert_eq!(registry.unusable(0), None);
        assert!(
            registry.mark_poisoned("nothing").is_empty(),
            "no pool is poisoned"
        );

        broken.add_observer(Box::new(Bomb));
        let struck = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            broken.allocate(4096, StreamId::DEFAULT)
        }));
        assert!(struck.is_err(), "the observer panicked inside allocate");
        assert!(broken.is_poisoned());
        assert_eq!(registry.unusable(0).as_deref(), Some(UNRECORDED_PANIC));
        assert_eq!(registry.unusable(1), None);
        assert_eq!(registry.unusable(7), None, "no pool, nothing to refuse");

        assert_eq!(
            registry.mark_poisoned("an internal error in test: bomb"),
            vec![0]
        );
        assert_eq!(
            registry.unusable(0).as_deref(),
            Some("an internal error in test: bomb")
        );
        assert!(
            registry.mark_poisoned("a later panic").is_empty(),
            "the first reason stays"
        );
        assert_eq!(
            registry.unusable(0).as_deref(),
            Some("an internal error in test: bomb")
        );

        // A new pool for the device is usable again.
        registry.set(0, pool());
        assert_eq!(registry.unusable(0), None);
    }
}
