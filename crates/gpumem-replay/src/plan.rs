//! The whole of `gpumem plan` as one library call: a [`PlanRequest`] (the model, the run
//! settings, the GPU and what to find) in, a [`PlanReport`] out — the estimate, the reserved
//! memory each allocator would hold, the advice, the fit and the plan that fits. The command
//! line, the HTML report and the Python package render this one type; its JSON form is the
//! documented schema of `gpumem plan --json` (pinned by `tests/report_schema.rs`).

use std::path::PathBuf;
use std::sync::OnceLock;

use gpumem_plan::estimate::DEFAULT_CONTEXT_BYTES;
use gpumem_plan::fit::{check_margin, fit_measured, FitGoal, DEFAULT_MARGIN, MAX_GPUS};
use gpumem_plan::limits::{check_context_mib, BATCH};
use gpumem_plan::{
    advise, combine_until_fits, estimate, fewest_gpus, find_gpu, find_model, load_config,
    serving_profile, Estimate, Estimated, Fit, FitTarget, ModelSpec, Overheads, PeakMeasure,
    PlanError, ServingProfile, Settings, Suggestion, Warning, Workload,
};
use gpumem_pool::PolicyKind;
use serde::{Deserialize, Serialize};

use crate::planned::{
    pool_capacity, replay_failed, replay_run, PlanReplayError, Replayed, PLAN_POLICIES,
};

/// Where a plan's reserved memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum ReservedBy {
    /// The planned allocation sequence replayed through PyTorch's allocator (and expandable
    /// segments and gpumem's policy, for comparison): within about 1 % of PyTorch's
    /// `max_memory_reserved` on measured runs, tens of milliseconds per plan.
    #[default]
    Replay,
    /// The planner's fixed allocator share on top of allocated memory: microseconds per plan,
    /// for sweeps over thousands of configurations; reserved memory is a rougher figure.
    Estimate,
}

/// What to plan: the model, the run settings, the GPU and what to find on it. The fields are
/// the flags of `gpumem plan` (with the `clap` feature this is that command line) and the
/// keyword arguments of the Python package's `gpumem.plan`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default)]
pub struct PlanRequest {
    /// Catalogue model name or Hugging Face id (e.g. llama-3-8b, gpt2, resnet50).
    #[cfg_attr(
        feature = "clap",
        arg(long, conflicts_with = "config", required_unless_present_any = ["config", "list_models"])
    )]
    pub model: Option<String>,
    /// Path to a Hugging Face config.json (or {"model_type":"resnet","depth":50}).
    #[cfg_attr(feature = "clap", arg(long))]
    pub config: Option<PathBuf>,
    /// The run: mode, batch, sequence, precision, parallelism, adapters, …
    #[cfg_attr(feature = "clap", command(flatten))]
    #[serde(flatten)]
    pub settings: Settings,
    /// Global batch to reach with accumulation (with --fit batch).
    #[cfg_attr(
        feature = "clap",
        arg(long, allow_negative_numbers = true, value_parser = whole_number)
    )]
    pub global_batch: Option<u64>,
    /// GPU name (h100, a100-40gb, rtx-4090, ...) or a size (24GB, 80GiB): says whether the
    /// run fits, and replays reserved memory within it (PyTorch empties its cache before it
    /// runs out).
    #[cfg_attr(feature = "clap", arg(long))]
    pub gpu: Option<String>,
    /// Find the largest batch or seq whose plan fits --gpu with --margin kept free, and show
    /// the plan at it (a --batch or --seq it replaces is ignored).
    #[cfg_attr(feature = "clap", arg(long))]
    pub fit: Option<String>,
    /// Safety margin --fit and --min-gpus keep free, as a fraction of GPU memory [default: 0.1].
    #[cfg_attr(feature = "clap", arg(long, allow_negative_numbers = true))]
    pub margin: Option<f64>,
    /// Also find the fewest GPUs on which this layout fits --gpu.
    #[cfg_attr(feature = "clap", arg(long))]
    pub min_gpus: bool,
    /// CUDA context + framework per GPU, MiB.
    #[cfg_attr(
        feature = "clap",
        arg(long, default_value_t = DEFAULT_CONTEXT_BYTES >> 20, allow_negative_numbers = true,
            value_parser = whole_number)
    )]
    pub context_mib: u64,
    /// Where reserved memory comes from: replay (the planned allocations replayed through
    /// PyTorch's allocator; tens of ms) or estimate (a fixed allocator share; microseconds).
    #[cfg_attr(feature = "clap", arg(long, value_enum, hide_possible_values = true, default_value_t = ReservedBy::Replay))]
    pub reserved: ReservedBy,
}

