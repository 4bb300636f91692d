//! The device contract: what every backend's [`Device`] and [`VirtualMemory`] calls do, and
//! which calls they refuse.

use gpumem_device::{Device, DevicePtr, StreamId, VirtualMemory};

use super::{ensure, pattern, refused, Check, Offers, Step, Subject};

const MIB: u64 = 1 << 20;

/// `vmm()`, `create_stream` and copies are as the backend says.
pub(super) fn offers(subject: Subject, offers: Offers) -> Check {
    let dev = subject.device;
    ensure(dev.vmm().is_some() == offers.vmm, || {
        format!(
            "vmm() is {}, but the backend says VMM is {}",
            if dev.vmm().is_some() { "Some" } else { "None" },
            if offers.vmm { "offered" } else { "absent" }
        )
    })?;
    let (a, b) = (
        dev.create_stream().step("create_stream")?,
        dev.create_stream().step("create_stream")?,
    );
    let several = a != b && a != StreamId::DEFAULT && b != StreamId::DEFAULT;
    ensure(several == offers.streams, || {
        format!(
            "create_stream gave {a:?} and {b:?}, but the backend says it has {}",
            if offers.streams {
                "several streams"
            } else {
                "one queue"
            }
        )
    })?;
    dev.destroy_stream(a).step("destroy_stream")?;
    dev.destroy_stream(b).step("destroy_stream")?;
    let ptr = dev.malloc(64).step("malloc(64)")?;
    let copied = dev.copy_to_device(ptr, &[7; 64], StreamId::DEFAULT);
    dev.free(ptr).step("free")?;
    ensure(copied.is_ok() == offers.copies, || match copied {
        Ok(()) => "copy_to_device works, but the backend says it has no copies".into(),
        Err(e) => format!("the backend says it copies, but copy_to_device failed: {e}"),
    })
}

/// Memory comes and goes, allocations do not overlap, and `mem_info` accounts for them.
pub(super) fn malloc_and_free(subject: Subject, _: Offers) -> Check {
    let dev = subject.device;
    let before = dev.mem_info().step("mem_info")?;
    ensure(before.total > 0 && before.free <= before.total, || {
        format!("mem_info before any allocation: {before:?}")
    })?;
    let size = (before.free / 8).min(64 * MIB);
    ensure(size >= MIB, || {
        format!("too little free memory: {before:?}")
    })?;
    let ptr = dev.malloc(size).step("malloc")?;
    ensure(ptr != 0, || "malloc returned a null pointer".into())?;
    let during = dev.mem_info().step("mem_info")?;
    ensure(during.total == before.total, || {
        format!("total memory changed: {before:?} -> {during:?}")
    })?;
    ensure(during.free + size <= before.free, || {
        format!("{size} bytes allocated, but free memory went {before:?} -> {during:?}")
    })?;
    let odd = dev.malloc(1000 + 3).step("malloc(1003)")?;
    let disjoint = odd + 1003 <= ptr || ptr + size <= odd;
    ensure(disjoint, || {
        format!("[{odd:#x}, +1003) overlaps [{ptr:#x}, +{size}), both live")
    })?;
    dev.free(odd).step("free(1003-byte allocation)")?;
    dev.free(ptr).step("free")?;
    let after = dev.mem_info().step("mem_info")?;
    ensure(after.free >= during.free + size, || {
        format!("{size} bytes freed, but free memory went {during:?} -> {after:?}")
    })
}

/// `malloc(0)` is an error.
pub(super) fn zero_size_malloc(subject: Subject, _: Offers) -> Check {
    refused(subject.device.malloc(0), "malloc(0)")
}

/// Frees of pointers the device did not hand out, or no longer holds, are errors.
pub(super) fn foreign_frees(subject: Subject, _: Offers) -> Check {
    let dev = subject.device;
    let ptr = dev.malloc(4096).step("malloc")?;
    refused(
        dev.free(ptr + 256),
        "free of a pointer inside an allocation",
    )?;
    refused(
        dev.free(0x0dea_dbee_f000),
        "free of an address never allocated",
    )?;
    dev.free(ptr).step("free")?;
    refused(dev.free(ptr), "a second free of the same pointer")?;
    // The device still works.
    let again = dev.malloc(4096).step("malloc after refused frees")?;
    dev.free(again).step("free")
}

/// Streams are made and destroyed; work on them is synchronised.
pub(super) fn streams(subject: Subject, _: Offers) -> Check {
    let dev = subject.device;
    let made: Vec<StreamId> = (0..3)
        .map(|_| dev.create_stream())
        .collect::<Result<_, _>>()
        .step("create_stream")?;
    for &stream in &made {
        dev.synchronize_stream(stream).step("synchronize_stream")?;
    }
    for stream in made {
        dev.destroy_stream(stream).step("destroy_stream")?;
    }
    dev.synchronize().step("synchronize")
}

