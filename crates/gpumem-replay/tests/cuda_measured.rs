//! The planner against PyTorch runs measured on a real GPU (an NVIDIA H200, PyTorch 2.11 with
//! CUDA 13, transformers 5.17, PEFT 0.21; `gpumem-measure-peak --device cuda`, run by hand on
//! lent machines, the LoRA, settings and multimodal grids on 2026-11-27):
//! `testdata/plan/measured_cuda*.jsonl`, six grids. Each row holds the peak allocated bytes of
//! the last step (from PyTorch's own allocation history) and PyTorch's `max_memory_reserved`
//! over the whole run; the plan's reserved is its allocation sequence replayed through the
//! `torch` policy. Run with `--nocapture` for the table.
//!
//! The harness ran every case of a grid in one process, emptying PyTorch's cache between
//! cases. The cuBLAS workspaces (32 MiB each on this GPU) are made at the first matrix product
//! of the process (the forward's) and at its first backward (the autograd thread's) and kept:
//! a case's recorded peak holds only those made during it, while its reserved peak holds the
//! segments of all made so far, whole, since `empty_cache` releases only segments with nothing
//! live in them (a workspace carved from a cached block of the first case's backward keeps
//! that block's segment for the rest of the grid). The comparison plans each case as that
//! process ran it: the planned cases of a grid replayed in order through one pool of PyTorch's
//! policy, its cache emptied and its peaks reset before each case, the workspaces made once.

mod common;

use common::median_and_max;
use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_device::{DevicePtr, StreamId};
use gpumem_plan::sequence::has_startup;
use gpumem_plan::{
    estimate, load_config, planned_run, ModelSpec, Overheads, PlannedEvent, Settings, Workload,
};
use gpumem_pool::{PolicyKind, Pool, PoolConfig};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Deserialize)]
struct Case {
    id: String,
    config: String,
    settings: Settings,
    measured: Measured,
    versions: Versions,
    run: Run,
}

/// The software a case ran under (required: a row without them cannot be compared again).
#[derive(Deserialize)]
struct Versions {
    torch: String,
    transformers: String,
}

/// Where and when a case ran.
#[derive(Deserialize)]
struct Run {
    gpu: String,
    driver: String,
    date: String,
}

#[derive(Deserialize)]
struct Measured {
    peak_allocated_bytes: u64,
    peak_reserved_bytes: u64,
    phase: Option<String>,
}

/// The harness's process: one pool of PyTorch's policy (default settings) that runs a grid's
/// cases in order, with the cuBLAS workspaces made so far.
struct Process {
    pool: Pool,
    workspaces: Vec<DevicePtr>,
}

impl Process {
    fn new() -> Process {
        let device = Arc::new(SimDevice::new(SimConfig::address_only(141 << 30)).unwrap());
        let config = PoolConfig {
            policy: PolicyKind::Torch,
            ..PoolConfig::default()
        };
        Process {
            pool: Pool::new(device, config).unwrap(),
            workspaces: Vec::new(),
        }
    }

