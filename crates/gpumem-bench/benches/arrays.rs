//! (d) gpumem-array against the backend it runs on, side by side in one run, on the simulated
//! device, on wgpu (Mesa's lavapipe here) and on CUDA device 0 (each skipped with a note when
//! it does not open):
//!
//! - `upload/…`, `download/…`: 16 MiB between page-locked (`alloc_pinned`) host memory and
//!   the device, through a `DeviceArray` (`copy_from_slice`, `copy_to_host`) against the
//!   backend's raw `copy_to_device` / `copy_to_host` on the same memory (goal ≥ 95 % of raw);
//! - `alloc-free/…`: a 1 MiB `DeviceArray::empty` and its drop (through the pool) against the
//!   backend's raw `malloc` + `free`;
//! - `batches/…`: 8 batches of 4 MiB through `DeviceContext::batches` against uploading each
//!   batch synchronously with `upload`, both until the device has finished every copy (wall
//!   time: the machinery's cost; the overlap itself is measured on the simulated device's
//!   virtual clocks, printed at the end).
//!
//! `cargo bench -p gpumem-bench --bench arrays` (filter: `-- sim`, `-- wgpu`, …).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use gpumem_array::prelude::*;
use gpumem_bench::report::Recorder;
use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::{Device, StreamId};
use gpumem_pool::{Pool, PoolConfig};

const SAMPLES: usize = 10;
const MIB: usize = 1 << 20;
const COPY_BYTES: usize = 16 * MIB;
const BATCH_BYTES: usize = 4 * MIB;
const BATCHES: usize = 8;

fn main() {
    let mut c = Criterion::default()
        .sample_size(SAMPLES)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    let bytes = Recorder::default();
    let mut interleaved_rows = Vec::new();
    let ops = Recorder::default();
    let batches = Recorder::default();
    for (name, device) in devices() {
        let gpu = DeviceContext::new(Arc::new(
            Pool::new(device.clone(), PoolConfig::default()).expect("pool"),
        ));
        copies(&mut c, &bytes, name, &gpu);
        interleaved_rows.extend(interleaved_copies(name, &gpu));
        alloc_free(&mut c, &ops, name, &gpu);
        batch_iteration(&mut c, &batches, name, &gpu);
    }
    c.final_summary();
    println!("\nArrays against the raw backend (median of criterion's {SAMPLES} samples):");
    println!("{}", bytes.markdown(SAMPLES, "raw", "byte"));
    println!(
        "\nThe same copies interleaved ({ROUNDS} rounds, alternating which goes first; robust to \
         the load of a shared machine drifting between criterion's groups):\n\n\
         | copy | raw | array | array / raw time |\n|---|---:|---:|---:|"
    );
    for row in &interleaved_rows {
        println!("{row}");
    }
    println!("{}", ops.markdown(SAMPLES, "raw", "op"));
    println!("{}", batches.markdown(SAMPLES, "upload", "batch"));
    println!("\n{}", virtual_overlap());
}

