//! Diffusion denoisers read from diffusers configs (keyed by `_class_name`): the Stable
//! Diffusion UNet (`UNet2DConditionModel`: SD 1.x, 2.x, SDXL) and the class-conditional DiT
//! (`DiTTransformer2DModel`, or `Transformer2DModel` with `norm_type: "ada_norm_zero"`).
//!
//! One walk over the modules in forward order ([`UnetSpec::walk`]) gives both the exact
//! parameter counts and the memory units of one denoising step, so the two cannot disagree.
//! The workload is a step on latents: `--image-size` is the pixel side, the latent side is
//! [`VAE_FACTOR`] times smaller, and the text encoder's hidden states ([`TEXT_TOKENS`] tokens)
//! are an input, not a model. Attention runs through `scaled_dot_product_attention`
//! (diffusers' default `AttnProcessor2_0`).

use crate::error::{PlanError, Result};
use crate::limits::{self, Bound};
use crate::model::denoiser::{groupnorm, linear};
use crate::unit::Unit;
use crate::workload::{Mode, Workload};
use serde_json::Value;

// The denoisers' shapes and parameter counts are the model's (`model::denoiser`), which
// holds them; this module reads them from configs and plans their steps.
pub use crate::model::denoiser::{
    DiffusionSpec, DitSpec, UnetLayer, UnetSpec, UnetStep, SUPPORTED_CLASSES, TEXT_TOKENS,
    VAE_FACTOR,
};

/// Reads a diffusers config whose `_class_name` is `class`.
pub fn parse(class: &str, json: &Value) -> Result<DiffusionSpec> {
    let fields = Fields { json, class };
    match class {
        "UNet2DConditionModel" => fields.unet().map(DiffusionSpec::Unet),
        "DiTTransformer2DModel" => fields.dit().map(DiffusionSpec::Dit),
        "Transformer2DModel" => {
            // diffusers builds a DiT from a Transformer2DModel config with patches and
            // adaLN-zero norms (facebook/DiT-XL-2-256); other variants are different models.
            let norm = fields.str_or("norm_type", "layer_norm")?;
            if norm == "ada_norm_zero"
                && fields.json.get("patch_size").is_some_and(|p| !p.is_null())
            {
                fields.dit().map(DiffusionSpec::Dit)
            } else {
                Err(fields.unsupported(
                    "norm_type",
                    norm,
                    "a Transformer2DModel is planned as a DiT (norm_type \"ada_norm_zero\" with a \
                     patch_size); PixArt (\"ada_norm_single\") and continuous-input transformers \
                     are not modelled",
                ))
            }
        }
        other => Err(crate::names::unknown(
            "_class_name",
            other,
            SUPPORTED_CLASSES.iter().copied(),
        )),
    }
}