impl Default for PlanRequest {
    fn default() -> Self {
        PlanRequest {
            model: None,
            config: None,
            settings: Settings::default(),
            global_batch: None,
            gpu: None,
            fit: None,
            margin: None,
            min_gpus: false,
            context_mib: DEFAULT_CONTEXT_BYTES >> 20,
            reserved: ReservedBy::Replay,
        }
    }
}

impl PlanRequest {
    /// Every name a request accepts: its own fields and the run settings' flags, spelt as
    /// fields (`grad_ckpt` for `--grad-ckpt`).
    pub fn field_names() -> &'static [String] {
        static NAMES: OnceLock<Vec<String>> = OnceLock::new();
        NAMES.get_or_init(|| {
            // A struct of plain fields always serializes as an object (a test checks the
            // names); the flattened settings come with it. `gpu` is the request's own field.
            let fields = match serde_json::to_value(PlanRequest::default()) {
                Ok(serde_json::Value::Object(fields)) => fields,
                _ => serde_json::Map::new(),
            };
            fields
                .into_iter()
                .map(|(name, _)| name)
                .filter(|name| name == "gpu" || !Settings::NOT_FLAGS.contains(&name.as_str()))
                .collect()
        })
    }

    /// Reads a request from a JSON object of fields by name, absent ones at their defaults:
    /// how the Python package passes keyword arguments. A name that is not a field is an
    /// error listing the accepted ones (nearest first); a value of the wrong type names its
    /// field.
    pub fn from_json(object: &str) -> Result<PlanRequest, PlanError> {
        let invalid = |reason: String| PlanError::InvalidValue {
            name: "plan request".into(),
            value: object.chars().take(200).collect(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_str(object).map_err(|e| invalid(format!("not JSON: {e}")))?;
        let Some(fields) = value.as_object() else {
            return Err(invalid("not a JSON object of settings by name".into()));
        };
        let accepted = Self::field_names();
        if let Some(unknown) = fields.keys().find(|k| !accepted.contains(k)) {
            return Err(gpumem_plan::names::unknown(
                "plan setting",
                unknown,
                accepted.iter().map(String::as_str),
            ));
        }
        serde_json::from_value(value.clone()).map_err(|e| {
            // Name the field at fault: the first that does not read on its own.
            fields
                .iter()
                .find_map(|(name, field)| {
                    let alone = serde_json::json!({ name: field });
                    serde_json::from_value::<PlanRequest>(alone).err().map(|e| {
                        PlanError::InvalidValue {
                            name: name.clone(),
                            value: field.to_string(),
                            reason: e.to_string(),
                        }
                    })
                })
                .unwrap_or_else(|| invalid(e.to_string()))
        })
    }

    /// The model asked for: a catalogue name or Hugging Face id, or a config file.
    pub fn model_spec(&self) -> Result<ModelSpec, PlanError> {
        match (&self.model, &self.config) {
            (Some(_), Some(_)) => Err(PlanError::Conflict {
                first: "--model".into(),
                second: "--config".into(),
                reason: "give the model by name or by its config file, not both".into(),
            }),
            (Some(name), None) => find_model(name),
            (None, Some(path)) => load_config(path),
            (None, None) => Err(PlanError::InvalidValue {
                name: "model".into(),
                value: "none".into(),
                reason: "give a model name (--model NAME) or a config file (--config PATH)".into(),
            }),
        }
    }

    /// The fit target asked for, if any.
    fn fit_target(&self) -> Result<Option<FitTarget>, PlanError> {
        match self.fit.as_deref() {
            None => Ok(None),
            Some("batch") => Ok(Some(FitTarget::Batch)),
            Some("seq") => Ok(Some(FitTarget::Seq)),
            Some(other) => Err(gpumem_plan::names::unknown(
                "fit target",
                other,
                ["batch", "seq"],
            )),
        }
    }

    /// The request's own values, checked whether or not the plan uses them: the margin, the
    /// context and the global batch.
    fn check_values(&self) -> Result<(), PlanError> {
        if let Some(margin) = self.margin {
            check_margin(margin)?;
        }
        check_context_mib(self.context_mib)?;
        if let Some(global) = self.global_batch {
            BATCH.check("global-batch", global)?;
        }
        Ok(())
    }

    /// A serving engine's plan is its start-up profile on one GPU: a fit or a GPU count
    /// searched on the peaks of a PyTorch process would answer for a run not planned.
    fn check_engine(&self) -> Result<(), PlanError> {
        let Some(engine) = &self.settings.engine else {
            return Ok(());
        };
        let second = match (&self.fit, self.min_gpus) {
            (Some(fit), _) => format!("--fit {fit}"),
            (None, true) => "--min-gpus".into(),
            (None, false) => return Ok(()),
        };
        Err(PlanError::Conflict {
            first: format!("--engine {engine}"),
            second,
            reason: "it searches the peaks of a PyTorch process, and a serving engine's plan is \
                     its start-up profile on one GPU, whose KV cache takes what the weights and \
                     activations leave (--gpu-memory-utilization, --max-num-seqs); drop one"
                .into(),
        })
    }

    /// The flags given that act on nothing asked for.
    fn unused_flags(&self, target: Option<FitTarget>) -> Vec<Warning> {
        let mut warnings = Vec::new();
        if self.global_batch.is_some() && target != Some(FitTarget::Batch) {
            warnings.push(Warning::Ignored {
                flag: "--global-batch",
                reason: "it sets the accumulation of --fit batch, which is not asked for".into(),
            });
        }
        if self.min_gpus && self.gpu.is_none() {
            warnings.push(Warning::Ignored {
                flag: "--min-gpus",
                reason: "it counts GPUs of the --gpu given, and none is".into(),
            });
        }
        if self.margin.is_some() && target.is_none() && !(self.min_gpus && self.gpu.is_some()) {
            warnings.push(Warning::Ignored {
                flag: "--margin",
                reason: "it is the memory --fit and --min-gpus (with --gpu) keep free, and \
                         neither is asked for"
                    .into(),
            });
        }
        let searched = match target {
            Some(FitTarget::Batch) => self.settings.batch.map(|_| "--batch"),
            Some(FitTarget::Seq) => self.settings.seq.map(|_| "--seq"),
            None => None,
        };
        if let (Some(flag), Some(fit)) = (searched, &self.fit) {
            warnings.push(Warning::Ignored {
                flag,
                reason: format!(
                    "--fit {fit} searches it from 1 up, and the plan shown is at the largest \
                     value that fits"
                ),
            });
        }
        warnings
    }
}

/// Parses a whole number typed on the command line: a negative one gets a reason rather than
/// clap's "invalid digit found in string".
#[cfg(feature = "clap")]
fn whole_number(text: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| "must be a non-negative integer".to_string())
}

