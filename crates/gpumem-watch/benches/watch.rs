//! What watching costs. (a) A process publishing its pools: one answer of its endpoint (what
//! `gpumem top`/`exporter`/`diagnose` ask once per interval), side by side with reading
//! `/proc/<pid>/stat` and `/proc/<pid>/status` (what process monitors read for every process
//! on every refresh); and the pool's allocate+free with the publisher on and off (the
//! allocation path must not pay). (b) The exporter with 8 GPUs × 32 processes (256 pools):
//! rendering the exposition, side by side with prometheus-client (the official Rust client)
//! setting and encoding the same series, and a whole HTTP scrape on loopback.
//!
//! `cargo bench -p gpumem-watch --bench watch` (docs/benchmarks.md has the figures).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::StreamId;
use gpumem_pool::{DeviceRegistry, Pool, PoolConfig};
use gpumem_watch::exporter::{render, Exporter};
use gpumem_watch::publish::Publisher;
use gpumem_watch::{synthetic, PoolEndpoints, Sample, SampleSource, WatchError};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A pool with 1000 live blocks of mixed sizes, like a training step's.
fn busy_pool() -> Arc<Pool> {
    let device = Arc::new(SimDevice::new(SimConfig::address_only(80 << 30)).unwrap());
    let pool = Arc::new(Pool::new(device, PoolConfig::default()).unwrap());
    for i in 0..1000u64 {
        // Never freed: live for the whole benchmark.
        pool.allocate((i % 37 + 1) << 16, StreamId::DEFAULT)
            .unwrap();
    }
    pool
}

fn publishing(c: &mut Criterion) {
    let registry: &'static DeviceRegistry = Box::leak(Box::new(DeviceRegistry::new()));
    let pool = busy_pool();
    registry.set(0, pool.clone());
    let dir = tempfile::tempdir().unwrap();
    let endpoints = PoolEndpoints::new(dir.path());
    let mut group = c.benchmark_group("publish");

    group.bench_function("allocate+free, publisher off", |b| {
        b.iter(|| {
            let a = pool.allocate(1 << 20, StreamId::DEFAULT).unwrap();
            pool.free(a.ptr).unwrap();
        })
    });
    let publisher = Publisher::start(dir.path(), registry).unwrap();
    group.bench_function("allocate+free, publisher on", |b| {
        b.iter(|| {
            let a = pool.allocate(1 << 20, StreamId::DEFAULT).unwrap();
            pool.free(a.ptr).unwrap();
        })
    });
    assert_eq!(endpoints.pools().unwrap().len(), 1);
    group.bench_function("one answer (gpumem endpoint, 1 pool)", |b| {
        b.iter(|| endpoints.pools().unwrap())
    });
    group.bench_function("peer: read /proc/pid/stat and status", |b| {
        b.iter(|| {
            let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            stat.len() + status.len()
        })
    });
    group.finish();
    drop(publisher);
}

/// The same sample on every scrape.
struct Repeat(Sample);

impl SampleSource for Repeat {
    fn next_sample(&mut self) -> Result<Option<Sample>, WatchError> {
        Ok(Some(self.0.clone()))
    }
}

type Labels = Vec<(String, String)>;
type GaugeFamily = Family<Labels, Gauge<f64, AtomicU64>>;

/// prometheus-client holding the same series as `render` writes: one family per metric, the
/// same labels, values set from the sample, then encoded.
fn prometheus_client_exposition(sample: &Sample) -> String {
    let mut registry = Registry::default();
    let gauge = GaugeFamily::default;
    let gpu_families: Vec<(&str, GaugeFamily)> = [
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    ]
    .into_iter()
    .map(|name| (name, gauge()))
    .collect();
    let pool_families: Vec<(&str, GaugeFamily)> = [
        "gpumem_pool_allocated_bytes",
        "gpumem_pool_reserved_bytes",
        "gpumem_pool_cached_bytes",
        "gpumem_pool_largest_free_block_bytes",
        "gpumem_pool_fragmentation_ratio",
        "gpumem_pool_ooms",
    ]
    .into_iter()
    .map(|name| (name, gauge()))
    .collect();
    let process = gauge();
    for gpu in &sample.gpus {
        let labels: Labels = vec![
            ("gpu".into(), gpu.index.to_string()),
            ("UUID".into(), gpu.uuid.clone()),
            ("pci_bus_id".into(), gpu.pci_bus_id.clone()),
            ("device".into(), format!("nvidia{}", gpu.index)),
            ("modelName".into(), gpu.name.clone()),
            ("Hostname".into(), sample.host.clone()),
        ];
        let mib = (1u64 << 20) as f64;
        let values = [
            gpu.memory_free() as f64 / mib,
            gpu.memory_used as f64 / mib,
            gpu.memory_total as f64 / mib,
            gpu.gpu_util,
            gpu.memory_util,
            gpu.power_watts,
            gpu.pcie_tx_bytes_per_s as f64,
            gpu.pcie_rx_bytes_per_s as f64,
        ];
        for ((_, family), value) in gpu_families.iter().zip(values) {
            family.get_or_create(&labels).set(value);
        }
        for p in &gpu.processes {
            let labels: Labels = vec![
                ("gpu".into(), gpu.index.to_string()),
                ("pid".into(), p.pid.to_string()),
                ("Hostname".into(), sample.host.clone()),
            ];
            process
                .get_or_create(&labels)
                .set(p.memory.unwrap_or(0) as f64);
        }
    }
    for pool in &sample.pools {
        let labels: Labels = vec![
            ("gpu".into(), pool.device.to_string()),
            ("pid".into(), pool.pid.to_string()),
            ("policy".into(), pool.policy.clone()),
            ("Hostname".into(), sample.host.clone()),
        ];
        let values = [
            pool.allocated as f64,
            pool.reserved as f64,
            pool.cached() as f64,
            pool.largest_free_block as f64,
            pool.fragmentation(),
            pool.num_ooms as f64,
        ];
        for ((_, family), value) in pool_families.iter().zip(values) {
            family.get_or_create(&labels).set(value);
        }
    }
    for (name, family) in gpu_families.into_iter().chain(pool_families) {
        registry.register(name, name, family);
    }
    registry.register("gpumem_process_memory_bytes", "memory", process);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    out
}

fn scrape(addr: &std::net::SocketAddr) -> usize {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut body = Vec::new();
    stream.read_to_end(&mut body).unwrap();
    body.len()
}

fn exporting(c: &mut Criterion) {
    let sample = synthetic::healthy_at(8, 32, 0);
    assert_eq!(sample.pools.len(), 256);
    let mut group = c.benchmark_group("exporter 8 GPUs x 32 processes");
    group.bench_function("render (gpumem)", |b| b.iter(|| render(&sample)));
    group.bench_function("peer: prometheus-client set + encode", |b| {
        b.iter(|| prometheus_client_exposition(&sample))
    });
    let exporter = Exporter::bind("127.0.0.1:0", Box::new(Repeat(sample.clone()))).unwrap();
    let addr = exporter.local_addr().unwrap();
    std::thread::spawn(move || exporter.serve(|w| panic!("{w}")));
    group.bench_function("HTTP scrape on loopback (gpumem exporter)", |b| {
        b.iter(|| scrape(&addr))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3));
    targets = publishing, exporting
}
criterion_main!(benches);
