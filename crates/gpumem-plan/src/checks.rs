//! A workload checked against its model. What no real run can do is an error naming the setting
//! and what is accepted; what a run would do but probably not as meant is a [`Warning`] that
//! travels with the estimate.

use crate::error::{PlanError, Result};
use crate::model::{Architecture, Head, ModelSpec, TransformerSpec};
use crate::warning::Warning;
use crate::workload::{choices, Dtype, Mode, Sharding, Workload};

/// A dual encoder (CLIP, SigLIP) is planned on one pipeline stage without tensor parallelism
/// or LoRA: how those split or adapt two towers is not modelled.
fn check_dual_encoder(
    model: &ModelSpec,
    spec: &TransformerSpec,
    workload: &Workload,
) -> Result<()> {
    if spec.dual.is_none() {
        return Ok(());
    }
    let layout = &workload.layout;
    let refused = [
        ("tp", layout.tp.to_string(), layout.tp > 1),
        ("pp", layout.pp.to_string(), layout.pp > 1),
        (
            "lora-rank",
            workload.lora.map_or(String::new(), |l| l.rank.to_string()),
            workload.lora.is_some(),
        ),
    ];
    match refused.into_iter().find(|(_, _, given)| *given) {
        None => Ok(()),
        Some((name, value, _)) => Err(PlanError::InvalidValue {
            name: name.into(),
            value,
            reason: format!(
                "{} is a dual encoder (text and vision towers): it is planned with data \
                 parallelism, ZeRO or FSDP, full training or inference; tensor and pipeline \
                 parallelism and LoRA over two towers are not modelled",
                model.name
            ),
        }),
    }
}

/// Checks `workload` on `model`: [`Workload::validate`], then the settings the model decides.
/// Errors: generation on a model without a decoder, an image smaller than a vision
/// transformer's patch, tensor parallelism not dividing the heads, more tokens than a learned
/// position table, LoRA on a CNN or wider than the model, more pipeline stages than blocks.
/// Warnings: sharding over one data-parallel rank, autocast to the other 16-bit type, tokens
/// past the trained rotary positions.
pub fn check(model: &ModelSpec, workload: &Workload) -> Result<Vec<Warning>> {
    workload.validate()?;
    check_head_for_mode(model, workload)?;
    let mut warnings = Vec::new();
    check_architecture(model, workload, &mut warnings)?;
    check_pipeline_stages(model, workload)?;
    let layout = &workload.layout;
    let sharded = layout.sharding != Sharding::None;
    // Offloading moves the states off the GPU even on one rank (ZeRO-Offload), so it saves.
    if workload.mode == Mode::Train && sharded && layout.dp() == 1 && !layout.offload.optimizer() {
        warnings.push(Warning::ShardingOverOneRank {
            sharding: layout.sharding,
        });
    }
    if let Some(amp) = workload.amp {
        if workload.dtype != Dtype::Fp32 && amp != workload.dtype {
            warnings.push(Warning::MixedHalfTypes {
                dtype: workload.dtype,
                amp,
            });
        }
    }
    Ok(warnings)
}

/// Generation needs a decoder; chunked and fused cross-entropy need a causal LM head.
fn check_head_for_mode(model: &ModelSpec, workload: &Workload) -> Result<()> {
    if workload.mode == Mode::Generate && !model.has_decoder() {
        return Err(PlanError::InvalidValue {
            name: "mode".into(),
            value: "generate".into(),
            reason: format!(
                "{} has no decoder, so it cannot generate tokens; plan one forward with --mode \
                 infer, or --mode train",
                model.name
            ),
        });
    }
    let causal_lm = matches!(&model.arch, Architecture::Transformer(t) if t.head == Head::CausalLm);
    if workload.mode == Mode::Train && workload.loss.chunked() && !causal_lm {
        let name = choices::LOSSES
            .iter()
            .find(|(_, loss)| *loss == workload.loss)
            .map_or("?", |(name, _)| name);
        return Err(PlanError::InvalidValue {
            name: "loss".into(),
            value: name.into(),
            reason: format!(
                "chunked and fused cross-entropy read a causal language model's logits; {} has \
                 no causal LM head (use --loss hf or none)",
                model.name
            ),
        });
    }
    Ok(())
}

/// The settings only some architectures support: per transformer, its towers, heads, LoRA rank
/// and positions (adding its warnings); LoRA, a frozen vision tower or a quantised checkpoint
/// on a CNN or diffusion model; diffusion's own checks.
fn check_architecture(
    model: &ModelSpec,
    workload: &Workload,
    warnings: &mut Vec<Warning>,
) -> Result<()> {
    match &model.arch {
        Architecture::Transformer(t) => {
            check_dual_encoder(model, t, workload)?;

            if workload.freeze_vision_tower && t.vision.is_none() && t.dual.is_none() {
                return Err(PlanError::InvalidValue {
                    name: "freeze-vision-tower".into(),
                    value: model.name.clone(),
                    reason: "needs a vision tower beside a language model or text tower (a \
                             vision-language model such as LLaVA, or a CLIP/SigLIP dual encoder)"
                        .into(),
                });
            }
            check_image_size(model, t, workload)?;
            check_tensor_parallel(model, t, workload.layout.tp)?;
            check_lora_rank(model, t, workload)?;
            check_positions(model, t, workload, warnings)?;
        }
        Architecture::Resnet(_) | Architecture::Diffusion(_) if workload.lora.is_some() => {
            return Err(PlanError::Conflict {
                first: "LoRA (--lora-rank / --qlora)".into(),
                second: format!("model {}", model.name),
                reason: "LoRA is modelled for transformers only; plan this model without it".into(),
            });
        }
        Architecture::Resnet(_) | Architecture::Diffusion(_) if workload.freeze_vision_tower => {
            return Err(PlanError::Conflict {
                first: "--freeze-vision-tower".into(),
                second: format!("model {}", model.name),
                reason: "needs a vision tower beside a language model or text tower".into(),
            });
        }
        Architecture::Resnet(_) | Architecture::Diffusion(_) if workload.quant.is_some() => {
            return Err(PlanError::InvalidValue {
                name: "quant".into(),
                value: model.name.clone(),
                reason: "quantised checkpoints are modelled for transformers only (their block \
                         linears); pass --quant none"
                    .into(),
            });
        }
        Architecture::Resnet(_) => {}
        Architecture::Diffusion(_) => crate::diffusion::check(model, workload)?,
    }
    Ok(())
}