struct Fields<'a> {
    json: &'a Value,
    class: &'a str,
}

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.json.get(key).filter(|v| !v.is_null())
    }

    fn invalid(&self, key: &str, value: &Value, reason: &str) -> PlanError {
        PlanError::InvalidValue {
            name: key.to_string(),
            value: value.to_string(),
            reason: reason.to_string(),
        }
    }

    fn unsupported(&self, key: &str, value: &str, reason: &str) -> PlanError {
        PlanError::InvalidValue {
            name: key.to_string(),
            value: value.to_string(),
            reason: format!("{}: {reason}", self.class),
        }
    }

    fn u64_or(&self, key: &'static str, default: Option<u64>, bound: Bound) -> Result<u64> {
        match self.get(key) {
            None => default.ok_or_else(|| PlanError::MissingField {
                model_type: self.class.to_string(),
                field: key,
                spellings: vec![key],
            }),
            Some(v) => match v.as_u64() {
                Some(n) => bound.check(key, n),
                None => Err(self.invalid(key, v, "must be a positive integer")),
            },
        }
    }

    fn str_or<'b>(&'b self, key: &str, default: &'b str) -> Result<&'b str> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .as_str()
                .ok_or_else(|| self.invalid(key, v, "must be a string")),
        }
    }

    /// An integer per stage: a list of `stages` integers, or one integer for all.
    fn per_stage(
        &self,
        key: &'static str,
        stages: usize,
        default: Option<u64>,
        bound: Bound,
    ) -> Result<Vec<u64>> {
        match self.get(key) {
            Some(Value::Array(items)) => {
                if items.len() != stages {
                    return Err(self.invalid(
                        key,
                        self.json.get(key).unwrap_or(&Value::Null),
                        &format!("must list one value per stage ({stages})"),
                    ));
                }
                items
                    .iter()
                    .map(|v| match v.as_u64() {
                        Some(n) => bound.check(key, n),
                        None => Err(self.invalid(key, v, "must hold positive integers")),
                    })
                    .collect()
            }
            _ => Ok(vec![self.u64_or(key, default, bound)?; stages]),
        }
    }

    fn block_types(&self, key: &'static str, attention: &str, plain: &str) -> Result<Vec<bool>> {
        let items =
            self.get(key)
                .and_then(Value::as_array)
                .ok_or_else(|| PlanError::MissingField {
                    model_type: self.class.to_string(),
                    field: key,
                    spellings: vec![key],
                })?;
        items
            .iter()
            .map(|v| match v.as_str() {
                Some(name) if name == attention => Ok(true),
                Some(name) if name == plain => Ok(false),
                _ => Err(self.invalid(key, v, &format!("supported: {attention}, {plain}"))),
            })
            .collect()
    }

    fn unet(&self) -> Result<UnetSpec> {
        let channels = self.unet_channels()?;
        let stages = channels.len();
        let (down_attention, up_attention) = self.unet_block_attention(stages)?;
        self.reject_unmodelled_unet_options()?;
        // diffusers' naming quirk: `attention_head_dim` holds the heads when
        // `num_attention_heads` is absent.
        let heads_key = if self.get("num_attention_heads").is_some() {
            "num_attention_heads"
        } else {
            "attention_head_dim"
        };
        let heads = self.per_stage(heads_key, stages, Some(8), limits::WIDTH)?;
        if heads.iter().zip(&channels).any(|(h, c)| h > c) {
            return Err(self.invalid(
                heads_key,
                self.json.get(heads_key).unwrap_or(&Value::Null),
                &format!(
                    "each stage's attention heads must be at most its channels \
                     (block_out_channels {channels:?}): a head is channels / heads wide"
                ),
            ));
        }
        let transformer_layers = self.per_stage(
            "transformer_layers_per_block",
            stages,
            Some(1),
            limits::LAYERS,
        )?;
        let up_transformer_layers = self.unet_up_transformer_layers(&transformer_layers, stages)?;
        let addition = self.unet_addition()?;
        let time_embed = match self.get("time_embedding_dim") {
            Some(_) => self.u64_or("time_embedding_dim", None, limits::WIDTH)?,
            None => 4 * channels[0],
        };
        let kernel = |key: &'static str| self.u64_or(key, Some(3), limits::WIDTH);
        let layers = self.per_stage("layers_per_block", stages, Some(2), limits::LAYERS)?;
        // Every module is a step of the walk: bound them all together, as a stack's blocks are.
        // A stage's up path runs its resnets with the up attention listed for it, which the up
        // order lists last for the first stage.
        let modules: u64 = layers
            .iter()
            .zip(
                transformer_layers
                    .iter()
                    .zip(up_transformer_layers.iter().rev()),
            )
            .map(|(resnets, (down, up))| (resnets + 1) * (2 + down + up))
            .sum();
        limits::LAYERS.check("resnets and transformer blocks (all stages)", modules)?;
        let spec = UnetSpec {
            in_channels: self.u64_or("in_channels", Some(4), limits::WIDTH)?,
            out_channels: self.u64_or("out_channels", Some(4), limits::WIDTH)?,
            sample_size: self.u64_or("sample_size", Some(64), limits::POSITIONS)?,
            conv_kernels: (kernel("conv_in_kernel")?, kernel("conv_out_kernel")?),
            layers,
            cross_dim: self.per_stage("cross_attention_dim", stages, Some(1280), limits::WIDTH)?,
            channels,
            down_attention,
            up_attention,
            transformer_layers,
            up_transformer_layers,
            heads,
            time_embed,
            addition,
        };
        check_parameters(
            unet_parameter_bound(&spec, modules),
            "block_out_channels, conv_in_kernel, conv_out_kernel, cross_attention_dim and \
             time_embedding_dim",
        )?;
        Ok(spec)
    }

    /// `block_out_channels`: the channels of each stage.
    fn unet_channels(&self) -> Result<Vec<u64>> {
        match self.get("block_out_channels") {
            Some(Value::Array(items)) if !items.is_empty() => {
                self.per_stage("block_out_channels", items.len(), None, limits::WIDTH)
            }
            other => Err(self.invalid(
                "block_out_channels",
                other.unwrap_or(&Value::Null),
                "must list the channels of each stage",
            )),
        }
    }

    /// Whether each down and each up stage has cross-attention, one entry per stage.
    fn unet_block_attention(&self, stages: usize) -> Result<(Vec<bool>, Vec<bool>)> {
        let down_attention =
            self.block_types("down_block_types", "CrossAttnDownBlock2D", "DownBlock2D")?;
        let up_attention = self.block_types("up_block_types", "CrossAttnUpBlock2D", "UpBlock2D")?;
        if down_attention.len() != stages || up_attention.len() != stages {
            return Err(self.invalid(
                "down_block_types",
                self.json.get("down_block_types").unwrap_or(&Value::Null),
                "down_block_types, up_block_types and block_out_channels must have one entry per \
                 stage",
            ));
        }
        Ok((down_attention, up_attention))
    }

    /// Errors on a mid block, conditioning or attention variant the planner does not model.
    fn reject_unmodelled_unet_options(&self) -> Result<()> {
        let mid = self.str_or("mid_block_type", "UNetMidBlock2DCrossAttn")?;
        if mid != "UNetMidBlock2DCrossAttn" {
            return Err(self.unsupported(
                "mid_block_type",
                mid,
                "supported: UNetMidBlock2DCrossAttn",
            ));
        }
        for key in [
            "class_embed_type",
            "encoder_hid_dim",
            "time_cond_proj_dim",
            "num_class_embeds",
        ] {
            if let Some(v) = self.get(key) {
                return Err(self.invalid(key, v, "not modelled: must be null"));
            }
        }
        // `only_cross_attention` is one flag or one per down stage.
        for key in ["only_cross_attention", "dual_cross_attention"] {
            let flags = match self.get(key) {
                None => continue,
                Some(Value::Array(stages)) if key == "only_cross_attention" => {
                    stages.iter().map(Value::as_bool).collect()
                }
                Some(flag) => flag.as_bool().map(|flag| vec![flag]),
            };
            match flags {
                Some(flags) if !flags.contains(&true) => {}
                Some(_) => {
                    return Err(self.unsupported(
                        key,
                        "true",
                        "only_cross_attention and dual_cross_attention are not modelled",
                    ))
                }
                None => {
                    return Err(self.invalid(
                        key,
                        self.json.get(key).unwrap_or(&Value::Null),
                        "must be false (true, or a list of flags per stage, is not modelled)",
                    ))
                }
            }
        }
        Ok(())
    }

    /// Transformer layers of each up stage: `reverse_transformer_layers_per_block`'s first
    /// entries, else the down stages' `down_layers` reversed.
    fn unet_up_transformer_layers(&self, down_layers: &[u64], stages: usize) -> Result<Vec<u64>> {
        let up_layers = match self.get("reverse_transformer_layers_per_block") {
            Some(Value::Array(rows)) => rows
                .iter()
                .map(|row| {
                    row.as_array()
                        .and_then(|r| r.first())
                        .and_then(Value::as_u64)
                        .ok_or_else(|| {
                            self.invalid(
                                "reverse_transformer_layers_per_block",
                                row,
                                "must hold lists of positive integers",
                            )
                        })
                        .and_then(|n| {
                            limits::LAYERS.check("reverse_transformer_layers_per_block", n)
                        })
                })
                .collect::<Result<Vec<u64>>>()?,
            _ => down_layers.iter().rev().copied().collect(),
        };
        if up_layers.len() != stages {
            return Err(self.invalid(
                "reverse_transformer_layers_per_block",
                self.json
                    .get("reverse_transformer_layers_per_block")
                    .unwrap_or(&Value::Null),
                "must have one entry per stage",
            ));
        }
        Ok(up_layers)
    }

    /// SDXL's added time and text embedding (`addition_embed_type: text_time`): its input width.
    fn unet_addition(&self) -> Result<Option<u64>> {
        match self.get("addition_embed_type") {
            None => Ok(None),
            Some(Value::String(kind)) if kind == "text_time" => self
                .u64_or("projection_class_embeddings_input_dim", None, limits::WIDTH)
                .map(Some),
            Some(v) => Err(self.invalid("addition_embed_type", v, "supported: text_time, null")),
        }
    }

    fn dit(&self) -> Result<DitSpec> {
        let heads = self.u64_or("num_attention_heads", Some(16), limits::WIDTH)?;
        let head_dim = self.u64_or("attention_head_dim", Some(72), limits::WIDTH)?;
        let in_channels = self.u64_or("in_channels", Some(4), limits::WIDTH)?;
        let patch = self.u64_or("patch_size", Some(2), limits::WIDTH)?;
        let sample_size = self.u64_or("sample_size", Some(32), limits::POSITIONS)?;
        if !sample_size.is_multiple_of(patch) {
            return Err(self.invalid(
                "patch_size",
                &Value::from(patch),
                &format!("must divide sample_size {sample_size}"),
            ));
        }
        let spec = DitSpec {
            hidden: limits::WIDTH
                .check("num_attention_heads × attention_head_dim", heads * head_dim)?,
            heads,
            layers: self.u64_or("num_layers", Some(28), limits::LAYERS)?,
            patch,
            in_channels,
            out_channels: self.u64_or("out_channels", Some(in_channels), limits::WIDTH)?,
            sample_size,
            classes: self.u64_or("num_embeds_ada_norm", Some(1000), limits::VOCAB)?,
        };
        check_parameters(
            dit_parameter_bound(&spec),
            "num_attention_heads × attention_head_dim, num_layers, patch_size, out_channels and \
             sample_size",
        )?;
        Ok(spec)
    }
}

