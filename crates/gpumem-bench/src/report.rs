//! Measuring every allocator on a workload once (no criterion) and printing the results as
//! Markdown: what `bench-report` prints and `docs/benchmarks.md` holds.

use std::fmt::Write as _;
use std::time::Duration;

use gpumem_pool::{Bytes, PolicyKind};
use gpumem_replay::{replay, PolicyReport, ReplayOptions};
use gpumem_trace::Trace;

use crate::arena::{with_arena, Allocator, Arena, WithArena};
use crate::run::{prepare, profile, Prepared, Profile, Timing};
use crate::workload::Scenario;

/// How hard [`measure_ops`] tries.
#[derive(Clone, Debug)]
pub struct OpsOptions {
    /// Most timed body passes (rounds) per allocator (the fastest pass is kept).
    pub max_passes: u32,
    /// After 3 rounds, stop once this much time per allocator has been spent timing.
    pub min_total: Duration,
    /// Give up on an allocator (setup + first pass, and separately the profiling pass) after
    /// this long: range-alloc's linear best fit at 10⁵–10⁶ live blocks.
    pub budget: Duration,
    /// Check every allocation against the live spans for overlaps during profiling.
    pub check_overlaps: bool,
}

impl Default for OpsOptions {
    fn default() -> Self {
        OpsOptions {
            max_passes: 10,
            min_total: Duration::from_secs(1),
            budget: Duration::from_secs(10),
            check_overlaps: false,
        }
    }
}

/// One allocator on one workload.
#[derive(Clone, Debug)]
pub struct OpsRow {
    /// The allocator.
    pub allocator: Allocator,
    /// Per-op cost.
    pub timing: Timing,
    /// Footprint and fragmentation; `None` when the budget ran out.
    pub profile: Option<Profile>,
}

/// Every allocator on one workload.
#[derive(Clone, Debug)]
pub struct OpsTable {
    /// Scenario name.
    pub name: String,
    /// Scenario description.
    pub description: String,
    /// Timed operations per pass.
    pub body_ops: usize,
    /// Most live blocks.
    pub max_live_blocks: usize,
    /// Peak live requested bytes.
    pub peak_live_bytes: u64,
    /// One row per allocator, in the order asked.
    pub rows: Vec<OpsRow>,
}

impl OpsTable {
    /// The row of `allocator`.
    pub fn row(&self, allocator: Allocator) -> Option<&OpsRow> {
        self.rows.iter().find(|r| r.allocator == allocator)
    }

    /// Cost of `allocator` relative to offset-allocator.
    pub fn ratio(&self, allocator: Allocator) -> Option<f64> {
        self.ratio_to(allocator, Allocator::OffsetAllocator)
    }

    /// Cost of `allocator` relative to `reference` (which must have finished its timing).
    pub fn ratio_to(&self, allocator: Allocator, reference: Allocator) -> Option<f64> {
        let r = self.row(allocator)?;
        let reference = self.row(reference).filter(|r| r.timing.complete)?;
        Some(r.timing.ns_per_op / reference.timing.ns_per_op)
    }
}

struct Prepare<'a> {
    w: &'a Scenario,
    budget: Duration,
}

impl<'a> WithArena for Prepare<'a> {
    type Output = Option<Box<dyn Prepared + 'a>>;

    fn run<A: Arena + 'static>(self, make: &dyn Fn() -> A) -> Self::Output {
        prepare(make, self.w, self.budget)
    }
}

struct Profiling<'a> {
    w: &'a Scenario,
    opts: &'a OpsOptions,
}

impl WithArena for Profiling<'_> {
    type Output = Option<Profile>;

    fn run<A: Arena + 'static>(self, make: &dyn Fn() -> A) -> Self::Output {
        let mut arena = make();
        profile(
            &mut arena,
            self.w,
            self.opts.check_overlaps,
            Some(self.opts.budget),
        )
    }
}