    /// Runs one planned case as the harness did (`gc.collect()`, `empty_cache()`,
    /// `reset_peak_memory_stats()`, then the case): returns its peak reserved bytes and the
    /// bytes of its workspaces the process made before it (not in the case's recorded peak).
    fn run(&mut self, id: &str, model: &ModelSpec, workload: &Workload) -> (u64, u64) {
        assert!(!has_startup(workload), "{id}: a start-up phase");
        let run = planned_run(model, workload).unwrap_or_else(|e| panic!("{id}: {e}"));
        self.pool.empty_cache().unwrap();
        self.pool.reset_peak_stats();
        // The workspaces of this case the process already has (their events are skipped), and
        // those it makes now (kept past the case).
        let had = self.workspaces.len().min(run.process_workspaces.len());
        let skipped = &run.process_workspaces[..had];
        let kept = &run.process_workspaces[had..];
        let made_before = self.workspaces[..had]
            .iter()
            .map(|&p| self.pool.allocation(p).unwrap().size)
            .sum();
        let mut live: HashMap<u64, DevicePtr> = HashMap::new();
        for event in &run.events {
            match *event {
                PlannedEvent::Alloc { id: tensor, .. } if skipped.contains(&tensor) => {}
                PlannedEvent::Alloc {
                    id: tensor,
                    bytes,
                    stream,
                } => {
                    let ptr = self
                        .pool
                        .allocate(bytes, StreamId(stream.id()))
                        .unwrap()
                        .ptr;
                    if kept.contains(&tensor) {
                        self.workspaces.push(ptr);
                    } else {
                        live.insert(tensor, ptr);
                    }
                }
                PlannedEvent::Free { id: tensor } => {
                    if let Some(ptr) = live.remove(&tensor) {
                        self.pool.free(ptr).unwrap();
                    }
                }
                PlannedEvent::Step { .. } => {}
            }
        }
        assert!(live.is_empty(), "{id}: tensors left live");
        (self.pool.stats().reserved_bytes.all.peak, made_before)
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One measured case as planned: its model and its relative errors.
struct Planned {
    model: gpumem_plan::ModelSpec,
    settings: Settings,
    allocated_error: f64,
    reserved_error: f64,
}

/// Every case of `file` as planned, after printing its table.
fn planned(file: &str) -> Vec<Planned> {
    let text = std::fs::read_to_string(repo().join("testdata/plan").join(file))
        .unwrap_or_else(|e| panic!("{file}: {e}"));
    let overheads = Overheads {
        context_bytes: 0,
        allocator_fraction: 0.0,
    };
    println!(
        "{:<58} {:>11} {:>11} {:>8} {:>11} {:>11} {:>8}  phase",
        file, "alloc", "planned", "error", "reserved", "planned", "error"
    );
    let mut rows = Vec::new();
    let mut process = Process::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: Case = serde_json::from_str(line).unwrap_or_else(|e| panic!("{file}: {e}"));
        for (what, value) in [
            ("versions.torch", &case.versions.torch),
            ("versions.transformers", &case.versions.transformers),
            ("run.gpu", &case.run.gpu),
            ("run.driver", &case.run.driver),
            ("run.date", &case.run.date),
        ] {
            assert!(!value.is_empty(), "{}: {what} is empty", case.id);
        }
        let model = load_config(&repo().join(&case.config)).unwrap();
        let settings = Settings {
            gpu: Some("h200".into()),
            ..case.settings.clone()
        };
        let workload = settings.to_workload().unwrap();
        let plan =
            estimate(&model, &workload, &overheads).unwrap_or_else(|e| panic!("{}: {e}", case.id));
        // The recorded peak holds only the workspaces made during the case.
        let (planned_reserved, held_before) = process.run(&case.id, &model, &workload);
        let m = &case.measured;
        let planned_allocated = plan.peak_allocated_bytes - held_before;
        let a = planned_allocated as f64 / m.peak_allocated_bytes as f64 - 1.0;
        let r = planned_reserved as f64 / m.peak_reserved_bytes as f64 - 1.0;
        println!(
            "{:<58} {:>11} {:>11} {:>+7.2}% {:>11} {:>11} {:>+7.2}%  {} / {}",
            case.id,
            m.peak_allocated_bytes,
            planned_allocated,
            100.0 * a,
            m.peak_reserved_bytes,
            planned_reserved,
            100.0 * r,
            m.phase.as_deref().unwrap_or("-"),
            plan.peak_phase.label()
        );
        rows.push(Planned {
            model,
            settings: case.settings,
            allocated_error: a,
            reserved_error: r,
        });
    }
    rows
}

/// |relative errors| (allocated, reserved) of every case of `file`, after printing its table.
fn errors(file: &str) -> (Vec<f64>, Vec<f64>) {
    planned(file)
        .iter()
        .map(|p| (p.allocated_error.abs(), p.reserved_error.abs()))
        .unzip()
}

/// The measured files, one per grid.
const FILES: [&str; 6] = [
    "measured_cuda.jsonl",
    "measured_cuda_heldout.jsonl",
    "measured_cuda_architectures.jsonl",
    "measured_cuda_lora.jsonl",
    "measured_cuda_settings.jsonl",
    "measured_cuda_multimodal.jsonl",
];

/// Goal for the median |error| of the planned peak allocated bytes over each file.
const ALLOCATED_MEDIAN_GOAL: f64 = 0.01;

/// Bound on any one case's |error| of the planned peak allocated bytes: issue 28's 5 % (the
/// largest today is 3.9 %, OPT-350m's fp16 step without an optimizer; docs/plan.md states each
/// set's), so that no change makes a case worse unnoticed.
const ALLOCATED_MAX_BOUND: f64 = 0.05;

/// Bound on a set's median |error| of the planned peak reserved bytes (the multimodal grid's
/// 2.9 % is the largest docs/plan.md states), each case replayed in the grid's process
/// ([`Process`]).
const RESERVED_MEDIAN_BOUND: f64 = 0.04;

/// Bound on any one case's |error| of the planned peak reserved bytes (15.7 %, Qwen2.5-2l's
/// bf16 step without a loss, is the largest docs/plan.md states).
const RESERVED_MAX_BOUND: f64 = 0.16;

#[test]
fn planner_against_h200_measurements() {
    let (mut cases, mut reserved_sum) = (0, 0.0);
    for file in FILES {
        let (mut allocated, mut reserved) = errors(file);
        cases += reserved.len();
        reserved_sum += reserved.iter().sum::<f64>();
        let (am, ax) = median_and_max(&mut allocated);
        let (rm, rx) = median_and_max(&mut reserved);
        println!(
            "{file}: {} cases; allocated median {:.2}% max {:.2}%; reserved median {:.2}% max {:.2}%\n",
            allocated.len(),
            100.0 * am,
            100.0 * ax,
            100.0 * rm,
            100.0 * rx
        );
        assert!(
            am <= ALLOCATED_MEDIAN_GOAL,
            "{file}: median |error| of allocated {:.2}%",
            100.0 * am
        );
        assert!(
            ax <= ALLOCATED_MAX_BOUND,
            "{file}: max |error| of allocated {:.2}%",
            100.0 * ax
        );
        assert!(
            rm <= RESERVED_MEDIAN_BOUND && rx <= RESERVED_MAX_BOUND,
            "{file}: |error| of reserved: median {:.2}%, max {:.2}%",
            100.0 * rm,
            100.0 * rx
        );
    }
    // One figure for the whole planned sequence, as docs/plan.md follows it from session to
    // session.
    println!(
        "all sets: {cases} cases; reserved |error| summed {:.0} points",
        100.0 * reserved_sum
    );
}

/// Every column sum (a linear's bias gradient, `grad.sum(0)` over a contiguous
/// `rows × cols` gradient) in the H200's op logs (`gpumem-op-log`,
/// `testdata/plan/oplogs/h200.jsonl.gz`) took, beyond its output, the staging the planner
/// gives it: PyTorch's own allocations, not our arithmetic's.
#[test]
fn column_sum_staging_matches_the_h200_op_logs() {
    use std::collections::BTreeMap;
    use std::io::{BufRead, BufReader};
    let file = std::fs::File::open(repo().join("testdata/plan/oplogs/h200.jsonl.gz")).unwrap();
    let h200 = gpumem_plan::find_gpu("h200").unwrap().cores;
    // (rows, cols) → the peak above the op's end, each time it ran.
    let mut seen: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
    for line in BufReader::new(flate2::read::GzDecoder::new(file)).lines() {
        let case: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        for op in case["ops"].as_array().unwrap() {
            let (name, peak, after) = (&op[0], op[2].as_u64(), op[3].as_u64());
            let input = &op[5][0];
            let shape: Vec<u64> = input[0]
                .as_array()
                .map(|dims| dims.iter().filter_map(|d| d.as_u64()).collect())
                .unwrap_or_default();
            let output = op[4][0].as_array().map_or(0, Vec::len);
            if name == "sum"
                && shape.len() == 2
                && output == 2
                && op[4][0][0] == serde_json::json!(1)
            {
                let extra = peak.unwrap() - after.unwrap();
                seen.entry((shape[0], shape[1])).or_default().push(extra);
            }
        }
    }
    assert!(seen.keys().any(|&(rows, _)| rows >= 1024), "{seen:?}");
    for (&(rows, cols), extras) in &seen {
        let planned = gpumem_plan::column_sum_staging_bytes(rows, cols, &h200);
        println!("{rows} × {cols}: planned {planned}, logged {extras:?}");
        assert!(
            extras.contains(&planned),
            "{rows} × {cols}: planned {planned}, logged {extras:?}"
        );
    }
}

/// fp32 inference with grouped keys under SDPA is the path only CUDA takes (its math path:
/// transformers builds no mask, the kernel its own causal bias; a 1-byte mask beside the
/// probabilities): every such H200 case is planned within 0.5 % (StarCoder's multi-query
/// attention −0.36 %, the others −0.01 %).
#[test]
fn grouped_key_fp32_inference_matches_the_h200() {
    let mut checked = 0;
    for file in FILES {
        for p in planned(file) {
            let gpumem_plan::Architecture::Transformer(t) = &p.model.arch else {
                continue;
            };
            let s = &p.settings;
            if t.kv_heads < t.heads
                && t.sliding.is_none()
                && s.mode.as_deref() == Some("infer")
                && s.dtype.as_deref() == Some("fp32")
                && s.attn.as_deref() == Some("sdpa")
            {
                checked += 1;
                assert!(
                    p.allocated_error.abs() < 0.005,
                    "{}: {:+.2} %",
                    p.model.name,
                    100.0 * p.allocated_error
                );
            }
        }
    }
    assert!(checked >= 7, "{checked} cases");
}

/// AdamW's foreach step on the H200 (PyTorch 2.11's `_multi_tensor_adam` with
/// `decoupled_weight_decay`, not capturable, not maximising): the step counters, the decoupled
/// weight decay (`_foreach_mul_` of the parameters), both moments (`_foreach_lerp_`,
/// `_foreach_mul_`, `_foreach_addcmul_`), the bias corrections and eps (`_foreach_div_`,
/// `_foreach_add_`) and the update (`_foreach_addcdiv_`) run in place; only `_foreach_sqrt`
/// of the second moments makes new tensors, one per trainable parameter in the states' dtype.
/// The planner's foreach temporaries are that list: every op-log case with a foreach AdamW step
/// holds them (its trainable parameters × the states' bytes; byte for byte but for T5's bias
/// tables), once per step.
#[test]
fn foreach_adamw_temporaries_match_the_h200_op_logs() {
    use std::io::{BufRead, BufReader};
    let mut settings = std::collections::HashMap::new();
    for file in FILES {
        let text = std::fs::read_to_string(repo().join("testdata/plan").join(file)).unwrap();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let case: Case = serde_json::from_str(line).unwrap();
            settings.insert(case.id, (case.config, case.settings));
        }
    }
    let file = std::fs::File::open(repo().join("testdata/plan/oplogs/h200.jsonl.gz")).unwrap();
    let mut checked = 0;
    for line in BufReader::new(flate2::read::GzDecoder::new(file)).lines() {
        let case: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        let id = case["id"].as_str().unwrap();
        let ops = case["ops"].as_array().unwrap();
        let foreach: Vec<&serde_json::Value> = ops
            .iter()
            .filter(|op| op[0].as_str().unwrap().starts_with("_foreach_"))
            .collect();
        let sqrts: Vec<&&serde_json::Value> = foreach
            .iter()
            .filter(|op| op[0] == "_foreach_sqrt")
            .collect();
        if sqrts.is_empty() {
            continue;
        }
        for op in &foreach {
            if op[0] != "_foreach_sqrt" {
                assert_eq!(op[1], op[3], "{id}: {} allocated", op[0]);
                assert_eq!(op[1], op[2], "{id}: {} peaked", op[0]);
            }
        }
        let (config, s) = &settings[id];
        let model = load_config(&repo().join(config)).unwrap();
        let workload = s.resolve(&model).unwrap().workload;
        let plan = gpumem_plan::estimate(&model, &workload, &Overheads::default()).unwrap();
        // States in fp32 under autocast and for PEFT's fp32 adapters, else in the weights' dtype.
        let state_bytes = if s.amp.is_some() || s.lora_rank.is_some() {
            4
        } else {
            workload.dtype.bytes()
        };
        let planned = plan.trainable_params * state_bytes;
        assert_eq!(sqrts.len(), 2, "{id}: one list per step");
        for sqrt in sqrts {
            let made: u64 = sqrt[4]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t[2].as_u64().unwrap())
                .sum();
            println!("{id}: _foreach_sqrt made {made} B, planned {planned} B");
            // T5's relative position bias tables (32 buckets × heads, one per stack: 512 and
            // 384 parameters) are not among the planner's trainable parameters: within 0.01 %.
            let off = made.abs_diff(planned) as f64 / made as f64;
            assert!(off < 1e-4, "{id}: made {made}, planned {planned}");
        }
        checked += 1;
    }
    assert!(checked >= 8, "{checked} cases with a foreach AdamW step");
}