/// `settings` without the flags `warnings` say have no effect, as if not given: a serving
/// engine's PyTorch figures then stay those of the run it plans, whatever flags it ignores
/// (`--batch`, `--seq`, …). The settings' fields are the flags' names (`--no-cache` is
/// `no_cache`), as [`PlanRequest::field_names`] reads them.
fn without_ignored(settings: &Settings, warnings: &[Warning]) -> Result<Settings, PlanError> {
    let invalid = |e: serde_json::Error| PlanError::InvalidValue {
        name: "settings".into(),
        value: format!("{settings:?}"),
        reason: format!("do not read back without the ignored flags: {e}"),
    };
    let mut fields = match serde_json::to_value(settings).map_err(invalid)? {
        serde_json::Value::Object(fields) => fields,
        _ => return Ok(settings.clone()),
    };
    for warning in warnings {
        if let Warning::Ignored { flag, .. } = warning {
            fields.remove(&flag.trim_start_matches("--").replace('-', "_"));
        }
    }
    serde_json::from_value(serde_json::Value::Object(fields)).map_err(invalid)
}

/// Peak memory of the planned allocation sequence replayed through one allocator policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedReserved {
    /// The policy (`torch`, `expandable`, `gpumem`).
    pub policy: String,
    /// Peak bytes handed to tensors.
    pub peak_allocated_bytes: u64,
    /// Peak bytes the policy holds from the device.
    pub peak_reserved_bytes: u64,
    /// Times the policy emptied its cache to retry an allocation within the GPU's memory over
    /// the planned steps (PyTorch's `num_alloc_retries`); 0 without a GPU named.
    pub alloc_retries: u64,
}

