//! Checks a backend end to end with real bytes: every policy's blocks hold what was written
//! into them, through allocation, reuse and cache release, and a real trace replayed with
//! memory behind every block never lets two live blocks share a byte.
//!
//! This is what `gpumem selftest` runs on a user's own device (the simulated one, CUDA or
//! wgpu): the simulated device shows the pool's logic is right; a real device also shows that
//! the backend's allocations, mappings and copies are.
//!
//! The device is watched by a [`HazardChecker`], and every block is used by a declared kernel
//! on its stream when it is written and again right before its free, as a training step uses
//! its tensors: a policy that unmapped, released or lent memory to another stream while such
//! work could still be running fails the hazard check.

use std::sync::Arc;
use std::time::Instant;

use gpumem_device::{Device, DeviceError, DevicePtr, HazardChecker, StreamId};
use gpumem_pool::{PolicyKind, Pool, PoolError, PoolOptions};
use gpumem_trace::{Event, Trace};
use serde::Serialize;

use crate::{pool_of, PolicySource, ReplayOptions};

/// The sizes of the round-trip phase: odd and even, around the 512-byte rounding, the 1 MiB
/// small/large boundary, 10 MiB (PyTorch's large-segment threshold) and larger.
const ROUND_TRIP_SIZES: [u64; 12] = [
    1,
    3,
    511,
    512,
    4097,
    65_536,
    300_000,
    1 << 20,
    (1 << 20) + 1,
    3 << 20,
    (10 << 20) + 7,
    24 << 20,
];

/// One check and its outcome.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it held.
    pub passed: bool,
    /// Numbers behind it, or what went wrong.
    pub detail: String,
}

/// What a self-test of one policy on one device found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SelftestReport {
    /// The device, as it names itself.
    pub device: String,
    /// The policy tested.
    pub policy: String,
    /// Every check, in the order they ran.
    pub checks: Vec<Check>,
    /// Bytes written and read back.
    pub bytes_verified: u64,
    /// Device calls the pool made that allocate or map memory.
    pub device_alloc_calls: u64,
    /// Device calls the pool made that free or unmap memory.
    pub device_free_calls: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

impl SelftestReport {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|check| check.passed)
    }
}

/// The trace replayed with real bytes when none is given: a real PyTorch inference trace
/// (GPT-2, 2 layers, 62 MiB at its peak), small enough for any device.
pub const BUNDLED_TRACE: &[u8] =
    include_bytes!("../../../testdata/traces/small-gpt2-2l-infer-b1-s32.jsonl.gz");

/// A policy the device cannot run, left out of a self-test.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SkippedPolicy {
    /// The policy.
    pub policy: String,
    /// Why it was left out.
    pub reason: String,
}

/// The self-test of several policies on one device: `gpumem selftest --json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SelftestRun {
    /// One report per policy tested, in the order asked for.
    pub reports: Vec<SelftestReport>,
    /// The policies the device cannot run.
    pub skipped: Vec<SkippedPolicy>,
}

impl SelftestRun {
    /// Whether every check of every policy passed.
    pub fn passed(&self) -> bool {
        self.reports.iter().all(SelftestReport::passed)
    }
}

/// [`selftest()`] of each of `policies` on `device`; `expandable` is skipped on a device
/// without virtual memory management, which it needs. `on_report` sees each report as it is
/// made (the command prints them as they come).
pub fn selftest_policies(
    device: Arc<dyn Device>,
    policies: &[PolicyKind],
    trace: &Trace,
    bytes_per_block: u64,
    on_report: &mut dyn FnMut(Result<&SelftestReport, &SkippedPolicy>),
) -> Result<SelftestRun, SelftestError> {
    let mut run = SelftestRun {
        reports: Vec::new(),
        skipped: Vec::new(),
    };
    for &policy in policies {
        if policy == PolicyKind::Expandable && device.vmm().is_none() {
            let skipped = SkippedPolicy {
                policy: policy.to_string(),
                reason: format!("{} has no virtual memory management", device.name()),
            };
            on_report(Err(&skipped));
            run.skipped.push(skipped);
            continue;
        }
        let report = selftest(device.clone(), &policy, trace, bytes_per_block).map_err(|e| {
            SelftestError::Policy {
                policy: policy.to_string(),
                source: Box::new(e),
            }
        })?;
        on_report(Ok(&report));
        run.reports.push(report);
    }
    Ok(run)
}

