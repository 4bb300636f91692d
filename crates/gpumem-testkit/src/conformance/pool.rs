//! A pool of one policy under a fixed asynchronous multi-stream workload, watched by the
//! [`HazardChecker`]: it must give everything back and never unmap, release or re-lend memory
//! that declared work may still use.

use std::sync::Arc;

use gpumem_device::{Device, HazardChecker, StreamId};
use gpumem_pool::{Limit, PolicyKind, Pool, PoolConfig, PoolError, PoolOptions};

use super::{ensure, pattern, Check, Offers, Step, Subject};
use crate::Rng;

const MIB: u64 = 1 << 20;
/// The most device memory the workload plans for, whatever the device has.
const BUDGET: u64 = 256 * MIB;
/// Steps of the workload.
const STEPS: usize = 240;
/// The workload's seed: the same operations on every backend.
const SEED: u64 = 0x00c0_ffee;
/// Streams: the default one and two created ones.
const STREAMS: usize = 3;
/// Allocations of the growth phase before it must have run out of memory.
const MAX_GROWTH: usize = 16;

/// A live block: where, how big, its stream, the seed of its bytes.
#[derive(Clone, Copy, Debug)]
struct Block {
    ptr: u64,
    size: u64,
    stream: StreamId,
    seed: u64,
}

/// The pool, the checker under it and the workload's state.
struct Workload {
    checker: Arc<HazardChecker>,
    pool: Pool,
    streams: Vec<StreamId>,
    /// Whether blocks carry byte patterns (the device copies).
    copies: bool,
    live: Vec<Block>,
    rng: Rng,
    /// The label of the last kernel (every kernel has its own).
    label: u64,
    budget: u64,
}

/// Runs the workload with `policy` on a fresh device; see the [module](self) documentation.
pub(super) fn run(subject: Subject, offers: Offers, policy: PolicyKind) -> Check {
    let Subject { device, work } = subject;
    let start = device.mem_info().step("mem_info")?;
    let mut checker = HazardChecker::new(device.clone());
    if let Some(work) = work {
        checker = checker.with_work(work);
    }
    let checker = Arc::new(checker);
    let mut streams = vec![StreamId::DEFAULT];
    for _ in 1..STREAMS {
        streams.push(checker.create_stream().step("create_stream")?);
    }
    let config = PoolConfig {
        policy,
        ..PoolConfig::default()
    };
    let pool = Pool::new(checker.clone(), config).step("Pool::new")?;
    let mut workload = Workload {
        checker,
        pool,
        streams,
        copies: offers.copies,
        live: Vec::new(),
        rng: Rng::new(SEED),
        label: 0,
        budget: start.free.min(BUDGET),
    };
    for step in 0..STEPS {
        workload.step(step)?;
    }
    workload.finish()?;
    let Workload {
        checker,
        pool,
        streams,
        ..
    } = workload;
    drop(pool);
    for stream in streams.into_iter().filter(|&s| s != StreamId::DEFAULT) {
        checker.destroy_stream(stream).step("destroy_stream")?;
    }
    let end = device.mem_info().step("mem_info")?;
    ensure(end.free >= start.free, || {
        format!("the device did not get its memory back: {start:?} -> {end:?}")
    })
}

impl Workload {
    /// One step: the phase changes at fixed steps, otherwise an operation drawn at random.
    fn step(&mut self, step: usize) -> Check {
        if step == STEPS / 3 {
            let limit = self.budget / 2;
            self.set_hard_limit(Some(limit), &format!("step {step}: hard limit {limit}"))?;
        } else if step == STEPS / 2 {
            self.grow_until_out_of_memory(step)?;
        } else if step == 5 * STEPS / 6 {
            self.set_hard_limit(None, &format!("step {step}: no hard limit"))?;
        }
        match self.rng.below(26) {
            0..10 => {
                let size = self.size();
                let stream = self.streams[self.rng.below(STREAMS as u64) as usize];
                self.allocate(size, stream, &format!("step {step}: allocate {size} bytes"))?;
            }
            10..13 => {
                if let Some(i) = self.pick() {
                    let block = self.live[i];
                    self.doing(&format!("step {step}: kernel on block {:#x}", block.ptr));
                    self.kernel(block.stream, block)?;
                }
            }
            13..16 => {
                if let Some(i) = self.pick() {
                    let other = self.streams[self.rng.below(STREAMS as u64) as usize];
                    self.use_elsewhere(i, other, step)?;
                }
            }
            16..24 => {
                if let Some(i) = self.pick() {
                    self.free(i, &format!("step {step}: free"))?;
                }
            }
            24 => {
                self.doing(&format!("step {step}: empty_cache"));
                self.pool.empty_cache().step("empty_cache")?;
            }
            _ => {
                self.doing(&format!("step {step}: synchronize"));
                self.pool.synchronize().step("synchronize")?;
            }
        }
        self.no_hazards()
    }

    /// A request size: mostly small, sometimes an eighth of the budget; any byte count.
    fn size(&mut self) -> u64 {
        let b = self.budget;
        let (lo, hi) = match self.rng.below(100) {
            0..35 => (1, 4096),
            35..70 => (4096, MIB),
            70..92 => (MIB, b / 32),
            _ => (b / 32, b / 8),
        };
        let size = self.rng.log_uniform(lo, hi.max(lo + 1));
        size.saturating_sub(self.rng.below(4)).max(1)
    }

