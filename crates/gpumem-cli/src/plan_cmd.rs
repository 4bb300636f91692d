//! `gpumem plan`: argument parsing and printing over `gpumem_plan`.

use crate::output::{self, CommandError};
use gpumem_plan::estimate::DEFAULT_CONTEXT_BYTES;
use gpumem_plan::fit::MAX_GPUS;
use gpumem_plan::{
    advise, allocation_sequence, combine_until_fits, estimate, fewest_gpus, find_gpu, find_model,
    load_config, Estimate, Fit, FitTarget, ModelSpec, Overheads, PlanError, Settings, Suggestion,
    Warning, Workload,
};
use gpumem_pool::PolicyKind;
use gpumem_replay::planned::{
    fit_reserved, planned_trace, replay_failed, replay_planned, PlanReplayError, Replayed,
    ReservedFit,
};
use gpumem_replay::PolicyReport;
use gpumem_trace::Format;
use std::path::{Path, PathBuf};

/// Arguments of `gpumem plan` (boxed: the flags are many and the command enum stays small).
#[derive(clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    flags: Box<PlanFlags>,
}

/// The flags of `gpumem plan`: the model, the run settings (defined once, in `gpumem_plan`), and
/// what to do with the estimate.
#[derive(clap::Args)]
struct PlanFlags {
    /// Catalogue model name or Hugging Face id (e.g. llama-3-8b, gpt2, resnet50).
    #[arg(long, conflicts_with = "config", required_unless_present_any = ["config", "list_models"])]
    model: Option<String>,
    /// Path to a Hugging Face config.json (or {"model_type":"resnet","depth":50}).
    #[arg(long)]
    config: Option<PathBuf>,
    /// List catalogue models and exit.
    #[arg(long)]
    list_models: bool,
    #[command(flatten)]
    settings: Settings,
    /// Global batch to reach with accumulation (with --fit batch).
    #[arg(long)]
    global_batch: Option<u64>,
    /// GPU name (h100, a100-40gb, rtx-4090, ...) or a size (24GB, 80GiB).
    #[arg(long)]
    gpu: Option<String>,
    /// Find the largest batch or seq that fits --gpu.
    #[arg(long)]
    fit: Option<String>,
    /// Safety margin kept free when fitting, as a fraction of GPU memory.
    #[arg(long, default_value_t = 0.1)]
    margin: f64,
    /// Also find the fewest GPUs on which this layout fits --gpu.
    #[arg(long)]
    min_gpus: bool,
    /// CUDA context + framework per GPU, MiB.
    #[arg(long, default_value_t = DEFAULT_CONTEXT_BYTES >> 20)]
    context_mib: u64,
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

fn model(a: &PlanFlags) -> Result<ModelSpec, PlanError> {
    match (&a.model, &a.config) {
        (Some(name), _) => find_model(name),
        (None, Some(path)) => load_config(path),
        (None, None) => Err(PlanError::InvalidValue {
            name: "model".into(),
            value: "none".into(),
            reason: "give --model NAME or --config PATH".into(),
        }),
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Runs `gpumem plan`.
pub fn run(args: PlanArgs) -> Result<(), CommandError> {
    let args = args.flags;
    if args.list_models {
        return output::print(&gpumem_plan::model_names().join("\n"));
    }
    let (text, nothing_fits) = plan(&args).map_err(|e| e.to_string())?;
    output::print(&text)?;
    nothing_fits.map_or(Ok(()), |e| Err(e.to_string().into()))
}

/// The plan's output (JSON or the table), and the error to report after it when nothing fits.
fn plan(a: &PlanFlags) -> Result<(String, Option<PlanError>), PlanError> {
    let model = model(a)?;
    let settings = Settings {
        gpu: a.gpu.clone(),
        ..a.settings.clone()
    };
    let resolved = settings.resolve(&model)?;
    let workload = resolved.workload;
    let gpu = a.gpu.as_deref().map(find_gpu).transpose()?;
    let overheads = Overheads {
        context_bytes: a.context_mib.saturating_mul(1 << 20),
        ..Overheads::default()
    };
    let target = match a.fit.as_deref() {
        None => None,
        Some("batch") => Some(FitTarget::Batch),
        Some("seq") => Some(FitTarget::Seq),
        Some(other) => {
            return Err(gpumem_plan::names::unknown(
                "fit target",
                other,
                ["batch", "seq"],
            ))
        }
    };
    // When nothing fits, the plan as given is still shown with its advice before the error.
    let mut nothing_fits = None;
    let reserved_fit: Option<ReservedFit> = match (target, &gpu) {
        (Some(target), Some(gpu)) => match fit_reserved(
            &model,
            &workload,
            &overheads,
            target,
            gpu.memory_bytes,
            a.margin,
            a.global_batch,
        ) {
            Ok(f) => Some(f),
            Err(PlanReplayError::Plan(e @ PlanError::NothingFits { .. })) => {
                nothing_fits = Some(e);
                None
            }
            Err(PlanReplayError::Plan(e)) => return Err(e),
            Err(PlanReplayError::Replay(e)) => return Err(replay_failed(&model, e)),
        },
        (Some(_), None) => {
            return Err(PlanError::InvalidValue {
                name: "fit".into(),
                value: a.fit.clone().unwrap_or_default(),
                reason: "needs --gpu NAME or --gpu SIZE".into(),
            })
        }
        _ => None,
    };
    let fitted: Option<&Fit> = reserved_fit.as_ref().map(|f| &f.fit);
    let (shown, estimate_now) = match fitted {
        Some(f) => (f.workload.clone(), f.estimate.clone()),
        None => (workload.clone(), estimate(&model, &workload, &overheads)?),
    };
    let replayed = replay_plan(&model, &shown, a.trace_out.as_deref())?;
    // Reserved memory is what PyTorch's allocator (the torch policy) holds for the sequence.
    let torch_reserved = replayed
        .iter()
        .find(|r| r.policy == PolicyKind::Torch.to_string())
        .map_or(estimate_now.peak_reserved_bytes, |r| r.peak_reserved_bytes);
    let estimate_now = estimate_now.with_reserved(torch_reserved);
    let gpu_bytes = gpu.as_ref().map(|g| g.memory_bytes);
    let advice = advise(&model, &shown, &overheads, gpu_bytes, &Replayed)?;
    let combination = match gpu_bytes {
        Some(bytes) if estimate_now.peak_total_bytes > bytes => {
            combine_until_fits(&model, &shown, &overheads, bytes, &Replayed)?
        }
        _ => None,
    };
    let min_gpus = match (&gpu, a.min_gpus) {
        (Some(g), true) => fewest_gpus(&model, &workload, &overheads, g.memory_bytes, a.margin)?,
        _ => None,
    };
    let warnings: Vec<Warning> = resolved
        .warnings
        .into_iter()
        .chain(unused_fit_flags(a, target))
        .chain(estimate_now.warnings.iter().cloned())
        .collect();
    if let Some(path) = &a.report {
        let page = gpumem_report::render_plan(&model.name, &estimate_now, gpu_bytes);
        gpumem_report::write_atomically(path, page.as_bytes()).map_err(|e| {
            PlanError::InvalidValue {
                name: "--report".into(),
                value: path.display().to_string(),
                reason: e.to_string(),
            }
        })?;
    }
    if a.json {
        let mut out = serde_json::json!({
            "model": model.name,
            "warnings": warnings,
            "total_params": estimate_now.total_params,
            "trainable_params": estimate_now.trainable_params,
            "workload": shown,
            "peak_allocated_bytes": estimate_now.peak_allocated_bytes,
            "peak_reserved_bytes": estimate_now.peak_reserved_bytes,
            "peak_total_bytes": estimate_now.peak_total_bytes,
            "peak_phase": estimate_now.peak_phase,
            "breakdown": estimate_now.breakdown,
            "phases": estimate_now.phases,
            "replay": replayed.iter().map(|r| serde_json::json!({
                "policy": r.policy,
                "peak_allocated_bytes": r.peak_allocated_bytes,
                "peak_reserved_bytes": r.peak_reserved_bytes,
            })).collect::<Vec<_>>(),
            "advice": advice,
        });
        if let Some(g) = &gpu {
            out["gpu"] = serde_json::json!({ "name": g.name, "memory_bytes": g.memory_bytes,
                "fits": estimate_now.peak_total_bytes <= g.memory_bytes });
        }
        if let Some(r) = &reserved_fit {
            let f = &r.fit;
            out["fit"] = serde_json::json!({ "target": f.target, "value": f.value, "margin": f.margin,
                "usable_bytes": f.usable_bytes, "grad_accum": f.grad_accum, "global_batch": f.global_batch,
                "reserved_bytes": r.reserved_bytes, "total_bytes": r.total_bytes });
        }
        if a.min_gpus {
            out["min_gpus"] = serde_json::json!(min_gpus);
        }
        if let Some((changes, _, peak)) = &combination {
            out["plan_that_fits"] =
                serde_json::json!({ "changes": changes, "peak_total_bytes": peak });
        }
        if let Some(e) = &nothing_fits {
            out["fit_error"] = serde_json::json!(e.to_string());
        }
        let text = serde_json::to_string_pretty(&out).unwrap_or_default();
        return Ok((text, nothing_fits));
    }
    let mut text = table(
        &model,
        &warnings,
        &estimate_now,
        gpu.as_ref(),
        reserved_fit.as_ref(),
        &advice,
        a.min_gpus.then_some(min_gpus),
    );
    let replays: Vec<String> = replayed
        .iter()
        .map(|r| format!("{} {}", r.policy, gib(r.peak_reserved_bytes)))
        .collect();
    text += &format!(
        "reserved (planned allocations replayed): {}\n",
        replays.join(" | ")
    );
    if let Some(path) = &a.trace_out {
        text += &format!(
            "planned allocation sequence written to {}\n",
            path.display()
        );
    }
    if let Some((changes, _, peak)) = &combination {
        text += &format!(
            "plan that fits: add {}  → {}\n",
            changes.join(" "),
            gib(*peak)
        );
    }
    Ok((text.trim_end().to_string(), nothing_fits))
}

/// Replays the planned allocation sequence of `workload` through the torch, expandable and
/// gpumem policies (reserved memory as each allocator would hold it), writing it to `trace_out`
/// first when given.
fn replay_plan(
    model: &ModelSpec,
    workload: &Workload,
    trace_out: Option<&Path>,
) -> Result<Vec<PolicyReport>, PlanError> {
    let name = format!("gpumem plan: {}", model.name);
    let trace = planned_trace(&name, &allocation_sequence(model, workload)?);
    if let Some(path) = trace_out {
        gpumem_trace::write_path(&trace, path, Format::Native).map_err(|e| {
            PlanError::Unreadable {
                path: path.display().to_string(),
                reason: format!("cannot write the trace: {e}"),
            }
        })?;
    }
    replay_planned(&trace).map_err(|e| replay_failed(model, e))
}

/// `--global-batch` and `--min-gpus` given without what they act on.
fn unused_fit_flags(a: &PlanFlags, target: Option<FitTarget>) -> Vec<Warning> {
    let mut warnings = Vec::new();
    if a.global_batch.is_some() && target != Some(FitTarget::Batch) {
        warnings.push(Warning::Ignored {
            flag: "--global-batch",
            reason: "it sets the accumulation of --fit batch, which is not asked for".into(),
        });
    }
    if a.min_gpus && a.gpu.is_none() {
        warnings.push(Warning::Ignored {
            flag: "--min-gpus",
            reason: "it counts GPUs of the --gpu given, and none is".into(),
        });
    }
    warnings
}

fn table(
    model: &ModelSpec,
    warnings: &[Warning],
    e: &Estimate,
    gpu: Option<&gpumem_plan::Gpu>,
    fitted: Option<&ReservedFit>,
    advice: &[Suggestion],
    min_gpus: Option<Option<u64>>,
) -> String {
    use std::fmt::Write;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "model: {}  ({} parameters, {} trainable)",
        model.name, e.total_params, e.trainable_params
    );
    for w in warnings {
        let _ = writeln!(t, "warning: {w}");
    }
    if let Some(f) = fitted.map(|r| &r.fit) {
        let _ = writeln!(t, "plan at the fitted {} = {}:", f.target_name(), f.value);
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
    if let Some(g) = gpu {
        let verdict = if e.peak_total_bytes <= g.memory_bytes {
            "fits"
        } else {
            "does NOT fit"
        };
        let _ = writeln!(t, "gpu: {} ({}): {verdict}", g.name, gib(g.memory_bytes));
    }
    if let Some(r) = fitted {
        let f = &r.fit;
        let _ = writeln!(
            t,
            "fit: {} = {} within {} (margin {:.0}%): reserved {} (torch replay) + context = {}; \
             grad accumulation {} → global batch {}",
            f.target_name(),
            f.value,
            gib(f.usable_bytes),
            100.0 * f.margin,
            gib(r.reserved_bytes),
            gib(r.total_bytes),
            f.grad_accum,
            f.global_batch
        );
    }
    if let Some(n) = min_gpus {
        match n {
            Some(n) => {
                let _ = writeln!(t, "fewest GPUs for this layout: {n}");
            }
            None => {
                let _ = writeln!(
                    t,
                    "fewest GPUs for this layout: does not fit on up to {MAX_GPUS}"
                );
            }
        }
    }
    if !advice.is_empty() {
        let _ = writeln!(t, "advice (change in peak; largest saving first):");
        for s in advice.iter().take(8) {
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
    t
}