/// Times and profiles each of `allocators` on `w`.
///
/// Timing: every allocator gets an arena brought to the setup's state; then the body is
/// replayed in rounds, one pass per allocator per round (round-robin, so that background load
/// hits all of them alike), for at least 3 and at most `max_passes` rounds, or until about
/// `min_total` per allocator has been spent; the fastest pass counts. An allocator whose setup
/// or first pass exceeds `budget` drops out with what it did. Profiling: one more pass over
/// setup + body on a fresh arena per allocator (see [`profile`]).
pub fn measure_ops(w: &Scenario, allocators: &[Allocator], opts: &OpsOptions) -> OpsTable {
    struct Slot<'a> {
        runner: Option<Box<dyn Prepared + 'a>>,
        timing: Timing,
    }
    let mut slots: Vec<Slot<'_>> = allocators
        .iter()
        .map(|&a| {
            let runner = with_arena(
                a,
                w,
                Prepare {
                    w,
                    budget: opts.budget,
                },
            );
            Slot {
                timing: Timing {
                    ns_per_op: f64::NAN,
                    passes: 0,
                    complete: runner.is_some(),
                },
                runner,
            }
        })
        .collect();
    let started = std::time::Instant::now();
    let total = opts.min_total * allocators.len() as u32;
    let mut round = 0;
    while round < opts.max_passes.max(1) && (round < 3 || started.elapsed() < total) {
        for slot in slots.iter_mut() {
            let Some(runner) = slot.runner.as_mut() else {
                continue;
            };
            let deadline = (round == 0).then(|| std::time::Instant::now() + opts.budget);
            match runner.pass(deadline) {
                Ok(ns) => {
                    let t = &mut slot.timing;
                    t.ns_per_op = if t.passes == 0 {
                        ns
                    } else {
                        t.ns_per_op.min(ns)
                    };
                    t.passes += 1;
                }
                Err(partial) => {
                    slot.timing = Timing {
                        ns_per_op: partial,
                        passes: 0,
                        complete: false,
                    };
                    slot.runner = None;
                }
            }
        }
        round += 1;
    }
    for slot in &mut slots {
        slot.runner = None; // free the arenas before profiling
    }
    let rows = allocators
        .iter()
        .zip(slots)
        .map(|(&allocator, slot)| {
            let profile = if slot.timing.complete {
                with_arena(allocator, w, Profiling { w, opts })
            } else {
                None
            };
            OpsRow {
                allocator,
                timing: slot.timing,
                profile,
            }
        })
        .collect();
    OpsTable {
        name: w.name.clone(),
        description: w.description.clone(),
        body_ops: w.body.len(),
        max_live_blocks: w.max_live_blocks,
        peak_live_bytes: w.peak_live_bytes,
        rows,
    }
}

fn pct(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

fn ns(t: &Timing) -> String {
    match (t.complete, t.ns_per_op.is_nan()) {
        (true, _) => format!("{:.1}", t.ns_per_op),
        (false, true) => "> budget (setup)".into(),
        (false, false) => format!("≥ {:.0} (budget)", t.ns_per_op),
    }
}

/// One Markdown table per workload: ns/op, ratio to offset-allocator, failures, footprint,
/// utilisation, fragmentation.
pub fn ops_markdown(t: &OpsTable) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "#### `{}`: {}\n", t.name, t.description);
    let _ = writeln!(
        s,
        "{} timed ops per pass; at most {} live blocks; peak live {}.\n",
        t.body_ops,
        t.max_live_blocks,
        Bytes(t.peak_live_bytes)
    );
    let _ = writeln!(
        s,
        "| allocator | ns/op | × offset-allocator | failures | peak footprint | utilisation | free at peak | ext. frag. at peak |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &t.rows {
        let ratio = match t.ratio(r.allocator) {
            Some(x) if r.timing.complete => format!("{x:.2}×"),
            Some(x) if !x.is_nan() => format!("≥ {x:.0}×"),
            _ => "—".into(),
        };
        let (failures, footprint, util, free, frag) = match &r.profile {
            Some(p) => (
                p.failures.to_string(),
                Bytes(p.footprint).to_string(),
                pct(p.utilization),
                Bytes(p.free_at_peak).to_string(),
                pct(p.fragmentation),
            ),
            None => ("—".into(), "—".into(), "—".into(), "—".into(), "—".into()),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.allocator.name(),
            ns(&r.timing),
            ratio,
            failures,
            footprint,
            util,
            free,
            frag
        );
    }
    s
}

