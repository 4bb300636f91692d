//! `gpumem plan`: the flags of [`PlanRequest`] parsed, [`gpumem_replay::plan::plan`] called,
//! its [`PlanReport`] printed as a table or JSON (and written as HTML or a trace when asked).

use crate::output::{self, CommandError};
use gpumem_plan::{allocation_sequence, PlanError, ServingProfile};
use gpumem_replay::plan::{plan, PlanReport, PlanRequest, ReservedBy};
use gpumem_replay::planned::planned_trace;
use gpumem_trace::Format;
use std::path::{Path, PathBuf};

/// Arguments of `gpumem plan` (boxed: the flags are many and the command enum stays small).
#[derive(clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    flags: Box<PlanFlags>,
}

/// The flags of `gpumem plan`: what to plan (defined once, in `gpumem_replay::plan`), and what
/// to do with the report.
#[derive(clap::Args)]
struct PlanFlags {
    #[command(flatten)]
    request: PlanRequest,
    /// List catalogue models and exit.
    #[arg(long)]
    list_models: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the plan as an HTML page (self-contained): allocated bytes phase by phase
    /// against the GPU, and what the peak consists of.
    #[arg(long, value_name = "OUT")]
    report: Option<PathBuf>,
    /// Write the planned allocation sequence (two steps) as a gpumem trace (JSON lines) that
    /// `gpumem replay` reads.
    #[arg(long, value_name = "FILE")]
    trace_out: Option<PathBuf>,
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Runs `gpumem plan`; when a fit finds nothing, the plan as asked for is printed first and
/// the command then fails with the reason.
pub fn run(args: PlanArgs) -> Result<(), CommandError> {
    let args = args.flags;
    if args.list_models {
        return output::print(&gpumem_plan::model_names().join("\n"));
    }
    check_flags(&args).map_err(|e| e.to_string())?;
    let report = plan(&args.request).map_err(|e| e.to_string())?;
    if let Some(path) = &args.report {
        let gpu_bytes = report.gpu.as_ref().map(|g| g.memory_bytes);
        let page = gpumem_report::render_plan(&report.model, &report.estimate, gpu_bytes);
        gpumem_report::write_atomically(path, page.as_bytes())
            .map_err(|e| format!("--report {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.trace_out {
        write_trace(&args.request, &report, path)?;
    }
    let text = if args.json {
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
    } else {
        table(&report, args.trace_out.as_deref())
    };
    output::print(&text)?;
    report.fit_error.map_or(Ok(()), |e| Err(e.into()))
}

/// The outputs that draw a PyTorch process, which a serving engine's plan is not (a conflict
/// rather than a page or trace of a run not planned).
fn check_flags(args: &PlanFlags) -> Result<(), PlanError> {
    let Some(engine) = &args.request.settings.engine else {
        return Ok(());
    };
    let outputs = [
        ("--report", args.report.is_some()),
        ("--trace-out", args.trace_out.is_some()),
    ];
    match outputs.into_iter().find(|(_, given)| *given) {
        None => Ok(()),
        Some((flag, _)) => Err(PlanError::Conflict {
            first: format!("--engine {engine}"),
            second: flag.into(),
            reason: "it draws the phases of a PyTorch process, and a serving engine's plan is \
                     its start-up profile (printed, or with --json); drop one"
                .into(),
        }),
    }
}

/// Writes the planned allocation sequence of the report's workload to `path`; a file that
/// cannot be written is an error naming `--trace-out` and the path.
fn write_trace(
    request: &PlanRequest,
    report: &PlanReport,
    path: &Path,
) -> Result<(), CommandError> {
    let model = request.model_spec().map_err(|e| e.to_string())?;
    let sequence = allocation_sequence(&model, &report.workload).map_err(|e| e.to_string())?;
    let trace = planned_trace(&format!("gpumem plan: {}", model.name), &sequence);
    gpumem_trace::write_path(&trace, path, Format::Native).map_err(|e| {
        format!(
            "--trace-out {}: cannot write the trace: {e}",
            path.display()
        )
        .into()
    })
}

/// A serving engine's profile as `gpumem plan --engine` prints it, in the terms of vLLM's own
/// start-up log.
fn serving_table(model: &str, p: &ServingProfile) -> String {
    use std::fmt::Write;
    let s = &p.settings;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "model: {model}  served by vLLM (V0 profile): max_model_len {}, max_num_batched_tokens \
         {}, max_num_seqs {}, block_size {}",
        s.max_model_len, s.max_num_batched_tokens, s.max_num_seqs, s.block_size
    );
    let _ = writeln!(
        t,
        "  model weights take           {:>12}",
        gib(p.weights_bytes)
    );
    let _ = writeln!(
        t,
        "  activation peak              {:>12}  (forward {}, sampler {})",
        gib(p.activation_peak_bytes),
        gib(p.forward_peak_bytes),
        gib(p.sampler_peak_bytes)
    );
    let _ = writeln!(
        t,
        "  non-torch memory (given)     {:>12}",
        gib(s.non_torch_bytes)
    );
    let _ = writeln!(
        t,
        "  KV cache per token           {:>12}",
        format!("{} KiB", p.kv_bytes_per_token as f64 / 1024.0)
    );
    match (
        p.gpu_bytes,
        p.kv_cache_bytes,
        p.gpu_blocks,
        p.kv_tokens,
        p.max_concurrency,
    ) {
        (Some(total), Some(kv), Some(blocks), Some(tokens), Some(concurrency)) => {
            let _ = writeln!(
                t,
                "  the instance can use         {:>12}  ({} × gpu_memory_utilization {:.2})",
                gib((total as f64 * s.gpu_memory_utilization) as u64),
                gib(total),
                s.gpu_memory_utilization
            );
            if kv <= 0 {
                let _ = writeln!(
                    t,
                    "  KV cache: none left ({:.2} GiB short): vLLM refuses to start",
                    -kv as f64 / (1u64 << 30) as f64
                );
            } else {
                let _ = writeln!(t, "  KV cache                     {:>12}", gib(kv as u64));
                let _ = writeln!(t, "  # GPU blocks: {blocks}");
                let _ = writeln!(t, "  GPU KV cache size: {tokens} tokens");
                let _ = writeln!(
                    t,
                    "  Maximum concurrency for {} tokens per request: {:.2}x",
                    s.max_model_len, concurrency
                );
            }
        }
        _ => {
            let _ = writeln!(
                t,
                "  (give --gpu for the KV-cache blocks, tokens and concurrency)"
            );
        }
    }
    t.trim_end().to_string()
}

/// The report as the table `gpumem plan` prints.
fn table(r: &PlanReport, trace_out: Option<&Path>) -> String {
    use std::fmt::Write;
    if let Some(serving) = &r.serving {
        let warnings = r
            .estimate
            .warnings
            .iter()
            .map(|w| format!("warning: {w}\n"));
        return warnings.collect::<String>() + &serving_table(&r.model, serving);
    }
    let e = &r.estimate;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "model: {}  ({} parameters, {} trainable)",
        r.model, e.total_params, e.trainable_params
    );
    for w in &e.warnings {
        let _ = writeln!(t, "warning: {w}");
    }
    if let Some(f) = &r.fit {
        let _ = writeln!(t, "plan at the fitted {} = {}:", f.target.name(), f.value);
    }
    let _ = writeln!(
        t,
        "peak per GPU: {}  in phase: {}",
        gib(e.peak_total_bytes),
        e.peak_phase.label()
    );
    let _ = writeln!(t, "  {:<18} {:>12}", "component", "memory");
    for (name, bytes) in e.breakdown.entries() {
        let note = match e.kv_cache_kind {
            Some(kind) if name == "kv_cache" => format!("  ({})", kind.note()),
            _ => String::new(),
        };
        let _ = writeln!(t, "  {:<18} {:>12}{note}", name, gib(bytes));
    }
    let _ = writeln!(
        t,
        "  {:<18} {:>12}",
        "= allocated",
        gib(e.peak_allocated_bytes)
    );
    let _ = writeln!(
        t,
        "  {:<18} {:>12}",
        "= reserved",
        gib(e.peak_reserved_bytes)
    );
    let _ = writeln!(t, "  {:<18} {:>12}", "= total", gib(e.peak_total_bytes));
    let phases: Vec<String> = e
        .phases
        .iter()
        .map(|p| format!("{} {}", p.phase.label(), gib(p.allocated_bytes)))
        .collect();
    let _ = writeln!(t, "phases (allocated): {}", phases.join(" | "));
    if let Some(g) = &r.gpu {
        let verdict = if g.fits { "fits" } else { "does NOT fit" };
        let _ = writeln!(t, "gpu: {} ({}): {verdict}", g.name, gib(g.memory_bytes));
    }
    if let Some(f) = &r.fit {
        let outside = if r.estimate.breakdown.communication > 0 {
            "context + NCCL"
        } else {
            "context"
        };
        let _ = writeln!(
            t,
            "fit: {} = {} within {} (margin {:.0}%): reserved {} ({}) + {outside} = {}; \
             grad accumulation {} → global batch {}",
            f.target.name(),
            f.value,
            gib(f.usable_bytes),
            100.0 * f.margin,
            gib(f.reserved_bytes),
            match r.reserved_by {
                ReservedBy::Replay => "torch replay",
                ReservedBy::Estimate => "estimated",
            },
            gib(f.total_bytes),
            f.grad_accum,
            f.global_batch
        );
    }
    if let Some(m) = &r.min_gpus {
        match m.gpus {
            Some(n) => {
                let _ = writeln!(t, "fewest GPUs for this layout: {n}");
            }
            None => {
                let _ = writeln!(
                    t,
                    "fewest GPUs for this layout: does not fit on up to {}",
                    m.searched_up_to
                );
            }
        }
    }
    if !r.advice.is_empty() {
        let _ = writeln!(t, "advice (change in peak; largest saving first):");
        for s in r.advice.iter().take(8) {
            let fits = if s.fits == Some(true) { "  fits" } else { "" };
            let _ = writeln!(
                t,
                "  {:<32} {:>+11.2} GiB → {:>11}{fits}   cost: {}",
                s.change,
                -(s.saved_bytes as f64) / (1u64 << 30) as f64,
                gib(s.new_peak_total_bytes),
                s.cost
            );
        }
    }
    if !r.replay.is_empty() {
        let replays: Vec<String> = r
            .replay
            .iter()
            .map(|p| format!("{} {}", p.policy, gib(p.peak_reserved_bytes)))
            .collect();
        let _ = writeln!(
            t,
            "reserved (planned allocations replayed): {}",
            replays.join(" | ")
        );
    }
    if let Some(path) = trace_out {
        let _ = writeln!(
            t,
            "planned allocation sequence written to {}",
            path.display()
        );
    }
    if let Some(p) = &r.plan_that_fits {
        let _ = writeln!(
            t,
            "plan that fits: add {}  → {}",
            p.changes.join(" "),
            gib(p.peak_total_bytes)
        );
    }
    t.trim_end().to_string()
}
