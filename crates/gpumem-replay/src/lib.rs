//! Replays allocation traces through gpumem pool policies on an address-only simulated device,
//! so that an 80 GiB training trace replays on a laptop, and reports per policy what it would
//! have needed: peak allocated and reserved bytes, utilisation, device calls (in all and per
//! step in steady state), whether and where it would run out of memory on a device of a
//! given capacity, and the smallest device on which it runs.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod initial_state;
pub mod plan;
pub mod planned;
mod report;
pub mod request;
pub mod selftest;
pub mod timeline;
pub mod tune;

pub use initial_state::InitialState;
pub use report::{
    replay_report, PolicyInfo, RankReport, RanksReport, ReplayReport, TraceInfo, TuneResult,
    EXAMPLE_TRACE,
};

use std::sync::Arc;
use std::time::Instant;

use gpumem_device::sim::{SimConfig, SimDevice, DEFAULT_GRANULARITY, MAX_CAPACITY};
use gpumem_device::{AddressMap, Device, DeviceError, HazardChecker, StreamId};
use gpumem_pool::policies::torch_settings::TorchSettings;
use gpumem_pool::policies::GpumemSettings;
use gpumem_pool::{
    Action, Bytes, ConfigError, DeviceCalls, MemoryStats, OomError, Policy, PolicyKind, Pool,
    PoolConfig, PoolError, PoolEvent, PoolObserver, PoolOptions,
};
use gpumem_trace::{Event, Trace};
use serde::Serialize;

/// Device size for runs that must not be limited by capacity: the largest simulated device.
const UNLIMITED_CAPACITY: u64 = MAX_CAPACITY;

/// The step of [`smallest_capacity`]'s search: the 2 MiB page that device memory comes in.
pub const CAPACITY_RESOLUTION: u64 = 2 << 20;

/// Pages of device memory a replay maps at most at its live peak: 512 GiB of the GPUs' 2 MiB
/// pages (see [`replay_granularity`]).
const MAX_REPLAY_PAGES: u64 = 1 << 18;

/// How often (in events) progress is reported.
const PROGRESS_EVERY: usize = 1 << 16;

/// Settings of a replay.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplayOptions {
    /// Device memory to check the trace against; `None` checks nothing.
    pub capacity: Option<u64>,
    /// PyTorch allocator options for the `torch` and `expandable` policies.
    pub torch: TorchSettings,
    /// The `gpumem` policy's settings.
    pub gpumem: GpumemSettings,
    /// Events of pool history to record (for a snapshot); 0 records none.
    pub history_capacity: usize,
    /// Also search the smallest device capacity on which the trace runs
    /// ([`smallest_capacity`]): a few more replays per policy.
    pub smallest_capacity: bool,
    /// Replay placement only, without the model of asynchronous execution (no kernels, no
    /// hazard checking; [`PolicyReport::hazards`] stays 0): several times faster, for passes
    /// that need only peaks and out-of-memory points (the capacity search, tuning's
    /// screening, the planner). Placement, peaks and device calls are the same either way.
    pub placement_only: bool,
}

/// What a replay runs: a named source of fresh policies (every replay pass needs its own).
/// The built-in [`PolicyKind`]s are sources, built with [`ReplayOptions::torch`] and
/// [`ReplayOptions::gpumem`]; an outside policy becomes one with [`CustomPolicy`].
pub trait PolicySource {
    /// The name reports and progress show.
    fn name(&self) -> &'static str;
    /// A fresh policy, holding no memory, or why the settings cannot make one.
    fn make(&self, options: &ReplayOptions) -> Result<Box<dyn Policy>, ConfigError>;
}

impl PolicySource for PolicyKind {
    fn name(&self) -> &'static str {
        self.as_str()
    }

    fn make(&self, options: &ReplayOptions) -> Result<Box<dyn Policy>, ConfigError> {
        let config = PoolConfig {
            policy: *self,
            torch: options.torch.clone(),
            gpumem: options.gpumem,
            ..PoolConfig::default()
        };
        self.build(&config)
    }
}

/// A policy from outside gpumem's built-ins, replayed like any other: its name and a
/// constructor of fresh instances.
pub struct CustomPolicy<F: Fn() -> Box<dyn Policy>> {
    /// The name reports show.
    pub name: &'static str,
    /// Makes a fresh policy.
    pub make: F,
}

impl<F: Fn() -> Box<dyn Policy>> PolicySource for CustomPolicy<F> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn make(&self, _: &ReplayOptions) -> Result<Box<dyn Policy>, ConfigError> {
        Ok((self.make)())
    }
}