/// Fills `out` with the bytes `from..from + out.len()` of the pattern of block `tag`: each
/// 8-byte word of the block a hash of the tag and the word's offset, so the pattern differs
/// between blocks and along a block (a block that overlaps another or lands at the wrong
/// offset reads wrong), at one multiply per word.
fn fill_pattern(out: &mut [u8], tag: u64, from: u64) {
    let word = |w: u64| {
        tag.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(w.wrapping_mul(0xD6E8_FEB8_6659_FD93))
            .rotate_left(29)
            .to_le_bytes()
    };
    // The bytes before the first whole word, the whole words, and the bytes after them.
    let head = (((8 - from % 8) % 8) as usize).min(out.len());
    let (head_bytes, body) = out.split_at_mut(head);
    for (offset, byte) in (from..).zip(head_bytes) {
        *byte = word(offset / 8)[(offset % 8) as usize];
    }
    let first = (from + head as u64) / 8;
    let after = first + (body.len() / 8) as u64;
    let mut words = body.chunks_exact_mut(8);
    for (w, chunk) in (first..).zip(&mut words) {
        chunk.copy_from_slice(&word(w));
    }
    let tail = words.into_remainder();
    let n = tail.len();
    tail.copy_from_slice(&word(after)[..n]);
}

/// A live block under test: where, how large, and the tag of the pattern it holds.
struct Written {
    ptr: DevicePtr,
    size: u64,
    tag: u64,
}

/// The parts of a block that are written and verified: all of it up to `limit` bytes, else
/// its first and last `limit / 2` bytes.
fn extents(size: u64, limit: u64) -> Vec<(u64, u64)> {
    if size <= limit {
        vec![(0, size)]
    } else {
        vec![(0, limit / 2), (size - limit / 2, limit / 2)]
    }
}

/// Writes and reads the device through one pool, counting the bytes it verified.
struct Tester<'a> {
    device: &'a HazardChecker,
    limit: u64,
    bytes: u64,
    /// Scratch for the pattern written or expected, kept between blocks.
    pattern: Vec<u8>,
    /// Scratch for the bytes read back, kept between blocks.
    back: Vec<u8>,
}

/// The run time declared for each kernel that uses a block (the checker's model only).
const KERNEL_NS: u64 = 10_000;

impl Tester<'_> {
    /// Writes the block's pattern, then a kernel on its stream uses the whole block.
    fn write(&mut self, block: &Written) -> Result<(), DeviceError> {
        for (from, len) in extents(block.size, self.limit) {
            self.pattern.resize(len as usize, 0);
            fill_pattern(&mut self.pattern, block.tag, from);
            self.device
                .copy_to_device(block.ptr + from, &self.pattern, StreamId::DEFAULT)?;
        }
        self.use_block(block)
    }

    /// A kernel on the default stream that touches the whole block and is still queued when
    /// the host goes on.
    fn use_block(&self, block: &Written) -> Result<(), DeviceError> {
        let range = [(block.ptr, block.size)];
        self.device
            .launch(StreamId::DEFAULT, &range, KERNEL_NS, block.tag)
    }

    /// Reads the block back; `Ok(None)` if it holds its pattern, else what differed.
    fn verify(&mut self, block: &Written) -> Result<Option<String>, DeviceError> {
        for (from, len) in extents(block.size, self.limit) {
            self.back.resize(len as usize, 0);
            self.device
                .copy_to_host(&mut self.back, block.ptr + from, StreamId::DEFAULT)?;
            self.bytes += len;
            self.pattern.resize(len as usize, 0);
            fill_pattern(&mut self.pattern, block.tag, from);
            if let Some(i) = (self.back != self.pattern)
                .then(|| {
                    self.back
                        .iter()
                        .zip(&self.pattern)
                        .position(|(b, w)| b != w)
                })
                .flatten()
            {
                return Ok(Some(format!(
                    "block {:#x} ({} bytes): byte {} reads {:#04x}, {:#04x} was written",
                    block.ptr,
                    block.size,
                    from + i as u64,
                    self.back[i],
                    self.pattern[i]
                )));
            }
        }
        Ok(None)
    }
}