/// The GPU asked about and whether the plan fits it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuVerdict {
    /// Catalogue name, or the size as given.
    pub name: String,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// Whether the plan's peak total fits.
    pub fits: bool,
}

/// The largest batch or sequence that fits the GPU, and what it holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FitReport {
    /// What was searched: `batch` or `seq`.
    pub target: FitTarget,
    /// The largest value that fits.
    pub value: u64,
    /// The safety margin kept free, as a fraction of GPU memory.
    pub margin: f64,
    /// Memory the plan may use: GPU memory × (1 − margin).
    pub usable_bytes: u64,
    /// Gradient accumulation steps to reach the global batch asked for (1 without one).
    pub grad_accum: u64,
    /// Global batch reached: micro-batch × data-parallel ranks × accumulation.
    pub global_batch: u64,
    /// Peak reserved bytes at the fitted value (replayed or estimated, as the plan says): the
    /// plan's own `peak_reserved_bytes`.
    pub reserved_bytes: u64,
    /// Reserved plus the context and NCCL's memory: what was compared with `usable_bytes`, the
    /// plan's own `peak_total_bytes`.
    pub total_bytes: u64,
}

/// The fewest GPUs on which the layout fits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MinGpus {
    /// The count, or none when it does not fit on up to `searched_up_to` GPUs.
    pub gpus: Option<u64>,
    /// The most GPUs tried.
    pub searched_up_to: u64,
}

/// Changes that together make a plan that does not fit the GPU fit it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanThatFits {
    /// The changes, as flags in the order they were added, each flag once at its last value.
    pub changes: Vec<String>,
    /// Peak total bytes with all of them.
    pub peak_total_bytes: u64,
}

/// Everything `gpumem plan` answers; the JSON of `gpumem plan --json` and the object the
/// Python package's `gpumem.plan` returns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanReport {
    /// The model's name.
    pub model: String,
    /// The workload planned: the one asked for, or the fitted one.
    pub workload: Workload,
    /// Where `peak_reserved_bytes` comes from.
    pub reserved_by: ReservedBy,
    /// The estimate: peaks, breakdown, phases, parameters, and every warning about the
    /// request (its `warnings` gather the settings', the unused flags' and the estimate's).
    #[serde(flatten)]
    pub estimate: Estimate,
    /// The planned allocations replayed per policy (empty when `reserved_by` is estimate).
    pub replay: Vec<PlannedReserved>,
    /// Changes to the plan, largest saving first (none with `--engine`: they change a PyTorch
    /// process).
    pub advice: Vec<Suggestion>,
    /// The GPU asked about, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuVerdict>,
    /// The fit, when one was asked for and something fits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit: Option<FitReport>,
    /// The fewest GPUs, when asked for with a GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_gpus: Option<MinGpus>,
    /// Changes that make the plan fit, when it does not fit the GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_that_fits: Option<PlanThatFits>,
    /// Why the fit asked for failed (nothing fits); the plan shown is then the one asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit_error: Option<String>,
    /// The serving engine's start-up profile and the KV cache it leaves on the GPU, when
    /// `--engine` is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<ServingProfile>,
}