/// An upper bound on a UNet's parameters (and so on every count of its modules), in `u128` so
/// that no product overflows; `modules`: its resnets and transformer blocks. Every module —
/// the stem, a resnet (its input up to twice the widest stage, with the skip), a transformer
/// block, an attention's projections, a sampler, the head — holds fewer than 40 matrices of
/// the widest width `w`, each convolution `k²` times larger.
fn unet_parameter_bound(spec: &UnetSpec, modules: u64) -> u128 {
    let widest = spec.channels.iter().max().copied().unwrap_or(0) * 2;
    let w = [
        widest,
        spec.time_embed,
        spec.in_channels,
        spec.out_channels,
        spec.addition.unwrap_or(0),
    ]
    .into_iter()
    .chain(spec.cross_dim.iter().copied())
    .max()
    .map_or(0, u128::from);
    let k = u128::from(spec.conv_kernels.0.max(spec.conv_kernels.1).max(3));
    let units = 2 * u128::from(modules) + 4 * spec.channels.len() as u128 + 8;
    units * 40 * w * w * k * k
}

/// An upper bound on a DiT's parameters and its position table, in `u128`: every block's
/// matrices (fewer than 16 of h × h) and class table, the patch convolution and the
/// projection back to patches, the table of one row per patch.
fn dit_parameter_bound(spec: &DitSpec) -> u128 {
    let wide = u128::from;
    let (h, p) = (wide(spec.hidden), wide(spec.patch));
    let block = 16 * h * h + (wide(spec.classes) + 300) * h;
    let patches = wide(spec.in_channels + spec.out_channels) * p * p * h;
    let table = (wide(spec.sample_size) / p).pow(2) * h;
    wide(spec.layers) * block + patches + table + 4 * h * h
}