/// A vision transformer (or a dual encoder's vision tower) cuts its input into patches: an
/// image smaller than one patch gives its patch convolution no output (PyTorch raises).
fn check_image_size(model: &ModelSpec, t: &TransformerSpec, workload: &Workload) -> Result<()> {
    let patches = t.patches.or(t.dual.as_ref().and_then(|d| d.tower.patches));
    match patches {
        Some(p) if workload.image_size < p.patch => Err(PlanError::InvalidValue {
            name: "image-size".into(),
            value: workload.image_size.to_string(),
            reason: format!(
                "must be at least the {}-pixel patch side of {}: a smaller image has no patch \
                 (its trained size is {})",
                p.patch, model.name, p.image_size
            ),
        }),
        _ => Ok(()),
    }
}

/// Each pipeline stage holds whole blocks.
fn check_pipeline_stages(model: &ModelSpec, workload: &Workload) -> Result<()> {
    let layout = &workload.layout;
    if layout.pp > model.blocks() {
        return Err(PlanError::InvalidValue {
            name: "pp".into(),
            value: layout.pp.to_string(),
            reason: format!(
                "must be at most the {} blocks of {}: each pipeline stage holds whole blocks",
                model.blocks(),
                model.name
            ),
        });
    }
    Ok(())
}

/// Each tensor-parallel rank holds whole attention heads, so `tp` must divide them.
fn check_tensor_parallel(model: &ModelSpec, t: &TransformerSpec, tp: u64) -> Result<()> {
    if t.heads.is_multiple_of(tp) {
        return Ok(());
    }
    let divisors: Vec<String> = (1..=t.heads)
        .filter(|d| t.heads.is_multiple_of(*d))
        .map(|d| d.to_string())
        .collect();
    Err(PlanError::InvalidValue {
        name: "tp".into(),
        value: tp.to_string(),
        reason: format!(
            "must divide the {} attention heads of {} (each GPU holds whole heads); accepted: {}",
            t.heads,
            model.name,
            divisors.join(", ")
        ),
    })
}

/// A LoRA rank above the model width adds more parameters than the matrices it adapts.
fn check_lora_rank(model: &ModelSpec, t: &TransformerSpec, workload: &Workload) -> Result<()> {
    if let Some(lora) = workload.lora {
        lora.targets.check(t, &model.name)?;
        let peft = workload.framework == crate::workload::Framework::Hf;
        if peft && lora.dropout > 0.0 && lora.targets.adapts_parameters(t) {
            return Err(PlanError::InvalidValue {
                name: "lora-dropout".into(),
                value: lora.dropout.to_string(),
                reason: format!(
                    "PEFT adapts {}'s router and fused experts as parameters (its ParamWrapper), \
                     which refuses dropout: pass --lora-dropout 0, or --lora-targets without \
                     the router and MLP names (e.g. q_proj,k_proj,v_proj,o_proj)",
                    model.name
                ),
            });
        }
    }
    match workload.lora {
        Some(lora) if lora.rank > t.hidden => Err(PlanError::InvalidValue {
            name: "lora-rank".into(),
            value: lora.rank.to_string(),
            reason: format!(
                "must be at most the hidden size {} of {}: a wider adapter has more parameters \
                 than the matrix it adapts",
                t.hidden, model.name
            ),
        }),
        _ => Ok(()),
    }
}

/// Tokens beyond a learned position table cannot be embedded (error); beyond the trained length
/// of rotary positions they run, with degraded quality (warning).
fn check_positions(
    model: &ModelSpec,
    t: &TransformerSpec,
    workload: &Workload,
    warnings: &mut Vec<Warning>,
) -> Result<()> {
    let (Some(positions), true) = (t.max_positions, model.reads_tokens()) else {
        return Ok(());
    };
    let tokens = workload.tokens();
    if tokens <= positions {
        return Ok(());
    }
    if model.token_limit().is_none() {
        warnings.push(Warning::PastTrainedPositions { tokens, positions });
        return Ok(());
    }
    let (name, limit) = match workload.mode {
        Mode::Generate => (
            "seq + new-tokens - 1",
            "the prompt and every generated token but the last must fit in them",
        ),
        Mode::Train | Mode::Infer => ("seq", "at most that many tokens per sequence"),
    };
    Err(PlanError::InvalidValue {
        name: name.into(),
        value: tokens.to_string(),
        reason: format!(
            "{} has {positions} learned positions (max_position_embeddings): {limit}",
            model.name
        ),
    })
}