/// Plans `request`: the estimate (reserved memory as `request.reserved` says), the advice,
/// and the fit, fewest GPUs and plan that fits when asked for. When nothing fits, the report
/// is the plan as asked for with its advice, and `fit_error` says why. With `--engine`, the
/// PyTorch figures are planned without the flags the engine ignores, and no advice is given.
pub fn plan(request: &PlanRequest) -> Result<PlanReport, PlanError> {
    request.check_values()?;
    request.check_engine()?;
    let model = request.model_spec()?;
    let settings = Settings {
        gpu: request.gpu.clone(),
        ..request.settings.clone()
    };
    let resolved = settings.resolve(&model)?;
    let engine = settings.engine.is_some();
    let workload = if engine {
        without_ignored(&settings, &resolved.warnings)?
            .resolve(&model)?
            .workload
    } else {
        resolved.workload
    };
    let gpu = request.gpu.as_deref().map(find_gpu).transpose()?;
    let serving = settings
        .serving(&model)?
        .map(|serve| serving_profile(&model, &workload, &serve, gpu.as_ref()))
        .transpose()?;
    let overheads = Overheads {
        context_bytes: request.context_mib << 20,
        ..Overheads::default()
    };
    let margin = request.margin.unwrap_or(DEFAULT_MARGIN);
    let target = request.fit_target()?;
    let replayed = request.reserved == ReservedBy::Replay;
    let measure: &dyn PeakMeasure = if replayed { &Replayed } else { &Estimated };
    let mut fit_error = None;
    let fitted = match (target, &gpu) {
        (Some(target), Some(gpu)) => {
            let goal = FitGoal {
                target,
                gpu_bytes: gpu.memory_bytes,
                margin,
                global_batch: request.global_batch,
            };
            match fit_measured(&model, &workload, &overheads, &goal, measure) {
                Ok(fit) => Some(fit),
                Err(e @ PlanError::NothingFits { .. }) => {
                    fit_error = Some(e.to_string());
                    None
                }
                Err(e) => return Err(e),
            }
        }
        (Some(_), None) => {
            return Err(PlanError::InvalidValue {
                name: "fit".into(),
                value: request.fit.clone().unwrap_or_default(),
                reason: "needs a GPU (--gpu NAME or --gpu SIZE)".into(),
            })
        }
        _ => None,
    };
    // The fit's estimate is the plan's, measured as the plan is: its figures are the plan's.
    let (shown, estimated) = match &fitted {
        Some(f) => (f.workload.clone(), f.estimate.clone()),
        None => (workload.clone(), estimate(&model, &workload, &overheads)?),
    };
    let replay = if replayed {
        replay_plan(&model, &shown, pool_capacity(&shown, &estimated)?)?
    } else {
        Vec::new()
    };
    // Reserved memory is what PyTorch's allocator (the torch policy) holds for the sequence.
    let torch = replay
        .iter()
        .find(|r| r.policy == PolicyKind::Torch.as_str());
    let mut estimated = match torch {
        Some(torch) => estimated.with_reserved(torch.peak_reserved_bytes),
        None => estimated,
    };
    let flushes = match (torch, &gpu) {
        (Some(t), Some(g)) if t.alloc_retries > 0 => Some(Warning::CacheFlushes {
            retries: t.alloc_retries,
            gpu: g.name.clone(),
        }),
        _ => None,
    };
    let gpu_bytes = gpu.as_ref().map(|g| g.memory_bytes);
    let advice = match engine {
        true => Vec::new(),
        false => advise(&model, &shown, &overheads, gpu_bytes, measure)?,
    };
    let plan_that_fits = match gpu_bytes {
        Some(bytes) if !engine && estimated.peak_total_bytes > bytes => combine_until_fits(
            &model, &shown, &overheads, bytes, measure,
        )?
        .map(|(changes, _, peak_total_bytes)| PlanThatFits {
            changes,
            peak_total_bytes,
        }),
        _ => None,
    };
    let min_gpus = match (&gpu, request.min_gpus) {
        (Some(g), true) => Some(MinGpus {
            gpus: fewest_gpus(&model, &workload, &overheads, g.memory_bytes, margin)?,
            searched_up_to: MAX_GPUS,
        }),
        _ => None,
    };
    estimated.warnings = resolved
        .warnings
        .into_iter()
        .chain(request.unused_flags(target))
        .chain(std::mem::take(&mut estimated.warnings))
        .chain(flushes)
        .collect();
    Ok(PlanReport {
        model: model.name.clone(),
        workload: shown,
        reserved_by: request.reserved,
        gpu: gpu.map(|g| GpuVerdict {
            fits: estimated.peak_total_bytes <= g.memory_bytes,
            name: g.name,
            memory_bytes: g.memory_bytes,
        }),
        fit: fitted.as_ref().map(|f| fit_report(f, &estimated)),
        estimate: estimated,
        replay,
        advice,
        min_gpus,
        plan_that_fits,
        fit_error,
        serving,
    })
}