/// Events on the default and a created stream: recorded, queried, waited for, awaited by
/// another stream, destroyed.
pub(super) fn events(subject: Subject, offers: Offers) -> Check {
    let dev = subject.device;
    let (s1, s2) = (
        dev.create_stream().step("create_stream")?,
        dev.create_stream().step("create_stream")?,
    );
    for stream in [StreamId::DEFAULT, s1] {
        let event = dev.record_event(stream).step("record_event")?;
        dev.event_completed(event).step("event_completed")?;
        dev.wait_event(event).step("wait_event")?;
        let done = dev.event_completed(event).step("event_completed")?;
        ensure(done, || {
            format!("an event on {stream:?} is not complete after wait_event")
        })?;
        dev.destroy_event(event).step("destroy_event")?;
    }
    // Work on s2 ordered after s1's: what s1 wrote, s2 reads.
    let ptr = dev.malloc(4096).step("malloc")?;
    let data = pattern(1, 4096);
    if offers.copies {
        dev.copy_to_device(ptr, &data, s1).step("copy_to_device")?;
    }
    let written = dev.record_event(s1).step("record_event")?;
    dev.stream_wait_event(s2, written)
        .step("stream_wait_event")?;
    dev.destroy_event(written).step("destroy_event")?;
    if offers.copies {
        let mut back = vec![0u8; 4096];
        dev.copy_to_host(&mut back, ptr, s2).step("copy_to_host")?;
        ensure(back == data, || {
            "bytes written on one stream differ when read on another after its event".into()
        })?;
    }
    dev.synchronize_stream(s2).step("synchronize_stream")?;
    dev.synchronize().step("synchronize")?;
    dev.free(ptr).step("free")?;
    dev.destroy_stream(s1).step("destroy_stream")?;
    dev.destroy_stream(s2).step("destroy_stream")
}

/// Reads `len` bytes at `ptr` on the default stream.
fn read(dev: &dyn Device, ptr: DevicePtr, len: usize) -> Result<Vec<u8>, String> {
    let mut back = vec![0u8; len];
    dev.copy_to_host(&mut back, ptr, StreamId::DEFAULT)
        .step("copy_to_host")?;
    Ok(back)
}

/// Synchronous and asynchronous copies of any offset and length keep the bytes around them;
/// copies outside allocations are refused.
pub(super) fn copies(subject: Subject, _: Offers) -> Check {
    let dev = subject.device;
    let s = StreamId::DEFAULT;
    let len = 3 * 4096 + 123;
    let room = len as u64 + 64;
    let (a, b) = (
        dev.malloc(room).step("malloc")?,
        dev.malloc(room).step("malloc")?,
    );
    let under = pattern(2, room as usize);
    let data = pattern(3, len);
    dev.copy_to_device(a, &under, s).step("copy_to_device")?;
    dev.copy_to_device(a + 3, &data, s)
        .step("copy_to_device at an odd offset")?;
    let mut expected = under.clone();
    expected[3..3 + len].copy_from_slice(&data);
    ensure(read(dev.as_ref(), a, room as usize)? == expected, || {
        format!("a copy of {len} bytes to offset 3 did not land exactly there")
    })?;
    dev.copy_on_device(b + 1, a + 3, len as u64, s)
        .step("copy_on_device")?;
    ensure(read(dev.as_ref(), b + 1, len)? == data, || {
        "copy_on_device changed the bytes".into()
    })?;
    let mut staging = dev.alloc_pinned(len).step("alloc_pinned")?;
    staging.copy_from_slice(&pattern(4, len));
    let staging = dev
        .copy_to_device_async(b, staging, s)
        .step("copy_to_device_async")?
        .wait()
        .step("waiting for copy_to_device_async")?;
    let back = dev
        .copy_to_host_async(dev.alloc_pinned(len).step("alloc_pinned")?, b, s)
        .step("copy_to_host_async")?
        .wait()
        .step("waiting for copy_to_host_async")?;
    ensure(back[..] == staging[..], || {
        "asynchronous copies changed the bytes".into()
    })?;
    refused(
        dev.copy_to_device(a + room - 4, &[0; 8], s),
        "a copy running past the end of an allocation",
    )?;
    dev.free(a).step("free")?;
    refused(
        dev.copy_to_host(&mut [0; 8], a, s),
        "a copy from freed memory",
    )?;
    dev.free(b).step("free")
}

/// The device's VMM (the scenario runs only where it is offered).
fn vmm_of(dev: &dyn Device) -> Result<&dyn VirtualMemory, String> {
    dev.vmm()
        .ok_or_else(|| "vmm() is None on a backend that offers VMM".into())
}