/// Rejects a denoiser whose dimensions, each within its bound, multiply past
/// [`limits::MAX_PARAMETERS`] (`bound`: an upper bound of its count; `fields`: the config's
/// fields it grows with).
fn check_parameters(bound: u128, fields: &str) -> Result<()> {
    if bound > u128::from(limits::MAX_PARAMETERS) {
        return Err(PlanError::InvalidValue {
            name: "model size".into(),
            value: format!("up to {bound} parameters"),
            reason: format!(
                "the widths, kernels and blocks multiply past the planner's bound of {} \
                 parameters; check {fields}",
                limits::MAX_PARAMETERS
            ),
        });
    }
    Ok(())
}

/// Bytes per element of a denoising step's tensors, and its size.
#[derive(Debug, Clone, Copy)]
struct Step {
    /// Activation bytes per element.
    act: f64,
    /// Input bytes per element (the weight dtype the inputs are cast to).
    input: f64,
    /// Samples of the micro-batch.
    batch: f64,
    /// A training step (saved tensors, loss) rather than a no-grad forward.
    training: bool,
}

impl Step {
    fn of(workload: &Workload, batch: u64) -> Self {
        Step {
            act: workload.compute_dtype().bytes() as f64,
            input: workload.dtype.bytes() as f64,
            batch: batch as f64,
            training: workload.mode == Mode::Train,
        }
    }

    /// The MSE loss on the prediction (`F.mse_loss(pred.float(), target.float())`): the fp32
    /// copies of a half-precision prediction and target are saved beside the prediction.
    fn loss_saved(&self, elements: f64) -> f64 {
        let copies = if self.act < 4.0 { 2.0 * 4.0 } else { 0.0 };
        elements * (self.act + copies)
    }
}

/// Latent side of a run at `image_size` pixels.
pub fn latent_side(image_size: u64) -> u64 {
    image_size.div_ceil(VAE_FACTOR).max(1)
}

/// The units of one denoising step of `spec` for `batch` samples.
pub(crate) fn units(spec: &DiffusionSpec, workload: &Workload, batch: u64) -> Vec<Unit> {
    let step = Step::of(workload, batch);
    let side = latent_side(workload.image_size);
    match spec {
        DiffusionSpec::Unet(u) => unet_units(u, step, side),
        DiffusionSpec::Dit(d) => dit_units(d, step, side),
    }
}

/// Keeps a unit's saved bytes only in training.
fn trained(unit: Unit, step: Step) -> Unit {
    if step.training {
        unit
    } else {
        Unit { saved: 0.0, ..unit }
    }
}