/// The fit as the report shows it, with the plan's figures at the fitted value.
fn fit_report(fit: &Fit, plan: &Estimate) -> FitReport {
    FitReport {
        target: fit.target,
        value: fit.value,
        margin: fit.margin,
        usable_bytes: fit.usable_bytes,
        grad_accum: fit.grad_accum,
        global_batch: fit.global_batch,
        reserved_bytes: plan.peak_reserved_bytes,
        total_bytes: plan.peak_total_bytes,
    }
}

/// Replays the planned allocation sequence of `workload` through the torch, expandable and
/// gpumem policies: reserved memory as each allocator would hold it (within `capacity`, the
/// pool's share of the GPU named, where one is: [`replay_run`]).
fn replay_plan(
    model: &ModelSpec,
    workload: &Workload,
    capacity: Option<u64>,
) -> Result<Vec<PlannedReserved>, PlanError> {
    let reports = match replay_run(model, workload, &PLAN_POLICIES, capacity) {
        Ok(reports) => reports,
        Err(PlanReplayError::Plan(e)) => return Err(e),
        Err(PlanReplayError::Replay(e)) => return Err(replay_failed(model, e)),
    };
    Ok(reports
        .into_iter()
        .map(|r| PlannedReserved {
            policy: r.policy,
            peak_allocated_bytes: r.peak_allocated_bytes,
            peak_reserved_bytes: r.peak_reserved_bytes,
            alloc_retries: r.num_alloc_retries,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names a request takes are its own fields and the settings' flags: not the
    /// validation-only settings.
    #[test]
    fn field_names_are_the_flags() {
        let names = PlanRequest::field_names();
        for name in [
            "model",
            "config",
            "gpu",
            "fit",
            "reserved",
            "batch",
            "grad_ckpt",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        for name in ["target", "lora_base_int8"] {
            assert!(!names.iter().any(|n| n == name), "{name} in {names:?}");
        }
        let refused = PlanRequest::from_json(r#"{"model": "gpt2", "target": "cpu"}"#);
        assert!(
            matches!(refused, Err(PlanError::UnknownName { .. })),
            "{refused:?}"
        );
        let typed = PlanRequest::from_json(r#"{"model": "gpt2", "batch": "four"}"#);
        assert!(
            matches!(&typed, Err(PlanError::InvalidValue { name, .. }) if name == "batch"),
            "{typed:?}"
        );
        let request = PlanRequest::from_json(r#"{"model": "gpt2", "batch": 4}"#).unwrap();
        assert_eq!(request.settings.batch, Some(4));
        assert_eq!(request.reserved, ReservedBy::Replay);
    }

    /// `plan` itself checks the request's own values, for the Python package as for the
    /// command line (which alone did): a margin out of range without a fit, a context past
    /// 1 TiB, a global batch of 0 without a fit.
    #[test]
    fn plan_checks_the_request_values() {
        for (json, field) in [
            (r#"{"model": "gpt2", "margin": 1.5}"#, "margin"),
            (
                r#"{"model": "gpt2", "context_mib": 99999999999999}"#,
                "context-mib",
            ),
            (r#"{"model": "gpt2", "global_batch": 0}"#, "global-batch"),
        ] {
            let refused = plan(&PlanRequest::from_json(json).unwrap());
            assert!(
                matches!(&refused, Err(PlanError::InvalidValue { name, .. }) if name == field),
                "{json}: {refused:?}"
            );
        }
    }
}