/// Where a replay ran out of memory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OomReport {
    /// The device capacity the replay was held to.
    pub capacity_bytes: u64,
    /// Index of the failing allocation in the trace's events.
    pub event_index: usize,
    /// The step the failure fell in, when the trace marks steps.
    pub step: Option<u64>,
    /// Bytes the failing allocation asked for.
    pub requested_bytes: u64,
    /// Bytes allocated when it failed.
    pub allocated_bytes: u64,
    /// Bytes reserved when it failed.
    pub reserved_bytes: u64,
    /// The pool's explanation.
    pub message: String,
}

/// What one policy did with a trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyReport {
    /// Policy name.
    pub policy: String,
    /// Highest allocated bytes (after the policy's rounding).
    pub peak_allocated_bytes: u64,
    /// Highest bytes as requested, before rounding.
    pub peak_requested_bytes: u64,
    /// Highest bytes reserved from the device.
    pub peak_reserved_bytes: u64,
    /// `peak_allocated_bytes / peak_reserved_bytes`, the metric GMLake and STAlloc report.
    pub utilization: f64,
    /// Device calls that allocate or free memory (malloc, free, create, map, unmap, release).
    pub device_calls: u64,
    /// Of those, the calls that allocate or map.
    pub device_alloc_calls: u64,
    /// The most allocate/map calls of any step once the trace's steps after the first are
    /// repeated on the warm pool (`None` with fewer than 2 steps): what the policy costs per
    /// step in steady state. The whole trace's calls are in `device_alloc_calls`.
    pub steady_state_alloc_calls_per_step: Option<u64>,
    /// The most memory-API calls of any step in steady state (as above), allocating and
    /// freeing: malloc, free, create, map, unmap, release.
    pub steady_state_device_calls_per_step: Option<u64>,
    /// The most synchronisations of any step in steady state (as above): each stalls the host
    /// until the GPU has caught up (`cudaFree`'s implicit one included).
    pub steady_state_syncs_per_step: Option<u64>,
    /// Synchronisations the pool made over the whole trace, `cudaFree`'s included.
    pub synchronizations: u64,
    /// Memory the policy unmapped, released or lent to another stream while work queued
    /// before its free could still use it, in the replay's model of asynchronous execution
    /// (each block used by a kernel on its stream at its allocation and right before its
    /// free, on a GPU that finishes work only when the host waits): must be 0.
    pub hazards: usize,
    /// Steps marked in the trace.
    pub steps: u64,
    /// Allocations that needed the whole cache freed first.
    pub num_alloc_retries: u64,
    /// `None` when the trace fits the capacity (or none was given), else where it failed.
    pub oom: Option<OomReport>,
    /// The smallest device capacity, in steps of [`CAPACITY_RESOLUTION`], on which the trace
    /// runs through this policy (reclaiming as it must), when it was asked for.
    pub smallest_capacity_bytes: Option<u64>,
    /// Events replayed.
    pub events: usize,
    /// Replay speed, events per second of wall time.
    pub events_per_second: f64,
    /// For a trace recorded mid-process, how the replay began from the memory held when its
    /// recording began; `None` for a trace without [`Trace::initial_segments`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_state: Option<InitialState>,
}

impl PolicyReport {
    /// Whether the replay fits `capacity`, in words: `-` without one, `yes`, or where it ran
    /// out of memory (event, step and the size asked for).
    pub fn fits(&self, capacity: Option<u64>) -> String {
        match (&self.oom, capacity) {
            (None, None) => "-".to_string(),
            (None, Some(_)) => "yes".to_string(),
            (Some(o), _) => format!(
                "OOM at event {}{} ({} requested)",
                o.event_index,
                o.step.map_or(String::new(), |s| format!(", step {s}")),
                Bytes(o.requested_bytes)
            ),
        }
    }
}

/// A finished replay: its report, and the pool as it was left (for snapshots and status).
pub struct Replay {
    /// The numbers.
    pub report: PolicyReport,
    /// The pool after the last event (or after the OOM).
    pub pool: Pool,
}

