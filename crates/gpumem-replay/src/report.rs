//! What `gpumem replay` and `gpumem tune` answer, as values: the trace replayed, the capacity
//! checked and one [`PolicyReport`] per policy (per rank for a job's several traces). The
//! command line's `--json`, its tables and the Python package render these types; their JSON
//! form is the documented schema (pinned by `tests/report_schema.rs`).

use gpumem_pool::PolicyKind;
use gpumem_trace::Trace;
use serde::Serialize;

use crate::tune::TuneReport;
use crate::{highest_rank, replay, PolicyReport, Progress, ReplayError, ReplayOptions};

/// The trace `gpumem replay` replays when given none: a real PyTorch training trace (GPT-2,
/// 12 layers, batch 4, sequence 256, AdamW, 4 steps) captured by `gpumem-capture-trace`.
pub const EXAMPLE_TRACE: &[u8] =
    include_bytes!("../../../testdata/traces/gpt2-12l-train-b4-s256.jsonl.gz");

/// The trace a report is about: its name, where it came from, its length and its peak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceInfo {
    /// The trace's name (the file's, or the one recorded in it).
    pub name: String,
    /// What produced it (`pytorch-snapshot`, `rmm-log`, `gpumem-plan`, …).
    pub source: String,
    /// Events: allocations, frees and step marks.
    pub events: usize,
    /// Step marks.
    pub steps: u64,
    /// The most bytes live at once.
    pub peak_live_bytes: u64,
    /// One sentence per kind of input the reader skipped (RMM `allocate failure` rows, snapshot
    /// entries of unknown actions, …): what the replay leaves out. Empty when nothing was.
    pub skipped: Vec<String>,
}

impl TraceInfo {
    /// The summary of `trace`.
    pub fn of(trace: &Trace) -> TraceInfo {
        let summary = trace.summary();
        TraceInfo {
            name: trace.meta.name.clone(),
            source: trace.meta.source.clone(),
            events: summary.events,
            steps: summary.steps,
            peak_live_bytes: summary.peak_live_bytes,
            skipped: trace.meta.skipped_notes(),
        }
    }
}

/// A built-in policy as `gpumem policies` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyInfo {
    /// The name `GPUMEM_POOL` and `--policy` take.
    pub name: &'static str,
    /// What the policy is, in one line.
    pub description: &'static str,
    /// Whether a pool runs it when no policy is chosen.
    pub default: bool,
}

impl PolicyInfo {
    /// Every built-in policy, in the order reports list them, the default marked.
    pub fn all() -> Vec<PolicyInfo> {
        let default = gpumem_pool::PoolConfig::default().policy;
        PolicyKind::ALL
            .iter()
            .map(|&kind| PolicyInfo {
                name: kind.as_str(),
                description: kind.description(),
                default: kind == default,
            })
            .collect()
    }
}

/// One trace replayed through several policies: `gpumem replay --json` of one trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplayReport {
    /// The trace replayed.
    pub trace: TraceInfo,
    /// The device capacity checked for out-of-memory, if one was given.
    pub capacity_bytes: Option<u64>,
    /// One report per policy, in the order asked for.
    pub policies: Vec<PolicyReport>,
}

/// One rank of a job: its trace and its policies' reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankReport {
    /// The rank: the trace's position among those given.
    pub rank: usize,
    /// The rank's trace.
    pub trace: TraceInfo,
    /// One report per policy.
    pub policies: Vec<PolicyReport>,
}

/// Several traces of one job (its ranks) replayed side by side: `gpumem replay --json` of
/// several traces.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RanksReport {
    /// The device capacity checked, if one was given.
    pub capacity_bytes: Option<u64>,
    /// Every rank, in the order given.
    pub ranks: Vec<RankReport>,
    /// The rank whose highest policy peaks highest: the one to size the job for.
    pub highest_rank: usize,
}

impl RanksReport {
    /// The ranks' reports, the highest found.
    pub fn new(capacity_bytes: Option<u64>, ranks: Vec<ReplayReport>) -> RanksReport {
        let highest_rank = highest_rank(ranks.iter().map(|r| r.policies.as_slice()));
        RanksReport {
            capacity_bytes,
            ranks: ranks
                .into_iter()
                .enumerate()
                .map(|(rank, r)| RankReport {
                    rank,
                    trace: r.trace,
                    policies: r.policies,
                })
                .collect(),
            highest_rank,
        }
    }
}

/// The search of PyTorch's allocator options for a trace: `gpumem tune --json`.
#[derive(Debug, Clone, Serialize)]
pub struct TuneResult {
    /// The trace tuned for.
    pub trace: TraceInfo,
    /// The settings found, best first, and what they are compared with.
    pub tune: TuneReport,
}

/// Replays `trace` through each of `policies` in turn ([`replay()`]), reporting progress.
pub fn replay_report(
    trace: &Trace,
    policies: &[PolicyKind],
    options: &ReplayOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<ReplayReport, ReplayError> {
    let policies = policies
        .iter()
        .map(|&policy| replay(trace, policy, options, progress).map(|r| r.report))
        .collect::<Result<_, _>>()?;
    Ok(ReplayReport {
        trace: TraceInfo::of(trace),
        capacity_bytes: options.capacity,
        policies,
    })
}