    /// A live block's index, if any is live.
    fn pick(&mut self) -> Option<usize> {
        (!self.live.is_empty()).then(|| self.rng.below(self.live.len() as u64) as usize)
    }

    /// Names what is being done, in hazards and errors.
    fn doing(&self, what: &str) {
        self.checker.set_context(what);
    }

    /// The hazards found so far, as the error.
    fn no_hazards(&self) -> Check {
        let hazards = self.checker.take_hazards();
        ensure(hazards.is_empty(), || {
            let shown: Vec<String> = hazards.iter().take(5).map(ToString::to_string).collect();
            format!("{} hazard(s): {}", hazards.len(), shown.join("; "))
        })
    }

    /// A kernel on `stream` touching the whole block.
    fn kernel(&mut self, stream: StreamId, block: Block) -> Check {
        self.label += 1;
        self.checker
            .launch(stream, &[(block.ptr, block.size)], 10_000, self.label)
            .step("launch")
    }

    /// Allocates on `stream`, writes the block's pattern and runs a kernel on it. An
    /// out-of-memory error is an answer (`Ok(false)`); any other error is a failure.
    fn allocate(&mut self, size: u64, stream: StreamId, what: &str) -> Result<bool, String> {
        self.doing(what);
        let allocation = match self.pool.allocate(size, stream) {
            Ok(allocation) => allocation,
            Err(PoolError::OutOfMemory(_)) => return Ok(false),
            Err(e) => return Err(format!("{what}: {e}")),
        };
        let block = Block {
            ptr: allocation.ptr,
            size,
            stream,
            seed: self.rng.next_u64(),
        };
        if self.copies {
            let bytes = pattern(block.seed, size as usize);
            self.checker
                .copy_to_device(block.ptr, &bytes, stream)
                .step(&format!("{what}: writing the block's bytes"))?;
        }
        self.kernel(stream, block)?;
        self.live.push(block);
        Ok(true)
    }

    /// A kernel on `other`, ordered after the block's own stream by an event and announced
    /// with `record_stream`; the block's stream then waits for `other` (a program that did
    /// not would race on the block itself, whatever the pool does).
    fn use_elsewhere(&mut self, i: usize, other: StreamId, step: usize) -> Check {
        let block = self.live[i];
        self.doing(&format!(
            "step {step}: block {:#x} of stream {} used on stream {}",
            block.ptr, block.stream.0, other.0
        ));
        let c = &self.checker;
        let ready = c.record_event(block.stream).step("record_event")?;
        c.stream_wait_event(other, ready)
            .step("stream_wait_event")?;
        c.destroy_event(ready).step("destroy_event")?;
        self.kernel(other, block)?;
        self.pool
            .record_stream(block.ptr, other)
            .step("record_stream")?;
        let c = &self.checker;
        let done = c.record_event(other).step("record_event")?;
        c.stream_wait_event(block.stream, done)
            .step("stream_wait_event")?;
        c.destroy_event(done).step("destroy_event")
    }

    /// Checks the block's bytes, runs a last kernel on its stream and frees it.
    fn free(&mut self, i: usize, what: &str) -> Check {
        let block = self.live.swap_remove(i);
        let what = format!("{what} {} bytes at {:#x}", block.size, block.ptr);
        self.doing(&what);
        if self.copies {
            let mut back = vec![0u8; block.size as usize];
            self.checker
                .copy_to_host(&mut back, block.ptr, block.stream)
                .step(&format!("{what}: reading the block's bytes"))?;
            let expected = pattern(block.seed, block.size as usize);
            if let Some(at) = back.iter().zip(&expected).position(|(a, b)| a != b) {
                return Err(format!(
                    "{what}: byte {at} changed while the block was live (another block \
                     overlaps it?)"
                ));
            }
        }
        self.kernel(block.stream, block)?;
        self.pool.free(block.ptr).step(&what)
    }

    fn set_hard_limit(&mut self, bytes: Option<u64>, what: &str) -> Check {
        self.doing(what);
        let options = PoolOptions {
            hard_limit: bytes.map(Limit::Bytes),
            ..PoolOptions::default()
        };
        self.pool.set_limits(&options).step(what)?;
        self.no_hazards()
    }

    /// Allocates an eighth of the budget at a time, across the streams, until the pool runs
    /// out of memory under the hard limit.
    fn grow_until_out_of_memory(&mut self, step: usize) -> Check {
        let size = self.budget / 8;
        for i in 0..MAX_GROWTH {
            let stream = self.streams[i % STREAMS];
            let what = format!("step {step}: growth {i}, {size} bytes");
            let grew = self.allocate(size, stream, &what)?;
            self.no_hazards()?;
            if !grew {
                return Ok(());
            }
        }
        Err(format!(
            "step {step}: {MAX_GROWTH} allocations of {size} bytes under a hard limit of {} \
             never ran out of memory",
            self.budget / 2
        ))
    }

    /// Frees every block and empties the cache: nothing may stay reserved.
    fn finish(&mut self) -> Check {
        while !self.live.is_empty() {
            self.free(0, "the end: free")?;
            self.no_hazards()?;
        }
        self.doing("the end: empty_cache");
        self.pool.empty_cache().step("empty_cache")?;
        self.no_hazards()?;
        let reserved = self.pool.stats().reserved_bytes.all.current;
        ensure(reserved == 0, || {
            format!("{reserved} bytes still reserved after every free and empty_cache")
        })
    }
}
