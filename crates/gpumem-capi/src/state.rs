//! The process-wide state behind the C functions: the pools, one per device, are those of
//! [`gpumem_pool::global_registry`] (the registry the publisher and the Python binding read,
//! which also says when a panic left a pool unusable), made on the backend that
//! `GPUMEM_DEVICE` names; beside them only what a pool cannot hold: the settings new pools are
//! made with, the CUDA devices (to adopt callers' streams), the publishing endpoint, and each
//! thread's last error. The last OOM is the pool's own record.

use std::any::Any;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use gpumem_cuda::CudaDevice;
use gpumem_device::sim::{self, SimConfig, SimDevice};
use gpumem_device::{Device, DevicePtr, StreamId};
use gpumem_pool::{
    global_registry, parse_limit, ConfigError, Limit, PolicyKind, Pool, PoolConfig, PoolError,
    PoolOptions, ACCEPTED_SIZE_FORMS,
};
use gpumem_publish::{endpoint_dir, publishing_requested, PublishError, Publisher, PUBLISH_VAR};

/// The most device ordinals the library serves (ordinals 0 to 63).
pub const GPUMEM_MAX_DEVICES: usize = 64;

/// Capacity of each simulated device when `GPUMEM_SIM_CAPACITY` is unset.
const DEFAULT_SIM_CAPACITY: u64 = 16 << 30;

/// What a C call can fail with; [`CapiError::status`] is the code the call returns and the
/// text is what `gpumem_last_error` gives.
#[derive(Debug, thiserror::Error)]
pub enum CapiError {
    /// `GPUMEM_DEVICE` names no backend.
    #[error(
        "GPUMEM_DEVICE={0:?} is not valid: unknown backend; accepted: cuda (the default), sim"
    )]
    UnknownBackend(String),
    /// `GPUMEM_SIM_CAPACITY` is not a size.
    #[error("GPUMEM_SIM_CAPACITY={value:?} is not valid: {problem}; accepted: a size in bytes, e.g. 16GiB, 80GB, 1000000")]
    SimCapacity {
        /// The value given.
        value: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A device ordinal outside 0..GPUMEM_MAX_DEVICES.
    #[error("device {0} is not valid: accepted: 0 to {max}", max = GPUMEM_MAX_DEVICES - 1)]
    DeviceOrdinal(i64),
    /// An argument that cannot be used (a null or non-UTF-8 string, an unknown policy).
    #[error("{name} {value:?} is not valid: {problem}")]
    InvalidArgument {
        /// Which argument.
        name: &'static str,
        /// Its value as given.
        value: String,
        /// What is wrong and what is accepted.
        problem: String,
    },
    /// The device's backend could not be opened.
    #[error("cannot open device {device} on the {backend} backend: {source}")]
    Open {
        /// The ordinal.
        device: usize,
        /// `cuda` or `sim`.
        backend: &'static str,
        /// Why.
        source: gpumem_device::DeviceError,
    },
    /// The pool refused or failed; an OOM carries gpumem's explanation.
    #[error("device {device}: {source}")]
    Pool {
        /// The ordinal.
        device: usize,
        /// The pool's error.
        source: PoolError,
    },
    /// A free whose size is not the size the pointer was allocated with.
    #[error("device {device}: {ptr:#x} was allocated with {allocated} bytes but freed with {given} bytes; nothing was freed")]
    SizeMismatch {
        /// The ordinal.
        device: usize,
        /// The pointer.
        ptr: DevicePtr,
        /// The size the allocation has.
        allocated: u64,
        /// The size given to free.
        given: u64,
    },
    /// A free that names another stream than the one the pointer was allocated for.
    #[error("device {device}: {ptr:#x} was allocated for stream {allocated_on} but freed on stream {given} (handle {handle:#x}); nothing was freed")]
    WrongStream {
        /// The ordinal.
        device: usize,
        /// The pointer.
        ptr: DevicePtr,
        /// The pool's stream of the allocation.
        allocated_on: u64,
        /// The pool's stream for the handle given to free.
        given: u64,
        /// The `cudaStream_t` given to free.
        handle: u64,
    },
    /// A free on another device than the pointer's.
    #[error(
        "{ptr:#x} was freed on device {given} but belongs to device {owner}; nothing was freed"
    )]
    WrongDevice {
        /// The pointer.
        ptr: DevicePtr,
        /// The device given.
        given: usize,
        /// The device whose pool handed it out.
        owner: usize,
    },
    /// The policy cannot change while the pool has live allocations.
    #[error("device {device}: the policy cannot change to {policy} while {live} allocations are live (change it before the first allocation)")]
    PolicyBusy {
        /// The ordinal.
        device: usize,
        /// The policy asked for.
        policy: PolicyKind,
        /// Live allocations.
        live: u64,
    },
    /// Publishing the pools (`GPUMEM_PUBLISH`, [`crate::api::publish`]) was refused or failed.
    #[error("cannot publish the pools: {0}")]
    Publish(#[from] PublishError),
    /// A panic inside gpumem, caught at the C entry point: a bug, reported instead of
    /// aborting the host process or unwinding into its C or C++.
    #[error("internal error in {entry}: panicked: {message}; {}", consequence(.unusable))]
    Panic {
        /// The entry point whose body panicked.
        entry: &'static str,
        /// The panic's message.
        message: String,
        /// The devices whose pools the panic struck while their state was locked: unusable
        /// from now on.
        unusable: Vec<usize>,
    },
    /// The device's pool was left unusable by an earlier panic.
    #[error("the gpumem pool of device {device} is unusable after {reason}; restart the process to get a working pool (the panic is a bug in gpumem: please report it with this message)")]
    Unusable {
        /// The ordinal.
        device: usize,
        /// What broke it, as recorded in the registry.
        reason: String,
    },
    /// A snapshot could not be written.
    #[error("cannot write the snapshot to {path:?}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

impl CapiError {
    /// Whether this is an allocation that did not fit.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            CapiError::Pool {
                source: PoolError::OutOfMemory(_),
                ..
            }
        )
    }
}

