//! The hazard checker over the simulated device: each hazard it exists for is found, and the
//! orderings that make memory safe again (synchronisation, events, `free`) clear it.

use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::{Device, HazardChecker, HazardKind, StreamId};

const MIB: u64 = 1 << 20;

/// A checker over an address-only simulated device whose declared kernels are queued on it.
fn checker() -> HazardChecker {
    let sim = Arc::new(SimDevice::new(SimConfig::address_only(1 << 30)).unwrap());
    let work = sim.clone();
    HazardChecker::new(sim).with_work(Box::new(move |stream, ns| {
        work.enqueue_timed_work(stream, ns)
    }))
}

fn kinds(checker: &HazardChecker) -> Vec<HazardKind> {
    checker.take_hazards().into_iter().map(|h| h.kind).collect()
}

#[test]
fn unmapping_memory_under_queued_work_is_a_hazard_until_the_host_has_waited() {
    let dev = checker();
    let vmm = dev.vmm().unwrap();
    let va = vmm.reserve(8 * MIB).unwrap();
    let chunk = vmm.create_physical(2 * MIB).unwrap();
    vmm.map(va, chunk).unwrap();
    dev.set_context("step 3, free of block 7");
    dev.launch(StreamId::DEFAULT, &[(va, MIB)], 1000, 7)
        .unwrap();
    vmm.unmap(va, 2 * MIB).unwrap();
    let hazards = dev.take_hazards();
    assert_eq!(hazards.len(), 1);
    assert_eq!(hazards[0].kind, HazardKind::UnmappedInFlight);
    assert_eq!(hazards[0].in_flight, Some((StreamId::DEFAULT, 7)));
    let text = hazards[0].to_string();
    assert!(
        text.contains("work labelled 7") && text.contains("step 3"),
        "{text}"
    );

    vmm.map(va, chunk).unwrap();
    dev.launch(StreamId::DEFAULT, &[(va, MIB)], 1000, 8)
        .unwrap();
    dev.synchronize_stream(StreamId::DEFAULT).unwrap();
    vmm.unmap(va, 2 * MIB).unwrap();
    assert!(kinds(&dev).is_empty(), "the host waited for the stream");
}

#[test]
fn an_event_the_host_saw_complete_orders_the_unmap() {
    let dev = checker();
    let vmm = dev.vmm().unwrap();
    let va = vmm.reserve(2 * MIB).unwrap();
    let chunk = vmm.create_physical(2 * MIB).unwrap();
    vmm.map(va, chunk).unwrap();
    dev.launch(StreamId::DEFAULT, &[(va, 4096)], 1000, 1)
        .unwrap();
    let event = dev.record_event(StreamId::DEFAULT).unwrap();
    assert!(
        !dev.event_completed(event).unwrap(),
        "the simulated kernel is still queued"
    );
    dev.wait_event(event).unwrap();
    vmm.unmap(va, 2 * MIB).unwrap();
    assert!(kinds(&dev).is_empty());
    assert_eq!(dev.synchronizations(), 1);
}

#[test]
fn reuse_on_another_stream_needs_an_event_between() {
    let dev = checker();
    let (a, b) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let ptr = dev.malloc(4 * MIB).unwrap();
    dev.launch(a, &[(ptr, MIB)], 1000, 1).unwrap();
    dev.launch(b, &[(ptr + MIB / 2, MIB)], 1000, 2).unwrap();
    assert_eq!(kinds(&dev), [HazardKind::ReusedAcrossStreams]);

    // Stream b waits for a's event: ordered, no hazard.
    dev.launch(a, &[(ptr + 2 * MIB, MIB)], 1000, 3).unwrap();
    let event = dev.record_event(a).unwrap();
    dev.stream_wait_event(b, event).unwrap();
    dev.launch(b, &[(ptr + 2 * MIB, MIB)], 1000, 4).unwrap();
    assert!(kinds(&dev).is_empty());
    // Memory disjoint from any earlier use is free to use anywhere.
    dev.launch(a, &[(ptr + 3 * MIB + 4096, 4096)], 1000, 5)
        .unwrap();
    assert!(kinds(&dev).is_empty());
}

#[test]
fn a_chunk_mapped_twice_is_one_piece_of_memory() {
    let dev = checker();
    let (a, b) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let vmm = dev.vmm().unwrap();
    let (va1, va2) = (vmm.reserve(2 * MIB).unwrap(), vmm.reserve(2 * MIB).unwrap());
    let chunk = vmm.create_physical(2 * MIB).unwrap();
    vmm.map(va1, chunk).unwrap();
    dev.launch(a, &[(va1, 2 * MIB)], 1000, 1).unwrap();
    // Stitching: the chunk moves under another address of another stream.
    vmm.map(va2, chunk).unwrap();
    dev.launch(b, &[(va2, MIB)], 1000, 2).unwrap();
    assert_eq!(kinds(&dev), [HazardKind::ReusedAcrossStreams]);
    // The old address is unmapped once a's work is known complete: no hazard. The new
    // mapping's pending use (stream b) does not make the old address's unmap unsafe.
    let event = dev.record_event(a).unwrap();
    dev.wait_event(event).unwrap();
    vmm.unmap(va1, 2 * MIB).unwrap();
    assert!(kinds(&dev).is_empty());
}

#[test]
fn free_synchronises_and_unbacked_addresses_are_illegal() {
    let dev = checker();
    let s = dev.create_stream().unwrap();
    let ptr = dev.malloc(MIB).unwrap();
    dev.launch(s, &[(ptr, MIB)], 1000, 1).unwrap();
    dev.free(ptr).unwrap();
    assert!(kinds(&dev).is_empty(), "cudaFree waits for the device");
    assert_eq!(dev.synchronizations(), 1);
    dev.launch(s, &[(ptr, 16)], 1000, 2).unwrap();
    assert_eq!(kinds(&dev), [HazardKind::IllegalAddress]);
    let vmm = dev.vmm().unwrap();
    let va = vmm.reserve(4 * MIB).unwrap();
    let chunk = vmm.create_physical(2 * MIB).unwrap();
    vmm.map(va, chunk).unwrap();
    dev.launch(s, &[(va + MIB, 2 * MIB)], 1000, 3).unwrap();
    assert_eq!(
        kinds(&dev),
        [HazardKind::IllegalAddress],
        "the second page is not mapped"
    );
}

#[test]
fn copies_are_uses_and_synchronous_ones_wait() {
    let sim = Arc::new(SimDevice::new(SimConfig::host(64 * MIB)).unwrap());
    let dev = HazardChecker::new(sim);
    let s = dev.create_stream().unwrap();
    let vmm = dev.vmm().unwrap();
    let va = vmm.reserve(2 * MIB).unwrap();
    let chunk = vmm.create_physical(2 * MIB).unwrap();
    vmm.map(va, chunk).unwrap();
    let buffer = dev.alloc_pinned(4096).unwrap();
    let in_flight = dev.copy_to_device_async(va, buffer, s).unwrap();
    drop(in_flight);
    vmm.unmap(va, 2 * MIB).unwrap();
    assert_eq!(
        kinds(&dev),
        [HazardKind::UnmappedInFlight],
        "the checker never saw the copy complete"
    );
    vmm.map(va, chunk).unwrap();
    dev.copy_to_device(va, &[1; 4096], s).unwrap();
    vmm.unmap(va, 2 * MIB).unwrap();
    assert!(kinds(&dev).is_empty(), "a synchronous copy has completed");
}
