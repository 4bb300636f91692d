//! The wgpu backend on a real adapter (without a GPU: Mesa's software Vulkan driver, lavapipe):
//! memory, the address space, copies of any alignment, events, binding ranges in a compute
//! pass, and typed errors that leave nothing allocated.

mod common;

use std::sync::Arc;

use common::{open, open_with_limit, pattern};
use gpumem_device::{Device, DeviceError, MemInfo, StreamId};
use gpumem_wgpu::{
    AdapterChoice, MemorySource, WgpuDevice, WgpuOptions, ADDRESS_ALIGNMENT, ADDRESS_BASE,
    ADDRESS_END, ESTIMATE_BUFFERS,
};

const S: StreamId = StreamId::DEFAULT;
const MIB: u64 = 1 << 20;

fn read(dev: &WgpuDevice, ptr: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    dev.copy_to_host(&mut out, ptr, S).unwrap();
    out
}

/// Nothing is left allocated: the device's bytes and mem_info are back to the start.
fn assert_empty(dev: &WgpuDevice) {
    assert_eq!(dev.allocated(), 0, "bytes left allocated");
    assert_eq!(dev.live_allocations(), 0, "allocations left");
    let info = dev.mem_info().unwrap();
    assert_eq!(info.free, info.total);
}

#[test]
fn opens_an_adapter_by_preference_index_and_name() {
    let Some(dev) = open(WgpuOptions::default()) else {
        return;
    };
    let name = dev.name();
    let info = dev.adapter_info();
    assert_eq!(
        name,
        format!("wgpu:{} ({})", info.backend.to_str(), info.name)
    );
    eprintln!("opened {name}");
    let adapters = WgpuDevice::adapters();
    let listed = adapters
        .iter()
        .find(|a| a.name == info.name)
        .expect("the opened adapter is listed");
    assert_eq!(listed.max_buffer_size, dev.limits().max_buffer_size);
    assert!(!listed.backend.is_empty() && !listed.device_type.is_empty());

    let by_index = WgpuDevice::open(WgpuOptions {
        adapter: AdapterChoice::Index(listed.index),
        ..WgpuOptions::default()
    })
    .unwrap();
    assert_eq!(by_index.adapter_info().name, info.name);
    let part = info.name.split_whitespace().next().unwrap().to_uppercase();
    let by_name = WgpuDevice::open(WgpuOptions {
        adapter: AdapterChoice::Name(part),
        ..WgpuOptions::default()
    })
    .unwrap();
    assert!(by_name.adapter_info().name.contains(&info.name[..3]));

    for bad in [
        AdapterChoice::Index(adapters.len()),
        AdapterChoice::Name("no such adapter, surely".into()),
    ] {
        let err = WgpuDevice::open(WgpuOptions {
            adapter: bad.clone(),
            ..WgpuOptions::default()
        })
        .unwrap_err();
        assert!(
            matches!(err, DeviceError::InvalidValue(_)),
            "{bad:?}: {err}"
        );
    }
    let err = WgpuDevice::open(WgpuOptions {
        memory_limit: Some(0),
        ..WgpuOptions::default()
    })
    .unwrap_err();
    assert!(matches!(err, DeviceError::InvalidValue(_)), "{err}");
}

#[test]
fn malloc_places_buffers_in_the_address_space_and_free_gives_them_back() {
    let Some(dev) = open_with_limit(64 * MIB) else {
        return;
    };
    assert_eq!(dev.memory().source, MemorySource::Limit);
    assert_eq!(dev.vmm().map(|_| ()), None, "no VMM");
    assert_eq!(
        dev.mem_info().unwrap(),
        MemInfo {
            free: 64 * MIB,
            total: 64 * MIB
        }
    );
    let sizes = [1u64, 3, 256, 1000, 4099, MIB, 5 * MIB + 7];
    let ptrs: Vec<u64> = sizes.iter().map(|&s| dev.malloc(s).unwrap()).collect();
    let padded: u64 = sizes.iter().map(|s| s.next_multiple_of(4)).sum();
    assert_eq!(dev.allocated(), padded);
    assert_eq!(dev.mem_info().unwrap().free, 64 * MIB - padded);
    for (i, (&p, &s)) in ptrs.iter().zip(&sizes).enumerate() {
        assert_eq!(p % ADDRESS_ALIGNMENT, 0, "aligned");
        assert!(p % dev.address_alignment() == 0);
        for (&q, &t) in ptrs.iter().zip(&sizes).skip(i + 1) {
            assert!(
                p + s <= q || q + t <= p,
                "disjoint: {p:#x}+{s} and {q:#x}+{t}"
            );
        }
    }
    // Freeing: only the exact start, once.
    let err = dev.free(ptrs[3] + 4).unwrap_err();
    assert!(
        matches!(&err, DeviceError::InvalidAddress { what, .. } if what.contains("inside")),
        "{err}"
    );
    for &p in &ptrs {
        dev.free(p).unwrap();
    }
    let err = dev.free(ptrs[0]).unwrap_err();
    assert!(matches!(err, DeviceError::InvalidAddress { .. }), "{err}");
    assert!(matches!(
        dev.malloc(0).unwrap_err(),
        DeviceError::InvalidValue(_)
    ));
    assert_empty(&dev);
    // A new buffer does not reuse a just-freed address (next-fit).
    let again = dev.malloc(1).unwrap();
    assert!(!ptrs.contains(&again));
    dev.free(again).unwrap();
    assert_empty(&dev);
}