/// Progress of a running replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The name of the policy being replayed.
    pub policy: &'static str,
    /// Events done.
    pub done: usize,
    /// Events in all.
    pub total: usize,
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The trace frees an address that is not live (the readers normally prevent this).
    #[error("event {index}: free of address {addr:#x}, which is not live in the trace")]
    FreeOfNonLive {
        /// Event index.
        index: usize,
        /// Address in the trace.
        addr: u64,
    },
    /// The trace allocates at an address that is still live.
    #[error("event {index}: alloc at address {addr:#x}, which is still live in the trace")]
    AllocOfLive {
        /// Event index.
        index: usize,
        /// Address in the trace.
        addr: u64,
    },
    /// The pool failed for a reason other than memory.
    #[error("event {index}: {source}")]
    Pool {
        /// Event index.
        index: usize,
        /// The pool's error.
        source: PoolError,
    },
    /// The simulated device could not be created.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Replays `trace` through `policy`. Without a capacity (or when the policy's peak reserved
/// memory fits it), one run on an unlimited device gives the numbers; otherwise a second run
/// on a device of exactly the capacity tells whether reclaiming saves it and where it fails.
pub fn replay(
    trace: &Trace,
    policy: impl PolicySource,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Replay, ReplayError> {
    let policy: &dyn PolicySource = &policy;
    let unlimited = run(trace, policy, UNLIMITED_CAPACITY, options, progress)?;
    let steady = steady_state_calls(trace, policy, options)?;
    let mut report = unlimited.report(policy, trace, steady);
    // Only a trace past the unlimited device's petabyte runs out here: reported, not cut short.
    report.oom = unlimited.oom_report(trace, UNLIMITED_CAPACITY);
    report.smallest_capacity_bytes = match options.smallest_capacity {
        true => smallest_capacity(trace, policy, options, &report, progress)?,
        false => None,
    };
    within_capacity(
        trace,
        trace.events.len(),
        policy,
        options,
        (unlimited, report),
        steady,
        progress,
    )
}

/// The replay of `trace`'s events before `end` on a device of `options.capacity` where the
/// `unlimited` run's reserved peak exceeds it: its report when reclaiming made it fit (what
/// would happen on that device), else the unlimited report with where it ran out of memory.
fn within_capacity(
    trace: &Trace,
    end: usize,
    policy: &dyn PolicySource,
    options: &ReplayOptions,
    (unlimited, mut report): (Run, PolicyReport),
    steady: Option<SteadyState>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Replay, ReplayError> {
    let capacity = match options.capacity {
        Some(c) if report.peak_reserved_bytes > c => c,
        _ => {
            return Ok(Replay {
                report,
                pool: unlimited.pool,
            })
        }
    };
    let limited = run_until(trace, end, policy, capacity, options, progress)?;
    report.oom = limited.oom_report(trace, capacity);
    if report.oom.is_none() {
        // Reclaiming made it fit: the capacity-bound run is what would happen on that device.
        let smallest = report.smallest_capacity_bytes;
        report = limited.report(policy, trace, steady);
        report.smallest_capacity_bytes = smallest;
    }
    Ok(Replay {
        report,
        pool: limited.pool,
    })
}

/// The smallest device capacity, a multiple of [`CAPACITY_RESOLUTION`], on which `trace` runs
/// through `policy` without running out of memory, given the report of its run on an unlimited
/// device: a bisection between the peak allocated bytes (below which nothing fits) and the
/// peak reserved bytes (which fit), replaying on a device of each capacity tried. A policy
/// that reclaims and stitches under pressure needs less than its unlimited peak. The search
/// assumes that more memory never hurts; it returns a capacity that fits and one step below
/// which the replay ran out of memory. `None` only if the trace does not fit even at twice
/// the unlimited peak (a policy that behaves worse under pressure than without it).
pub fn smallest_capacity(
    trace: &Trace,
    policy: &dyn PolicySource,
    options: &ReplayOptions,
    unlimited: &PolicyReport,
    progress: &mut dyn FnMut(Progress),
) -> Result<Option<u64>, ReplayError> {
    let quiet = ReplayOptions {
        capacity: None,
        history_capacity: 0,
        smallest_capacity: false,
        placement_only: true,
        ..options.clone()
    };
    let mut fits = |capacity: u64| -> Result<bool, ReplayError> {
        Ok(run(trace, policy, capacity, &quiet, progress)?
            .oom
            .is_none())
    };
    if unlimited.peak_allocated_bytes == 0 {
        return Ok(Some(0));
    }
    let step = CAPACITY_RESOLUTION;
    // The largest multiple of the step below the peak allocated bytes cannot fit.
    let mut lo = unlimited.peak_allocated_bytes.saturating_sub(1) / step * step;
    let mut hi = unlimited.peak_reserved_bytes.max(1).next_multiple_of(step);
    while !fits(hi)? {
        lo = hi;
        hi += hi.div_ceil(4).next_multiple_of(step);
        if hi > 2 * unlimited.peak_reserved_bytes.max(step) {
            return Ok(None);
        }
    }
    while hi - lo > step {
        let mid = lo + (hi - lo) / step / 2 * step;
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(Some(hi))
}

/// Replays `trace` through `policy` for its peaks (allocated, requested, reserved), its
/// allocating device calls, its retries and where it runs out of memory, without the
/// steady-state pass, capacity search and asynchronous model that [`replay`] adds (what a
/// planner needs, at a fraction of the cost): once on an unlimited device, and again on one of
/// `options.capacity` where the first run outgrew it, as [`replay`] does. It stops at the
/// trace's last allocation: the frees after it change none of these (a free only returns
/// memory), so the report's freeing device calls and synchronisations leave them out
/// (a plan's sequence ends by freeing everything: a third of its events).
pub fn replay_peaks(
    trace: &Trace,
    policy: impl PolicySource,
    options: &ReplayOptions,
) -> Result<PolicyReport, ReplayError> {
    let policy: &dyn PolicySource = &policy;
    let options = ReplayOptions {
        placement_only: true,
        ..options.clone()
    };
    let end = trace
        .events
        .iter()
        .rposition(|e| matches!(e, Event::Alloc { .. }))
        .map_or(0, |last| last + 1);
    let unlimited = run_until(
        trace,
        end,
        policy,
        UNLIMITED_CAPACITY,
        &options,
        &mut |_| {},
    )?;
    let report = unlimited.report(policy, trace, None);
    let within = within_capacity(
        trace,
        end,
        policy,
        &options,
        (unlimited, report),
        None,
        &mut |_| {},
    )?;
    Ok(within.report)
}

/// Replays `trace` through each of `policies`, in order.
pub fn replay_all(
    trace: &Trace,
    policies: &[PolicyKind],
    options: &ReplayOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Vec<PolicyReport>, ReplayError> {
    policies
        .iter()
        .map(|&p| replay(trace, p, options, progress).map(|r| r.report))
        .collect()
}

/// Of several ranks' replays (one list of policy reports per rank, as [`replay_all`] returns),
/// the rank whose highest peak reserved bytes, over its policies, is the highest: the rank that
/// decides whether a distributed job fits. The first such rank on a tie; 0 when there is none.
pub fn highest_rank<'a>(ranks: impl IntoIterator<Item = &'a [PolicyReport]>) -> usize {
    let peaks = ranks.into_iter().map(|reports| {
        reports
            .iter()
            .map(|r| r.peak_reserved_bytes)
            .max()
            .unwrap_or(0)
    });
    let mut best = (0, 0);
    for (rank, peak) in peaks.enumerate() {
        if peak > best.1 {
            best = (rank, peak);
        }
    }
    best.0
}

/// The step marked last before event `index`.
fn step_at(trace: &Trace, index: usize) -> Option<u64> {
    trace.events[..index].iter().rev().find_map(|e| match e {
        Event::Step { index } => Some(*index),
        _ => None,
    })
}

/// One pass of a trace through a pool.
struct Run {
    pool: Pool,
    stats: MemoryStats,
    /// Where the replay ran out of memory, if it did.
    oom: Option<FirstOom>,
    initial_state: Option<InitialState>,
    /// Hazards the checker found (see [`PolicyReport::hazards`]).
    hazards: usize,
    events: usize,
    seconds: f64,
}

impl Run {
    /// Where this run, on a device of `capacity` bytes, ran out of memory, if it did.
    fn oom_report(&self, trace: &Trace, capacity: u64) -> Option<OomReport> {
        self.oom.as_ref().map(|(index, oom)| OomReport {
            capacity_bytes: capacity,
            event_index: *index,
            step: step_at(trace, *index),
            requested_bytes: oom.requested,
            allocated_bytes: oom.pool.allocated,
            reserved_bytes: oom.pool.reserved,
            message: oom.to_string(),
        })
    }
}

/// A fresh pool of `policy` for `trace` on an address-only device of `capacity` bytes, for
/// placement only (see [`replay_pool`] for the asynchronous model).
fn new_pool(
    trace: &Trace,
    policy: &dyn PolicySource,
    capacity: u64,
    options: &ReplayOptions,
    history_capacity: usize,
) -> Result<Pool, ReplayError> {
    Ok(replay_pool(trace, policy, capacity, options, history_capacity, false)?.0)
}

/// A fresh pool of `policy` for `trace` on an address-only device of `capacity` bytes, whose
/// `malloc` hands out the addresses the traced driver did ([`Trace::initial_segments`], then
/// [`Trace::device_allocations`]) for allocations of the same sizes. With `asynchronous`, the
/// trace's work runs asynchronously: the device is a simulated GPU that finishes work only
/// when the host waits for it, watched by a [`HazardChecker`] (returned too,
/// for the hazards it finds), and every block is used by a kernel on its stream when it is
/// allocated and right before it is freed ([`KernelsOnBlocks`]).
fn replay_pool(
    trace: &Trace,
    policy: &dyn PolicySource,
    capacity: u64,
    options: &ReplayOptions,
    history_capacity: usize,
    asynchronous: bool,
) -> Result<(Pool, Option<Arc<HazardChecker>>), ReplayError> {
    let sim = Arc::new(SimDevice::new(SimConfig {
        granularity: Some(replay_granularity(trace)),
        ..SimConfig::address_only(capacity)
    })?);
    // The segments a mid-process trace starts with are taken over first, at their addresses.
    let initial = trace.initial_segments.iter().filter(|s| !s.expandable);
    sim.place_mallocs_at(
        initial
            .map(|s| (s.address, s.size))
            .chain(trace.device_allocations.iter().map(|a| (a.address, a.size))),
    );
    let checker =
        asynchronous.then(|| {
            let work = sim.clone();
            Arc::new(HazardChecker::new(sim.clone()).with_work(Box::new(
                move |stream, duration_ns| work.enqueue_timed_work(stream, duration_ns),
            )))
        });
    let device: Arc<dyn Device> = match &checker {
        Some(checker) => checker.clone(),
        None => sim,
    };
    let pool_options = PoolOptions {
        history_capacity,
        ..PoolOptions::default()
    };
    let pool = pool_of(device, policy, options, pool_options)
        .map_err(|source| ReplayError::Pool { index: 0, source })?;
    if let Some(checker) = &checker {
        pool.add_observer(Box::new(KernelsOnBlocks {
            checker: checker.clone(),
            kernels: 0,
        }));
    }
    Ok((pool, checker))
}

/// The VMM page `trace` is replayed on: the GPUs' 2 MiB, or, for a trace whose live bytes
/// pass [`MAX_REPLAY_PAGES`] of those (512 GiB: more than any GPU holds, as a plan of a model
/// far too large for one does), the smallest power-of-two multiple of it that keeps them
/// within that many pages. Policies that map memory page by page (`gpumem`, `expandable`)
/// then make as many device calls as for a GPU-sized trace, not one per 2 MiB of terabytes
/// (minutes and gigabytes of host memory), and round what they reserve to that page.
fn replay_granularity(trace: &Trace) -> u64 {
    let pages = trace
        .summary()
        .peak_live_bytes
        .div_ceil(DEFAULT_GRANULARITY)
        .div_ceil(MAX_REPLAY_PAGES);
    DEFAULT_GRANULARITY.saturating_mul(pages.max(1).next_power_of_two())
}

/// The work of a replayed trace: a kernel on a block's stream right after it is handed out and
/// right before its free is requested, each reading or writing the bytes asked for.
struct KernelsOnBlocks {
    checker: Arc<HazardChecker>,
    /// Kernels declared so far: each one's label.
    kernels: u64,
}

/// A kernel's nominal run time: its bytes at 2 TB/s, at least 5 µs.
fn kernel_ns(bytes: u64) -> u64 {
    (bytes / 2_000).max(5_000)
}

impl PoolObserver for KernelsOnBlocks {
    fn on_event(&mut self, event: &PoolEvent) {
        if matches!(event.action, Action::Alloc | Action::FreeRequested) && event.size > 0 {
            self.kernels += 1;
            let range = [(event.addr, event.size)];
            // The checker records the use before the simulated device queues the work; a
            // device refusal (it knows the stream) changes nothing the replay reports.
            let _ = self
                .checker
                .launch(event.stream, &range, kernel_ns(event.size), self.kernels);
        }
    }
}

/// A fresh pool over `device` running a policy of `policy`, made with `options`' settings.
fn pool_of(
    device: Arc<dyn Device>,
    policy: &dyn PolicySource,
    options: &ReplayOptions,
    pool_options: PoolOptions,
) -> Result<Pool, PoolError> {
    let made = policy.make(options).map_err(PoolError::Config)?;
    Pool::with_policy(device, made, pool_options)
}

/// The index of the first allocation that failed with out-of-memory, and its explanation.
type FirstOom = (usize, Box<OomError>);

/// How [`drive`] treats events that do not fit the blocks it holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mismatch {
    /// An error: the trace is invalid.
    Reject,
    /// Repeating part of a trace: an alloc at a held address frees the old block first, a free
    /// of an address not held is skipped.
    Tolerate,
}

/// Replays `events` into `pool`, mapping trace addresses to pool pointers in `live`, calling
/// `on_event` with each event's index once the event is applied. Returns the allocating device
/// calls of each step (steps end at `Step` markers and at the end) and the first out-of-memory
/// failure, where it stops.
fn drive(
    pool: &Pool,
    events: &[Event],
    live: &mut AddressMap<u64>,
    mismatch: Mismatch,
    on_event: &mut dyn FnMut(usize),
) -> Result<(Vec<u64>, Option<FirstOom>), ReplayError> {
    let mut calls_per_step = Vec::new();
    let allocating_calls = || pool.stats().device_calls.allocating();
    let mut calls_before = allocating_calls();
    let mut close_step = |calls_per_step: &mut Vec<u64>| {
        let calls = allocating_calls();
        calls_per_step.push(calls - calls_before);
        calls_before = calls;
    };
    for (index, event) in events.iter().enumerate() {
        match *event {
            Event::Alloc { addr, size, stream } => {
                if let Some(previous) = live.remove(&addr) {
                    if mismatch == Mismatch::Reject {
                        return Err(ReplayError::AllocOfLive { index, addr });
                    }
                    pool.free(previous)
                        .map_err(|source| ReplayError::Pool { index, source })?;
                }
                match pool.allocate(size, StreamId(stream)) {
                    Ok(a) => {
                        live.insert(addr, a.ptr);
                    }
                    Err(PoolError::OutOfMemory(e)) => {
                        return Ok((calls_per_step, Some((index, e))))
                    }
                    Err(source) => return Err(ReplayError::Pool { index, source }),
                }
            }
            Event::Free { addr, .. } => match live.remove(&addr) {
                Some(ptr) => pool
                    .free(ptr)
                    .map_err(|source| ReplayError::Pool { index, source })?,
                None if mismatch == Mismatch::Reject => {
                    return Err(ReplayError::FreeOfNonLive { index, addr })
                }
                None => {}
            },
            Event::Step { .. } => close_step(&mut calls_per_step),
        }
        on_event(index);
    }
    close_step(&mut calls_per_step);
    Ok((calls_per_step, None))
}

/// Replays `trace` through a fresh pool of `policy` on a device of `capacity` bytes.
fn run(
    trace: &Trace,
    policy: &dyn PolicySource,
    capacity: u64,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Run, ReplayError> {
    run_until(
        trace,
        trace.events.len(),
        policy,
        capacity,
        options,
        progress,
    )
}

/// [`run`] over `trace`'s events before `end`.
fn run_until(
    trace: &Trace,
    end: usize,
    policy: &dyn PolicySource,
    capacity: u64,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Run, ReplayError> {
    let (pool, checker) = replay_pool(
        trace,
        policy,
        capacity,
        options,
        options.history_capacity,
        !options.placement_only,
    )?;
    let total = end;
    let started = Instant::now();
    let mut on_event = |index: usize| {
        if index.is_multiple_of(PROGRESS_EVERY) {
            progress(Progress {
                policy: policy.name(),
                done: index,
                total,
            });
        }
    };
    let (_, oom, initial_state) =
        initial_state::drive_until(&pool, trace, end, &mut AddressMap::default(), &mut on_event)?;
    progress(Progress {
        policy: policy.name(),
        done: total,
        total,
    });
    let seconds = started.elapsed().as_secs_f64();
    Ok(Run {
        stats: pool.stats(),
        pool,
        oom,
        initial_state,
        hazards: checker.map_or(0, |c| c.hazards().len()),
        events: total,
        seconds,
    })
}

/// Times the trace's steps after the first are repeated to measure the steady state.
const STEADY_REPEATS: usize = 2;

/// The most allocating device calls of any step once the trace's steps after the first are
/// repeated [`STEADY_REPEATS`] more times on a pool that has replayed the whole trace: what the
/// policy costs per step once warm, which a short recorded trace may not reach by itself.
/// `None` for a trace with fewer than two steps.
fn steady_state_calls(
    trace: &Trace,
    policy: &dyn PolicySource,
    options: &ReplayOptions,
) -> Result<Option<SteadyState>, ReplayError> {
    let steps: Vec<usize> = trace
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, Event::Step { .. }))
        .map(|(i, _)| i)
        .collect();
    if steps.len() < 2 {
        return Ok(None);
    }
    let pool = new_pool(trace, policy, UNLIMITED_CAPACITY, options, 0)?;
    let mut live = AddressMap::default();
    let mut ignore = |_| {};
    initial_state::drive_trace(&pool, trace, &mut live, &mut ignore)?;
    let mut most = SteadyState::default();
    // Step by step from the second step marker on, each step up to the next marker (the last
    // one up to the end), so that every step's calls are counted on their own.
    let bounds: Vec<(usize, usize)> = steps[1..]
        .iter()
        .zip(steps[2..].iter().chain([&trace.events.len()]))
        .map(|(&from, &to)| (from, to))
        .collect();
    for _ in 0..STEADY_REPEATS {
        for &(from, to) in &bounds {
            let before = pool.stats().device_calls;
            drive(
                &pool,
                &trace.events[from..to],
                &mut live,
                Mismatch::Tolerate,
                &mut ignore,
            )?;
            most = most.max(&SteadyState::between(&before, &pool.stats().device_calls));
        }
    }
    Ok(Some(most))
}

/// What one step costs in device calls: the most of any step in steady state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SteadyState {
    /// Allocating calls (malloc, create, map).
    alloc_calls: u64,
    /// Every memory-API call.
    device_calls: u64,
    /// Synchronisations, `cudaFree`'s included.
    syncs: u64,
}

impl SteadyState {
    /// The calls made between two readings of the pool's counters.
    fn between(before: &DeviceCalls, after: &DeviceCalls) -> SteadyState {
        let all = |c: &DeviceCalls| c.allocating() + c.freeing();
        SteadyState {
            alloc_calls: after.allocating() - before.allocating(),
            device_calls: all(after) - all(before),
            syncs: after.synchronizing() - before.synchronizing(),
        }
    }

    /// Each count the larger of the two.
    fn max(&self, other: &SteadyState) -> SteadyState {
        SteadyState {
            alloc_calls: self.alloc_calls.max(other.alloc_calls),
            device_calls: self.device_calls.max(other.device_calls),
            syncs: self.syncs.max(other.syncs),
        }
    }
}

impl Run {
    fn report(
        &self,
        policy: &dyn PolicySource,
        trace: &Trace,
        steady: Option<SteadyState>,
    ) -> PolicyReport {
        let s = &self.stats;
        let peak_allocated = s.allocated_bytes.all.peak;
        let peak_reserved = s.reserved_bytes.all.peak;
        PolicyReport {
            policy: policy.name().to_string(),
            peak_allocated_bytes: peak_allocated,
            peak_requested_bytes: s.requested_bytes.all.peak,
            peak_reserved_bytes: peak_reserved,
            utilization: if peak_reserved == 0 {
                1.0
            } else {
                peak_allocated as f64 / peak_reserved as f64
            },
            device_calls: s.device_calls.allocating() + s.device_calls.freeing(),
            device_alloc_calls: s.device_calls.allocating(),
            steady_state_alloc_calls_per_step: steady.map(|s| s.alloc_calls),
            steady_state_device_calls_per_step: steady.map(|s| s.device_calls),
            steady_state_syncs_per_step: steady.map(|s| s.syncs),
            synchronizations: s.device_calls.synchronizing(),
            hazards: self.hazards,
            steps: trace
                .events
                .iter()
                .filter(|e| matches!(e, Event::Step { .. }))
                .count() as u64,
            num_alloc_retries: s.num_alloc_retries,
            oom: None,
            smallest_capacity_bytes: None,
            events: self.events,
            events_per_second: self.events as f64 / self.seconds.max(1e-9),
            initial_state: self.initial_state.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peaking_at(peaks: &[u64]) -> Vec<PolicyReport> {
        peaks
            .iter()
            .map(|&peak| PolicyReport {
                policy: "p".into(),
                peak_allocated_bytes: peak,
                peak_requested_bytes: peak,
                peak_reserved_bytes: peak,
                utilization: 1.0,
                device_calls: 0,
                device_alloc_calls: 0,
                steady_state_alloc_calls_per_step: None,
                steady_state_device_calls_per_step: None,
                steady_state_syncs_per_step: None,
                synchronizations: 0,
                hazards: 0,
                steps: 0,
                num_alloc_retries: 0,
                oom: None,
                smallest_capacity_bytes: None,
                events: 0,
                events_per_second: 0.0,
                initial_state: None,
            })
            .collect()
    }

    #[test]
    fn a_trace_past_the_unlimited_device_reports_where_it_ran_out() {
        const TIB: u64 = 1 << 40;
        let alloc = |addr, size| Event::Alloc {
            addr,
            size,
            stream: 0,
        };
        let cases = [
            // Each fits the petabyte device, both together do not.
            (
                vec![alloc(4096, 600 * TIB), alloc(8192, 600 * TIB)],
                1,
                600 * TIB,
            ),
            // One block larger than the device.
            (
                vec![alloc(4096, UNLIMITED_CAPACITY + 1)],
                0,
                UNLIMITED_CAPACITY + 1,
            ),
        ];
        for (events, index, requested) in cases {
            let trace = Trace {
                events,
                ..Trace::default()
            };
            for policy in PolicyKind::ALL {
                let report = replay(&trace, policy, &ReplayOptions::default(), &mut |_| {})
                    .unwrap()
                    .report;
                let oom = report.oom.unwrap_or_else(|| panic!("{policy:?}: no OOM"));
                assert_eq!(
                    (oom.event_index, oom.requested_bytes, oom.capacity_bytes),
                    (index, requested, UNLIMITED_CAPACITY),
                    "{policy:?}"
                );
            }
        }
    }

    #[test]
    fn the_highest_rank_is_the_first_with_the_highest_policy_peak() {
        let ranks = [
            peaking_at(&[5, 9]),
            peaking_at(&[12, 3]),
            peaking_at(&[1, 12]),
        ];
        assert_eq!(highest_rank(ranks.iter().map(Vec::as_slice)), 1);
        assert_eq!(highest_rank(ranks[..1].iter().map(Vec::as_slice)), 0);
        assert_eq!(highest_rank(std::iter::empty()), 0);
    }

    /// A planned sequence ends by freeing everything (a third of the events of a large plan):
    /// `replay_peaks` stops at its last allocation, with the peaks, retries and out-of-memory
    /// point of the whole replay, on an unlimited device and on ones that make the pool empty
    /// its cache or run out.
    #[test]
    fn peaks_stop_at_the_last_allocation_with_the_whole_replays_figures() {
        let model = gpumem_plan::find_model("gpt2").unwrap();
        let workload = gpumem_plan::Settings {
            batch: Some(4),
            seq: Some(256),
            ..gpumem_plan::Settings::default()
        }
        .resolve(&model)
        .unwrap()
        .workload;
        let events = gpumem_plan::allocation_sequence(&model, &workload).unwrap();
        let trace = planned::planned_trace("gpt2", &events);
        let last = trace
            .events
            .iter()
            .rposition(|e| matches!(e, Event::Alloc { .. }))
            .unwrap();
        assert!(last + 1 < trace.events.len());
        let figures = |r: &PolicyReport| {
            (
                r.peak_allocated_bytes,
                r.peak_requested_bytes,
                r.peak_reserved_bytes,
                r.num_alloc_retries,
                r.oom.as_ref().map(|o| (o.event_index, o.reserved_bytes)),
            )
        };
        let whole = |policy, capacity| {
            let options = ReplayOptions {
                capacity,
                ..ReplayOptions::default()
            };
            replay(&trace, policy, &options, &mut |_| {})
                .unwrap()
                .report
        };
        // Just below PyTorch's reserved peak its pool empties its cache once and fits; at half
        // the live peak every policy runs out.
        let reserved = whole(PolicyKind::Torch, None).peak_reserved_bytes;
        let flushing = Some(reserved - (8 << 20));
        assert_eq!(whole(PolicyKind::Torch, flushing).num_alloc_retries, 1);
        for capacity in [None, flushing, Some(trace.summary().peak_live_bytes / 2)] {
            let options = ReplayOptions {
                capacity,
                ..ReplayOptions::default()
            };
            for policy in planned::PLAN_POLICIES {
                let peaks = replay_peaks(&trace, policy, &options).unwrap();
                let what = format!("{policy:?} {capacity:?}");
                assert_eq!(figures(&peaks), figures(&whole(policy, capacity)), "{what}");
                assert_eq!(peaks.events, last + 1, "{what}");
            }
        }
    }
}