fn unet_units(spec: &UnetSpec, step: Step, side: u64) -> Vec<Unit> {
    let a = step.act;
    let b = step.batch;
    // Pixels of the micro-batch after `level` stride-2 convolutions (padding 1: ceil(side / 2)).
    let pixels = |level: u32| {
        let s = (0..level).fold(side, |s, _| s.div_ceil(2));
        b * (s * s) as f64
    };
    let text = b * (TEXT_TOKENS * spec.cross_dim.iter().copied().max().unwrap_or(0)) as f64;
    let latent = pixels(0) * spec.in_channels as f64;
    let prediction = pixels(0) * spec.out_channels as f64;
    // The loop's inputs: noisy latents and the text hidden states (and the target noise).
    let inputs = step.input * (latent + text + if step.training { prediction } else { 0.0 });
    let mut units = Vec::new();
    let mut skips: Vec<f64> = Vec::new();
    let mut taken = 0.0;
    let mut stage_input = 0.0;
    let mut previous_output = 0.0;
    let mut input_is_skip = false;
    for s in spec.walk() {
        if s.takes_skips > 0 {
            // The UNet's forward slices this stage's skips off its list and holds them until the
            // next stage starts; its `sample` holds the stage's input until the stage returns.
            let keep = skips.len().saturating_sub(s.takes_skips as usize);
            taken = skips.drain(keep..).sum();
            stage_input = previous_output;
        }
        let params = spec.layer_params(s.layer);
        let first = units.len();
        let tensors = LoopTensors { inputs, prediction };
        let unit = unet_module(spec, s.layer, step, params, tensors, &pixels, &mut units);
        units.push(trained(unit, step));
        // Skips held while the module runs, less its own input when that is the newest skip.
        let held_skips: f64 = skips.iter().sum::<f64>() + taken + stage_input;
        let own = if input_is_skip {
            skips.last().copied().unwrap_or(0.0)
        } else {
            0.0
        };
        for unit in &mut units[first..] {
            unit.inference_live += held_skips - own;
        }
        input_is_skip = s.pushes_skip;
        previous_output = unet_output(spec, s.layer, &pixels) * a;
        if s.pushes_skip {
            skips.push(previous_output);
        }
    }
    units
}

/// What the denoising loop feeds a UNet and takes from it.
#[derive(Debug, Clone, Copy)]
struct LoopTensors {
    /// Bytes of its inputs: noisy latents and the text hidden states (and the target noise).
    inputs: f64,
    /// Elements of the predicted noise.
    prediction: f64,
}

/// The unit of one UNet module (an attention module pushes its projection in and its blocks
/// onto `units` first). `pixels`: pixels of the micro-batch at a level.
fn unet_module(
    spec: &UnetSpec,
    layer: UnetLayer,
    step: Step,
    params: u64,
    tensors: LoopTensors,
    pixels: &impl Fn(u32) -> f64,
    units: &mut Vec<Unit>,
) -> Unit {
    let a = step.act;
    let LoopTensors { inputs, prediction } = tensors;
    match layer {
        UnetLayer::Stem => {
            let out = pixels(0) * spec.channels[0] as f64 * a;
            Unit {
                name: "embeddings",
                held: inputs,
                forward_transient: out,
                inference_live: out,
                params,
                ..Unit::default()
            }
        }
        UnetLayer::Resnet {
            inputs: i,
            outputs: o,
            level,
        } => unet_resnet(pixels(level) * a, i, o, params),
        UnetLayer::Attention {
            channels,
            heads,
            layers,
            level,
            ..
        } => unet_attention(
            UnetAttention {
                channels,
                heads,
                layers,
            },
            pixels(level),
            step,
            params,
            units,
        ),
        UnetLayer::Downsample { channels, level } => unet_downsample(
            pixels(level),
            pixels(level + 1),
            channels as f64 * a,
            params,
        ),
        UnetLayer::Upsample { channels, level } => unet_upsample(
            pixels(level),
            pixels(level.saturating_sub(1)),
            channels as f64 * a,
            params,
        ),
        UnetLayer::Out => {
            let p = pixels(0) * a;
            let c0 = spec.channels[0] as f64;
            Unit {
                name: "head",
                // GroupNorm input, its output (SiLU) and the SiLU output (conv_out); the
                // prediction for the loss.
                saved: 3.0 * p * c0 + step.loss_saved(prediction),
                held: prediction * a,
                forward_transient: p * c0,
                backward_transient: 2.0 * p * c0,
                gradient_transient: p * c0,
                inference_live: 3.0 * p * c0,
                params,
                ..Unit::default()
            }
        }
    }
}

/// A UNet downsampling convolution (stride 2) of `c` bytes per pixel, `before` pixels in and
/// `after` out.
fn unet_downsample(before: f64, after: f64, c: f64, params: u64) -> Unit {
    Unit {
        name: "block",
        saved: before * c,
        checkpoint: Some(before * c),
        forward_transient: after * c,
        backward_transient: (before + after) * c,
        gradient_transient: before * c,
        inference_live: (before + after) * c,
        params,
        ..Unit::default()
    }
}