#[test]
fn without_a_limit_the_memory_is_the_drivers_or_says_it_is_an_estimate() {
    let Some(dev) = open(WgpuOptions::default()) else {
        return;
    };
    let memory = dev.memory();
    let total = memory.info.total;
    assert_eq!(dev.mem_info().unwrap().total, total);
    assert!(memory.info.free <= total, "{memory:?}");
    let estimate = dev
        .limits()
        .max_buffer_size
        .saturating_mul(ESTIMATE_BUFFERS)
        .min(ADDRESS_END - ADDRESS_BASE);
    match memory.source {
        MemorySource::Limit => panic!("no limit was given: {memory:?}"),
        // Vulkan, this build's only backend on Linux, requires a device-local heap.
        MemorySource::Estimate if cfg!(target_os = "linux") => {
            panic!("Vulkan reports its heaps: {memory:?}")
        }
        MemorySource::Estimate => assert_eq!(total, estimate),
        MemorySource::Budget | MemorySource::HeapSize => assert!(total > 0),
    }
    assert_eq!(
        memory.source.is_estimate(),
        memory.source == MemorySource::Estimate
    );
    eprintln!("{} memory: {memory:?}", dev.name());
    let p = dev.malloc(4096).unwrap();
    let after = dev.memory();
    assert_eq!(after.source, memory.source);
    if memory.source != MemorySource::Budget {
        // Only this device's bytes count (the budget's usage is the driver's to report).
        assert_eq!(after.info.free, total - 4096);
    }
    dev.free(p).unwrap();
    assert_empty(&dev);
}

#[test]
fn bytes_round_trip_at_any_offset_and_length() {
    let Some(dev) = open_with_limit(64 * MIB) else {
        return;
    };
    const LEN: usize = 4099;
    let ptr = dev.malloc(LEN as u64).unwrap();
    let mut mirror = pattern(1, LEN);
    dev.copy_to_device(ptr, &mirror, S).unwrap();
    assert_eq!(read(&dev, ptr, LEN), mirror);
    let mut seed = 2;
    for offset in (0..9).chain([LEN - 13, LEN - 5]) {
        for len in (1..14).chain([64, 255, 1001]) {
            if offset + len > LEN {
                continue;
            }
            let bytes = pattern(seed, len);
            seed += 1;
            dev.copy_to_device(ptr + offset as u64, &bytes, S).unwrap();
            mirror[offset..offset + len].copy_from_slice(&bytes);
            assert_eq!(
                read(&dev, ptr + offset as u64, len),
                bytes,
                "offset {offset}, length {len}"
            );
        }
        // The bytes around every write were kept.
        assert_eq!(read(&dev, ptr, LEN), mirror, "after offset {offset}");
    }
    // Reads of any alignment, including the last bytes of an unaligned buffer.
    for (offset, len) in [(LEN - 1, 1), (LEN - 3, 3), (1, LEN - 1), (2, 5), (0, 0)] {
        assert_eq!(
            read(&dev, ptr + offset as u64, len),
            &mirror[offset..offset + len]
        );
    }
    dev.free(ptr).unwrap();
    assert_empty(&dev);
}

