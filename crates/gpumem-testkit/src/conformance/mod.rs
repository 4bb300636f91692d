//! One conformance suite for every [`Device`] backend, as RMM runs one test suite over every
//! memory resource: the simulated device, the CUDA backend (on the mock driver or a GPU) and
//! wgpu run the same scenarios through [`run`].
//!
//! - **The device contract**: memory comes and goes with `mem_info` accounting for it; bad
//!   calls (zero-size `malloc`, frees of pointers the device did not hand out, copies outside
//!   allocations, VMM calls on the wrong ranges or handles) are refused with an error, never a
//!   panic; streams and events are made, recorded, queried, waited for and destroyed; copies
//!   round-trip bytes; a VMM chunk mapped at two addresses shows the same bytes at both.
//! - **A pool under asynchronous work**: each built-in policy the device supports runs a fixed
//!   multi-stream workload over a [`HazardChecker`](gpumem_device::HazardChecker): blocks
//!   written and used by declared kernels, lent to other streams through events and
//!   `record_stream`, freed behind a last kernel, with `empty_cache`, `synchronize`, a hard
//!   limit set mid-run and growth until out of memory. It must end with everything given back
//!   and no memory unmapped, released or re-lent under work that may still use it.
//!
//! A scenario needs only what [`Offers`] says the backend has; what it lacks is skipped and
//! listed in the [`Report`] with the reason, and the first scenario checks that the device
//! offers what the description says, so that nothing is skipped by mistake. Each scenario gets
//! a fresh device and runs under `catch_unwind`: a panic is a failure like any other.

mod contract;
mod pool;

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use gpumem_device::hazards::WorkHook;
use gpumem_device::{Device, DeviceError};
use gpumem_pool::PolicyKind;

use crate::Rng;

/// What a backend offers. The suite skips what it lacks, and checks that the device offers
/// what is said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offers {
    /// Virtual memory management ([`Device::vmm`] is `Some`).
    pub vmm: bool,
    /// Independent streams: [`Device::create_stream`] makes new ones. Otherwise the device has
    /// one queue and every stream is it.
    pub streams: bool,
    /// Copies between host and device memory.
    pub copies: bool,
}

/// A fresh device for one scenario.
pub struct Subject {
    /// The device under test.
    pub device: Arc<dyn Device>,
    /// How a declared kernel takes time on the device, for a backend that can keep work queued
    /// until the host waits for it (the simulated device's `enqueue_timed_work`); it is handed
    /// to [`HazardChecker::with_work`](gpumem_device::HazardChecker::with_work). `None`:
    /// kernels are only declared to the checker.
    pub work: Option<WorkHook>,
}

impl Subject {
    /// A device whose kernels are only declared.
    pub fn new(device: Arc<dyn Device>) -> Subject {
        Subject { device, work: None }
    }

    /// Runs declared kernels on the device through `work`.
    pub fn with_work(mut self, work: WorkHook) -> Subject {
        self.work = Some(work);
        self
    }
}

impl<D: Device + 'static> From<Arc<D>> for Subject {
    fn from(device: Arc<D>) -> Subject {
        Subject::new(device)
    }
}

/// A scenario that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The scenario's name.
    pub scenario: String,
    /// What went wrong.
    pub problem: String,
}

/// A scenario, or part of one, that did not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip {
    /// What was skipped.
    pub scenario: String,
    /// What the backend lacks.
    pub reason: String,
}

/// What a run of the suite found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The name of the first device opened.
    pub device: String,
    /// The scenarios that passed.
    pub passed: Vec<String>,
    /// What was skipped, and why.
    pub skipped: Vec<Skip>,
    /// The scenarios that failed. A backend's test asserts that this is empty.
    pub failures: Vec<Failure>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "conformance of {}: {} passed, {} skipped, {} failed",
            self.device,
            self.passed.len(),
            self.skipped.len(),
            self.failures.len()
        )?;
        for name in &self.passed {
            writeln!(f, "  passed:  {name}")?;
        }
        for skip in &self.skipped {
            writeln!(f, "  skipped: {} ({})", skip.scenario, skip.reason)?;
        }
        for failure in &self.failures {
            writeln!(f, "  FAILED:  {}: {}", failure.scenario, failure.problem)?;
        }
        Ok(())
    }
}

/// Why scenarios that need VMM are skipped.
const NO_VMM: &str = "no virtual memory management";
/// Why scenarios that need copies are skipped.
const NO_COPIES: &str = "no copies between host and device";

