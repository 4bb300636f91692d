//! Opening the test device: without an adapter a test fails with what to install, unless the
//! user opted out of missing test dependencies (`gpumem_testkit::deps`).

#![allow(dead_code)]

use std::sync::{Arc, Once};

use gpumem_testkit::deps;
use gpumem_wgpu::{WgpuDevice, WgpuOptions};

/// A device opened with `options`; without an adapter the test fails with what to install,
/// or, when the user opted out, `None` after a `SKIPPED:` line.
pub fn open(options: WgpuOptions) -> Option<Arc<WgpuDevice>> {
    quiet_device_select();
    deps::require(deps::VULKAN, WgpuDevice::open(options)).map(Arc::new)
}

/// A device with `limit` bytes of memory.
pub fn open_with_limit(limit: u64) -> Option<Arc<WgpuDevice>> {
    open(WgpuOptions {
        memory_limit: Some(limit),
        ..WgpuOptions::default()
    })
}

/// `len` bytes of a pattern that differs for every `seed` and position.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Mesa's device-select Vulkan layer prints "XDG_RUNTIME_DIR is invalid or not set" for every
/// instance when that variable is unset (as in CI); it only orders GPUs, so the tests turn it
/// off then. Every test opens its device through here before it touches Vulkan, and the
/// variable is set once, before any of them goes on.
fn quiet_device_select() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("XDG_RUNTIME_DIR").is_none()
            && std::env::var_os("NODEVICE_SELECT").is_none()
        {
            std::env::set_var("NODEVICE_SELECT", "1");
        }
    });
}