#[test]
fn device_to_device_copies_within_and_between_buffers() {
    let Some(dev) = open_with_limit(64 * MIB) else {
        return;
    };
    const LEN: usize = 2048;
    let (a, b) = (
        dev.malloc(LEN as u64).unwrap(),
        dev.malloc(LEN as u64).unwrap(),
    );
    let mut ma = pattern(10, LEN);
    let mut mb = pattern(11, LEN);
    dev.copy_to_device(a, &ma, S).unwrap();
    dev.copy_to_device(b, &mb, S).unwrap();
    // (destination is b?, dst offset, src offset, length): aligned on the device, unaligned
    // through host memory, overlapping within one buffer.
    let cases = [
        (true, 0, 0, 512),
        (true, 1024, 4, 100),
        (true, 3, 5, 77),
        (true, 2047, 0, 1),
        (false, 16, 0, 1024),
        (false, 0, 16, 1024),
        (false, 1, 2, 999),
    ];
    for (to_b, dst_off, src_off, len) in cases {
        let (dst, src) = if to_b { (b, a) } else { (a, a) };
        dev.copy_on_device(dst + dst_off as u64, src + src_off as u64, len as u64, S)
            .unwrap();
        let from = ma[src_off..src_off + len].to_vec();
        let target = if to_b { &mut mb } else { &mut ma };
        target[dst_off..dst_off + len].copy_from_slice(&from);
        assert_eq!(read(&dev, a, LEN), ma, "{to_b} {dst_off} {src_off} {len}");
        assert_eq!(read(&dev, b, LEN), mb, "{to_b} {dst_off} {src_off} {len}");
    }
    // A range must lie inside one allocation.
    let err = dev.copy_on_device(b, a + 1024, 2048, S).unwrap_err();
    assert!(
        matches!(&err, DeviceError::InvalidAddress { what, .. } if what.contains("inside one allocation")),
        "{err}"
    );
    let err = dev.copy_to_device(b + 2000, &[0; 100], S).unwrap_err();
    assert!(matches!(err, DeviceError::InvalidAddress { .. }), "{err}");
    let err = dev.copy_to_host(&mut [0; 4], 1 << 20, S).unwrap_err();
    assert!(matches!(err, DeviceError::InvalidAddress { .. }), "{err}");
    assert_eq!(read(&dev, b, LEN), mb, "failed copies changed nothing");
    dev.free(a).unwrap();
    dev.free(b).unwrap();
    let err = dev.copy_on_device(b, a, 4, S).unwrap_err();
    assert!(matches!(err, DeviceError::InvalidAddress { .. }), "{err}");
    assert_empty(&dev);
}

#[test]
fn events_are_submissions_and_async_copies_finish_with_them() {
    let Some(dev) = open_with_limit(64 * MIB) else {
        return;
    };
    assert_eq!(dev.create_stream().unwrap(), StreamId::DEFAULT);
    let event = dev.record_event(StreamId(5)).unwrap();
    dev.wait_event(event).unwrap();
    assert!(dev.event_completed(event).unwrap());
    dev.destroy_event(event).unwrap();
    assert!(matches!(
        dev.event_completed(event),
        Err(DeviceError::UnknownHandle { kind: "event", .. })
    ));
    let event = dev.record_event(S).unwrap();
    let mut polls = 0;
    while !dev.event_completed(event).unwrap() {
        polls += 1;
        assert!(polls < 1_000_000, "the event never completes");
        std::thread::yield_now();
    }
    dev.destroy_event(event).unwrap();

    const LEN: usize = 100_003;
    let (a, b) = (
        dev.malloc(LEN as u64).unwrap(),
        dev.malloc(LEN as u64).unwrap(),
    );
    let bytes = pattern(20, LEN);
    let mut host = dev.alloc_pinned(LEN).unwrap();
    host.copy_from_slice(&bytes);
    let host = dev
        .copy_to_device_async(a, host, S)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(&host[..], &bytes[..], "the source comes back untouched");
    let copied = dev.copy_on_device_async(b, a, 65_536, S).unwrap();
    let unaligned = dev
        .copy_on_device_async(b + 65_537, a + 3, 1_000, S)
        .unwrap();
    dev.wait_event(copied).unwrap();
    dev.wait_event(unaligned).unwrap();
    dev.destroy_event(copied).unwrap();
    dev.destroy_event(unaligned).unwrap();
    let mut expected = vec![0u8; LEN];
    expected[..65_536].copy_from_slice(&bytes[..65_536]);
    expected[65_537..66_537].copy_from_slice(&bytes[3..1_003]);

    // Read back asynchronously, at an unaligned offset, polling until done.
    let mut in_flight = dev
        .copy_to_host_async(dev.alloc_pinned(LEN - 1).unwrap(), b + 1, S)
        .unwrap();
    let back = loop {
        match in_flight.try_finish().unwrap() {
            Ok(buf) => break buf,
            Err(pending) => in_flight = pending,
        }
    };
    assert_eq!(&back[..], &expected[1..]);
    let whole = dev
        .copy_to_host_async(dev.alloc_pinned(LEN).unwrap(), b, S)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(&whole[..], &expected[..]);
    // Dropping an in-flight copy waits for it.
    drop(dev.copy_to_host_async(whole, a, S).unwrap());
    dev.synchronize().unwrap();
    dev.synchronize_stream(StreamId(3)).unwrap();
    dev.free(a).unwrap();
    dev.free(b).unwrap();
    assert_empty(&dev);
}