/// What a scenario returns: `Err` says what went wrong.
type Check = Result<(), String>;

/// A scenario's body: a fresh device and what the backend offers.
type Body = Box<dyn Fn(Subject, Offers) -> Check>;

/// A scenario: its name, why it is skipped (when the backend lacks what it needs), its body.
type Scenario = (String, Option<&'static str>, Body);

/// Runs every scenario on fresh devices from `open` and reports what passed, was skipped and
/// failed.
pub fn run(offers: Offers, open: &dyn Fn() -> Subject) -> Report {
    let mut report = Report::default();
    let mut skip = |scenario: &str, reason: &str| {
        report.skipped.push(Skip {
            scenario: scenario.into(),
            reason: reason.into(),
        })
    };
    if !offers.streams {
        skip(
            "several streams",
            "one queue: every stream is the queue, so cross-stream ordering is not exercised",
        );
    }
    if !offers.copies {
        skip("byte patterns in pool blocks", NO_COPIES);
    }
    let mut scenarios: Vec<Scenario> = vec![
        plain("the device offers what the backend says", contract::offers),
        plain("malloc, free and mem_info", contract::malloc_and_free),
        plain("zero-size malloc is refused", contract::zero_size_malloc),
        plain("foreign frees are refused", contract::foreign_frees),
        plain("streams are created and destroyed", contract::streams),
        plain(
            "events are recorded, queried, waited for and destroyed",
            contract::events,
        ),
        needs(
            offers.copies,
            NO_COPIES,
            "copies round-trip bytes, outside allocations refused",
            contract::copies,
        ),
        needs(
            offers.vmm,
            NO_VMM,
            "VMM: map, alias, unmap and release",
            contract::vmm_round_trip,
        ),
        needs(
            offers.vmm,
            NO_VMM,
            "VMM: bad calls are refused",
            contract::vmm_refusals,
        ),
    ];
    for policy in PolicyKind::ALL {
        let name = format!("pool under asynchronous work: {policy}");
        let body: Body = Box::new(move |subject, offers| pool::run(subject, offers, policy));
        let lacking = (policy == PolicyKind::Expandable && !offers.vmm)
            .then_some("expandable segments need virtual memory management");
        scenarios.push((name, lacking, body));
    }
    for (name, lacking, body) in scenarios {
        if let Some(reason) = lacking {
            report.skipped.push(Skip {
                scenario: name,
                reason: reason.into(),
            });
            continue;
        }
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let subject = open();
            if report.device.is_empty() {
                report.device = subject.device.name();
            }
            body(subject, offers)
        }));
        let problem = match outcome {
            Ok(Ok(())) => {
                report.passed.push(name);
                continue;
            }
            Ok(Err(problem)) => problem,
            Err(panic) => format!("panicked: {}", panic_text(panic.as_ref())),
        };
        report.failures.push(Failure {
            scenario: name,
            problem,
        });
    }
    report
}

/// A scenario every backend runs.
fn plain(name: &str, body: fn(Subject, Offers) -> Check) -> Scenario {
    (name.into(), None, Box::new(body))
}

/// A scenario that runs only when `offered`; otherwise skipped for `lacking`.
fn needs(
    offered: bool,
    lacking: &'static str,
    name: &str,
    body: fn(Subject, Offers) -> Check,
) -> Scenario {
    (name.into(), (!offered).then_some(lacking), Box::new(body))
}

/// A panic's message.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".into())
}

/// A device call's result, with what was being done when it failed.
trait Step<T> {
    /// `Err` names `what` and the device's error.
    fn step(self, what: &str) -> Result<T, String>;
}

impl<T, E: fmt::Display> Step<T> for Result<T, E> {
    fn step(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// `Err(problem())` unless `holds`.
fn ensure(holds: bool, problem: impl FnOnce() -> String) -> Check {
    if holds {
        Ok(())
    } else {
        Err(problem())
    }
}

/// A call that must be refused with an error.
fn refused<T: fmt::Debug>(result: Result<T, DeviceError>, what: &str) -> Check {
    match result {
        Err(_) => Ok(()),
        Ok(value) => Err(format!(
            "{what} was accepted ({value:?}); it must be refused"
        )),
    }
}

/// `len` bytes that differ for every `seed` and position, so that bytes read from the wrong
/// place show.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    Rng::new(seed).fill_bytes(&mut bytes);
    bytes
}