/// The simulated device, wgpu when an adapter opens, CUDA device 0 when a driver and GPU are
/// there.
fn devices() -> Vec<(&'static str, Arc<dyn Device>)> {
    let sim = SimDevice::new(SimConfig::host(4 << 30)).expect("sim");
    let mut devices: Vec<(&'static str, Arc<dyn Device>)> = vec![("sim", Arc::new(sim))];
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
    let options = gpumem_wgpu::WgpuOptions {
        memory_limit: Some(1 << 30),
        ..Default::default()
    };
    match gpumem_wgpu::WgpuDevice::open(options) {
        Ok(device) => devices.push(("wgpu", Arc::new(device))),
        Err(e) => eprintln!("wgpu benchmarks skipped: no adapter ({e})"),
    }
    match gpumem_cuda::CudaDevice::open(0) {
        Ok(device) => devices.push(("cuda", Arc::new(device))),
        Err(e) => eprintln!("CUDA benchmarks skipped: {e}"),
    }
    devices
}

/// Times `iters` runs of `f` and records them under `group`/`id`.
fn timed(
    recorder: &Recorder,
    group: &str,
    id: &str,
    elements: u64,
    iters: u64,
    mut f: impl FnMut(),
) -> Duration {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    let elapsed = t.elapsed();
    recorder.record(group, id, iters, elapsed, elements);
    elapsed
}

fn copies(c: &mut Criterion, recorder: &Recorder, name: &str, gpu: &DeviceContext) {
    let device = gpu.device();
    let raw = device.malloc(COPY_BYTES as u64).expect("malloc");
    let mut raw_host = device.alloc_pinned(COPY_BYTES).expect("pinned");
    raw_host.fill(7);
    let mut array = DeviceArray::<u32>::zeros(gpu, &[COPY_BYTES / 4]).expect("array");
    let mut host = PinnedHostArray::<u32>::zeros(gpu, &[COPY_BYTES / 4]).expect("pinned");
    host.as_mut_slice().fill(7);
    let n = COPY_BYTES as u64;
    let s = StreamId::DEFAULT;

    let group_name = format!("upload/{name}/16MiB");
    let mut group = c.benchmark_group(&group_name);
    group.bench_function(BenchmarkId::from_parameter("raw"), |b| {
        b.iter_custom(|iters| {
            timed(recorder, &group_name, "raw", n, iters, || {
                device.copy_to_device(raw, &raw_host, s).expect("copy")
            })
        })
    });
    group.bench_function(BenchmarkId::from_parameter("array"), |b| {
        b.iter_custom(|iters| {
            timed(recorder, &group_name, "array", n, iters, || {
                array.copy_from_slice(host.as_slice()).expect("copy")
            })
        })
    });
    let block = array.device_ptr();
    group.bench_function(BenchmarkId::from_parameter("raw-pool-block"), |b| {
        b.iter_custom(|iters| {
            timed(recorder, &group_name, "raw-pool-block", n, iters, || {
                device.copy_to_device(block, &raw_host, s).expect("copy")
            })
        })
    });
    group.finish();

    let group_name = format!("download/{name}/16MiB");
    let mut group = c.benchmark_group(&group_name);
    group.bench_function(BenchmarkId::from_parameter("raw"), |b| {
        b.iter_custom(|iters| {
            timed(recorder, &group_name, "raw", n, iters, || {
                device.copy_to_host(&mut raw_host, raw, s).expect("copy")
            })
        })
    });
    group.bench_function(BenchmarkId::from_parameter("array"), |b| {
        b.iter_custom(|iters| {
            timed(recorder, &group_name, "array", n, iters, || {
                array.copy_to_host(host.as_mut_slice()).expect("copy")
            })
        })
    });
    group.finish();
    device.free(raw).expect("free");
}

/// Rounds of the interleaved comparison.
const ROUNDS: u32 = 100;

/// Upload and download of 16 MiB, raw and through an array, interleaved: one Markdown row each.
fn interleaved_copies(name: &str, gpu: &DeviceContext) -> Vec<String> {
    let device = gpu.device();
    let raw = device.malloc(COPY_BYTES as u64).expect("malloc");
    let mut raw_host = device.alloc_pinned(COPY_BYTES).expect("pinned");
    let mut array = DeviceArray::<u32>::zeros(gpu, &[COPY_BYTES / 4]).expect("array");
    let mut host = PinnedHostArray::<u32>::zeros(gpu, &[COPY_BYTES / 4]).expect("pinned");
    raw_host.fill(7);
    host.as_mut_slice().fill(7);
    let s = StreamId::DEFAULT;
    let mut rows = Vec::new();
    let (raw_up, array_up) = alternate(
        || device.copy_to_device(raw, &raw_host, s).expect("copy"),
        || array.copy_from_slice(host.as_slice()).expect("copy"),
    );
    rows.push(row(name, "upload", raw_up, array_up));
    let (raw_down, array_down) = alternate(
        || device.copy_to_host(&mut raw_host, raw, s).expect("copy"),
        || array.copy_to_host(host.as_mut_slice()).expect("copy"),
    );
    rows.push(row(name, "download", raw_down, array_down));
    device.free(raw).expect("free");
    rows
}

/// Total time of `ROUNDS` calls of each, alternating which goes first.
fn alternate(mut a: impl FnMut(), mut b: impl FnMut()) -> (Duration, Duration) {
    let (mut ta, mut tb) = (Duration::ZERO, Duration::ZERO);
    let time = |f: &mut dyn FnMut(), total: &mut Duration| {
        let t = Instant::now();
        f();
        *total += t.elapsed();
    };
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            time(&mut a, &mut ta);
            time(&mut b, &mut tb);
        } else {
            time(&mut b, &mut tb);
            time(&mut a, &mut ta);
        }
    }
    (ta, tb)
}

fn row(name: &str, what: &str, raw: Duration, array: Duration) -> String {
    let rate = |d: Duration| {
        let bytes = f64::from(ROUNDS) * COPY_BYTES as f64;
        format!("{:.0} MB/s", bytes / d.as_secs_f64() / 1e6)
    };
    format!(
        "| {what} {name} 16 MiB | {} | {} | {:.2}× |",
        rate(raw),
        rate(array),
        array.as_secs_f64() / raw.as_secs_f64()
    )
}