/// Why a self-test could not run to its end (a failed check is not an error: it is in the
/// report).
#[derive(Debug, thiserror::Error)]
pub enum SelftestError {
    /// The device failed a call.
    #[error("device error: {0}")]
    Device(#[from] DeviceError),
    /// The pool failed for a reason other than a check.
    #[error("pool error: {0}")]
    Pool(#[from] PoolError),
    /// The self-test of one of several policies failed to run.
    #[error("{policy}: {source}")]
    Policy {
        /// The policy.
        policy: String,
        /// What failed.
        source: Box<SelftestError>,
    },
}

/// Runs the self-test of `policy` on `device`: round trips of blocks of many sizes (write a
/// distinct pattern into every block, free half, allocate again so that freed memory is
/// reused, read everything back), memory returned after the cache is emptied, then `trace`
/// replayed with a pattern written into every block at its allocation and verified at its
/// free. At most `bytes_per_block` bytes of each block are written (its start and end beyond
/// that); the device needs room for the trace's peak.
pub fn selftest(
    device: Arc<dyn Device>,
    policy: &dyn PolicySource,
    trace: &Trace,
    bytes_per_block: u64,
) -> Result<SelftestReport, SelftestError> {
    let started = Instant::now();
    let checker = Arc::new(HazardChecker::new(device.clone()));
    let pool = pool_of(
        checker.clone(),
        policy,
        &ReplayOptions::default(),
        PoolOptions::default(),
    )?;
    let mut tester = Tester {
        device: &checker,
        limit: bytes_per_block.max(2),
        bytes: 0,
        pattern: Vec::new(),
        back: Vec::new(),
    };
    let mut checks = Vec::new();
    let free_before = device.mem_info()?.free;
    checks.push(round_trips(&pool, &mut tester)?);
    pool.empty_cache()?;
    let free_after = device.mem_info()?.free;
    let reserved = pool.stats().reserved_bytes.all.current;
    checks.push(Check {
        name: "memory given back after empty_cache".into(),
        passed: free_after >= free_before && reserved == 0,
        detail: format!(
            "device free {free_before} bytes before, {free_after} after; {reserved} reserved"
        ),
    });
    pool.reset_peak_stats();
    checks.push(replay_with_bytes(&pool, &mut tester, trace)?);
    pool.empty_cache()?;
    let hazards = checker.take_hazards();
    checks.push(Check {
        name: "no memory unmapped, released or lent to another stream under queued work".into(),
        passed: hazards.is_empty(),
        detail: match hazards.first() {
            None => format!(
                "every block used by a queued kernel at its allocation and before its free; \
                 {} host synchronisations",
                checker.synchronizations()
            ),
            Some(first) => format!("{} hazards, the first: {first}", hazards.len()),
        },
    });
    let calls = pool.stats().device_calls;
    Ok(SelftestReport {
        device: device.name(),
        policy: policy.name().to_string(),
        checks,
        bytes_verified: tester.bytes,
        device_alloc_calls: calls.allocating(),
        device_free_calls: calls.freeing(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn round_trips(pool: &Pool, tester: &mut Tester<'_>) -> Result<Check, SelftestError> {
    let mut live = Vec::new();
    let mut tag = 0;
    let mut allocate = |tester: &mut Tester<'_>,
                        live: &mut Vec<Written>,
                        size: u64|
     -> Result<(), SelftestError> {
        tag += 1;
        let block = Written {
            ptr: pool.allocate(size, StreamId::DEFAULT)?.ptr,
            size,
            tag,
        };
        tester.write(&block)?;
        live.push(block);
        Ok(())
    };
    for round in 0..3 {
        for &size in &ROUND_TRIP_SIZES {
            allocate(tester, &mut live, size + round)?;
        }
    }
    // Free every other block, then allocate the same sizes again: the cache serves them.
    let mut kept = Vec::new();
    let mut sizes = Vec::new();
    for (i, block) in live.drain(..).enumerate() {
        if i % 2 == 0 {
            tester.use_block(&block)?;
            pool.free(block.ptr)?;
            sizes.push(block.size);
        } else {
            kept.push(block);
        }
    }
    for size in sizes {
        allocate(tester, &mut kept, size)?;
    }
    let blocks = kept.len();
    let mut failure = None;
    for block in &kept {
        if let Some(what) = tester.verify(block)? {
            failure.get_or_insert(what);
        }
    }
    for block in kept {
        tester.use_block(&block)?;
        pool.free(block.ptr)?;
    }
    Ok(Check {
        name: "round trips: allocate, write, free, reuse, read back".into(),
        passed: failure.is_none(),
        detail: failure.unwrap_or_else(|| {
            format!("{blocks} live blocks of 1 B to 24 MiB hold what was written")
        }),
    })
}

fn replay_with_bytes(
    pool: &Pool,
    tester: &mut Tester<'_>,
    trace: &Trace,
) -> Result<Check, SelftestError> {
    let mut live: gpumem_device::AddressMap<Written> = Default::default();
    let mut failure = None;
    let mut allocs = 0u64;
    for (index, event) in trace.events.iter().enumerate() {
        match *event {
            Event::Alloc { addr, size, stream } => {
                let ptr = pool.allocate(size, StreamId(stream))?.ptr;
                let block = Written {
                    ptr,
                    size,
                    tag: index as u64,
                };
                if size > 0 {
                    tester.write(&block)?;
                }
                live.insert(addr, block);
                allocs += 1;
            }
            Event::Free { addr, .. } => {
                if let Some(block) = live.remove(&addr) {
                    if block.size > 0 {
                        if let Some(what) = tester.verify(&block)? {
                            failure.get_or_insert(format!("event {index}: {what}"));
                        }
                        tester.use_block(&block)?;
                    }
                    pool.free(block.ptr)?;
                }
            }
            Event::Step { .. } => {}
        }
    }
    for (_, block) in live.drain() {
        if block.size > 0 {
            if let Some(what) = tester.verify(&block)? {
                failure.get_or_insert(what);
            }
            tester.use_block(&block)?;
        }
        pool.free(block.ptr)?;
    }
    Ok(Check {
        name: format!(
            "trace `{}` with real bytes behind every block",
            trace.meta.name
        ),
        passed: failure.is_none(),
        detail: failure.unwrap_or_else(|| {
            format!(
                "{allocs} blocks, peak reserved {} bytes, every block read back intact",
                pool.stats().reserved_bytes.all.peak
            )
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem_device::sim::{SimConfig, SimDevice};
    use gpumem_pool::PolicyKind;

    fn small_trace() -> Trace {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../testdata/traces/small-gpt2-2l-infer-b1-s32.jsonl.gz"
        );
        gpumem_trace::read_path(path, Default::default()).unwrap()
    }

    #[test]
    fn every_policy_passes_on_the_host_backed_sim() {
        let trace = small_trace();
        for vmm in [true, false] {
            for policy in PolicyKind::ALL {
                if policy == PolicyKind::Expandable && !vmm {
                    continue;
                }
                let config = SimConfig {
                    granularity: vmm.then_some(2 << 20),
                    ..SimConfig::host(1 << 30)
                };
                let device: Arc<dyn Device> = Arc::new(SimDevice::new(config).unwrap());
                let report = selftest(device, &policy, &trace, 4096).unwrap();
                assert!(report.passed(), "{policy} vmm {vmm}: {:#?}", report.checks);
                assert_eq!(report.checks.len(), 4);
                assert!(report.bytes_verified > 400_000, "{}", report.bytes_verified);
                assert!(report.device_alloc_calls > 0);
                assert!(report.device_free_calls > 0, "the cache was emptied");
            }
        }
    }

    /// A device that corrupts one byte of every large copy: the self-test must catch it.
    struct Corrupting(SimDevice);

    impl Device for Corrupting {
        fn name(&self) -> String {
            "corrupting sim".into()
        }
        fn mem_info(&self) -> Result<gpumem_device::MemInfo, DeviceError> {
            self.0.mem_info()
        }
        fn malloc(&self, size: u64) -> Result<DevicePtr, DeviceError> {
            self.0.malloc(size)
        }
        fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
            self.0.free(ptr)
        }
        fn copy_to_device(
            &self,
            dst: DevicePtr,
            src: &[u8],
            stream: StreamId,
        ) -> Result<(), DeviceError> {
            let mut bytes = src.to_vec();
            if bytes.len() > 1000 {
                bytes[999] ^= 1;
            }
            self.0.copy_to_device(dst, &bytes, stream)
        }
        fn copy_to_host(
            &self,
            dst: &mut [u8],
            src: DevicePtr,
            stream: StreamId,
        ) -> Result<(), DeviceError> {
            self.0.copy_to_host(dst, src, stream)
        }
    }

    #[test]
    fn a_pattern_read_from_any_offset_is_the_same_bytes_and_differs_between_blocks() {
        let mut whole = vec![0u8; 64];
        fill_pattern(&mut whole, 7, 0);
        for from in 0..20u64 {
            for len in 0..40usize {
                let mut part = vec![0u8; len];
                fill_pattern(&mut part, 7, from);
                assert_eq!(
                    part,
                    whole[from as usize..from as usize + len],
                    "{from} {len}"
                );
            }
        }
        let mut other = vec![0u8; 64];
        fill_pattern(&mut other, 8, 0);
        assert_ne!(whole, other);
        // Along a block, no two words are the same (a block read at a shifted offset fails).
        let words: std::collections::HashSet<&[u8]> = whole.chunks(8).collect();
        assert_eq!(words.len(), 8);
    }

    #[test]
    fn a_backend_that_corrupts_bytes_fails_the_checks() {
        let sim = SimDevice::new(SimConfig::host(1 << 30)).unwrap();
        let device: Arc<dyn Device> = Arc::new(Corrupting(sim));
        let report = selftest(device, &PolicyKind::Torch, &small_trace(), 4096).unwrap();
        assert!(!report.passed());
        let failed: Vec<&Check> = report.checks.iter().filter(|c| !c.passed).collect();
        assert_eq!(failed.len(), 2, "{failed:#?}");
        assert!(
            failed[0].detail.contains("byte 999"),
            "{}",
            failed[0].detail
        );
    }
}
