//! The forward pass as a sequence of memory units: what each step saves for backward, what it
//! holds only briefly, and what it adds to the KV cache. Built from the tensors PyTorch really
//! keeps (saved inputs of linears, GELU/LayerNorm inputs, softmax outputs, dropout masks, the fp32
//! upcast of logits in the loss), so the phase simulation can replay a step.

use crate::model::{Architecture, ModelSpec, TransformerSpec};
use crate::quantity::{Bytes, Tokens, Width};
use crate::releases::OldRelease;
use crate::unit::Unit;
use crate::workload::{Framework, Kernels, Loss, Mode, Workload};
use kernel::AttentionKernel;
use resnet::resnet_units;
use sizes::{ElementSizes, Split};

mod adapters;
mod attention;
mod block;
mod cache;
mod cudnn;
mod embeddings;
mod head;
mod kernel;
mod loss;
mod mlp;
mod norm;
mod pooling;
mod resnet;
mod scores;
mod sizes;
mod stack;

/// Builds the unit sequence of a model under a workload for one micro-batch (`batch` samples).
pub fn build_units(model: &ModelSpec, workload: &Workload, batch: u64) -> Vec<Unit> {
    match &model.arch {
        Architecture::Transformer(spec) => {
            let mut units = Vec::new();
            if let Some(vision) = &spec.vision {
                // The vision tower runs on one image per sample at its own resolution, then the
                // projector maps its patch features to image tokens of the language model.
                let tower_size = vision
                    .tower
                    .patches
                    .map_or(workload.image_size, |p| p.image_size);
                // LoRA trains adapters on the language model's blocks only
                // (`lora::lora_params`): the tower and the projector are frozen with the rest of
                // the base, carry no adapter, and nothing that needs a gradient reaches them.
                let adapters_only = workload.mode == Mode::Train && workload.lora.is_some();
                let images = Workload {
                    image_size: tower_size,
                    lora: workload.lora.filter(|_| !adapters_only),
                    ..workload.clone()
                };
                let tower = TransformerGraph::new(&vision.tower, &images, batch);
                // Training: the layers after the one whose hidden states LLaVA reads, and the
                // tower's own final norm, feed nothing that reaches the loss.
                let read = vision.feature_layers as usize;
                let frozen = workload.freeze_vision_tower || adapters_only;
                units.extend(tower.units().into_iter().enumerate().map(|(index, unit)| {
                    // Units: the patch embeddings (0), the blocks (1..=layers), the final norm.
                    let unit = unit.in_a_tower();
                    if tower.training && (frozen || index > read) {
                        unit.unused_in_training()
                    } else {
                        unit
                    }
                }));
                let projector = tower.projector(vision.projector, vision.image_tokens, spec.hidden);
                units.push(if adapters_only {
                    // Not a block: no checkpoint wraps it.
                    Unit {
                        checkpoint: None,
                        ..projector.unused_in_training()
                    }
                } else {
                    projector
                });
            }
            let text = TransformerGraph::new(spec, workload, batch);
            if let Some(dual) = &spec.dual {
                // CLIPModel / SiglipModel: the vision tower runs first, then the text tower;
                // a no-grad forward returns both towers' outputs with the scores.
                let vision = TransformerGraph::new(&dual.tower, workload, batch);
                let frozen = vision.training && workload.freeze_vision_tower;
                units.extend(vision.units_returning_output().into_iter().map(|unit| {
                    let unit = unit.in_a_tower();
                    if frozen {
                        unit.unused_in_training()
                    } else {
                        unit
                    }
                }));
                units.extend(text.units_returning_output());
                units.push(text.contrastive(dual));
                return units;
            }
            units.extend(text.units());
            units
        }
        Architecture::Resnet(spec) => resnet_units(spec, workload, batch),
        Architecture::Diffusion(spec) => crate::diffusion::units(spec, workload, batch),
    }
}