/// Replays `trace` through each of `policies` `reps` times with `options` and keeps, per
/// policy, the report of the fastest run (the memory numbers are deterministic).
pub fn measure_replay(
    trace: &Trace,
    policies: &[PolicyKind],
    reps: u32,
    options: &ReplayOptions,
) -> Vec<PolicyReport> {
    policies
        .iter()
        .filter_map(|&p| {
            let mut best: Option<PolicyReport> = None;
            for _ in 0..reps.max(1) {
                match replay(trace, p, options, &mut |_| {}) {
                    Ok(r) => {
                        if best
                            .as_ref()
                            .is_none_or(|b| r.report.events_per_second > b.events_per_second)
                        {
                            best = Some(r.report);
                        }
                    }
                    Err(e) => {
                        eprintln!("replay of {} with {p} failed: {e}", trace.meta.name);
                        return None;
                    }
                }
            }
            best
        })
        .collect()
}

/// The replay table: per trace and policy, throughput and what the policy needed.
pub fn replay_markdown(results: &[(String, Vec<PolicyReport>)]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| trace | events | policy | events/s | peak allocated | peak reserved | utilisation | device alloc calls | steady-state alloc calls/step |"
    );
    let _ = writeln!(s, "|---|---:|---|---:|---:|---:|---:|---:|---:|");
    for (name, reports) in results {
        for r in reports {
            let _ = writeln!(
                s,
                "| `{}` | {} | {} | {:.2} M | {} | {} | {} | {} | {} |",
                name,
                r.events,
                r.policy,
                r.events_per_second / 1e6,
                Bytes(r.peak_allocated_bytes),
                Bytes(r.peak_reserved_bytes),
                pct(r.utilization),
                r.device_alloc_calls,
                r.steady_state_alloc_calls_per_step
                    .map_or("—".into(), |x| format!("{x}")),
            );
        }
    }
    s
}

/// The three goals of the benchmark item, checked against the measurements: `gpumem`
/// utilisation ≥ 97 % on every real trace, per-op cost within 2× of offset-allocator (the
/// policy alone against offset-allocator; through the pool against offset-allocator behind
/// the same frame, and, for the record, against bare offset-allocator), replay ≥ 5 M
/// events/s.
pub fn goals_markdown(
    ops: &[OpsTable],
    replays: &[(String, Vec<PolicyReport>)],
    real_traces: &[String],
) -> String {
    let mut s = String::new();
    let mark = |ok: bool| if ok { "✅" } else { "❌" };
    let gpumem = PolicyKind::Gpumem.to_string();
    let _ = writeln!(s, "| goal | input | measured | met |");
    let _ = writeln!(s, "|---|---|---:|:---:|");
    for (name, reports) in replays {
        let Some(r) = reports.iter().find(|r| r.policy == gpumem) else {
            continue;
        };
        if real_traces.contains(name) {
            let _ = writeln!(
                s,
                "| `gpumem` utilisation ≥ 97 % | `{name}` | {} | {} |",
                pct(r.utilization),
                mark(r.utilization >= 0.97)
            );
        }
    }
    let ratio_rows = [
        (
            Allocator::Policy(PolicyKind::Gpumem),
            Allocator::OffsetAllocator,
            true,
        ),
        (
            Allocator::Pool(PolicyKind::Gpumem),
            Allocator::FramedOffsetAllocator,
            true,
        ),
        (
            Allocator::Pool(PolicyKind::Gpumem),
            Allocator::OffsetAllocator,
            false,
        ),
    ];
    for (allocator, reference, is_goal) in ratio_rows {
        for t in ops {
            if let Some(x) = t.ratio_to(allocator, reference) {
                let complete = t.row(allocator).is_some_and(|r| r.timing.complete);
                let (goal, met) = match is_goal {
                    true => ("≤ 2×", mark(complete && x <= 2.0)),
                    // Not comparable work (no lock, no address table): shown, not judged.
                    false => ("(for the record)", "—"),
                };
                let _ = writeln!(
                    s,
                    "| `{}` per-op cost {goal} {} | `{}` | {x:.2}× | {met} |",
                    allocator.name(),
                    reference.name(),
                    t.name,
                );
            }
        }
    }
    for (name, reports) in replays {
        if let Some(r) = reports.iter().find(|r| r.policy == gpumem) {
            let _ = writeln!(
                s,
                "| replay ≥ 5 M events/s (`gpumem`) | `{name}` | {:.2} M/s | {} |",
                r.events_per_second / 1e6,
                mark(r.events_per_second >= 5e6)
            );
        }
    }
    s
}