/// What a caught panic did to the pools, for [`CapiError::Panic`]'s message.
fn consequence(unusable: &[usize]) -> String {
    match unusable {
        [] => "it struck while no pool's state was locked, so the pools stay usable".into(),
        devices => {
            let list: Vec<String> = devices.iter().map(usize::to_string).collect();
            format!(
                "it struck while the pool of device {} was changing its state, so that pool is \
                 unusable from now on (restart the process)",
                list.join(", ")
            )
        }
    }
}

/// The error for a panic caught in `entry` with `payload`: the pools it struck while their
/// state was locked are marked unusable in the registry, with the entry point and message as
/// the reason later calls give.
pub fn panicked(entry: &'static str, payload: &(dyn Any + Send)) -> CapiError {
    let message = payload
        .downcast_ref::<&str>()
        .map(|text| text.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    let reason = format!("an internal error in {entry}: {message}");
    let unusable = global_registry().mark_poisoned(&reason);
    CapiError::Panic {
        entry,
        message,
        unusable,
    }
}

/// The backend the pools run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Cuda,
    Sim { capacity: u64 },
}

impl Backend {
    /// The backend `GPUMEM_DEVICE` names (`cuda` when unset), with `GPUMEM_SIM_CAPACITY`.
    fn from_env() -> Result<Backend, CapiError> {
        let name = std::env::var("GPUMEM_DEVICE").unwrap_or_default();
        match name.trim() {
            "" | "cuda" => Ok(Backend::Cuda),
            "sim" => Ok(Backend::Sim {
                capacity: sim_capacity()?,
            }),
            _ => Err(CapiError::UnknownBackend(name)),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            Backend::Sim { .. } => "sim",
        }
    }
}

fn sim_capacity() -> Result<u64, CapiError> {
    let Ok(value) = std::env::var("GPUMEM_SIM_CAPACITY") else {
        return Ok(DEFAULT_SIM_CAPACITY);
    };
    let problem = |problem: String| CapiError::SimCapacity {
        value: value.clone(),
        problem,
    };
    match parse_limit(&value) {
        Ok(Limit::Bytes(0)) => Err(problem("zero bytes".into())),
        Ok(Limit::Bytes(bytes)) if bytes > sim::MAX_CAPACITY => Err(problem(format!(
            "above {} bytes (1 PiB), the largest simulated device",
            sim::MAX_CAPACITY
        ))),
        Ok(Limit::Bytes(bytes)) => Ok(bytes),
        Ok(Limit::Fraction(_)) => Err(problem("a percentage of no device".into())),
        Err(e) => Err(problem(e.to_string())),
    }
}