#[test]
fn addresses_resolve_to_buffer_ranges_that_compute_passes_bind() {
    let Some(dev) = open_with_limit(64 * MIB) else {
        return;
    };
    let ptr = dev.malloc(4096).unwrap();
    let other = dev.malloc(4096).unwrap();
    let range = dev.resolve(ptr + 512, 1024).unwrap();
    assert_eq!((range.base, range.offset, range.size), (ptr, 512, 1024));
    assert_eq!(range.buffer.size(), 4096);
    let whole = dev.resolve(ptr, 4096).unwrap();
    assert_eq!(whole.offset, 0);
    assert!(dev.resolve(ptr + 4000, 97).is_none(), "runs past the end");
    assert!(dev.resolve(ptr - 1, 1).is_none());
    assert!(dev.resolve(other, 1).unwrap().buffer != range.buffer);

    // A compute pass adds 1 to every u32 of the bound block only.
    let words: Vec<u32> = (0..1024).collect();
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    dev.copy_to_device(ptr, &bytes, S).unwrap();
    let gpu = dev.wgpu_device();
    let module = gpu.create_shader_module(gpumem_wgpu::wgpu::ShaderModuleDescriptor {
        label: None,
        source: gpumem_wgpu::wgpu::ShaderSource::Wgsl(
            "@group(0) @binding(0) var<storage, read_write> data: array<u32>;
             @compute @workgroup_size(64)
             fn main(@builtin(global_invocation_id) id: vec3<u32>) {
                 if (id.x < arrayLength(&data)) { data[id.x] = data[id.x] + 1u; }
             }"
            .into(),
        ),
    });
    use gpumem_wgpu::wgpu;
    let pipeline = gpu.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let bind = gpu.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(range.binding()),
        }],
    });
    let mut encoder = gpu.create_command_encoder(&Default::default());
    {
        let mut pass = encoder.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(1024 / 4 / 64, 1, 1);
    }
    dev.queue().submit([encoder.finish()]);
    // gpumem's events and copies are ordered after work submitted to the queue.
    let event = dev.record_event(S).unwrap();
    dev.wait_event(event).unwrap();
    dev.destroy_event(event).unwrap();
    let back = read(&dev, ptr, 4096);
    for (i, chunk) in back.chunks_exact(4).enumerate() {
        let w = u32::from_le_bytes(chunk.try_into().unwrap());
        let inside = (128..384).contains(&i);
        assert_eq!(w, i as u32 + u32::from(inside), "word {i}");
    }
    dev.free(ptr).unwrap();
    assert!(dev.resolve(ptr, 1).is_none(), "freed");
    dev.free(other).unwrap();
    assert_empty(&dev);
}

#[test]
fn requests_beyond_the_device_are_typed_errors_that_leak_nothing() {
    let Some(dev) = open_with_limit(16 * MIB) else {
        return;
    };
    let max = dev.limits().max_buffer_size;
    for size in [max + 1, u64::MAX] {
        let err = dev.malloc(size).unwrap_err();
        assert!(
            matches!(&err, DeviceError::InvalidValue(m) if m.contains("max_buffer_size")),
            "{err}"
        );
    }
    let held = dev.malloc(10 * MIB).unwrap();
    let err = dev.malloc(7 * MIB).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(
        matches!(err, DeviceError::OutOfMemory { requested: Some(r), info: Some(i), .. }
            if r == 7 * MIB && i.free == 6 * MIB && i.total == 16 * MIB)
    );
    assert_eq!(dev.allocated(), 10 * MIB, "the refusal took nothing");
    let fits = dev.malloc(6 * MIB).unwrap();
    dev.free(held).unwrap();
    dev.free(fits).unwrap();
    assert_empty(&dev);

    // Through an Arc<dyn Device>, as a pool holds it.
    let shared: Arc<dyn Device> = dev.clone();
    assert!(shared.malloc(17 * MIB).unwrap_err().is_out_of_memory());
    assert_empty(&dev);
}

#[test]
fn threads_share_one_device() {
    let Some(dev) = open_with_limit(256 * MIB) else {
        return;
    };
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                for i in 0..16u64 {
                    let len = 1 + ((t * 7919 + i * 104_729) % 70_000) as usize;
                    let ptr = dev.malloc(len as u64).unwrap();
                    let bytes = pattern(t * 100 + i, len);
                    dev.copy_to_device(ptr, &bytes, S).unwrap();
                    let event = dev.record_event(StreamId(t)).unwrap();
                    let mut host = dev.alloc_pinned(len).unwrap();
                    host.fill(0);
                    let back = dev
                        .copy_to_host_async(host, ptr, S)
                        .unwrap()
                        .wait()
                        .unwrap();
                    assert!(back[..] == bytes[..], "thread {t}, round {i}");
                    dev.wait_event(event).unwrap();
                    dev.destroy_event(event).unwrap();
                    dev.free(ptr).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_empty(&dev);
}
