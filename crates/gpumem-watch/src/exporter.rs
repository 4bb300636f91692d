//! Prometheus text exposition (format 0.0.4) of samples: GPU figures under dcgm-exporter's
//! metric names, units and labels (`gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`,
//! `Hostname`), so that dashboards and alerts written for it work unchanged, and the gpumem
//! pools' figures as `gpumem_pool_*` per process and device. [`Exporter`] serves it on
//! `/metrics`, sampling its source once per scrape.
//!
//! | metric | type | unit | from |
//! |---|---|---|---|
//! | `DCGM_FI_DEV_FB_USED`, `DCGM_FI_DEV_FB_FREE`, `DCGM_FI_DEV_FB_TOTAL` | gauge | MiB | NVML memory info |
//! | `DCGM_FI_DEV_GPU_UTIL`, `DCGM_FI_DEV_MEM_COPY_UTIL` | gauge | % | NVML utilisation rates |
//! | `DCGM_FI_DEV_POWER_USAGE` | gauge | W | NVML power usage |
//! | `DCGM_FI_PROF_PCIE_TX_BYTES`, `DCGM_FI_PROF_PCIE_RX_BYTES` | gauge | bytes/s | NVML PCIe throughput |
//! | `gpumem_process_memory_bytes{gpu,pid}` | gauge | bytes | NVML per-process memory |
//! | `gpumem_pool_{allocated,reserved,cached,largest_free_block}_bytes{gpu,pid,policy}` | gauge | bytes | pool endpoint |
//! | `gpumem_pool_fragmentation_ratio`, `gpumem_pool_{soft,hard}_limit_bytes` | gauge | 0–1, bytes | pool endpoint |
//! | `gpumem_pool_ooms_total` | counter | failures | pool endpoint |

use std::fmt::Write as _;
use std::net::SocketAddr;

use crate::{GpuSample, PoolSample, Sample, SampleSource, WatchError};

/// The content type of the classic Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

const MIB: f64 = (1u64 << 20) as f64;

/// One metric family: name, type, help, and how a GPU or pool gives its value.
struct Family<T> {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&T) -> Option<f64>,
}

const GPU_FAMILIES: &[Family<GpuSample>] = &[
    Family {
        name: "DCGM_FI_DEV_FB_FREE",
        kind: "gauge",
        help: "Framebuffer memory free (in MiB).",
        value: |g| Some(g.memory_free() as f64 / MIB),
    },
    Family {
        name: "DCGM_FI_DEV_FB_USED",
        kind: "gauge",
        help: "Framebuffer memory used (in MiB).",
        value: |g| Some(g.memory_used as f64 / MIB),
    },
    Family {
        name: "DCGM_FI_DEV_FB_TOTAL",
        kind: "gauge",
        help: "Framebuffer memory total (in MiB).",
        value: |g| Some(g.memory_total as f64 / MIB),
    },
    Family {
        name: "DCGM_FI_DEV_GPU_UTIL",
        kind: "gauge",
        help: "GPU utilization (in %).",
        value: |g| Some(g.gpu_util),
    },
    Family {
        name: "DCGM_FI_DEV_MEM_COPY_UTIL",
        kind: "gauge",
        help: "Memory utilization (in %).",
        value: |g| Some(g.memory_util),
    },
    Family {
        name: "DCGM_FI_DEV_POWER_USAGE",
        kind: "gauge",
        help: "Power draw (in W).",
        value: |g| Some(g.power_watts),
    },
    Family {
        name: "DCGM_FI_PROF_PCIE_TX_BYTES",
        kind: "gauge",
        help: "The rate of data transmitted over the PCIe bus (in bytes per second).",
        value: |g| Some(g.pcie_tx_bytes_per_s as f64),
    },
    Family {
        name: "DCGM_FI_PROF_PCIE_RX_BYTES",
        kind: "gauge",
        help: "The rate of data received over the PCIe bus (in bytes per second).",
        value: |g| Some(g.pcie_rx_bytes_per_s as f64),
    },
];

const POOL_FAMILIES: &[Family<PoolSample>] = &[
    Family {
        name: "gpumem_pool_allocated_bytes",
        kind: "gauge",
        help: "Bytes handed out by the gpumem pool.",
        value: |p| Some(p.allocated as f64),
    },
    Family {
        name: "gpumem_pool_reserved_bytes",
        kind: "gauge",
        help: "Bytes the gpumem pool holds from the device.",
        value: |p| Some(p.reserved as f64),
    },
    Family {
        name: "gpumem_pool_cached_bytes",
        kind: "gauge",
        help: "Bytes reserved but not allocated (cache and fragments).",
        value: |p| Some(p.cached() as f64),
    },
    Family {
        name: "gpumem_pool_largest_free_block_bytes",
        kind: "gauge",
        help: "The largest block the pool can hand out without asking the device.",
        value: |p| Some(p.largest_free_block as f64),
    },
    Family {
        name: "gpumem_pool_fragmentation_ratio",
        kind: "gauge",
        help: "1 - largest free block / cached bytes: 0 when the cache is one piece.",
        value: |p| Some(p.fragmentation()),
    },
    Family {
        name: "gpumem_pool_ooms_total",
        kind: "counter",
        help: "Allocations that failed with out-of-memory.",
        value: |p| Some(p.num_ooms as f64),
    },
    Family {
        name: "gpumem_pool_soft_limit_bytes",
        kind: "gauge",
        help: "The pool's soft limit, when one is set.",
        value: |p| p.soft_limit.map(|b| b as f64),
    },
    Family {
        name: "gpumem_pool_hard_limit_bytes",
        kind: "gauge",
        help: "The pool's hard limit, when one is set.",
        value: |p| p.hard_limit.map(|b| b as f64),
    },
];