/// The CUDA devices the pools run on, by ordinal, opened with the first pool of each and
/// kept for the process (one per device's primary context): a pool made again after a policy
/// change runs on the same one, which already knows the streams callers gave.
static CUDA_DEVICES: Mutex<BTreeMap<usize, Arc<CudaDevice>>> = Mutex::new(BTreeMap::new());

/// The pool's stream on `device` for the caller's `cudaStream_t`: on CUDA the stream is
/// adopted (the device accepts it from now on); on the simulated device any number is a
/// stream.
pub fn stream(device: usize, raw: u64) -> StreamId {
    match lock(&CUDA_DEVICES).get(&device) {
        Some(cuda) => cuda.adopt_stream(raw),
        None => StreamId(raw),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each guarded value is replaced whole, so a panic elsewhere cannot leave it half-written.
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// `None` until first needed, then the environment's configuration with the run-time changes
/// applied.
static CONFIG: Mutex<Option<PoolConfig>> = Mutex::new(None);

/// The configuration the next pool is made with: the environment's (`GPUMEM_POOL`,
/// `GPUMEM_SOFT_LIMIT`, `GPUMEM_HARD_LIMIT`, `GPUMEM_HISTORY`, `GPUMEM_POLICY_CONF`,
/// `PYTORCH_ALLOC_CONF`), read once, with later run-time changes.
fn config() -> Result<PoolConfig, CapiError> {
    let mut config = lock(&CONFIG);
    if config.is_none() {
        *config = Some(PoolConfig::from_env().map_err(|e| config_error(0, e))?);
    }
    Ok(config.clone().unwrap_or_default())
}

fn config_error(device: usize, e: ConfigError) -> CapiError {
    CapiError::Pool {
        device,
        source: PoolError::Config(e),
    }
}

/// Checks a C device ordinal.
pub fn ordinal(device: i64) -> Result<usize, CapiError> {
    usize::try_from(device)
        .ok()
        .filter(|d| *d < GPUMEM_MAX_DEVICES)
        .ok_or(CapiError::DeviceOrdinal(device))
}

/// The pool of `device`, made on first use on the backend `GPUMEM_DEVICE` names; an error
/// naming the panic when an earlier one left it unusable.
pub fn device_pool(device: usize) -> Result<Arc<Pool>, CapiError> {
    let registry = global_registry();
    let pool = match registry.get(device) {
        Some(pool) => pool,
        None => registry.get_or_try_init(device, || {
            let config = config()?;
            publish_if_asked()?;
            open(device, config)
        })?,
    };
    usable(device)?;
    Ok(pool)
}

/// The pool of `device` if one was made, without making one: a query or a bad free on a
/// device nothing allocated on answers from nothing, rather than opening the device (on CUDA,
/// a context of hundreds of MiB on that GPU); an error naming the panic when an earlier one
/// left it unusable.
pub fn made_pool(device: usize) -> Result<Option<Arc<Pool>>, CapiError> {
    let Some(pool) = global_registry().get(device) else {
        return Ok(None);
    };
    usable(device)?;
    Ok(Some(pool))
}

/// An error when an earlier panic left the pool of `device` unusable.
fn usable(device: usize) -> Result<(), CapiError> {
    match global_registry().unusable(device) {
        Some(reason) => Err(CapiError::Unusable { device, reason }),
        None => Ok(()),
    }
}

/// The endpoint answering for this process's pools, once started; it lives as long as the
/// process (a socket left behind is removed by the next reader that finds its process gone).
static PUBLISHER: Mutex<Option<Publisher>> = Mutex::new(None);

/// Starts publishing when `GPUMEM_PUBLISH` asks for it (checked as each pool is made, so a
/// bad value fails the call that makes the pool, with the reason as the last error).
fn publish_if_asked() -> Result<(), CapiError> {
    let value = std::env::var(PUBLISH_VAR).ok();
    if publishing_requested(value.as_deref())? {
        publish(None)?;
    }
    Ok(())
}

/// Publishes this process's pools (every pool, made and to be made) at `<dir>/<pid>.sock`,
/// `dir` defaulting to the directory `gpumem top`/`diagnose`/`exporter` read; returns the
/// socket's path. Publishing again returns the running endpoint's path, whatever `dir`.
pub fn publish(dir: Option<&Path>) -> Result<PathBuf, CapiError> {
    let mut publisher = lock(&PUBLISHER);
    if let Some(running) = publisher.as_ref() {
        return Ok(running.path().to_path_buf());
    }
    if dir.is_some_and(|dir| dir.as_os_str().is_empty()) {
        return Err(CapiError::InvalidArgument {
            name: "dir",
            value: String::new(),
            problem: "an empty directory; accepted: a directory, or NULL (None) for the one \
                      gpumem top, diagnose and exporter read"
                .into(),
        });
    }
    let dir = dir.map_or_else(endpoint_dir, Path::to_path_buf);
    let started = Publisher::start(&dir, global_registry())?;
    let path = started.path().to_path_buf();
    *publisher = Some(started);
    Ok(path)
}

/// Every pool made so far, by device (the unusable ones too: callers only read them).
pub fn all_pools() -> BTreeMap<usize, Arc<Pool>> {
    let registry = global_registry();
    registry
        .devices()
        .into_iter()
        .filter_map(|device| registry.get(device).map(|pool| (device, pool)))
        .collect()
}

/// A new pool for `device` with `config`, on the backend `GPUMEM_DEVICE` names.
fn open(device: usize, config: PoolConfig) -> Result<Pool, CapiError> {
    let backend = Backend::from_env()?;
    let opened = |source| CapiError::Open {
        device,
        backend: backend.name(),
        source,
    };
    let dev: Arc<dyn Device> = match backend {
        Backend::Cuda => {
            let mut cuda = lock(&CUDA_DEVICES);
            match cuda.get(&device) {
                Some(opened) => opened.clone(),
                None => {
                    let made = Arc::new(CudaDevice::open(device).map_err(opened)?);
                    cuda.insert(device, made.clone());
                    made
                }
            }
        }
        Backend::Sim { capacity } => {
            let sim = SimDevice::new(SimConfig::address_only(capacity)).map_err(opened)?;
            Arc::new(sim)
        }
    };
    let pool = Pool::new(dev, config).map_err(|source| CapiError::Pool { device, source })?;
    #[cfg(feature = "fault-injection")]
    crate::fault::arm_pool(&pool);
    Ok(pool)
}

/// Parses a limit as the environment variables take it; `none` is no limit (an empty string
/// is refused, as `GPUMEM_HARD_LIMIT=""` is: a caller leaving a limit alone passes NULL).
pub fn limit(name: &'static str, text: &str) -> Result<Option<Limit>, CapiError> {
    match text.trim() {
        "none" => Ok(None),
        t => parse_limit(t)
            .map(Some)
            .map_err(|e| CapiError::InvalidArgument {
                name,
                value: text.to_string(),
                problem: format!("{e}; accepted: none, or {ACCEPTED_SIZE_FORMS}"),
            }),
    }
}

/// What a configuration change sets; `None` fields are left as they are.
#[derive(Default)]
pub struct Change {
    /// A new policy.
    pub policy: Option<PolicyKind>,
    /// A new soft limit (`Some(None)`: none).
    pub soft_limit: Option<Option<Limit>>,
    /// A new hard limit (`Some(None)`: none).
    pub hard_limit: Option<Option<Limit>>,
    /// A new history capacity.
    pub history: Option<usize>,
}

/// Taken shared by every allocation while it runs ([`allocating`]) and exclusively by a
/// configuration change for the whole of it ([`configure`]): no allocation lands in a pool
/// that a policy change is replacing (it would be lost with the pool, a pointer no free could
/// find), and two changes never read the current limits while the other writes them (each
/// keeps the limit it leaves alone, which the other may be changing).
static CHANGES: RwLock<()> = RwLock::new(());

/// Runs the allocation `f` where no configuration change is under way (see [`CHANGES`]).
pub fn allocating<R>(f: impl FnOnce() -> R) -> R {
    let _shared = CHANGES.read().unwrap_or_else(PoisonError::into_inner);
    f()
}

/// Applies `change` to the pools of `devices` (every existing one when `None`) and, when
/// `devices` is `None`, to the configuration of pools made later. Checks everything before
/// changing anything: limits that conflict, or a policy change on a pool with live
/// allocations, change nothing. A change to one device is checked against that device's own
/// limits, not the process-wide configuration's.
pub fn configure(change: &Change, only: Option<usize>) -> Result<(), CapiError> {
    let _exclusive = CHANGES.write().unwrap_or_else(PoisonError::into_inner);
    let mut next = config()?;
    if let Some(policy) = change.policy {
        next.policy = policy;
    }
    if let Some(soft) = change.soft_limit {
        next.options.soft_limit = soft;
    }
    if let Some(hard) = change.hard_limit {
        next.options.hard_limit = hard;
    }
    if let Some(history) = change.history {
        next.options.history_capacity = history;
    }
    if only.is_none() {
        next.options.validate().map_err(|e| config_error(0, e))?;
    }
    let targets: Vec<(usize, Arc<Pool>)> = match only {
        Some(device) => vec![(device, device_pool(device)?)],
        // A pool a panic left unusable is left alone: it refuses every call on its device.
        None => all_pools()
            .into_iter()
            .filter(|(device, _)| usable(*device).is_ok())
            .collect(),
    };
    // Each pool keeps the limit the change leaves alone (its own, which a per-device change
    // may have set), so its new limits start from its current ones.
    let mut planned = Vec::new();
    for (device, pool) in &targets {
        let pool_error = |source: PoolError| CapiError::Pool {
            device: *device,
            source,
        };
        let mut rebuild = false;
        if let Some(policy) = change.policy {
            if policy.as_str() != pool.policy_name() {
                let live = pool.stats().allocation.all.current;
                if live > 0 {
                    return Err(CapiError::PolicyBusy {
                        device: *device,
                        policy,
                        live,
                    });
                }
                rebuild = true;
            }
        }
        let status = pool.status().map_err(pool_error)?;
        let options = PoolOptions {
            soft_limit: change
                .soft_limit
                .unwrap_or(status.soft_limit.map(Limit::Bytes)),
            hard_limit: change
                .hard_limit
                .unwrap_or(status.hard_limit.map(Limit::Bytes)),
            history_capacity: next.options.history_capacity,
        };
        options
            .resolve_limits(status.device_total)
            .map_err(|e| config_error(*device, e))?;
        planned.push((*device, pool, rebuild, options));
    }
    for (device, pool, remake, options) in planned {
        if remake {
            let config = PoolConfig {
                options,
                ..next.clone()
            };
            let remade = Arc::new(open(device, config)?);
            // Nothing is live in the pool replaced (checked above, and no allocation runs
            // meanwhile): its cached memory goes back to the device, which a CUDA device keeps
            // for the new pool (a dropped pool does not give its segments back).
            pool.empty_cache()
                .map_err(|source| CapiError::Pool { device, source })?;
            global_registry().set(device, remade);
            continue;
        }
        if change.soft_limit.is_some() || change.hard_limit.is_some() {
            pool.set_limits(&options)
                .map_err(|source| CapiError::Pool { device, source })?;
        }
        if let Some(history) = change.history {
            pool.set_history_capacity(history);
        }
    }
    if only.is_none() {
        *lock(&CONFIG) = Some(next);
    }
    Ok(())
}

/// The policy named `name`, or the error listing the policies.
pub fn policy(name: &str) -> Result<PolicyKind, CapiError> {
    name.parse()
        .map_err(|accepted: String| CapiError::InvalidArgument {
            name: "policy",
            value: name.to_string(),
            problem: format!("unknown pool policy; accepted: {accepted}"),
        })
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Makes `text` this thread's last error. In a call made while the thread exits (a
/// thread-local destructor freeing its cached block), after its last error is gone, the text
/// is dropped: the call still returns its code.
pub fn set_last_error(text: &str) {
    // An interior NUL would cut the C string short: it cannot come from our messages, but a
    // path or value quoted in one might carry it.
    let text = CString::new(text.replace('\0', "\\0")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = text);
}

/// Runs `f` with this thread's last error as a C string, borrowed where it lives (a pointer
/// to it stays valid until the next failure on this thread); an empty static one once the
/// thread's storage is gone, as the thread exits.
pub fn with_last_error<R>(f: impl FnOnce(&CStr) -> R) -> R {
    let mut f = Some(f);
    let mut run = |text: &CStr| f.take().map(|f| f(text));
    match LAST_ERROR.try_with(|last| run(&last.borrow())) {
        Ok(Some(result)) => result,
        _ => run(c"").expect("the thread's storage was gone: `f` has not run"),
    }
}
