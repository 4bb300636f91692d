//! The `Device` defaults, through backends that implement only the required core, and the core
//! plus synchronous copies.

use std::collections::BTreeMap;
use std::sync::Mutex;

use gpumem_device::{BackendCode, Device, DeviceError, DevicePtr, EventId, MemInfo, StreamId};

const CAPACITY: u64 = 1 << 20;

/// A backend with memory only: a bump allocator that reports its own out-of-memory code.
#[derive(Default)]
struct Bare {
    /// Live allocations: start → their bytes (which only [`Copying`] reads and writes).
    live: Mutex<BTreeMap<DevicePtr, Vec<u8>>>,
}

impl Bare {
    fn used(&self) -> u64 {
        self.live
            .lock()
            .unwrap()
            .values()
            .map(|b| b.len() as u64)
            .sum()
    }
}

impl Device for Bare {
    fn name(&self) -> String {
        "bare".into()
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        Ok(MemInfo {
            free: CAPACITY - self.used(),
            total: CAPACITY,
        })
    }

    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        if size > CAPACITY - self.used() {
            let code = BackendCode::new("bare", 2, "BARE_ERROR_OUT_OF_MEMORY", "no room");
            return Err(DeviceError::from_backend(code, true));
        }
        let mut live = self.live.lock().unwrap();
        let ptr = live.keys().next_back().map_or(0x1000, |&p| p + CAPACITY);
        live.insert(ptr, vec![0; size as usize]);
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let code = BackendCode::new("bare", 1, "BARE_ERROR_INVALID_VALUE", "not allocated");
        let freed = self.live.lock().unwrap().remove(&ptr);
        freed
            .map(drop)
            .ok_or(DeviceError::from_backend(code, false))
    }
}

/// [`Bare`] plus synchronous copies (whole allocations only, enough for these tests).
#[derive(Default)]
struct Copying(Bare);

impl Copying {
    fn with<R>(&self, ptr: DevicePtr, f: impl FnOnce(&mut Vec<u8>) -> R) -> Result<R, DeviceError> {
        let mut live = self.0.live.lock().unwrap();
        let bytes = live.get_mut(&ptr).ok_or(DeviceError::InvalidAddress {
            ptr,
            what: "not an allocation".into(),
        })?;
        Ok(f(bytes))
    }
}

impl Device for Copying {
    fn name(&self) -> String {
        "copying".into()
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        self.0.mem_info()
    }

    fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
        self.0.malloc(size)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.0.free(ptr)
    }

    fn copy_to_device(&self, dst: DevicePtr, src: &[u8], _: StreamId) -> Result<(), DeviceError> {
        self.with(dst, |bytes| bytes[..src.len()].copy_from_slice(src))
    }

    fn copy_to_host(&self, dst: &mut [u8], src: DevicePtr, _: StreamId) -> Result<(), DeviceError> {
        self.with(src, |bytes| dst.copy_from_slice(&bytes[..dst.len()]))
    }

    fn copy_on_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        _: StreamId,
    ) -> Result<(), DeviceError> {
        let staging = self.with(src, |bytes| bytes[..len as usize].to_vec())?;
        self.with(dst, |bytes| bytes[..len as usize].copy_from_slice(&staging))
    }
}

#[test]
fn streams_and_events_default_to_an_in_order_synchronous_device() {
    let dev = Bare::default();
    assert!(dev.vmm().is_none());
    let stream = dev.create_stream().unwrap();
    assert_eq!(
        stream,
        StreamId::DEFAULT,
        "one queue: a new stream is the default one"
    );
    for s in [stream, StreamId(7)] {
        let event = dev.record_event(s).unwrap();
        assert_eq!(event, EventId(0));
        assert!(
            dev.event_completed(event).unwrap(),
            "complete when recorded"
        );
        dev.wait_event(event).unwrap();
        dev.destroy_event(event).unwrap();
        dev.synchronize_stream(s).unwrap();
    }
    dev.synchronize().unwrap();
}

#[test]
fn transfers_default_to_unsupported() {
    let dev = Bare::default();
    let ptr = dev.malloc(64).unwrap();
    let unsupported = |r: Result<(), DeviceError>| match r {
        Err(DeviceError::Unsupported { backend, .. }) => assert_eq!(backend, "bare"),
        other => panic!("expected Unsupported, got {other:?}"),
    };
    let s = StreamId::DEFAULT;
    unsupported(dev.copy_to_device(ptr, &[1; 64], s));
    unsupported(dev.copy_to_host(&mut [0; 64], ptr, s));
    unsupported(dev.copy_on_device(ptr, ptr, 64, s));
    unsupported(dev.copy_on_device_async(ptr, ptr, 64, s).map(drop));
    let buf = dev.alloc_pinned(64).unwrap();
    assert_eq!((buf.len(), buf.is_page_locked()), (64, false));
    assert!(buf.iter().all(|&b| b == 0), "zeroed");
    unsupported(dev.copy_to_device_async(ptr, buf, s).map(drop));
    let buf = dev.alloc_pinned(64).unwrap();
    unsupported(dev.copy_to_host_async(buf, ptr, s).map(drop));
}

#[test]
fn async_copies_default_to_the_synchronous_copy_already_completed() {
    let dev = Copying::default();
    let (a, b) = (dev.malloc(64).unwrap(), dev.malloc(64).unwrap());
    let s = StreamId::DEFAULT;
    let mut buf = dev.alloc_pinned(64).unwrap();
    buf.copy_from_slice(&[42; 64]);
    let mut buf = dev
        .copy_to_device_async(a, buf, s)
        .unwrap()
        .try_finish()
        .unwrap()
        .expect("a synchronous copy has completed");
    let event = dev.copy_on_device_async(b, a, 64, s).unwrap();
    assert!(dev.event_completed(event).unwrap());
    buf.fill(0);
    let back = dev.copy_to_host_async(buf, b, s).unwrap().wait().unwrap();
    assert_eq!(&back[..], &[42; 64][..]);
}

#[test]
fn a_backend_out_of_memory_code_is_out_of_memory() {
    let dev = Bare::default();
    let err = dev.malloc(CAPACITY + 1).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(err.backend_code().map(|c| c.code), Some(2));
    let err = dev.free(0xdead).unwrap_err();
    assert!(!err.is_out_of_memory());
    assert!(matches!(err, DeviceError::Driver(ref c) if c.name == "BARE_ERROR_INVALID_VALUE"));
}