/// Timings a criterion benchmark records from inside `iter_custom`, so that the bench can
/// print a summary (ns per element, ratio to a reference) after criterion's own output.
#[derive(Debug, Default)]
pub struct Recorder {
    entries: std::cell::RefCell<Vec<Recorded>>,
}

#[derive(Clone, Debug)]
struct Recorded {
    group: String,
    id: String,
    iters: u64,
    elapsed: Duration,
    elements: u64,
}

impl Recorder {
    /// Records one `iter_custom` call: `iters` iterations of `elements` elements each.
    pub fn record(&self, group: &str, id: &str, iters: u64, elapsed: Duration, elements: u64) {
        self.entries.borrow_mut().push(Recorded {
            group: group.into(),
            id: id.into(),
            iters,
            elapsed,
            elements,
        });
    }

    /// Median ns per element over the last `samples` calls of `group`/`id` (criterion's
    /// measurement samples come after its warm-up calls).
    pub fn ns_per_element(&self, group: &str, id: &str, samples: usize) -> Option<f64> {
        let entries = self.entries.borrow();
        let mut v: Vec<f64> = entries
            .iter()
            .filter(|e| e.group == group && e.id == id && e.iters > 0)
            .map(|e| e.elapsed.as_nanos() as f64 / (e.iters * e.elements.max(1)) as f64)
            .collect();
        let v_len = v.len();
        v.drain(..v_len.saturating_sub(samples));
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }

    /// Groups and ids recorded, in first-seen order.
    pub fn keys(&self) -> Vec<(String, String)> {
        let mut keys: Vec<(String, String)> = Vec::new();
        for e in self.entries.borrow().iter() {
            if !keys.iter().any(|(g, i)| *g == e.group && *i == e.id) {
                keys.push((e.group.clone(), e.id.clone()));
            }
        }
        keys
    }

    /// A Markdown table per group: ns per element (median of the last `samples` calls),
    /// elements per second, and the ratio to `reference` (an id) when it was measured.
    pub fn markdown(&self, samples: usize, reference: &str, element: &str) -> String {
        let mut s = String::new();
        let keys = self.keys();
        let mut groups: Vec<&String> = Vec::new();
        for (g, _) in &keys {
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
        for g in groups {
            let reference_ns = self.ns_per_element(g, reference, samples);
            let _ = writeln!(s, "\n{g}\n");
            let _ = writeln!(
                s,
                "| benchmark | ns/{element} | M {element}s/s | × {reference} |"
            );
            let _ = writeln!(s, "|---|---:|---:|---:|");
            for (_, id) in keys.iter().filter(|(kg, _)| kg == g) {
                let Some(ns) = self.ns_per_element(g, id, samples) else {
                    continue;
                };
                let ratio = reference_ns.map_or("—".into(), |r| format!("{:.2}×", ns / r));
                let _ = writeln!(s, "| {id} | {ns:.1} | {:.2} | {ratio} |", 1e3 / ns);
            }
        }
        s
    }
}