/// The text exposition of one sample.
pub fn render(sample: &Sample) -> String {
    let mut out = String::with_capacity(256 * (sample.gpus.len() * 8 + sample.pools.len() * 8));
    let host = escape(&sample.host);
    let gpu_labels: Vec<String> = sample
        .gpus
        .iter()
        .map(|g| {
            format!(
                "gpu=\"{}\",UUID=\"{}\",pci_bus_id=\"{}\",device=\"nvidia{}\",modelName=\"{}\",Hostname=\"{host}\"",
                g.index,
                escape(&g.uuid),
                escape(&g.pci_bus_id),
                g.index,
                escape(&g.name)
            )
        })
        .collect();
    for family in GPU_FAMILIES {
        let rows = sample.gpus.iter().zip(&gpu_labels);
        write_family(&mut out, family, rows);
    }
    let process_rows: Vec<(u64, String)> = sample
        .gpus
        .iter()
        .flat_map(|g| {
            let host = &host;
            g.processes.iter().filter_map(move |p| {
                let labels = format!("gpu=\"{}\",pid=\"{}\",Hostname=\"{host}\"", g.index, p.pid);
                p.memory.map(|bytes| (bytes, labels))
            })
        })
        .collect();
    if !process_rows.is_empty() {
        header(
            &mut out,
            "gpumem_process_memory_bytes",
            "gauge",
            "Device memory a process holds (NVML).",
        );
        for (bytes, labels) in &process_rows {
            let _ = writeln!(out, "gpumem_process_memory_bytes{{{labels}}} {bytes}");
        }
    }
    let pool_labels: Vec<String> = sample
        .pools
        .iter()
        .map(|p| {
            format!(
                "gpu=\"{}\",pid=\"{}\",policy=\"{}\",Hostname=\"{host}\"",
                p.device,
                p.pid,
                escape(&p.policy)
            )
        })
        .collect();
    for family in POOL_FAMILIES {
        write_family(&mut out, family, sample.pools.iter().zip(&pool_labels));
    }
    out
}

fn write_family<'a, T: 'a>(
    out: &mut String,
    family: &Family<T>,
    rows: impl Iterator<Item = (&'a T, &'a String)>,
) {
    let mut rows = rows
        .filter_map(|(item, labels)| (family.value)(item).map(|v| (v, labels)))
        .peekable();
    if rows.peek().is_none() {
        return;
    }
    header(out, family.name, family.kind, family.help);
    for (value, labels) in rows {
        let _ = writeln!(out, "{}{{{labels}}} {value}", family.name);
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value as the text format wants it: backslash, quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// An HTTP server answering `/metrics` with the exposition of its source's next sample. A
/// recording advances one sample per scrape and then keeps showing its last.
pub struct Exporter {
    server: tiny_http::Server,
    source: Box<dyn SampleSource + Send>,
    last: Option<Sample>,
}

impl Exporter {
    /// Listens on `addr`, `HOST:PORT` (port 0 picks a free port: see
    /// [`Exporter::local_addr`]).
    pub fn bind(addr: &str, source: Box<dyn SampleSource + Send>) -> Result<Exporter, WatchError> {
        std::net::ToSocketAddrs::to_socket_addrs(addr).map_err(|e| {
            WatchError::BadListenAddress {
                addr: addr.to_string(),
                message: e.to_string(),
            }
        })?;
        let server = tiny_http::Server::http(addr).map_err(|e| {
            WatchError::io(addr, std::io::Error::other(format!("cannot listen: {e}")))
        })?;
        Ok(Exporter {
            server,
            source,
            last: None,
        })
    }

    /// The address actually listened on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.server.server_addr().to_ip()
    }

    /// Answers requests until the process ends, handing each warning of the source
    /// ([`SampleSource::take_warnings`]) to `warn`.
    pub fn serve(mut self, mut warn: impl FnMut(WatchError)) -> Result<(), WatchError> {
        loop {
            let request = self
                .server
                .recv()
                .map_err(|e| WatchError::io("exporter", e))?;
            // A scrape's query (Prometheus' `params`) selects nothing here: the path decides.
            let path = request.url().split('?').next().unwrap_or_default();
            let readable = matches!(
                request.method(),
                tiny_http::Method::Get | tiny_http::Method::Head
            );
            let (status, body, content_type) = match path {
                _ if !readable => (
                    405,
                    format!("{} is not served; GET /metrics\n", request.method()),
                    "text/plain; charset=utf-8",
                ),
                "/metrics" => {
                    let scraped = self.scrape();
                    self.source.take_warnings().into_iter().for_each(&mut warn);
                    match scraped {
                        Ok(text) => (200, text, CONTENT_TYPE),
                        Err(e) => (500, format!("{e}\n"), "text/plain; charset=utf-8"),
                    }
                }
                "/" => (
                    200,
                    "gpumem exporter: metrics at /metrics\n".to_string(),
                    "text/plain; charset=utf-8",
                ),
                _ => (
                    404,
                    "not found; try /metrics\n".to_string(),
                    "text/plain; charset=utf-8",
                ),
            };
            let header = tiny_http::Header::from_bytes("Content-Type", content_type)
                .expect("a constant header is valid");
            let response = tiny_http::Response::from_string(body)
                .with_status_code(status)
                .with_header(header);
            // A client that hung up costs its answer only.
            let _ = request.respond(response);
        }
    }

    fn scrape(&mut self) -> Result<String, WatchError> {
        if let Some(sample) = self.source.next_sample()? {
            self.last = Some(sample);
        }
        Ok(self.last.as_ref().map(render).unwrap_or_default())
    }
}
