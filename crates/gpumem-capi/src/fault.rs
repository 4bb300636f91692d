//! Test-only panics, compiled only with the `fault-injection` feature (no build a user gets
//! has them): [`gpumem_test_inject_panic`] arms one panic in a named entry point, so that tests
//! in Rust, C and Python can check that every entry point turns a panic into an error and
//! leaves the pools usable or marked unusable.

use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr};
use std::sync::Mutex;

use gpumem_pool::{Pool, PoolEvent, PoolObserver};

use crate::{guard, invalid, status, CapiError, GpumemStatus};

/// Every entry point a panic can be injected into (all of them but the injector).
const ENTRY_POINTS: &[&str] = &[
    "gpumem_torch_alloc",
    "gpumem_torch_pool_alloc",
    "gpumem_torch_free",
    "gpumem_cupy_malloc",
    "gpumem_cupy_free",
    "gpumem_alloc",
    "gpumem_free",
    "gpumem_last_error",
    "gpumem_memory_stats",
    "gpumem_pool_status",
    "gpumem_last_oom",
    "gpumem_policy",
    "gpumem_empty_cache",
    "gpumem_reset_peak_stats",
    "gpumem_set_history",
    "gpumem_configure",
    "gpumem_set_limits",
    "gpumem_snapshot",
    "gpumem_publish",
];

/// The entry points that always change a pool's state when they succeed (allocations of at
/// least one byte, frees of a live pointer): the only ones where a panic inside the pool's
/// locked state is certain to strike during the call.
const POOL_CHANGING: &[&str] = &[
    "gpumem_torch_alloc",
    "gpumem_torch_pool_alloc",
    "gpumem_torch_free",
    "gpumem_cupy_malloc",
    "gpumem_cupy_free",
    "gpumem_alloc",
    "gpumem_free",
];

/// The armed panic: the entry point and whether it strikes inside the pool's locked state.
static ARMED: Mutex<Option<(&'static str, bool)>> = Mutex::new(None);

thread_local! {
    /// Set for the duration of a call armed to panic inside the pool: the entry point's name.
    static PANIC_IN_POOL: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// Arms one panic in the next call of `entry_point` (any thread; the call after it runs
/// normally). With `while_pool_locked` 0 the panic strikes as the call begins, before it
/// touches any state, so the pools stay usable; otherwise it strikes inside the pool while
/// its state is locked (at the pool's next event: only the allocation and free entry points
/// are accepted), which leaves that device's pool unusable. Arming again replaces the armed
/// panic. Returns `GPUMEM_INVALID_ARGUMENT` for a NULL, unknown or unaccepted name.
///
/// # Safety
/// `entry_point` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpumem_test_inject_panic(
    entry_point: *const c_char,
    while_pool_locked: c_int,
) -> GpumemStatus {
    guard("gpumem_test_inject_panic", || {
        // SAFETY: forwarded from the caller.
        status(unsafe { arm(entry_point, while_pool_locked != 0) })
    })
}

/// Checks and arms what [`gpumem_test_inject_panic`] was given.
///
/// # Safety
/// `entry_point` must be NULL or a NUL-terminated string.
unsafe fn arm(entry_point: *const c_char, in_pool: bool) -> Result<(), CapiError> {
    let accepted = if in_pool { POOL_CHANGING } else { ENTRY_POINTS };
    let problem = |what: &str| {
        let accepted = accepted.join(", ");
        format!("{what}; accepted (while_pool_locked = {in_pool}): {accepted}")
    };
    if entry_point.is_null() {
        return Err(invalid("entry_point", "NULL", &problem("no name")));
    }
    // SAFETY: non-null and, by the contract, NUL-terminated.
    let name = unsafe { CStr::from_ptr(entry_point) }.to_string_lossy();
    let Some(&entry) = accepted.iter().find(|&&e| e == name) else {
        return Err(invalid(
            "entry_point",
            &name,
            &problem("not an entry point here"),
        ));
    };
    *ARMED.lock().unwrap_or_else(|p| p.into_inner()) = Some((entry, in_pool));
    Ok(())
}

/// Ends the armed in-pool panic's window when the entry point's call ends (returning or
/// unwinding).
pub struct Window;

impl Drop for Window {
    fn drop(&mut self) {
        PANIC_IN_POOL.with(|armed| armed.set(None));
    }
}

/// Called as each entry point's body begins: fires a panic armed for `entry` at the start,
/// or opens the window for one armed inside the pool.
pub fn enter(entry: &'static str) -> Window {
    let armed = ARMED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take_if(|(armed, _)| *armed == entry);
    match armed {
        Some((_, false)) => panic!("injected panic at the start of {entry}"),
        Some((_, true)) => PANIC_IN_POOL.with(|window| window.set(Some(entry))),
        None => {}
    }
    Window
}

/// Attaches to `pool` the observer that fires panics armed inside the pool: it runs under
/// the pool's lock, at each of its events.
pub fn arm_pool(pool: &Pool) {
    pool.add_observer(Box::new(PanicInPool));
}

/// Panics at the pool's event when this thread's call was armed to panic inside the pool.
struct PanicInPool;

impl PoolObserver for PanicInPool {
    fn on_event(&mut self, _: &PoolEvent) {
        if let Some(entry) = PANIC_IN_POOL.with(|window| window.take()) {
            panic!("injected panic inside the pool's locked state in {entry}");
        }
    }
}
