//! The crate's only unsafe code: every call into the CUDA driver (cudarc's raw `driver::sys`
//! bindings, loaded at run time) and the page-locked host memory, behind safe functions.
//!
//! What this module guarantees, so that no safe code elsewhere can break it:
//!
//! - **No call without the library.** cudarc panics when a driver function is called and
//!   `libcuda` cannot be loaded, or lacks the symbol. Every call here goes through a [`Driver`]
//!   token, which exists only once the library was found, every symbol the crate calls was
//!   looked up, and `cuInit` succeeded; or through a [`PrimaryContext`], made from a token.
//! - **The right context.** Every call that needs a context makes the device's primary
//!   context current on the calling thread first and restores the previous one after
//!   ([`PrimaryContext::bind`]).
//! - **No handle after it was destroyed.** Streams, events and physical chunks are owned values
//!   ([`Stream`], [`Event`], [`Physical`]) that destroy their handle exactly once; callers
//!   share them behind `Arc`s, so a handle is destroyed only once nobody is using it. Raw handle
//!   values leave this module only as numbers, and never come back in.
//! - **No host memory under a running copy.** Synchronous copies use the driver's synchronous
//!   calls, which return once the host buffer is no longer read or written. Asynchronous copies
//!   run only from and to page-locked memory allocated here
//!   ([`PinnedHost`](pinned::PinnedHost)); each allocation has a fence that holds the events
//!   recorded behind its copies, and every access to its bytes, and its release, waits for
//!   the fence first.
//!
//! Device addresses are plain integers: the driver validates them, and a bad one is an error
//! code, never a host-memory access.
//!
//! One submodule per thing owned, matching the cudarc (0.19) piece each stands in for:
//! [`loading`] (the library, its symbols and `cuInit`, behind the [`Driver`] token; cudarc's
//! `sys::culib` and `sys::is_culib_present`), [`context`] (the retained primary context, bound
//! to the calling thread around every call, and the calls that run in it; cudarc's
//! `CudaContext`), [`handles`] (streams, events and physical chunks, each destroyed exactly
//! once; cudarc's `CudaStream` and `CudaEvent`) and [`pinned`] (page-locked host memory and the
//! fence behind its asynchronous copies; cudarc's `PinnedHostSlice`).

#![allow(unsafe_code)]

mod context;
mod handles;
mod loading;
mod pinned;

use std::sync::{Mutex, MutexGuard};

use cudarc::driver::sys;

pub(crate) use context::{DeviceHandle, PrimaryContext};
pub(crate) use handles::{Event, Physical, Stream};
pub(crate) use loading::{describe, Driver, LoadError, MANAGED_SYMBOLS, VMM_SYMBOLS};
pub(crate) use pinned::AsyncCopyError;
pub(crate) use sys::CUresult;

/// The result of a driver call: the value, or the `CUresult` it failed with.
pub(crate) type CuResult<T> = Result<T, CUresult>;

fn check(result: CUresult) -> CuResult<()> {
    if result == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(result)
    }
}

/// Takes a lock; a poisoned one is taken over (the data behind these locks stays consistent
/// across a panic: each update is a single insert, remove or push).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