/// A transformer (or one tower of it) under a workload for one micro-batch: the parts in
/// `graph/*.rs` each add their own methods to it.
struct TransformerGraph<'a> {
    /// The stack's shape.
    spec: &'a TransformerSpec,
    /// What runs on it.
    workload: &'a Workload,
    /// Bytes per element of its tensors.
    bytes: ElementSizes,
    /// How tensor (and sequence) parallelism divides them.
    split: Split,
    /// Samples in the micro-batch.
    batch: f64,
    /// A training step (else a no-grad forward).
    training: bool,
    /// The kernel of the model's self-attentions.
    own_kernel: AttentionKernel,
    /// The kernel of an encoder-decoder's cross-attentions.
    cross_kernel: AttentionKernel,
}

impl<'a> TransformerGraph<'a> {
    /// The graph of `spec` under `workload` for `batch` samples.
    fn new(spec: &'a TransformerSpec, workload: &'a Workload, batch: u64) -> Self {
        let tp = workload.layout.tp as f64;
        TransformerGraph {
            spec,
            workload,
            bytes: ElementSizes::of(workload),
            split: Split {
                tp,
                sequence: if workload.layout.sp { tp } else { 1.0 },
            },
            batch: batch as f64,
            training: workload.mode == Mode::Train,
            own_kernel: AttentionKernel::choose(spec, workload, false),
            cross_kernel: AttentionKernel::choose(spec, workload, true),
        }
    }

    /// Does a dropout of probability `p` run (training only)?
    fn dropout_active(&self, p: f64) -> bool {
        self.training && p > 0.0
    }

    /// The staging buffer a linear's bias gradient takes on a GPU: `grad.sum(0)` over `rows`
    /// gradient rows of `cols` outputs ([`crate::gpu::column_sum_staging_bytes`]); nothing on
    /// the CPU, outside training, or where the base weights are frozen (LoRA).
    fn bias_gradient_staging(&self, rows: Tokens, cols: Width) -> Bytes {
        match self.workload.cores {
            Some(cores) if self.training && self.workload.lora.is_none() => {
                let (rows, cols) = (rows.count() as u64, cols.elements() as u64);
                Bytes(crate::gpu::column_sum_staging_bytes(rows, cols, &cores) as f64)
            }
            _ => Bytes::ZERO,
        }
    }

    /// Sequence length of the (decoder or only) stack.
    fn sequence(&self) -> Tokens {
        match self.spec.patches {
            Some(p) => Tokens(p.tokens_at(self.workload.image_size) as f64),
            None => Tokens(self.workload.seq as f64),
        }
    }

    /// Sequence length of an encoder-decoder's encoder: Whisper's fixed frames, else the input.
    fn encoder_sequence(&self) -> Tokens {
        match self.spec.audio {
            Some(a) => Tokens(a.frames as f64),
            None => self.sequence(),
        }
    }

    /// Sequence length on the decoder side of an encoder-decoder.
    fn decoder_sequence(&self) -> Tokens {
        if self.spec.is_encoder_decoder() && self.workload.mode == Mode::Generate {
            Tokens(self.workload.new_tokens as f64)
        } else {
            self.sequence()
        }
    }

    /// Does the caller hold the model's outputs through backward: `--loss none` (backward
    /// starts from them) or a loop that holds them until the step ends (`--hold-outputs`)?
    fn outputs_through_backward(&self) -> bool {
        self.workload.loss == Loss::None || self.workload.hold_outputs
    }

    /// Does the step run litgpt's own model (`--framework litgpt`) rather than the family's?
    fn litgpt(&self) -> bool {
        self.workload.framework == Framework::Litgpt
    }

    /// Does generation run gpt-fast's own model (`--framework gpt-fast`)?
    fn gpt_fast(&self) -> bool {
        self.workload.framework == Framework::GptFast
    }

    /// Do Liger-Kernel's fused kernels replace the norms and gated MLP of a training step
    /// (`--kernels liger`; a no-grad forward saves nothing either way)?
    fn liger(&self) -> bool {
        self.training && self.workload.kernels == Kernels::Liger
    }

    /// The older transformers release this run plans, if any.
    fn old_release(&self) -> Option<OldRelease<'a>> {
        OldRelease::of(self.spec, self.workload)
    }
}