/// A UNet upsampling (interpolation, then a convolution) of `c` bytes per pixel, `before`
/// pixels in and `after` out.
fn unet_upsample(before: f64, after: f64, c: f64, params: u64) -> Unit {
    Unit {
        name: "block",
        // Interpolation saves nothing; the convolution saves its upsampled input.
        saved: after * c,
        checkpoint: Some(before * c),
        forward_transient: (before + after) * c,
        backward_transient: 2.0 * after * c,
        gradient_transient: after * c,
        inference_live: (before + 2.0 * after) * c,
        params,
        ..Unit::default()
    }
}

/// The shape of a UNet cross-attention module.
#[derive(Debug, Clone, Copy)]
struct UnetAttention {
    channels: u64,
    heads: u64,
    /// Transformer blocks in the module.
    layers: u64,
}

/// A UNet resnet of `inputs` → `outputs` channels over `p` bytes per channel (its level's
/// pixels times the activation bytes).
fn unet_resnet(p: f64, inputs: u64, outputs: u64, params: u64) -> Unit {
    let (i, o) = (inputs as f64, outputs as f64);
    let shortcut = if i != o { o } else { 0.0 };
    Unit {
        name: "block",
        // Block input (GroupNorm, shortcut), both norm outputs (SiLU), both SiLU
        // outputs (convolutions), the first conv plus time embedding (GroupNorm).
        saved: p * (3.0 * i + 3.0 * o),
        checkpoint: Some(p * i),
        // The output, the residual sum before `/ output_scale_factor`, the shortcut.
        forward_transient: p * (2.0 * o + shortcut),
        backward_transient: p * (2.0 * o + i),
        gradient_transient: p * (i + o),
        inference_live: p * (3.0 * i).max(2.0 * i + o).max(i + 3.0 * o + shortcut),
        params,
        ..Unit::default()
    }
}

/// A UNet cross-attention module at `p` pixels of the micro-batch: pushes its projection in
/// and its `layers` transformer blocks onto `units`, and returns its projection out.
fn unet_attention(
    module: UnetAttention,
    p: f64,
    step: Step,
    params: u64,
    units: &mut Vec<Unit>,
) -> Unit {
    let UnetAttention {
        channels,
        heads,
        layers,
    } = module;
    let (a, b) = (step.act, step.batch);
    let c = channels as f64;
    let inner = (heads * (channels / heads)) as f64;
    let keys = b * TEXT_TOKENS as f64 * inner * a;
    // Projection in: the input (GroupNorm, residual) and the norm output in the
    // projection's layout.
    units.push(trained(
        Unit {
            name: "attention",
            saved: p * a * 2.0 * c,
            forward_transient: p * a * 2.0 * inner,
            inference_live: p * a * (3.0 * c + inner),
            backward_transient: p * a * 2.0 * c,
            gradient_transient: p * a * 2.0 * c,
            params: groupnorm(channels) + linear(channels, inner as u64),
            ..Unit::default()
        },
        step,
    ));
    let block_params = (params
        - groupnorm(channels)
        - linear(channels, inner as u64)
        - linear(inner as u64, channels))
        / layers;
    let lse = 2.0 * p * heads as f64 * 4.0;
    for _ in 0..layers {
        units.push(trained(
            Unit {
                name: "block",
                // Per token: input, norm1, q/k/v, attention output (SDPA writes it
                // token-major, so `transpose(1, 2).reshape` is a view), residual,
                // norm2, cross q and output, residual, norm3, GEGLU projection (8c),
                // GELU and product (4c each).
                saved: p * a * 28.0 * inner + 2.0 * keys + lse,
                checkpoint: Some(p * a * inner),
                forward_transient: p * a * 2.0 * inner,
                backward_transient: p * a * 12.0 * inner,
                gradient_transient: p * a * 2.0 * inner,
                // The residual the wrapper holds, the block input, the residual sum,
                // the attention output (`attn_output` stays bound), norm3 and the
                // feed-forward's projection, GELU and product.
                inference_live: p * a * 21.0 * inner + 2.0 * keys,
                params: block_params,
                ..Unit::default()
            },
            step,
        ));
    }
    Unit {
        name: "attention",
        saved: p * a * inner,
        forward_transient: p * a * 3.0 * c,
        backward_transient: p * a * 2.0 * c,
        gradient_transient: p * a * 2.0 * c,
        inference_live: p * a * (2.0 * inner + 3.0 * c),
        params: linear(inner as u64, channels),
        ..Unit::default()
    }
}

