//! Native reader throughput (events/s) on a generated 10⁶-event trace, plus the RMM and
//! snapshot readers on the same trace for comparison.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpumem_trace::formats::{native, rmm};
use gpumem_trace::{Event, Trace, TraceMeta};

const EVENTS: usize = 1_000_000;

/// A trace shaped like a training loop: a working set of ~2000 live blocks of mixed sizes,
/// allocs and frees interleaved at random (fixed seed), a step marker every 10 000 events.
fn generated_trace() -> Trace {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut live: Vec<u64> = Vec::new();
    let mut next_addr = 0x7f00_0000_0000u64;
    let mut events = Vec::with_capacity(EVENTS);
    while events.len() < EVENTS {
        if events.len() % 10_000 == 0 {
            events.push(Event::Step {
                index: (events.len() / 10_000) as u64,
            });
        } else if live.len() < 1000 || (live.len() < 3000 && next() % 2 == 0) {
            let size = 512 << (next() % 16);
            events.push(Event::Alloc {
                addr: next_addr,
                size,
                stream: 0,
            });
            live.push(next_addr);
            next_addr += size;
        } else {
            let index = (next() % live.len() as u64) as usize;
            let addr = live.swap_remove(index);
            events.push(Event::Free { addr, stream: 0 });
        }
    }
    Trace::new(TraceMeta::default(), events)
}

fn readers(c: &mut Criterion) {
    let trace = generated_trace();
    let mut native_bytes = Vec::new();
    native::write_native(&trace, &mut native_bytes).unwrap();
    let mut rmm_bytes = Vec::new();
    rmm::write_rmm(&trace, &mut rmm_bytes).unwrap();
    let mut pickle_bytes = Vec::new();
    gpumem_trace::snapshot::from_trace(&trace, 0)
        .write_pickle(&mut pickle_bytes)
        .unwrap();

    let mut group = c.benchmark_group("read_1M_events");
    group.sample_size(10);
    group.throughput(Throughput::Elements(EVENTS as u64));
    group.bench_function("native", |b| {
        b.iter(|| native::read_native(black_box(native_bytes.as_slice())).unwrap())
    });
    group.bench_function("rmm", |b| {
        b.iter(|| rmm::read_rmm(black_box(rmm_bytes.as_slice())).unwrap())
    });
    group.bench_function("pytorch_pickle", |b| {
        b.iter(|| {
            gpumem_trace::snapshot::read_trace(black_box(pickle_bytes.as_slice()), None).unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, readers);
criterion_main!(benches);