fn alloc_free(c: &mut Criterion, recorder: &Recorder, name: &str, gpu: &DeviceContext) {
    let device = gpu.device();
    let group_name = format!("alloc-free/{name}/1MiB");
    let mut group = c.benchmark_group(&group_name);
    group.bench_function(BenchmarkId::from_parameter("raw"), |b| {
        b.iter_custom(|iters| {
            timed(recorder, &group_name, "raw", 1, iters, || {
                let ptr = device.malloc(MIB as u64).expect("malloc");
                device.free(black_box(ptr)).expect("free");
            })
        })
    });
    group.bench_function(BenchmarkId::from_parameter("pool"), |b| {
        b.iter_custom(|iters| {
            timed(recorder, &group_name, "pool", 1, iters, || {
                drop(black_box(
                    DeviceArray::<u8>::empty(gpu, &[MIB]).expect("array"),
                ));
            })
        })
    });
    group.finish();
}

#[derive(ToDevice)]
struct Batch {
    tokens: HostArray<u32>,
}

fn host_batches() -> Vec<Batch> {
    (0..BATCHES as u32)
        .map(|k| Batch {
            tokens: HostArray::from_vec(vec![k; BATCH_BYTES / 4]),
        })
        .collect()
}

fn batch_iteration(c: &mut Criterion, recorder: &Recorder, name: &str, gpu: &DeviceContext) {
    let host = host_batches();
    let group_name = format!("batches/{name}/8x4MiB");
    let mut group = c.benchmark_group(&group_name);
    let n = BATCHES as u64;
    group.bench_function(BenchmarkId::from_parameter("upload"), |b| {
        b.iter_custom(|iters| {
            timed(recorder, &group_name, "upload", n, iters, || {
                for batch in &host {
                    black_box(upload(gpu, batch).expect("upload"));
                }
                // A copy from pageable memory may return before its DMA ends: wait for every
                // copy, as the batch iterator does when it is dropped.
                gpu.device().synchronize().expect("synchronize");
            })
        })
    });
    group.bench_function(BenchmarkId::from_parameter("batches"), |b| {
        b.iter_custom(|iters| {
            timed(recorder, &group_name, "batches", n, iters, || {
                for batch in gpu.batches(&host).expect("batches") {
                    black_box(batch.expect("batch"));
                }
                gpu.device().synchronize().expect("synchronize");
            })
        })
    });
    group.finish();
}

/// The batch iterator's overlap on the simulated device's virtual clocks (deterministic):
/// 8 batches of 4 MiB at 10 GB/s (419 µs each) with 419 µs of compute each.
fn virtual_overlap() -> String {
    let config = SimConfig {
        copy_bandwidth: Some(10_000_000_000),
        ..SimConfig::host(1 << 30)
    };
    let copy_ns = (BATCH_BYTES as u64) * 1_000_000_000 / 10_000_000_000;
    let run = |prefetch: bool| {
        let device = Arc::new(SimDevice::new(config.clone()).expect("sim"));
        let pool = Arc::new(Pool::new(device.clone(), PoolConfig::default()).expect("pool"));
        let stream = device.create_stream().expect("stream");
        let gpu = DeviceContext::new(pool.clone()).on_stream(stream);
        let host = host_batches();
        let step = |_batch| device.enqueue_timed_work(stream, copy_ns).expect("work");
        if prefetch {
            gpu.batches(&host)
                .expect("batches")
                .for_each(|b| step(b.expect("batch")));
        } else {
            host.iter()
                .for_each(|b| step(upload(&gpu, b).expect("upload")));
        }
        device.synchronize().expect("sync");
        (device.elapsed_ns(), pool.stats().allocated_bytes.all.peak)
    };
    let ((serial, serial_peak), (overlapped, peak)) = (run(false), run(true));
    format!(
        "Batch iterator on the simulated device's virtual clocks (copy = compute = {} µs per batch):\n\
         | | time per batch | × max(copy, compute) | peak allocated |\n|---|---:|---:|---:|\n\
         | upload, then compute | {:.0} µs | {:.2}× | {} MiB |\n\
         | batches (double-buffered) | {:.0} µs | {:.2}× | {} MiB |",
        copy_ns / 1000,
        serial as f64 / BATCHES as f64 / 1000.0,
        serial as f64 / BATCHES as f64 / copy_ns as f64,
        serial_peak >> 20,
        overlapped as f64 / BATCHES as f64 / 1000.0,
        overlapped as f64 / BATCHES as f64 / copy_ns as f64,
        peak >> 20,
    )
}