/// Elements of a module's output.
fn unet_output(spec: &UnetSpec, layer: UnetLayer, pixels: &impl Fn(u32) -> f64) -> f64 {
    match layer {
        UnetLayer::Stem => pixels(0) * spec.channels[0] as f64,
        UnetLayer::Resnet { outputs, level, .. } => pixels(level) * outputs as f64,
        UnetLayer::Attention {
            channels, level, ..
        } => pixels(level) * channels as f64,
        UnetLayer::Downsample { channels, level } => pixels(level + 1) * channels as f64,
        UnetLayer::Upsample { channels, level } => {
            pixels(level.saturating_sub(1)) * channels as f64
        }
        UnetLayer::Out => pixels(0) * spec.out_channels as f64,
    }
}

fn dit_units(spec: &DitSpec, step: Step, side: u64) -> Vec<Unit> {
    let a = step.act;
    let b = step.batch;
    let tokens = b * spec.tokens(side) as f64;
    let h = spec.hidden as f64;
    let latent = b * (spec.in_channels * side * side) as f64;
    let prediction = b * (spec.out_channels * side * side) as f64;
    let inputs = step.input * (latent + if step.training { prediction } else { 0.0 });
    let counts = spec.params();
    let mut units = vec![trained(
        Unit {
            name: "embeddings",
            held: inputs,
            // The patch convolution's output and its sum with the position table.
            forward_transient: 2.0 * tokens * h * a,
            inference_live: 2.0 * tokens * h * a,
            params: counts.embeddings,
            ..Unit::default()
        },
        step,
    )];
    let lse = tokens * spec.heads as f64 * 4.0;
    for _ in 0..spec.layers {
        units.push(trained(
            Unit {
                name: "block",
                // Per token: input, LayerNorm output and the modulated norm, q/k/v, attention
                // output (its `transpose(1, 2).reshape` a view) and the rescaled output (gate),
                // residual, the second norm and its modulation, the MLP's 4h projection and
                // GELU, its output (gate).
                saved: tokens * a * 20.0 * h + lse,
                checkpoint: Some(tokens * a * h),
                forward_transient: 2.0 * tokens * a * h,
                backward_transient: 8.0 * tokens * a * h,
                gradient_transient: 2.0 * tokens * a * h,
                // The block input, the residual, the gated attention output (`attn_output`
                // stays bound), the modulated norm, the MLP's projection and GELU.
                inference_live: 12.0 * tokens * a * h,
                params: spec.block_params(),
                ..Unit::default()
            },
            step,
        ));
    }
    units.push(trained(
        Unit {
            name: "head",
            saved: 3.0 * tokens * a * h + step.loss_saved(prediction),
            held: prediction * a,
            forward_transient: 2.0 * prediction * a,
            backward_transient: 2.0 * tokens * a * h,
            gradient_transient: tokens * a * h,
            inference_live: 3.0 * tokens * a * h + prediction * a,
            params: counts.head,
            ..Unit::default()
        },
        step,
    ));
    units
}

impl DiffusionSpec {
    /// Bytes of one typical activation (a first-stage feature map or the DiT's hidden states),
    /// the granularity of a planned allocation sequence.
    pub fn typical_activation(&self, workload: &Workload) -> f64 {
        let side = latent_side(workload.image_size);
        let elements = match self {
            DiffusionSpec::Unet(u) => side * side * u.channels[0],
            DiffusionSpec::Dit(d) => d.tokens(side) * d.hidden,
        };
        (workload.batch * elements) as f64 * workload.compute_dtype().bytes() as f64
    }
}