/// Reserve, create, map; a chunk mapped at two addresses shows the same bytes (with copies);
/// released while mapped, its memory goes back after the last unmap.
pub(super) fn vmm_round_trip(subject: Subject, offers: Offers) -> Check {
    let dev = subject.device;
    let vmm = vmm_of(dev.as_ref())?;
    let g = vmm.granularity();
    ensure(g.is_power_of_two(), || format!("granularity {g}"))?;
    let before = dev.mem_info().step("mem_info")?;
    let va = vmm.reserve(4 * g).step("reserve")?;
    ensure(va % g == 0, || {
        format!("reservation {va:#x} not aligned to {g}")
    })?;
    let h1 = vmm.create_physical(g).step("create_physical")?;
    let h2 = vmm.create_physical(2 * g).step("create_physical")?;
    let during = dev.mem_info().step("mem_info")?;
    ensure(during.free + 3 * g <= before.free, || {
        format!("chunks of {} bytes made: {before:?} -> {during:?}", 3 * g)
    })?;
    vmm.map(va, h1).step("map")?;
    vmm.map(va + g, h2).step("map")?;
    let va2 = vmm.reserve(2 * g).step("reserve")?;
    vmm.map(va2, h2)
        .step("map of a chunk already mapped elsewhere")?;
    if offers.copies {
        // Across the boundary between the two chunks, then through the second mapping.
        let data = pattern(5, 8192);
        dev.copy_to_device(va + g - 4096, &data, StreamId::DEFAULT)
            .step("copy_to_device across two mappings")?;
        ensure(read(dev.as_ref(), va + g - 4096, 8192)? == data, || {
            "bytes across two mappings changed".into()
        })?;
        ensure(read(dev.as_ref(), va2, 4096)? == data[4096..], || {
            "a chunk mapped at two addresses shows different bytes".into()
        })?;
        let more = pattern(6, 4096);
        dev.copy_to_device(va2 + 4096, &more, StreamId::DEFAULT)
            .step("copy_to_device")?;
        ensure(read(dev.as_ref(), va + g + 4096, 4096)? == more, || {
            "bytes written through one mapping are not seen through the other".into()
        })?;
        vmm.release_physical(h2)
            .step("release_physical while mapped")?;
        ensure(read(dev.as_ref(), va2, 4096)? == data[4096..], || {
            "a chunk released while mapped lost its bytes before its unmap".into()
        })?;
    } else {
        vmm.release_physical(h2)
            .step("release_physical while mapped")?;
    }
    vmm.unmap(va + g, 2 * g).step("unmap")?;
    vmm.unmap(va2, 2 * g).step("unmap")?;
    vmm.unmap(va, g).step("unmap")?;
    vmm.release_physical(h1).step("release_physical")?;
    vmm.release_reservation(va, 4 * g)
        .step("release_reservation")?;
    vmm.release_reservation(va2, 2 * g)
        .step("release_reservation")?;
    let after = dev.mem_info().step("mem_info")?;
    ensure(after.free >= before.free, || {
        format!("every chunk unmapped and released: {before:?} -> {after:?}")
    })
}

/// VMM calls on wrong sizes, ranges and handles are refused, and leave the device usable.
pub(super) fn vmm_refusals(subject: Subject, _: Offers) -> Check {
    let dev = subject.device;
    let vmm = vmm_of(dev.as_ref())?;
    let g = vmm.granularity();
    let before = dev.mem_info().step("mem_info")?;
    refused(vmm.reserve(0), "reserve(0)")?;
    refused(
        vmm.reserve(g + 1),
        "a reservation not a multiple of the granularity",
    )?;
    refused(vmm.create_physical(0), "create_physical(0)")?;
    refused(
        vmm.create_physical(g + 1),
        "a chunk not a multiple of the granularity",
    )?;
    let va = vmm.reserve(4 * g).step("reserve")?;
    let h1 = vmm.create_physical(g).step("create_physical")?;
    let h2 = vmm.create_physical(2 * g).step("create_physical")?;
    refused(vmm.map(va + g / 2, h1), "a map at an unaligned address")?;
    refused(vmm.map(va + 4 * g, h1), "a map outside every reservation")?;
    refused(
        vmm.map(va + 3 * g, h2),
        "a map running past its reservation",
    )?;
    vmm.map(va, h1).step("map")?;
    vmm.map(va + g, h2).step("map")?;
    refused(vmm.map(va, h2), "a map over a mapping")?;
    refused(vmm.unmap(va + g, g), "an unmap of part of a mapping")?;
    refused(vmm.unmap(va + 3 * g, g), "an unmap where nothing is mapped")?;
    refused(
        vmm.release_reservation(va, 4 * g),
        "release_reservation with mappings inside",
    )?;
    vmm.unmap(va, 3 * g).step("unmap of two mappings at once")?;
    refused(
        vmm.release_reservation(va, 2 * g),
        "release_reservation of the wrong size",
    )?;
    vmm.release_physical(h1).step("release_physical")?;
    refused(vmm.release_physical(h1), "a second release_physical")?;
    refused(vmm.map(va, h1), "a map of a released chunk")?;
    vmm.release_physical(h2).step("release_physical")?;
    vmm.release_reservation(va, 4 * g)
        .step("release_reservation")?;
    refused(
        vmm.release_reservation(va, 4 * g),
        "a second release_reservation",
    )?;
    let after = dev.mem_info().step("mem_info")?;
    ensure(after.free >= before.free, || {
        format!("memory not given back after refused VMM calls: {before:?} -> {after:?}")
    })
}