/// What a denoising step cannot be planned with: attention other than SDPA (diffusers'
/// default processor), tensor or pipeline parallelism, a DiT latent its patches do not tile.
pub fn check(model: &crate::model::ModelSpec, workload: &Workload) -> Result<()> {
    use crate::workload::Attention;
    let Some(spec) = model.diffusion() else {
        return Ok(());
    };
    if workload.attention != Attention::Sdpa {
        return Err(PlanError::InvalidValue {
            name: "attn".into(),
            value: format!("{:?}", workload.attention).to_lowercase(),
            reason: format!(
                "{} is planned with sdpa, diffusers' default attention processor \
                 (AttnProcessor2_0)",
                model.name
            ),
        });
    }
    if workload.layout.tp > 1 || workload.layout.pp > 1 {
        return Err(PlanError::InvalidValue {
            name: if workload.layout.tp > 1 { "tp" } else { "pp" }.into(),
            value: workload.layout.tp.max(workload.layout.pp).to_string(),
            reason: format!(
                "{} is planned on data parallelism only (diffusers trains UNets and DiTs with \
                 DDP)",
                model.name
            ),
        });
    }
    if let DiffusionSpec::Dit(d) = spec {
        let side = latent_side(workload.image_size);
        if !side.is_multiple_of(d.patch) {
            return Err(PlanError::InvalidValue {
                name: "image-size".into(),
                value: workload.image_size.to_string(),
                reason: format!(
                    "the latent side ({side} = image size / {VAE_FACTOR}) must be a multiple of \
                     the patch size {}",
                    d.patch
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{estimate, find_model, parse_config, Overheads, Settings};

    fn planned(model: &str, settings: Settings) -> Result<crate::Estimate> {
        let model = find_model(model)?;
        let workload = settings.resolve(&model)?.workload;
        estimate(&model, &workload, &Overheads::default())
    }

    #[test]
    fn classes_and_variants_outside_the_model_are_typed_errors() {
        let pixart = r#"{"_class_name": "Transformer2DModel", "norm_type": "ada_norm_single",
                         "patch_size": 2}"#;
        let err = parse_config("pixart", pixart).unwrap_err().to_string();
        assert!(
            err.contains("ada_norm_single") && err.contains("DiT"),
            "{err}"
        );
        let flux = r#"{"_class_name": "FluxTransformer2DModel"}"#;
        let err = parse_config("flux", flux).unwrap_err().to_string();
        assert!(err.contains("UNet2DConditionModel"), "{err}");
        let odd_block = r#"{"_class_name": "UNet2DConditionModel",
            "block_out_channels": [32, 64],
            "down_block_types": ["SimpleCrossAttnDownBlock2D", "DownBlock2D"],
            "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"]}"#;
        let err = parse_config("unet", odd_block).unwrap_err().to_string();
        assert!(err.contains("CrossAttnDownBlock2D"), "{err}");
        let mismatched = r#"{"_class_name": "UNet2DConditionModel",
            "block_out_channels": [32, 64, 64],
            "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
            "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"]}"#;
        let err = parse_config("unet", mismatched).unwrap_err().to_string();
        assert!(err.contains("one entry per stage"), "{err}");
        let huge = r#"{"_class_name": "UNet2DConditionModel",
            "block_out_channels": [32, 64], "layers_per_block": 5000,
            "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
            "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"]}"#;
        let err = parse_config("unet", huge).unwrap_err().to_string();
        assert!(err.contains("resnets and transformer blocks"), "{err}");
    }

    #[test]
    fn default_image_is_the_trained_resolution() {
        let model = find_model("sdxl-unet").unwrap();
        let workload = Settings::default().resolve(&model).unwrap().workload;
        assert_eq!(workload.image_size, 1024);
        let dit = find_model("dit-xl-2").unwrap();
        assert_eq!(
            Settings::default()
                .resolve(&dit)
                .unwrap()
                .workload
                .image_size,
            256
        );
    }

    #[test]
    fn attention_other_than_sdpa_and_untiled_latents_are_refused() {
        let eager = Settings {
            attn: Some("eager".into()),
            ..Settings::default()
        };
        let err = planned("sd-1.5-unet", eager).unwrap_err().to_string();
        assert!(err.contains("sdpa"), "{err}");
        let odd = Settings {
            image_size: Some(264),
            ..Settings::default()
        };
        let err = planned("dit-xl-2", odd).unwrap_err().to_string();
        assert!(err.contains("patch size"), "{err}");
    }

    #[test]
    fn skip_connections_make_inference_grow_with_the_image() {
        let at = |size: u64, mode: &str| {
            planned(
                "sd-1.5-unet",
                Settings {
                    mode: Some(mode.into()),
                    batch: Some(2),
                    image_size: Some(size),
                    dtype: Some("fp16".into()),
                    ..Settings::default()
                },
            )
            .unwrap()
        };
        let (small, large) = (at(512, "infer"), at(1024, "infer"));
        // Weights and the cuBLAS workspace do not grow with the image.
        let weights = 2 * 859_520_964;
        let fixed = weights + small.breakdown.blas_workspace;
        // Activations scale with the latent's pixels: four times as many at twice the side.
        let ratio = (large.peak_allocated_bytes - fixed) as f64
            / (small.peak_allocated_bytes - fixed) as f64;
        assert!((3.5..4.5).contains(&ratio), "{ratio}");
        // Training keeps every saved tensor: at the end of its forward, far more than a
        // no-grad step holds at its peak.
        let train = at(512, "train");
        let forward_end = train
            .phases
            .iter()
            .find(|p| p.phase == crate::Phase::ForwardEnd)
            .unwrap();
        // Weights, gradients (none yet) and two fp16 AdamW states besides the activations.
        let saved = forward_end.allocated_bytes - 3 * weights - train.breakdown.blas_workspace;
        assert!(saved > 10 * (small.peak_allocated_bytes - fixed), "{saved}");
    }
}
