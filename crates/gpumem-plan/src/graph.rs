//! The forward pass as a sequence of memory units: what each step saves for backward, what it
//! holds only briefly, and what it adds to the KV cache. Built from the tensors PyTorch really
//! keeps (saved inputs of linears, GELU/LayerNorm inputs, softmax outputs, dropout masks, the fp32
//! upcast of logits in the loss), so the phase simulation can replay a step.

use crate::model::{
    Activation, Architecture, ContrastiveLoss, ConvShape, DualEncoder, Head, LayerKind, ModelSpec,
    Norm, Patches, ResnetSpec, TransformerSpec,
};
use crate::releases::OldRelease;
use crate::single_gpu::per_op_saved_matmul_widths;
use crate::workload::{Checkpointing, Dtype, Framework, Loss, Mode, Target, Workload};
use kernel::{AttentionKernel, GroupedKeys};

mod kernel;

/// One step of the forward pass, in bytes for the whole micro-batch on one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Unit {
    /// What the unit is ("embeddings", "block", "head").
    pub name: &'static str,
    /// Bytes saved for backward when nothing is recomputed.
    pub saved: f64,
    /// Part of `saved` inside the attention core (dropped by selective recomputation).
    pub attention_core: f64,
    /// Bytes kept under full checkpointing (the block input), for checkpointable units.
    pub checkpoint: Option<f64>,
    /// Bytes per-op selective checkpointing keeps besides the block input: the outputs of the
    /// attention kernel and of every other bias-free matmul (see `single_gpu`).
    pub per_op_saved: f64,
    /// Bytes the unit's output keeps alive until the step ends (logits held by the model output).
    pub held: f64,
    /// Bytes the model's output keeps alive until the forward returns, released before backward
    /// (the caller keeps only the loss): cache copies of k and v that no kernel saves.
    pub forward_held: f64,
    /// Short-lived bytes at the unit's forward peak, on top of what it saves.
    pub forward_transient: f64,
    /// Short-lived bytes at the start of the unit's backward, before its parameter gradients
    /// exist (gradients of its activations, e.g. of the loss over the vocabulary).
    pub backward_transient: f64,
    /// Short-lived bytes while the unit's parameter gradients are produced (its own saved tensors
    /// are released by then).
    pub gradient_transient: f64,
    /// Of `saved`, the bytes still referenced while the unit's parameter gradients are
    /// produced: the LM head's weight gradient comes from its matmul's backward, while that
    /// matmul's input and the final norm's saved tensors (whose backward comes after) live.
    pub saved_through_gradients: f64,
    /// Peak bytes alive inside the unit in a no-grad forward (besides weights and KV cache).
    pub inference_live: f64,
    /// Bytes a no-grad forward keeps referenced from this unit on while the model's body runs,
    /// released when the body returns, before the head (the embedding outputs).
    pub body_held: f64,
    /// KV-cache bytes the unit keeps in a no-grad forward.
    pub kv_cache: f64,
    /// Tokens per sequence the unit's cache keeps at most (a sliding-window layer keeps the
    /// last `window − 1`); None: every token.
    pub kv_window: Option<f64>,
    /// Single tensors inside the byte totals above, for the allocation sequence.
    pub whole: WholeTensors,
    /// Parameters of the unit (their gradients appear when its backward runs).
    pub params: u64,
    /// Of `params`, those that get no gradient or optimizer state in training: frozen ones
    /// (Whisper's sinusoidal encoder positions), or all of a unit no gradient reaches (a vision
    /// tower's layers after the one LLaVA reads its features from).
    pub untrained_params: u64,
}

/// The single tensors inside a unit's byte totals whose sizes the planner knows. The
/// allocation sequence ([`crate::sequence`]) allocates them at those sizes and cuts only the
/// rest of a total into typical-size pieces: the caching allocator's segments follow real
/// tensor sizes, and the largest tensors (the loss's vocabulary-wide ones, the vocabulary
/// matrix, a block's weight matrices and score matrices) decide how many it needs.
/// Zero: no such tensor.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WholeTensors {
    /// Parts of `saved` made of tensors larger than a hidden state: the loss's
    /// log-probabilities; a block's score matrices and MLP intermediates.
    pub saved: [SavedGroup; 2],
    /// In `forward_transient`: the logits and their fp32 copy.
    pub forward_transient: [f64; 2],
    /// In `backward_transient`: the gradients of nll_loss and of log_softmax.
    pub backward_transient: [f64; 2],
    /// In `gradient_transient`: the logits' gradient.
    pub gradient_transient: f64,
    /// In `inference_live`: a no-grad MLP's intermediates, where they make the block's peak.
    pub live: SavedGroup,
    /// The gradient transient's whole tensor is the last of the backward transient's, kept
    /// alive rather than made anew (log_softmax's gradient is the logits' when no cast
    /// follows).
    pub gradient_continues: bool,
    /// Parameters of the unit's largest weight (the vocabulary matrix of an embedding table
    /// or an untied LM head): that weight, its gradient and each optimizer state are one
    /// tensor.
    pub params: u64,
    /// The unit is a dense block: its parameters are the matrices of
    /// `TransformerSpec::block_matrices`, each one tensor, and what its total holds besides
    /// (norms, biases, a decoder's cross-attention).
    pub block_matrices: bool,
}

/// Saved bytes of one kind, kept as tensors of one size.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SavedGroup {
    /// Bytes of all of them.
    pub bytes: f64,
    /// Bytes of one.
    pub tensor: f64,
}

impl Unit {
    /// Parameters that receive a gradient in training.
    pub fn trained_params(&self) -> u64 {
        self.params - self.untrained_params
    }

    /// The unit as it runs when nothing reads its output in training: what it would save
    /// lives only while it runs, and its backward never does.
    fn unused_in_training(self) -> Unit {
        Unit {
            forward_transient: self.forward_transient + self.saved,
            saved: 0.0,
            attention_core: 0.0,
            checkpoint: Some(0.0),
            backward_transient: 0.0,
            gradient_transient: 0.0,
            saved_through_gradients: 0.0,
            untrained_params: self.params,
            ..self
        }
    }
}

/// Gradient-sized tensors alive while a new gradient is added to an existing one (the new
/// gradient and the out-of-place sum), as measured for tied embeddings.
pub const ACCUMULATION_COPIES: f64 = 2.0;

/// Bytes per element for the tensors of a workload.
#[derive(Debug, Clone, Copy)]
struct ElementSizes {
    /// Activations computed by matmuls (the autocast dtype under AMP).
    act: f64,
    /// The residual stream and norm outputs (fp32 under autocast with fp32 weights).
    residual: f64,
    /// Autocast copies inputs per linear call instead of saving one shared tensor.
    autocast: bool,
}

impl ElementSizes {
    fn of(workload: &Workload) -> Self {
        let act = workload.compute_dtype().bytes() as f64;
        let residual = workload.module_dtype().bytes() as f64;
        ElementSizes {
            act,
            residual,
            autocast: workload.amp.is_some() && residual != act,
        }
    }

    /// Bytes saved for a norm output of width `width` read by `consumers` linear layers.
    fn linear_input(&self, width: f64, consumers: f64) -> f64 {
        if self.autocast {
            self.act * width * consumers
        } else {
            self.residual * width
        }
    }
}

/// Tensor-parallel split: terms inside attention/MLP divide by `tp`, the rest only with SP.
#[derive(Debug, Clone, Copy)]
struct Split {
    tp: f64,
    sequence: f64,
}

/// Sequence lengths of one attention: queries and keys.
#[derive(Debug, Clone, Copy)]
struct AttentionShape {
    queries: f64,
    keys: f64,
    causal: bool,
    /// Key tokens per sequence a sliding-window layer attends to and keeps in its cache while
    /// decoding; None: all.
    cached_keys: Option<f64>,
}

/// What one attention sublayer keeps besides its per-query-token terms, in bytes.
#[derive(Debug, Clone, Copy, Default)]
struct AttentionMemory {
    /// Saved bytes proportional to the key tokens (k, v and their expansions).
    key_saved: f64,
    /// Short-lived bytes in its forward (scores before the softmax, the mask).
    forward_transient: f64,
    /// Live bytes at its peak in a no-grad forward, besides the hidden states its block holds:
    /// projections, expanded keys and values, the scores' softmax or the kernel output, the mask.
    inference_live: f64,
    /// Bytes a no-grad forward keeps until its block returns: eager attention's probabilities,
    /// which every family's block holds (`hidden_states, _ = self.self_attn(...)`).
    inference_kept: f64,
    /// Bytes alive through all blocks of its stack in a no-grad forward: the causal mask eager
    /// attention adds (built once by the model), T5's relative position bias (computed by the
    /// first block, passed on to the others).
    stack_held: f64,
    /// KV-cache bytes it adds in a no-grad forward that keeps a cache.
    kv_cache: f64,
    /// Of `key_saved`, the keys and values a training forward's cache holds until the step
    /// ends, because the caller keeps the outputs through backward (`--loss none`).
    cache_held: f64,
    /// The k and v copies a training cache holds that the kernel does not save (see
    /// `Unit::forward_held`).
    forward_held: f64,
    /// Bytes alive at the start of its backward when the softmax ran in the activation dtype:
    /// the gradients of the probabilities and of the scores, one score matrix each.
    score_gradients: f64,
    /// The gradients of its queries, keys and values, which its backward makes together (a
    /// cross-attention's keys and values span the encoder's tokens).
    input_gradients: f64,
    /// Bytes of one score matrix in the activation dtype (the size of the tensors its core
    /// saves).
    score_matrix: f64,
}

/// Bytes per score element of eager attention's softmax, by the tensors that exist.
#[derive(Debug, Clone, Copy)]
struct ScoreBytes {
    /// The scores in the activation dtype (the softmax's input).
    input: f64,
    /// The softmax output: fp32 where the family upcasts (`softmax(..., dtype=torch.float32)`)
    /// or autocast runs softmax in fp32, else the activation dtype.
    probs: f64,
    /// The fp32 copy of a bf16 input that `softmax(x, dtype=float32)` converts first: PyTorch's
    /// fused `half_to_float` kernel takes fp16 on CUDA only (aten/src/ATen/native/SoftMax.cpp).
    conversion: f64,
    /// The cast of fp32 probabilities back to the activation dtype.
    cast: f64,
    /// `tanh` soft-capping of the scores: its output, saved for backward and alive beside the
    /// scores without gradients.
    softcap: f64,
    /// Dropout on the probabilities in training: a 1-byte mask and the output.
    dropout: f64,
    /// The masked scores an old release's clamp (`torch.max`) saves for backward.
    clamp: f64,
}

impl ScoreBytes {
    /// Saved for backward: the softmax output, and what the matmul with the values saves: the
    /// cast, or with dropout its mask and output (dropout runs on the cast, or under autocast
    /// on the fp32 probabilities, whose half-precision copy for the matmul is the same size).
    fn saved(&self) -> f64 {
        let into_values = if self.dropout > 0.0 {
            self.dropout
        } else {
            self.cast
        };
        self.probs + into_values + self.softcap + self.clamp
    }

    /// Peak in a no-grad forward: the input stays named while the softmax makes its fp32 copy
    /// and output, then while the output is cast (`x = softmax(x, ...).to(dtype)`).
    fn no_grad_peak(&self) -> f64 {
        self.input + self.softcap + self.probs + self.conversion.max(self.cast)
    }

    /// The probabilities the attention returns (the cast if any, else the softmax output).
    fn returned(&self) -> f64 {
        if self.cast > 0.0 {
            self.cast
        } else {
            self.probs
        }
    }
}

/// Per-token and per-score byte counts of one block, before multiplying by tokens.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    /// Saved bytes per token inside tensor-parallel regions.
    sharded: f64,
    /// Saved bytes per token outside them (norm inputs, residual, dropout masks).
    replicated: f64,
    /// Saved bytes of the attention core, absolute.
    core: f64,
}

/// One attention of a block as it runs: its shape, its kernel and its sizes on this GPU.
#[derive(Debug, Clone, Copy)]
struct AttentionCall {
    shape: AttentionShape,
    /// A cross-attention (its keys and values span the encoder's tokens).
    cross: bool,
    kernel: AttentionKernel,
    grouped: GroupedKeys,
    /// Query, key and value widths over all heads.
    q: f64,
    kv: f64,
    value: f64,
    /// Heads on this GPU.
    heads: f64,
    /// Score elements of the micro-batch on this GPU.
    scores: f64,
    query_tokens: f64,
    key_tokens: f64,
}

/// The masks and biases of one attention, in bytes (elements for the boolean sliding mask).
#[derive(Debug, Clone, Copy)]
struct AttentionMasks {
    /// T5's relative position bias, held through the stack.
    stack_bias: f64,
    /// The causal mask(s) transformers builds, held through the forward.
    causal: f64,
    /// CUDA's math path makes its own causal bias (transformers built no mask).
    kernel_causal: bool,
    /// SDPA's boolean sliding-window mask, held through the stack.
    sliding: f64,
    /// Its additive conversion on a sliding layer, saved for backward.
    converted: f64,
}

/// What one attention's kernel itself keeps, in bytes.
#[derive(Debug, Clone, Copy)]
struct AttentionCore {
    /// Saved for backward inside the attention core.
    saved: f64,
    /// Short-lived in its forward.
    transient: f64,
    /// Alive at the start of its backward (see `AttentionMemory::score_gradients`).
    score_gradients: f64,
    /// Alive at its no-grad peak.
    inference_live: f64,
    /// Kept by a no-grad forward until the block returns (returned probabilities).
    inference_kept: f64,
    /// Masks alive through the stack.
    stack_mask: f64,
}

/// Positions per LM-head chunk in litgpt's fine-tuning loops (`lm_head_chunk_size=128`).
const LITGPT_LM_HEAD_CHUNK: f64 = 128.0;

/// Output chunks of torchtune's `CEWithChunkedOutputLoss` (`num_output_chunks`), along the
/// sequence.
const TORCHTUNE_OUTPUT_CHUNKS: f64 = 8.0;

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
                let images = Workload {
                    image_size: tower_size,
                    ..workload.clone()
                };
                let tower = TransformerGraph::new(&vision.tower, &images, batch);
                // Training: the layers after the one whose hidden states LLaVA reads, and the
                // tower's own final norm, feed nothing that reaches the loss.
                let read = vision.feature_layers as usize;
                let frozen = workload.freeze_vision_tower;
                units.extend(tower.units().into_iter().enumerate().map(|(index, unit)| {
                    // Units: the patch embeddings (0), the blocks (1..=layers), the final norm.
                    if tower.training && (frozen || index > read) {
                        unit.unused_in_training()
                    } else {
                        unit
                    }
                }));
                units.push(tower.projector(vision.projector, vision.image_tokens, spec.hidden));
            }
            let text = TransformerGraph::new(spec, workload, batch);
            if let Some(dual) = &spec.dual {
                // CLIPModel / SiglipModel: the vision tower runs first, then the text tower;
                // a no-grad forward returns both towers' outputs with the scores.
                let vision = TransformerGraph::new(&dual.tower, workload, batch);
                let frozen = vision.training && workload.freeze_vision_tower;
                units.extend(vision.units_returning_output().into_iter().map(|unit| {
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

struct TransformerGraph<'a> {
    spec: &'a TransformerSpec,
    workload: &'a Workload,
    bytes: ElementSizes,
    split: Split,
    batch: f64,
    training: bool,
    /// The kernel of the model's self-attentions.
    own_kernel: AttentionKernel,
    /// The kernel of an encoder-decoder's cross-attentions.
    cross_kernel: AttentionKernel,
}

impl<'a> TransformerGraph<'a> {
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

    fn dropout_active(&self, p: f64) -> bool {
        self.training && p > 0.0
    }

    /// The staging buffer a linear's bias gradient takes on a GPU: `grad.sum(0)` over `rows`
    /// gradient rows of `cols` outputs ([`crate::gpu::column_sum_staging_bytes`]); nothing on
    /// the CPU, outside training, or where the base weights are frozen (LoRA).
    fn bias_gradient_staging(&self, rows: f64, cols: f64) -> f64 {
        match self.workload.cores {
            Some(cores) if self.training && self.workload.lora.is_none() => {
                crate::gpu::column_sum_staging_bytes(rows as u64, cols as u64, &cores) as f64
            }
            _ => 0.0,
        }
    }

    /// Sequence length of the (decoder or only) stack.
    fn sequence(&self) -> f64 {
        match self.spec.patches {
            Some(p) => Patches {
                image_size: self.workload.image_size,
                ..p
            }
            .tokens() as f64,
            None => self.workload.seq as f64,
        }
    }

    /// Sequence length of an encoder-decoder's encoder: Whisper's fixed frames, else the input.
    fn encoder_sequence(&self) -> f64 {
        match self.spec.audio {
            Some(a) => a.frames as f64,
            None => self.sequence(),
        }
    }

    /// The projector of a vision-language model: two linears with a GELU between them, from
    /// the tower's patch features to `image_tokens` tokens of width `width` per image.
    fn projector(&self, params: u64, image_tokens: u64, width: u64) -> Unit {
        let act = self.bytes.act;
        let tokens = self.batch * image_tokens as f64;
        let (v, t) = (self.spec.hidden as f64, width as f64);
        Unit {
            name: "projector",
            // The selected features, the first linear's output (GELU input) and the GELU output.
            saved: if self.training {
                tokens * act * (v + 2.0 * t)
            } else {
                0.0
            },
            forward_transient: tokens * act * t,
            backward_transient: 2.0 * tokens * act * t,
            gradient_transient: tokens * act * t,
            inference_live: tokens * act * (v + 2.0 * t),
            // The image features are scattered into a copy of the language model's input
            // embeddings; their concatenation over the images (a copy) is returned with the
            // output (`image_hidden_states`). Training drops the output before its backward.
            held: if self.training { 0.0 } else { tokens * act * t },
            // The tower's output (kept for `image_hidden_states`' source) stays referenced
            // while the language model runs: one tower hidden state and the projector's output.
            body_held: if self.training {
                0.0
            } else {
                tokens * act * t + self.batch * self.sequence() * self.bytes.residual * v
            },
            params,
            ..Unit::default()
        }
    }

    /// The stack's units, its last hidden state (and pooled output) held to the end of a
    /// no-grad forward: a dual encoder returns each tower's output in its own.
    fn units_returning_output(&self) -> Vec<Unit> {
        let mut units = self.units();
        if !self.training {
            if let Some(head) = units.last_mut() {
                let h = self.spec.hidden as f64;
                head.held +=
                    self.batch * (self.sequence() * self.bytes.residual + self.bytes.act) * h;
            }
        }
        units
    }

    /// A dual encoder's joint head: each tower's pooled output projected into the shared
    /// space and normalised, every text scored against every image (batch × batch), and in
    /// training the contrastive loss over those scores (`return_loss=True`).
    fn contrastive(&self, dual: &DualEncoder) -> Unit {
        let act = self.bytes.act;
        let b = self.batch;
        // The projections' outputs and their normalised copies, for both towers.
        let embeds = 4.0 * b * dual.embed_dim as f64 * act;
        let scores = b * b;
        let loss = self.training && self.workload.loss != Loss::None;
        let (saved, transient) = match (loss, dual.loss) {
            // The product of the scores with the exponentiated scale saves the matmul's output;
            // cross-entropy over the rows and over the transpose saves two log-softmax outputs.
            (true, ContrastiveLoss::Softmax) => (3.0 * act * scores, act * scores),
            // `logsigmoid(signs · (scores · scale + bias))`: the matmul's and the bias sum's
            // outputs, the fp32 ±1 matrix (built from an identity) and the product; on CUDA
            // `log_sigmoid_forward` keeps no buffer.
            (true, ContrastiveLoss::Sigmoid) => ((2.0 * act + 8.0) * scores, (act + 8.0) * scores),
            // No loss: the scores (and their scaled copy) are returned.
            (false, _) => (act * scores, act * scores),
        };
        Unit {
            name: "contrastive",
            saved: if self.training { embeds + saved } else { 0.0 },
            forward_transient: transient,
            // The scores' gradient and log-softmax's (or the sigmoid's) in fp32 at most.
            backward_transient: 2.0 * 4.0 * scores,
            gradient_transient: act * scores,
            inference_live: embeds + transient,
            // The returned scores (the per-image ones are a transposed view) and embeddings.
            held: if self.training {
                0.0
            } else {
                act * scores + embeds / 2.0
            },
            params: dual.joint_params,
            ..Unit::default()
        }
    }

    /// Sequence length on the decoder side of an encoder-decoder.
    fn decoder_sequence(&self) -> f64 {
        if self.spec.is_encoder_decoder() && self.workload.mode == Mode::Generate {
            self.workload.new_tokens as f64
        } else {
            self.sequence()
        }
    }

    fn units(&self) -> Vec<Unit> {
        let spec = self.spec;
        let mut units = vec![self.embeddings()];
        let seq = self.encoder_sequence();
        if spec.is_encoder_decoder() {
            let encoder = AttentionShape {
                queries: seq,
                keys: seq,
                causal: false,
                cached_keys: None,
            };
            // Whisper's encoder holds its convolutions' output (`inputs_embeds`) through its
            // layers in a no-grad forward.
            let stem_output = match spec.audio {
                Some(_) if !self.training => {
                    self.batch * seq * self.bytes.residual * spec.hidden as f64
                }
                _ => 0.0,
            };
            for index in 0..spec.encoder_layers {
                let mut block = self.block(encoder, None, LayerKind::default());
                block.inference_live += stem_output;
                if index == 0 {
                    block.saved -= self.frozen_prefix(encoder, LayerKind::default());
                }
                units.push(block);
            }
            if self.training && spec.final_norm {
                // The encoder's final norm saves its input (the last residual sum), and its
                // output is what every cross-attention's key and value projections read: saved
                // by them, or under autocast (each saves its own half-precision copy) held by
                // the model's output until the forward returns.
                if let Some(last) = units.last_mut() {
                    let (tokens, h) = (self.batch * seq, spec.hidden as f64);
                    last.saved += tokens * self.norm_saved();
                    if self.bytes.autocast {
                        last.forward_held += tokens * self.bytes.residual * h;
                    } else {
                        last.saved += tokens * self.bytes.residual * h;
                    }
                }
            }
            // The encoder's output is returned (`encoder_last_hidden_state`), and the
            // decoder's cross-attention reads it: held from the first decoder block to the end
            // of the forward.
            let encoder_output = if self.training {
                0.0
            } else {
                self.batch * seq * self.bytes.residual * spec.hidden as f64
            };
            let dec = self.decoder_sequence();
            let decoder = AttentionShape {
                queries: dec,
                keys: dec,
                causal: true,
                cached_keys: None,
            };
            let cross = AttentionShape {
                queries: dec,
                keys: seq,
                causal: false,
                cached_keys: None,
            };
            for index in 0..spec.layers {
                let mut block = self.block(decoder, Some(cross), LayerKind::default());
                if index == 0 {
                    block.held += encoder_output;
                    block.saved -= self.frozen_prefix(decoder, LayerKind::default());
                }
                units.push(block);
            }
        } else {
            for index in 0..spec.layers {
                let layer = spec.layer_kind(index);
                let window = spec
                    .sliding
                    .filter(|_| layer.sliding)
                    .map(|s| s.window.saturating_sub(1).max(1) as f64);
                let shape = AttentionShape {
                    queries: seq,
                    keys: seq,
                    causal: spec.decoder,
                    cached_keys: window,
                };
                let mut block = self.block(shape, None, layer);
                if index == 0 {
                    block.saved -= self.frozen_prefix(shape, layer);
                }
                units.push(block);
            }
        }
        if spec.head == Head::AttentionPool && self.training {
            units.extend(self.attention_pool());
        } else {
            units.push(self.four_bit_head(self.head()));
        }
        // A tied LM head's backward makes the word embedding's gradient: it exists from the
        // head's backward on, not from the embedding's (which then accumulates into it).
        let lm_head = matches!(spec.head, Head::CausalLm | Head::Seq2SeqLm | Head::MaskedLm);
        // The vocabulary matrices are single tensors: the word embedding's, and an untied LM
        // head's (a tied one is the embedding's, counted with the head from here on).
        units[0].whole.params = (spec.vocab * spec.word_width()).min(units[0].params);
        if spec.tied_embeddings && lm_head && units.len() > 1 {
            let shared = (spec.vocab * spec.hidden).min(units[0].params);
            units[0].params -= shared;
            units[0].whole.params = 0;
            if let Some(head) = units.last_mut() {
                head.params += shared;
                head.whole.params = shared;
            }
        } else if matches!(spec.head, Head::CausalLm | Head::Seq2SeqLm) {
            if let Some(head) = units.last_mut() {
                head.whole.params = (spec.vocab * spec.hidden).min(head.params);
            }
        }
        units
    }

    /// Saved bytes per token of a norm (its input and, for RMSNorm, the normalised fp32 values).
    fn norm_saved(&self) -> f64 {
        let h = self.spec.hidden as f64;
        let per_row = match self.spec.norm {
            Norm::LayerNorm => 8.0,
            _ => 4.0,
        };
        self.norm_element_bytes(self.bytes.residual) * h + per_row
    }

    /// Saved bytes per normalised element of an input of `input` bytes per element.
    fn norm_element_bytes(&self, input: f64) -> f64 {
        // Under LoRA the norms' weights are frozen: the product with the weight saves nothing,
        // so an RMSNorm keeps only the fp32 values its variance reads (LayerNorm saves its
        // input either way), and T5's `x * rsqrt(var)` its half-precision x beside them.
        let frozen = self.training && self.workload.lora.is_some();
        let litgpt = self.litgpt();
        let scaled_input = if self.spec.norm == Norm::RmsNormScaledInput && input < 4.0 {
            input
        } else {
            0.0
        };
        match self.spec.norm {
            Norm::RmsNorm | Norm::RmsNormOffset | Norm::RmsNormScaledInput if frozen => {
                4.0 + scaled_input
            }
            Norm::LayerNorm => input,
            // litgpt's RMSNorm multiplies the fp32 normalised values by the weight in fp32
            // (`x_normed * weight.float()`): both fp32 tensors are saved.
            Norm::RmsNorm | Norm::RmsNormOffset if litgpt => 8.0,
            // The fp32 copy the variance reads and the fp32 normalised values (scaled by
            // `1 + weight` before the cast back).
            Norm::RmsNormOffset => 8.0,
            // The fp32 copy and the cast of the normalised values that the weight scales;
            // `x * rsqrt(var)` (T5) saves a half-precision x beside the fp32 copy.
            Norm::RmsNorm | Norm::RmsNormScaledInput => 4.0 + input + scaled_input,
        }
    }

    fn embeddings(&self) -> Unit {
        let spec = self.spec;
        let tokens = self.batch * self.sequence();
        let h = spec.hidden as f64;
        // Token ids (int64), and labels in an evaluation forward, are held by the caller for the
        // whole step.
        let labels = if self.workload.mode == Mode::Infer && self.workload.labels {
            tokens * 8.0
        } else {
            0.0
        };
        let mut held = tokens * 8.0 + labels;
        let mut saved = 0.0;
        if let Some(p) = spec.patches {
            let pixels = self.batch * p.channels as f64 * (self.workload.image_size as f64).powi(2);
            held = pixels * self.bytes.residual;
            saved = if self.bytes.autocast {
                pixels * self.bytes.act
            } else {
                0.0
            };
        }
        // Whisper's encoder input: log-mel features over twice its frames, through two GELU
        // convolutions (the second with stride 2).
        let mut stem_live = 0.0;
        if let Some(a) = spec.audio {
            let frames = self.batch * a.frames as f64;
            let features = 2.0 * frames * a.mel_bins as f64;
            // Whisper's `generate` concatenates the batch's 30 s segments into a new tensor
            // (a copy of the features) that it keeps while it generates.
            let copies = if self.workload.mode == Mode::Generate {
                2.0
            } else {
                1.0
            };
            held += copies * features * self.bytes.residual;
            if self.training {
                // The autocast copy of the features, both convolutions' outputs (GELU inputs)
                // and the first GELU's output (the second convolution's input).
                saved += if self.bytes.autocast {
                    features * self.bytes.act
                } else {
                    0.0
                } + 5.0 * frames * h * self.bytes.act;
            }
            stem_live = 4.0 * frames * h * self.bytes.act;
        }
        if spec.embedding_norm {
            saved += tokens * self.bytes.residual * h;
        }
        if self.dropout_active(spec.embedding_dropout) {
            saved += tokens * h;
        }
        // A tied word embedding already holds the LM head's gradient: the embedding backward adds a
        // new V×h gradient and accumulating it allocates the sum.
        let tied_accumulation = if spec.tied_embeddings && spec.head != Head::None {
            ACCUMULATION_COPIES * (spec.vocab * spec.hidden) as f64 / self.split.tp
                * self.workload.module_dtype().bytes() as f64
        } else {
            0.0
        };
        // The model's forward holds its embedding outputs (`inputs_embeds`, and a position
        // embedding's output where it is a separate tensor) until its body returns, and RoPE's
        // cos and sin tables. Position ids default to one row (batch 1); generate passes them
        // per sequence.
        let position_rows = match self.workload.mode {
            Mode::Generate => tokens,
            Mode::Train | Mode::Infer => self.sequence(),
        };
        let positions = if spec.held.positions {
            position_rows * self.bytes.residual * h
        } else {
            0.0
        };
        // Under LoRA the embeddings (and an audio or patch stem) are frozen and read nothing
        // that needs a gradient: autograd records none of their operations.
        if self.training && self.workload.lora.is_some() {
            saved = 0.0;
        }
        let rotary = 2.0 * position_rows * spec.rotary_fraction * spec.head_dim as f64;
        let body_held = tokens * spec.held.embeddings as f64 * self.bytes.residual * h
            + positions
            + rotary * self.bytes.act;
        Unit {
            name: "embeddings",
            saved: saved / self.split.sequence,
            held,
            body_held,
            forward_transient: (2.0 * tokens * self.bytes.residual * h).max(stem_live),
            backward_transient: tokens * self.bytes.residual * h,
            gradient_transient: tied_accumulation + tokens * self.bytes.residual * h,
            inference_live: (2.0 * tokens * self.bytes.residual * h).max(stem_live),
            params: spec.params_of_embeddings(),
            // Whisper's sinusoidal encoder positions are a frozen parameter.
            untrained_params: spec.audio.map_or(0, |a| a.frames * spec.hidden),
            ..Unit::default()
        }
    }

    /// Hugging Face decoders keep `use_cache` on in training unless checkpointing (the model
    /// turns it off when any of its layers checkpoints): every layer's k and v then pass through
    /// a `DynamicCache` concatenation (new tensors). litgpt's and torchtune's own models (their
    /// chunked losses) keep no cache in training.
    fn cache_copies(&self) -> bool {
        self.training
            && self.spec.use_cache
            && self.workload.use_cache
            && !matches!(self.workload.loss, Loss::Chunked | Loss::ChunkedFp32)
            && self.spec.is_causal_lm()
            && matches!(
                self.workload.checkpointing,
                Checkpointing::None | Checkpointing::Selective
            )
    }

    /// Does this attention of a training step pass its k and v through a cache beside what
    /// its kernel saves? An encoder-decoder's decoder attentions, self and cross, when
    /// `use_cache` is on (the `EncoderDecoderCache` of T5 and Whisper fills in training too).
    /// (A decoder-only LM's cache copies are counted with its projections: `cache_copies`.)
    fn training_cache(&self, shape: AttentionShape, cross: bool) -> bool {
        self.training
            && self.spec.is_encoder_decoder()
            && (shape.causal || cross)
            && self.spec.use_cache
            && self.workload.use_cache
            && matches!(
                self.workload.checkpointing,
                Checkpointing::None | Checkpointing::Selective
            )
    }

    /// Are the queries contiguous per head when they reach the kernel (the family's own code,
    /// or litgpt's attention, which builds its rotated queries with `torch.cat`)? The kernel's
    /// output then comes in head layout and merging the heads is a copy.
    fn head_layout_queries(&self) -> bool {
        self.spec.head_layout_queries || self.litgpt()
    }

    /// Does fused `kernel` return its output in head layout, so that merging the heads copies
    /// it? Where the queries are contiguous per head and the kernel keeps their layout.
    fn fused_output_in_head_layout(&self, kernel: AttentionKernel) -> bool {
        self.head_layout_queries() && kernel.output_in_query_layout()
    }

    /// Does the step run litgpt's own model (`--framework litgpt`) rather than the family's?
    fn litgpt(&self) -> bool {
        self.workload.framework == Framework::Litgpt
    }

    /// Does the training step keep its forward's KV cache until backward ends? With
    /// `--loss none` the caller holds the model's outputs through backward, and the cache copies
    /// every layer made are among them.
    fn outputs_hold_cache(&self) -> bool {
        self.cache_copies() && self.workload.loss == Loss::None
    }

    /// Does this no-grad forward keep a KV cache? Generation always (decoder-only LMs); a plain
    /// forward of a decoder when `use_cache` is on in the config and the call (`DynamicCache`
    /// concatenates copies of every layer's keys and values, and the output returns them).
    fn keeps_cache(&self) -> bool {
        match self.workload.mode {
            Mode::Generate => self.spec.is_causal_lm(),
            Mode::Infer => self.spec.decoder && self.spec.use_cache && self.workload.use_cache,
            Mode::Train => false,
        }
    }

    /// Bytes per score element of a materialised attention's softmax under `kernel`.
    fn score_bytes(&self, kernel: AttentionKernel) -> ScoreBytes {
        let input = self.bytes.act;
        let dropout = if self.dropout_active(self.spec.attention_dropout) {
            1.0 + input
        } else {
            0.0
        };
        let old = self.old_release();
        let clamp = if old.is_some_and(|o| o.clamps_scores()) {
            input
        } else {
            0.0
        };
        if old.is_some_and(|o| o.fp32_rotary()) && input < 4.0 {
            // fp32 queries and keys: fp32 scores and softmax, cast to the values' dtype.
            return ScoreBytes {
                input: 4.0,
                probs: 4.0,
                conversion: 0.0,
                cast: input,
                softcap: 0.0,
                dropout,
                clamp,
            };
        }
        // SDPA's math fallback computes in fp32: the scores and their softmax. Its dropout is
        // `at::dropout`: CUDA's fused kernel keeps a 1-byte mask, CPU's `_dropout` a noise
        // tensor of the probabilities' dtype (`empty_like(input).bernoulli_`).
        let math_dropout_mask = match kernel {
            AttentionKernel::SdpaMathCpu => Some(4.0),
            AttentionKernel::SdpaMathCuda => Some(1.0),
            _ => None,
        };
        if let Some(mask) = math_dropout_mask {
            return ScoreBytes {
                input: 4.0,
                probs: 4.0,
                conversion: 0.0,
                cast: 0.0,
                softcap: 0.0,
                dropout: if dropout > 0.0 { mask + 4.0 } else { 0.0 },
                clamp,
            };
        }
        // OPT before 4.49 upcast the softmax of fp16 scores only (bf16 ran in bf16).
        let upcasts = self.spec.softmax_fp32
            && !(old.is_some_and(|o| o.upcasts_fp16_softmax_only())
                && self.workload.compute_dtype() != Dtype::Fp16);
        let probs = if upcasts || self.workload.amp.is_some() {
            4.0
        } else {
            input
        };
        let upcast = probs != input;
        ScoreBytes {
            input,
            probs,
            conversion: if upcast && self.workload.compute_dtype() == Dtype::Bf16 {
                probs
            } else {
                0.0
            },
            cast: if upcast { input } else { 0.0 },
            softcap: if self.spec.attention_softcap {
                input
            } else {
                0.0
            },
            dropout,
            clamp,
        }
    }

    /// The kernel of this model's self-attention, or of its cross-attention where `cross`.
    fn kernel(&self, cross: bool) -> AttentionKernel {
        if cross {
            self.cross_kernel
        } else {
            self.own_kernel
        }
    }

    /// One attention of `shape` (a cross-attention where `cross`) as it runs on this GPU.
    fn attention_call(&self, shape: AttentionShape, cross: bool) -> AttentionCall {
        let spec = self.spec;
        let kernel = self.kernel(cross);
        let heads = spec.heads as f64 / self.split.tp;
        AttentionCall {
            shape,
            cross,
            kernel,
            grouped: GroupedKeys::of(spec, kernel, self.litgpt()),
            q: spec.query_width() as f64,
            kv: spec.kv_width() as f64,
            value: spec.value_width() as f64,
            heads,
            scores: self.batch * heads * shape.queries * shape.keys,
            query_tokens: self.batch * shape.queries,
            key_tokens: self.batch * shape.keys,
        }
    }

    /// Does the kernel save the projections' q, k and v as they are? SDPA's math path copies
    /// half-precision inputs to fp32 first and saves the copies.
    fn kernel_saves_projections(&self, kernel: AttentionKernel) -> bool {
        !(kernel.is_math_path() && self.bytes.act < 4.0)
    }

    /// Bytes per element of the keys a cache copies: fp32 under an old release's fp32 rotary.
    fn cached_key_bytes(&self) -> f64 {
        if self.old_release().is_some_and(|o| o.fp32_rotary()) {
            4.0
        } else {
            self.bytes.act
        }
    }

    /// The attention sublayer: adds its per-query-token terms to `tally` and returns the rest.
    fn attention(&self, shape: AttentionShape, cross: bool, tally: &mut Tally) -> AttentionMemory {
        let call = self.attention_call(shape, cross);
        let act = self.bytes.act;
        let key_side = self.saved_attention_inputs(&call, tally);
        let key_side = self.saved_key_views(&call, key_side);
        let masks = self.attention_masks(&call);
        let core = if call.kernel.materialises_scores() {
            self.materialised_core(&call, &masks, tally)
        } else {
            self.fused_core(&call, &masks, tally)
        };
        if self.dropout_active(self.spec.hidden_dropout) {
            tally.replicated += self.spec.hidden as f64;
        }
        tally.core += core.saved;
        let (kv_cache, cache_held) = self.attention_cache(&call);
        AttentionMemory {
            key_saved: key_side / self.split.tp * call.key_tokens,
            forward_transient: core.transient,
            inference_live: core.inference_live,
            inference_kept: core.inference_kept,
            stack_held: masks.stack_bias + core.stack_mask,
            kv_cache,
            cache_held,
            forward_held: self.math_path_cache_copies(&call),
            score_gradients: core.score_gradients,
            input_gradients: act / self.split.tp
                * (call.query_tokens * call.q + call.key_tokens * (call.kv + call.value)),
            score_matrix: act * call.scores,
        }
    }

    /// What one attention saves of its inputs for backward (the norm output its projections
    /// read, q, k and v or the kernel's copies of them, per-head norms, latent attention's
    /// low-rank path): adds the bytes per query token to `tally` and returns the bytes per key
    /// token (a cross-attention's keys are the encoder's).
    fn saved_attention_inputs(&self, call: &AttentionCall, tally: &mut Tally) -> f64 {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, spec.hidden as f64);
        let (q, kv, value) = (call.q, call.kv, call.value);
        let mut key_side = 0.0;
        let projections_from_norm = if call.cross || spec.fused_qkv {
            1.0
        } else {
            3.0
        };
        if call.cross && self.bytes.autocast {
            // Under autocast a cross-attention's k and v each save their own half-precision
            // copy of the encoder's output, in every decoder block.
            key_side += 2.0 * act * h;
        }
        tally.sharded += if spec.post_norm && !call.cross {
            0.0
        } else {
            self.bytes.linear_input(h, projections_from_norm)
        };
        // q, k, v (rotated when RoPE is used) are saved by the attention. RoPE's products with the
        // gradient-free cos/sin tables save only the tables, so the raw projections are freed.
        // SDPA's math path scales copies of the queries and keys (and copies half-precision
        // inputs to fp32 first), which its matmuls save instead (counted below); fp32 values
        // are saved as they are.
        let math_path = call.kernel.is_math_path();
        if !math_path {
            tally.sharded += act * q;
            key_side += act * (kv + value);
        } else if self.kernel_saves_projections(call.kernel) {
            key_side += act * value;
        }
        // An old release's fp32 rotary: eager attention saves the fp32 queries and keys its
        // scores are made from; the SDPA path saves half-precision casts, while the fp32 keys
        // stay referenced as the layer's cache (`present`) in training too.
        if self.old_release().is_some_and(|o| o.fp32_rotary()) {
            if call.kernel.materialises_scores() {
                tally.sharded += (4.0 - act) * q;
                key_side += (4.0 - act) * kv;
            } else if self.cache_copies() {
                key_side += 4.0 * kv;
            }
        }
        if spec.qk_norm {
            // The family's RMSNorm over each head's q and k.
            tally.sharded += self.norm_element_bytes(act) * (q + kv);
        }
        tally.sharded += self.saved_latent_path(call);
        if math_path {
            // The math path saves its fp32 copies of the scaled queries and keys, and of the
            // values when they are in half precision.
            tally.sharded += 4.0 * q;
            key_side += 4.0 * kv + if act < 4.0 { 4.0 * value } else { 0.0 };
        }
        key_side
    }

    /// Saved bytes per query token of latent attention's low-rank path: q_a output and its
    /// RMSNorm, the kv latent (with the rotary key) and its RMSNorm, and the decompressed
    /// per-head keys and values of kv_b, kept whole where a fused kernel saves the values as
    /// views of it (eager attention's matmul and SDPA's math path save copies).
    fn saved_latent_path(&self, call: &AttentionCall) -> f64 {
        let Some(l) = self.spec.latent else {
            return 0.0;
        };
        let act = self.bytes.act;
        let (qr, kvr) = (l.query_rank as f64, l.kv_rank as f64);
        let decompressed =
            if self.kernel_saves_projections(call.kernel) && !call.kernel.materialises_scores() {
                act * (self.spec.heads * (l.nope_dim + l.value_dim)) as f64
            } else {
                0.0
            };
        act * qr
            + (4.0 + act) * qr
            + act * (kvr + l.rope_dim as f64)
            + (4.0 + act) * kvr
            + decompressed
    }

    /// Adds to `key_side` (saved bytes per key token) what the saved keys and values keep
    /// alive besides themselves: the fused projection they are views of, the cache's copies,
    /// or the copies grouped keys are repeated into.
    fn saved_key_views(&self, call: &AttentionCall, mut key_side: f64) -> f64 {
        let spec = self.spec;
        let act = self.bytes.act;
        let (q, kv, value) = (call.q, call.kv, call.value);
        let cache_holds_views = self
            .old_release()
            .is_some_and(|o| o.cache_holds_own_tensors());
        // Does the kernel receive the values as a view of a fused projection (the family's, or
        // litgpt's fused qkv for every model)? Not when the cache hands it copies (today's
        // releases, cache on), nor when grouped values are repeated first (eager attention,
        // SDPA's math path, litgpt's `repeat_interleave`).
        let values_view_fused = (spec.fused_qkv || self.litgpt())
            && !call.cross
            && (cache_holds_views || !self.cache_copies())
            && call.grouped == GroupedKeys::AsProjected;
        if values_view_fused {
            // The saved values keep the whole fused projection alive; beside rotated queries
            // and keys (new tensors), its q and k parts are extra. (Without rotary, q, k and
            // v are all views of it, as counted.)
            if spec.rotary_fraction > 0.0 {
                key_side += act * (q + kv);
            }
        } else if self.cache_copies()
            && !call.kernel.materialises_scores()
            && spec.fused_qkv
            && spec.rotary_fraction == 0.0
            && !call.cross
        {
            // The KV cache concatenates copies of k and v, which the kernel saves, while the
            // query view keeps the whole fused projection alive.
            key_side += act * (kv + value);
        }
        key_side += match call.grouped {
            GroupedKeys::AsProjected => 0.0,
            // repeat_kv expands k and v to all heads before the matmuls.
            GroupedKeys::RepeatedForScores => self.repeated_keys(call),
            // litgpt repeats grouped keys and values to every head before SDPA, which saves
            // the repeated copies instead.
            GroupedKeys::RepeatedByLitgpt => act * 2.0 * q - act * (kv + value),
        };
        key_side
    }

    /// Bytes per key token of grouped keys and values repeated to every head.
    fn repeated_keys(&self, call: &AttentionCall) -> f64 {
        self.bytes.act * 2.0 * call.q
    }

    /// The masks and biases one attention has alive.
    fn attention_masks(&self, call: &AttentionCall) -> AttentionMasks {
        let spec = self.spec;
        let (act, shape) = (self.bytes.act, call.shape);
        // T5's relative position bias (batch 1) lives through its stack: the self-attention's in
        // the weight dtype, the decoder's cross-attention zeros in the activation dtype.
        let stack_bias = if spec.relative_attention_buckets > 0 {
            let bias = if call.cross { act } else { self.bytes.residual };
            bias * call.heads * shape.queries * shape.keys
        } else {
            0.0
        };
        // A causal mask (b × q × k in the activation dtype) lives through the whole forward; a
        // model with sliding-window layers builds a second one for them. Where CUDA's math
        // path takes grouped keys, transformers built none (`is_causal`): the kernel makes
        // its own bias.
        let masks = if spec.sliding.is_some() { 2.0 } else { 1.0 };
        let kernel_causal =
            call.kernel == AttentionKernel::SdpaMathCuda && spec.relative_attention_buckets == 0;
        let causal = if shape.causal && !kernel_causal {
            masks * act * self.batch * shape.queries * shape.keys
        } else {
            0.0
        };
        // SDPA takes a boolean mask for sliding layers once the keys exceed the window (built
        // once, held through the stack), which it converts to an additive mask in the
        // activation dtype on each sliding layer (saved for backward).
        let (sliding, converted) = match spec.sliding {
            Some(s) if shape.causal && shape.keys > s.window as f64 => {
                let elements = self.batch * shape.queries * shape.keys;
                let converted = if shape.cached_keys.is_some() {
                    act * elements
                } else {
                    0.0
                };
                (elements, converted)
            }
            _ => (0.0, 0.0),
        };
        AttentionMasks {
            stack_bias,
            causal,
            kernel_causal,
            sliding,
            converted,
        }
    }

    /// Does this attention of a no-grad forward keep a KV cache? An encoder's self-attention
    /// (bidirectional, not cross) caches nothing.
    fn attention_caches(&self, call: &AttentionCall) -> bool {
        self.keeps_cache() && (call.shape.causal || call.cross)
    }

    /// No-grad projections alive at the attention (this GPU's heads): a fused projection stays
    /// whole behind its q/k/v views (RoPE adds a rotated q, and k unless the cache took a
    /// copy); separate projections leave q, and k and v unless the cache holds their copies.
    fn no_grad_projections(&self, call: &AttentionCall) -> f64 {
        let spec = self.spec;
        let act = self.bytes.act;
        let cached = self.attention_caches(call);
        let (q_local, kv_local) = (call.q / self.split.tp, call.kv / self.split.tp);
        if let Some(l) = spec.latent {
            // Latent attention: q_b's output behind the no-rope queries and the concatenated
            // queries; kv_b's output behind the values and the assembled per-head keys, and the
            // shared rotary key expanded to every head (the cache holds the latent instead).
            let per_head = |width: u64| (spec.heads * width) as f64 / self.split.tp;
            call.query_tokens
                * act
                * (2.0 * q_local
                    + per_head(l.nope_dim + l.value_dim)
                    + kv_local
                    + per_head(l.rope_dim))
        } else if spec.fused_qkv && !call.cross {
            let rotated = if spec.rotary_fraction > 0.0 {
                q_local + if cached { 0.0 } else { kv_local }
            } else {
                0.0
            };
            call.query_tokens * act * (q_local + 2.0 * kv_local + rotated)
        } else {
            call.query_tokens * act * q_local
                + if cached {
                    0.0
                } else {
                    call.key_tokens * act * (call.kv + call.value) / self.split.tp
                }
        }
    }

    /// The core of an attention whose kernel materialises the scores (eager attention, SDPA's
    /// math path): the softmax's saved tensors, the scores beside it, and its no-grad peak.
    fn materialised_core(
        &self,
        call: &AttentionCall,
        masks: &AttentionMasks,
        tally: &mut Tally,
    ) -> AttentionCore {
        let act = self.bytes.act;
        let (scores, shape) = (call.scores, call.shape);
        let score = self.score_bytes(call.kernel);
        let score_gradients = match self.workload.target {
            // CUDA's softmax backward first makes `grad * output` (SoftMax.cu): the
            // probabilities' gradient, that product and the scores' gradient, each in
            // the probabilities' dtype.
            Target::Gpu => 3.0 * scores * score.probs,
            Target::Cpu if score.probs == score.input => 2.0 * scores * score.input,
            Target::Cpu => 0.0,
        };
        // The head-merging copy is saved by the output projection.
        tally.sharded += act * call.q;
        // The math path keeps fp32 copies of half-precision q, k and v for the whole call,
        // and scales a copy of the queries.
        let (q_local, kv_local) = (call.q / self.split.tp, call.kv / self.split.tp);
        let copies = if act < 4.0 {
            4.0 * (q_local * call.query_tokens
                + (kv_local + call.value / self.split.tp) * call.key_tokens)
        } else {
            0.0
        };
        let scaled_queries = 4.0 * q_local * call.query_tokens;
        let (scaled, returned) = match call.kernel {
            // CUDA's (SDPA: no probabilities returned; grouped keys and values repeated to
            // every head, counted as `expanded`) also turns `is_causal` (no mask given)
            // into an fp32 bias, and `_safe_softmax` marks the masked scores in a 1-byte
            // tensor beside the biased scores and the probabilities (the H200's op logs).
            AttentionKernel::SdpaMathCuda => {
                let causal_bias = if shape.causal && masks.kernel_causal {
                    4.0 * shape.queries * shape.keys
                } else {
                    0.0
                };
                (copies + scaled_queries + causal_bias + scores, 0.0)
            }
            AttentionKernel::SdpaMathCpu => (copies + scaled_queries, scores * score.returned()),
            _ => (0.0, scores * score.returned()),
        };
        let expanded = match call.grouped {
            GroupedKeys::RepeatedForScores => self.repeated_keys(call),
            GroupedKeys::AsProjected | GroupedKeys::RepeatedByLitgpt => 0.0,
        };
        AttentionCore {
            saved: scores * score.saved(),
            // The raw scores exist next to their scaled/masked copy before the softmax. (A bf16
            // input's fp32 copy exists before the block's later saved tensors do, which the
            // forward replay counts already.)
            transient: scores * score.input + masks.causal,
            score_gradients,
            inference_live: self.no_grad_projections(call)
                + expanded / self.split.tp * call.key_tokens
                + scores * score.no_grad_peak()
                + scaled,
            inference_kept: returned,
            stack_mask: masks.causal,
        }
    }

    /// The core of an attention whose kernel is fused (SDPA's flash or memory-efficient
    /// kernel, FlashAttention-2): its output and fp32 log-sum-exp.
    fn fused_core(
        &self,
        call: &AttentionCall,
        masks: &AttentionMasks,
        tally: &mut Tally,
    ) -> AttentionCore {
        let act = self.bytes.act;
        let shape = call.shape;
        // Kernel output + fp32 log-sum-exp; the output is in the layout the output projection
        // reads unless the queries were made contiguous per head (then the merge copies).
        let merge_copy = if self.fused_output_in_head_layout(call.kernel) {
            act * call.q
        } else {
            0.0
        };
        tally.sharded += act * call.q + merge_copy + 4.0 * self.spec.heads as f64;
        // Without gradients T5's bias goes to the kernel as an additive mask: a causal
        // decoder's is combined with the mask (`torch.where`) and made contiguous.
        let bias_mask = if masks.stack_bias > 0.0 && shape.causal {
            2.0 * act * call.heads * shape.queries * shape.keys
        } else {
            0.0
        };
        let q_local = call.q / self.split.tp;
        AttentionCore {
            saved: masks.converted,
            transient: 0.0,
            score_gradients: 0.0,
            inference_live: self.no_grad_projections(call)
                + call.query_tokens
                    * (act * q_local + merge_copy / self.split.tp + 4.0 * call.heads)
                + bias_mask
                + masks.converted,
            inference_kept: 0.0,
            stack_mask: masks.sliding,
        }
    }

    /// The math path's own copies are what it saves: the cache kept in training holds its
    /// concatenated k (and half-precision v) beside them until the forward returns.
    fn math_path_cache_copies(&self, call: &AttentionCall) -> f64 {
        if call.kernel.is_math_path() && self.training_cache(call.shape, call.cross) {
            let value = if self.kernel_saves_projections(call.kernel) {
                0.0
            } else {
                call.value
            };
            call.key_tokens * self.bytes.act * (call.kv + value) / self.split.tp
        } else {
            0.0
        }
    }

    /// The attention's KV cache in a no-grad forward, and in training the part of its saved
    /// keys and values the caller's outputs hold until the step ends: `(kv_cache, held)`.
    /// The cache holds copies of k and v per key token (the encoder's for cross-attention);
    /// latent attention caches its compressed latent and rotary key, shared by all heads. A
    /// sliding-window layer keeps a view of its last window, so the prefill's whole copy
    /// stays alive; decoding then keeps only the window (`Unit::kv_window`).
    fn attention_cache(&self, call: &AttentionCall) -> (f64, f64) {
        let spec = self.spec;
        let act = self.bytes.act;
        let key_bytes = self.cached_key_bytes();
        let copies = (key_bytes * call.kv + act * call.value) / self.split.tp;
        let cache_bytes = match (spec.latent, self.old_release()) {
            (Some(_), _) => act * spec.cache_width() as f64,
            // A prompt's cache of the layer's own tensors (an old release's), whose views keep
            // a fused projection alive; decoding concatenates copies.
            (None, Some(old)) if call.shape.queries > 1.0 && !call.cross => {
                (old.prompt_cache_bytes(act, key_bytes) / self.split.tp).max(copies)
            }
            (None, _) => copies,
        };
        let kv_cache = if self.attention_caches(call) {
            cache_bytes * call.key_tokens
        } else {
            0.0
        };
        // The copies the kernel saves are the cache's own tensors. (An old release's cache of
        // views keeps its fused projection instead, and latent attention's cache is not what
        // the kernel saves: neither is counted here.)
        let cache_holds_views = self
            .old_release()
            .is_some_and(|o| o.cache_holds_own_tensors());
        let held = if self.outputs_hold_cache()
            && !call.cross
            && spec.latent.is_none()
            && !(spec.fused_qkv && cache_holds_views)
        {
            copies * call.key_tokens
        } else {
            0.0
        };
        (kv_cache, held)
    }

    /// Saved bytes per token of the MLP of a block of kind `layer` (the experts each token is
    /// routed to, and the shared ones) and its activation.
    fn mlp(&self, layer: LayerKind) -> f64 {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, spec.hidden as f64);
        let consumers = if spec.gated_mlp { 2.0 } else { 1.0 };
        // Each expert gathers its tokens (`hidden_states[token_idx]`, saved by its first linear)
        // and scales its output by the routing weight (the product saves that output); the
        // router saves its fp32 softmax (and its input's fp32 copy, where it upcasts that).
        let routing = if layer.moe {
            let upcast_input = if spec.moe.fp32_router && act < 4.0 {
                4.0 * h
            } else {
                0.0
            };
            4.0 * spec.experts as f64 + 2.0 * spec.experts_per_token as f64 * act * h + upcast_input
        } else {
            0.0
        };
        self.bytes.linear_input(h, consumers) + self.mlp_intermediates(layer) + routing
    }

    /// Saved bytes per token of an MLP's intermediate-width tensors (the activation's input
    /// and output, the gated product, dropout's mask and output).
    fn mlp_intermediates(&self, layer: LayerKind) -> f64 {
        let spec = self.spec;
        let act = self.bytes.act;
        let f = spec.routed_intermediate(layer) as f64;
        let mut per_expert = f * match spec.activation {
            Activation::Gelu | Activation::GeluTanh | Activation::Silu => 2.0 * act,
            Activation::Relu => act,
            Activation::QuickGelu => 3.0 * act,
            // 0.5·x·(1 + tanh(…)) in Python ops. Plain: x, tanh(…), 0.5·x, 1 + tanh(…) and the
            // product. Autocast runs pow in fp32, which promotes the tanh branch to fp32: the fp32
            // copy of x, tanh(…), 1 + tanh(…), plus 0.5·x and the product's cast for the next linear.
            Activation::GeluTanhPython if self.bytes.autocast => 3.0 * 4.0 + 2.0 * act,
            Activation::GeluTanhPython => 5.0 * act,
        };
        if spec.gated_mlp {
            per_expert += act * 2.0 * f; // up projection and the gated product
        }
        if self.dropout_active(spec.activation_dropout) {
            per_expert += f + if spec.activation == Activation::Relu {
                act * f
            } else {
                0.0
            };
        }
        per_expert
    }

    /// Bytes an MLP of kind `layer` has alive at its no-grad peak for `tokens` tokens, besides
    /// the hidden states its block holds. A dense MLP: its intermediates. A mixture of experts
    /// as transformers 5.x runs it (`grouped_mm` over the routed token copies, sorted by
    /// expert): the router's logits and fp32 probabilities, the top-k choices and their sort,
    /// then either the gathered copies with the gate/up output, its activation and product, or
    /// at the end the gathered copies, the down projection's output, its weighted copy and that
    /// reordered back; the shared experts' intermediates come after, over every token.
    fn mlp_no_grad_live(&self, tokens: f64, layer: LayerKind) -> f64 {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, spec.hidden as f64);
        if !layer.moe {
            let f = spec.routed_intermediate(layer) as f64 / self.split.tp;
            return tokens * act * f * self.mlp_live_intermediates();
        }
        let (experts, k) = (spec.experts as f64, spec.experts_per_token as f64);
        let f = spec.intermediate as f64 / self.split.tp;
        let routed = tokens * k;
        let router = tokens * experts * (act + 4.0) + routed * (4.0 + 3.0 * 8.0);
        let experts_live = routed * act * (h + 4.0 * f).max(4.0 * h);
        let shared = tokens * act * spec.moe.shared_intermediate as f64 / self.split.tp
            * self.mlp_live_intermediates();
        router + experts_live.max(tokens * act * h + shared)
    }

    /// Intermediates of width f alive at once in a no-grad MLP forward.
    fn mlp_live_intermediates(&self) -> f64 {
        match (self.spec.gated_mlp, self.spec.activation) {
            (true, _) if self.spec.fused_gate_up => 4.0, // gate|up (2f), activation, product
            (true, _) => 3.0,                            // activation(gate), up, product
            (false, Activation::GeluTanhPython) => 4.0,  // x, 0.5·x, two chained temporaries
            (false, Activation::QuickGelu) => 3.0,       // x, sigmoid(1.702·x), the product
            (false, _) => 2.0,                           // projection and activation
        }
    }

    /// Intermediate-sized gradients the MLP's activation backward adds to what the block
    /// saved. One for a single autograd node (GELU, SiLU: the new gradient, while the output's
    /// gradient replaces the freed output). CLIP's `x * sigmoid(1.702 x)` as Python ops: the
    /// product's backward makes both inputs' gradients while the output's gradient is alive,
    /// two more than the freed product.
    fn mlp_backward_intermediates(&self) -> f64 {
        match (self.spec.gated_mlp, self.spec.activation) {
            (false, Activation::QuickGelu) => 2.0,
            // ReLU saves its output, which is also the next linear's saved input: that
            // linear's backward frees nothing before ReLU's gradient is made beside its own.
            (false, Activation::Relu) => 2.0,
            _ => 1.0,
        }
    }

    fn block(
        &self,
        shape: AttentionShape,
        cross: Option<AttentionShape>,
        layer: LayerKind,
    ) -> Unit {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, spec.hidden as f64);
        let tokens = self.batch * shape.queries;
        let mut tally = Tally::default();
        let norms = spec.block_norms() as f64 + if cross.is_some() { 1.0 } else { 0.0 };
        if spec.post_norm {
            // The block input is saved by q/k/v; each add+norm saves the sum.
            tally.sharded += self
                .bytes
                .linear_input(h, if spec.fused_qkv { 1.0 } else { 3.0 });
            tally.replicated += 2.0 * (self.bytes.residual * h + 8.0);
        } else if spec.parallel_residual && !spec.shared_block_norm {
            // Both norms read the same residual input: it is saved once.
            tally.replicated += 2.0 * self.norm_saved() - self.bytes.residual * h;
        } else {
            tally.replicated += norms * self.norm_saved();
        }
        let own = self.attention(shape, false, &mut tally);
        let cross_shape = cross;
        let has_cross = cross.is_some();
        // The tokens a cross-attention's keys and values span (the encoder's).
        let encoder_tokens = cross.map_or(0.0, |c| self.batch * c.keys);
        let cross = cross
            .map(|c| self.attention(c, true, &mut tally))
            .unwrap_or_default();
        let key_bytes = own.key_saved + cross.key_saved - own.cache_held;
        let transient = own.forward_transient.max(cross.forward_transient);
        tally.sharded += self.mlp(layer);
        if self.dropout_active(spec.hidden_dropout) {
            tally.replicated += h;
        }
        let autocast_weights = if self.bytes.autocast {
            act * spec.block_linear_params(layer, has_cross) as f64 / self.split.tp
        } else {
            0.0
        };
        let saved = tokens
            * (tally.sharded / self.split.tp + tally.replicated / self.split.sequence)
            + key_bytes
            + tally.core
            + autocast_weights
            + {
                let change = self.lora_inputs(layer, has_cross);
                tokens * (change.attention + change.mlp + change.cross_queries)
                    + encoder_tokens * change.cross_keys
            }
            + self.lora_folded_experts(layer);
        let f = spec.routed_intermediate(layer) as f64 / self.split.tp;
        // No-grad forward: the hidden states the family's block code holds (block input, norm
        // output, residual sum, attention output) beside what each sublayer computes; the
        // probabilities eager attention returns stay held until the block returns, T5's position
        // bias through the stack.
        let hidden = tokens * self.bytes.residual * h;
        let held = &spec.held;
        // The pass counts the block's whole KV cache: the cross-attention's copies do not exist
        // yet while the self-attention runs.
        let attention_live =
            hidden * held.at_attention as f64 + own.inference_live - cross.kv_cache;
        // Cross-attention runs beside the self-attention's residual sum as well.
        let cross_live = if has_cross {
            hidden * (held.at_attention + 1) as f64 + own.inference_kept + cross.inference_live
        } else {
            0.0
        };
        // The block names each attention's probabilities `_`: the cross-attention's replace the
        // self-attention's.
        let kept = if has_cross {
            cross.inference_kept
        } else {
            own.inference_kept
        };
        let mlp_own_live = self.mlp_no_grad_live(tokens, layer);
        let mlp_live = hidden * held.at_mlp as f64 + mlp_own_live + kept;
        // One tensor of the MLP's intermediate width.
        let intermediate = tokens * act * f;
        let mlp_intermediates = if !layer.moe && mlp_live >= attention_live.max(cross_live) {
            SavedGroup {
                bytes: mlp_own_live,
                tensor: intermediate,
            }
        } else {
            SavedGroup::default()
        };
        let inference_live =
            attention_live.max(cross_live).max(mlp_live) + own.stack_held + cross.stack_held;
        // The score gradients exist in the attention's backward, after the MLP's (and, where
        // blocks run in sequence, the MLP's norm and the output projection's saved input are
        // released by then).
        let score_gradients = own.score_gradients.max(cross.score_gradients);
        let released_before_attention = if spec.parallel_residual || score_gradients == 0.0 {
            0.0
        } else {
            tokens
                * (self.mlp(layer) / self.split.tp
                    + self.norm_saved() / self.split.sequence
                    + act * spec.query_width() as f64 / self.split.tp)
        };
        let residual_gradient = 2.0 * tokens * self.bytes.residual * h;
        // In the attention's backward one residual-stream gradient is alive beside its own.
        let attention_backward = (score_gradients - released_before_attention)
            .max(cross.input_gradients - released_before_attention)
            - residual_gradient / 2.0;
        // On the GPU the first MLP linear's bias gradient is summed from its output's gradient
        // through a staging buffer, after the activation's and the second linear's backward
        // have released the intermediates they saved.
        let first_mlp_bias = if spec.mlp_bias && !spec.gated_mlp && !layer.moe {
            let staging = self.bias_gradient_staging(tokens, f);
            staging + tokens * (act * f - self.mlp_intermediates(layer) / self.split.tp)
        } else {
            0.0
        };
        let largest_intermediate = (tally.core / 2.0)
            .max(tokens * act * f * self.mlp_backward_intermediates())
            .max(first_mlp_bias)
            .max(attention_backward);
        let dequantised = self.dequantised(layer, tokens);
        // The cache copies the outputs hold: through backward with `--loss none` (the caller
        // keeps the outputs), else until the forward returns. As (held, forward_held).
        let cache_copies = own.forward_held + cross.forward_held;
        let outputs_held = if self.workload.loss == Loss::None {
            (cache_copies, 0.0)
        } else {
            (0.0, cache_copies)
        };
        Unit {
            name: "block",
            saved,
            attention_core: tally.core,
            checkpoint: Some(tokens * self.bytes.residual * h / self.split.sequence),
            per_op_saved: self.per_op_saved(shape, cross_shape, layer),
            held: own.cache_held + outputs_held.0,
            forward_held: outputs_held.1,
            forward_transient: (transient + tokens * act * f).max(self.adapter_transient(
                layer,
                tokens,
                encoder_tokens,
            )) + dequantised,
            // Saved tensors are released as their node runs: one intermediate's gradient at a
            // time (and a QLoRA base weight dequantised again for the input's gradient).
            backward_transient: largest_intermediate + residual_gradient + dequantised,
            gradient_transient: residual_gradient,
            inference_live: inference_live + dequantised,
            kv_cache: own.kv_cache + cross.kv_cache,
            kv_window: shape.cached_keys,
            whole: WholeTensors {
                saved: [
                    SavedGroup {
                        bytes: tally.core,
                        tensor: own.score_matrix,
                    },
                    // A mixture of experts saves per-expert slices, not whole intermediates.
                    if layer.moe {
                        SavedGroup::default()
                    } else {
                        SavedGroup {
                            bytes: tokens * self.mlp_intermediates(layer) / self.split.tp,
                            tensor: intermediate,
                        }
                    },
                ],
                live: mlp_intermediates,
                block_matrices: !layer.moe,
                ..WholeTensors::default()
            },
            params: spec.block_params(has_cross, layer),
            ..Unit::default()
        }
    }

    /// SigLIP's attention-pooling head in training, as two units in forward order:
    /// `nn.MultiheadAttention` over the final norm's output (one learned query), then its output
    /// projection, norm and MLP, whose gradients exist before the attention's backward runs.
    /// The attention's packed key/value projection reads a transposed view of the norm output
    /// (its matmul saves a contiguous copy) and makes its output contiguous (k and v are views
    /// of it, saved by the score and output products); in backward, the gradients of k and v
    /// each come back as a zero-filled tensor of the packed projection's size
    /// (`select_backward`) beside one of their gradients, after the packed output is released.
    fn attention_pool(&self) -> [Unit; 2] {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, spec.hidden as f64);
        let tokens = self.batch * self.sequence();
        let pooled = self.head();
        let attention_params =
            spec.norm_params() + spec.hidden + 3 * (spec.hidden + 1) * spec.hidden;
        // In a frozen tower, `nn.MultiheadAttention` (batch_first) projects the transposed keys
        // with `matmul`, which folds a strided input into one matrix product only when the
        // weight needs a gradient (aten `should_fold`); otherwise it multiplies key position by
        // key position (`bmm`) over the 2h × h key/value weight expanded with stride 0. CUDA's
        // strided-batched GEMM reads that broadcast in place; on CPU the half-precision bmm
        // (oneDNN) copies it for every position (pytorch/pytorch#151934): CPU only.
        let cpu_half = self.workload.target == Target::Cpu && act < 4.0;
        let expanded_weight = if self.training && self.workload.freeze_vision_tower && cpu_half {
            self.sequence() * 2.0 * h * h * act
        } else {
            0.0
        };
        let attention = Unit {
            name: "head",
            forward_transient: expanded_weight,
            saved: tokens * (self.norm_saved() + act * h + act * 2.0 * h),
            backward_transient: tokens * act * 3.0 * h,
            gradient_transient: tokens * self.bytes.residual * h,
            params: attention_params,
            ..Unit::default()
        };
        let rest = Unit {
            name: "head",
            saved: pooled.saved - tokens * self.norm_saved(),
            params: pooled.params - attention_params,
            ..Unit::default()
        };
        [attention, rest]
    }

    /// Bytes a block keeps under per-op selective checkpointing besides its input: the saved
    /// matmul outputs (per query token, and per key token for cross-attention's k and v) and,
    /// where SDPA runs a fused kernel, its output and fp32 log-sum-exp (torchtitan saves the
    /// flash and memory-efficient kernels' outputs; FlashAttention-2's own op is not in its list).
    fn per_op_saved(
        &self,
        shape: AttentionShape,
        cross: Option<AttentionShape>,
        layer: LayerKind,
    ) -> f64 {
        let spec = self.spec;
        let act = self.bytes.act;
        let (per_query, per_key) = per_op_saved_matmul_widths(spec, layer, cross.is_some());
        let queries = self.batch * shape.queries;
        let keys = cross.map_or(0.0, |c| self.batch * c.keys);
        let attentions = [
            self.own_kernel.is_sdpa_fused(),
            cross.is_some() && self.cross_kernel.is_sdpa_fused(),
        ]
        .into_iter()
        .filter(|&f| f)
        .count() as f64;
        let kernel =
            attentions * queries * (act * spec.query_width() as f64 + 4.0 * spec.heads as f64)
                / self.split.tp;
        (queries * per_query + keys * per_key) * act / self.split.tp + kernel
    }

    /// Bytes per token a block's saved inputs change by under LoRA (`lora::saved_change`):
    /// frozen linears save nothing, each adapter its own input (PEFT's fp32 copy over a
    /// half-precision base, or dropout's output and mask). Measured on CPU with peft 0.21.
    fn lora_inputs(&self, layer: LayerKind, cross_attention: bool) -> crate::lora::SavedChange {
        let Some(lora) = self.workload.lora.filter(|_| self.training) else {
            return Default::default();
        };
        let half_base = self.bytes.residual < 4.0;
        // The output projection reads the attention kernel's output, which the kernel saves
        // anyway, unless eager attention (or per-head queries) makes a merged copy for it.
        let o_input_shared = !self.own_kernel.materialises_scores()
            && !self.fused_output_in_head_layout(self.own_kernel);
        let block = crate::lora::LoraBlock {
            act: self.bytes.act,
            half_base,
            o_input_shared,
            litgpt: self.litgpt(),
            base_saves_inputs: self.workload.four_bit_base_saves_inputs(),
            cross_attention,
        };
        let change = crate::lora::saved_change(self.spec, layer, &lora, block);
        let tp = self.split.tp;
        crate::lora::SavedChange {
            attention: change.attention / tp,
            mlp: change.mlp / tp,
            cross_queries: change.cross_queries / tp,
            cross_keys: change.cross_keys / tp,
        }
    }

    /// Short-lived bytes of the widest adapter's forward (`lora::adapter_widths`) over `tokens`
    /// of the block and `encoder_tokens` a cross-attention reads:
    /// * before `lora_A`, with dropout: the input's fp32 cast over a half-precision base (PEFT;
    ///   without dropout the cast is what `lora_A` saves), and on CPU the mask `native_dropout`
    ///   first makes in its input's dtype;
    /// * after `lora_B`: its output and the scaled copy (fp32 under PEFT, the activation dtype
    ///   under litgpt). Adding the scaled fp32 output to a half-precision base output makes an
    ///   fp32 sum; on CPU `TensorIterator` first copies the half-precision operand to fp32 (it
    ///   "creates temporaries for CPU operations"; CUDA kernels cast as they read).
    fn adapter_transient(&self, layer: LayerKind, tokens: f64, encoder_tokens: f64) -> f64 {
        let Some(lora) = self.workload.lora.filter(|_| self.training) else {
            return 0.0;
        };
        let cpu = self.workload.target == Target::Cpu;
        let half_base = self.bytes.residual < 4.0;
        let litgpt = self.litgpt();
        let adapter_dtype = if litgpt { self.bytes.act } else { 4.0 };
        let before = if lora.dropout > 0.0 {
            let cast = if half_base && !litgpt { 4.0 } else { 0.0 };
            cast + if cpu { adapter_dtype } else { 0.0 }
        } else {
            0.0
        };
        let after = 2.0 * adapter_dtype
            + if cpu && half_base && !litgpt {
                4.0
            } else {
                0.0
            };
        let (own, cross) =
            crate::lora::adapter_widths(self.spec, layer, lora.targets, encoder_tokens > 0.0);
        let bytes = |tokens: f64, w: crate::lora::AdapterWidths| {
            tokens * (before * w.input).max(after * w.output)
        };
        bytes(tokens, own).max(bytes(encoder_tokens, cross)) / self.split.tp
    }

    /// Bytes a mixture of experts saves for the weights PEFT folds its router's and experts'
    /// adapters into (`lora::adapted_experts_bytes`).
    fn lora_folded_experts(&self, layer: LayerKind) -> f64 {
        match self
            .workload
            .lora
            .filter(|_| self.training && !self.litgpt())
        {
            Some(lora) => {
                crate::lora::adapted_experts_bytes(self.spec, layer, &lora, self.bytes.act)
                    / self.split.tp
            }
            None => 0.0,
        }
    }

    /// What the first block of a decoder saves under LoRA that no gradient needs: autograd
    /// records from the first adapter on, and the block's input (the frozen embeddings' output)
    /// requires none. Its first norm records nothing; when no attention linear carries an
    /// adapter, neither does the attention, nor (blocks in sequence) the second norm; with a
    /// parallel residual (GPT-NeoX, Phi) both norms read the input, and an MLP without
    /// adapters records nothing either.
    fn frozen_prefix(&self, shape: AttentionShape, layer: LayerKind) -> f64 {
        let spec = self.spec;
        let Some(lora) = self.workload.lora.filter(|_| self.training) else {
            return 0.0;
        };
        if spec.post_norm || spec.vision.is_some() || spec.dual.is_some() {
            return 0.0;
        }
        let tokens = self.batch * shape.queries;
        let norm = tokens * self.norm_saved() / self.split.sequence;
        let change = self.lora_inputs(layer, false);
        let mut prefix = match (spec.parallel_residual, spec.shared_block_norm) {
            (true, false) => {
                2.0 * norm - tokens * self.bytes.residual * spec.hidden as f64 / self.split.sequence
            }
            _ => norm,
        };
        if !crate::lora::adapts_attention(lora.targets) {
            let mut tally = Tally::default();
            let attention = self.attention(shape, false, &mut tally);
            prefix += tokens
                * (tally.sharded / self.split.tp
                    + tally.replicated / self.split.sequence
                    + change.attention)
                + attention.key_saved
                + tally.core;
            if !spec.parallel_residual {
                prefix += norm;
            }
            // Nor do the experts' inputs need a gradient.
            if !self.litgpt() {
                prefix += crate::lora::folds_read_by_the_input(spec, layer, &lora, self.bytes.act)
                    / self.split.tp;
            }
        }
        if spec.parallel_residual && !crate::lora::adapts_mlp(lora.targets) {
            prefix += tokens * (self.mlp(layer) / self.split.tp + change.mlp);
        }
        // A 4-bit base that keeps its inputs keeps none that needs no gradient: the first
        // block's q, k and v read one.
        if crate::lora::adapts_attention(lora.targets) && self.workload.four_bit_base_saves_inputs()
        {
            prefix += tokens * self.bytes.act * spec.hidden as f64 / self.split.sequence;
        }
        prefix
    }

    /// The LM head of a training step whose loss reads the logits in chunks (`saved`: what
    /// the head saves before its loss: the final norm's and the head's inputs).
    /// * `chunked` (litgpt): every chunk's logits stay referenced through backward, and each
    ///   chunk's cross-entropy saves its log-probabilities in the logits' dtype (fp32 under
    ///   autocast, beside an fp32 copy of the chunk); backward makes one chunk's gradients at a
    ///   time.
    /// * `chunked-fp32` (torchtune): all chunks' logits exist until the loss has run (the recipe
    ///   then drops them), each chunk's fp32 copy only during its own cross-entropy, which saves
    ///   fp32 log-probabilities.
    /// * `fused` (Liger-Kernel): the forward multiplies one chunk of rows by the head at a time
    ///   (`next_power_of_2(rows / ceil(vocab / hidden))` rows), writes the loss gradient into that
    ///   chunk in place, and keeps the gradient of the hidden states and the head's weight
    ///   gradient (when it trains) for backward; the head's input is not saved.
    fn chunked_loss_head(&self, tokens: f64, vocab: f64, saved: f64, params: u64) -> Unit {
        let act = self.bytes.act;
        let h = self.spec.hidden as f64;
        let positions = self.decoder_sequence();
        let logits = tokens * vocab;
        // Elements of one chunk's logits, and the number of chunks.
        let chunk = |default: f64| {
            let per_chunk = self.workload.loss_chunk.map_or(default, |c| c as f64);
            let per_chunk = per_chunk.min(positions);
            (
                self.batch * per_chunk * vocab,
                (positions / per_chunk).ceil(),
            )
        };
        // Every chunk's loss backward runs before the head's matmuls (autograd takes the
        // latest-made nodes first), so all chunks' logit gradients exist, in the logits' dtype
        // (an upcast's backward casts back). From the second chunk's matmul backward on, the
        // head's weight gradient of that chunk is made and then added to the one the earlier
        // chunks made (beside the out-of-place sum: the gradient reaches the weight through a
        // transpose, a view, which autograd does not accumulate in place), while the logit
        // gradients of the chunks still to come wait.
        let head_gradient = if self.workload.lora.is_none() {
            vocab * h * self.bytes.residual
        } else {
            0.0
        };
        let accumulating = |chunk: f64, chunks: f64| {
            if chunks < 2.0 {
                return chunk * act;
            }
            let waiting = (chunks - 2.0) * chunk * act;
            (chunk * act + head_gradient).max(ACCUMULATION_COPIES * head_gradient) + waiting
        };
        let unit = Unit {
            name: "head",
            params,
            ..Unit::default()
        };
        match self.workload.loss {
            Loss::Chunked => {
                let (chunk, chunks) = chunk(LITGPT_LM_HEAD_CHUNK);
                let (log_bytes, copy) = if self.workload.amp.is_some() && act < 4.0 {
                    (4.0, 4.0 * chunk)
                } else {
                    (act, 0.0)
                };
                Unit {
                    saved: saved + logits * log_bytes,
                    held: logits * act,
                    forward_transient: copy,
                    backward_transient: 2.0 * chunk * log_bytes,
                    gradient_transient: accumulating(chunk, chunks),
                    ..unit
                }
            }
            Loss::ChunkedFp32 => {
                let (chunk, chunks) = chunk((positions / TORCHTUNE_OUTPUT_CHUNKS).ceil());
                // `.float()` of fp32 logits returns them (no copy).
                let copy = if act < 4.0 { 4.0 * chunk } else { 0.0 };
                Unit {
                    saved: saved + logits * 4.0,
                    forward_transient: logits * act + copy,
                    backward_transient: 2.0 * 4.0 * chunk,
                    gradient_transient: accumulating(chunk, chunks),
                    ..unit
                }
            }
            _ => {
                let factor = (self.spec.vocab as f64 / h).ceil().max(1.0);
                let rows = ((tokens / factor).ceil() as u64).next_power_of_two() as f64;
                let head_input = tokens * self.head_input();
                Unit {
                    saved: saved - head_input + tokens * h * act + head_gradient,
                    // The chunk's logits and the per-row fp32 loss.
                    forward_transient: rows.min(tokens) * vocab * act + tokens * 4.0,
                    ..unit
                }
            }
        }
    }

    /// Bytes of the block's largest quantised weight dequantised while its matmul runs: a
    /// quantised checkpoint's inference (see `Quantization::dequantised_bytes`), or QLoRA's
    /// 4-bit base ([`Workload::four_bit_base`]).
    fn dequantised(&self, layer: LayerKind, tokens: f64) -> f64 {
        let elements = self.spec.largest_block_matrix(layer) as f64 / self.split.tp;
        self.dequantised_weight(elements, tokens)
    }

    /// Bytes a quantised weight of `elements` allocates while its matmul runs on `tokens`
    /// tokens: a quantised checkpoint in inference; QLoRA's 4-bit base always with gradients
    /// (`MatMul4Bit` dequantises in forward and again for the input's gradient), without them
    /// only for more than one token (a single token runs `gemv_4bit` on the packed weight).
    fn dequantised_weight(&self, elements: f64, tokens: f64) -> f64 {
        if let Some(quant) = self.workload.quant.filter(|_| !self.training) {
            return quant.dequantised_bytes(elements, tokens, self.workload.dtype);
        }
        let Some((quant, stored)) = self.workload.four_bit_base() else {
            return 0.0;
        };
        let tokens = if self.training {
            tokens.max(2.0)
        } else {
            tokens
        };
        quant.dequantised_bytes(elements, tokens, stored)
    }

    /// The LM head of a litgpt QLoRA step: Lightning's bitsandbytes plugin replaces every
    /// `nn.Linear` built under `init_module`, the head's too, so the head's forward and its
    /// input's gradient dequantise its whole weight (once per chunk of a chunked loss).
    /// Unchanged otherwise (transformers keeps the output embedding unquantised).
    fn four_bit_head(&self, head: Unit) -> Unit {
        if !self.workload.four_bit_lm_head() || !self.training || head.name != "head" {
            return head;
        }
        let elements = (self.spec.vocab * self.spec.hidden) as f64 / self.split.tp;
        let dequantised = self.dequantised_weight(elements, self.batch * self.decoder_sequence());
        Unit {
            forward_transient: head.forward_transient + dequantised,
            backward_transient: head.backward_transient + dequantised,
            ..head
        }
    }

    /// Do this run's logits cover every prompt position in generate's prefill (a release
    /// before the family's `logits_to_keep`), and does the family's forward then upcast them
    /// all to fp32?
    fn old_logits(&self) -> (bool, bool) {
        self.old_release().map_or((false, false), |old| {
            (old.full_prompt_logits(), old.upcast_all_logits())
        })
    }

    /// The older transformers release this run plans, if any.
    fn old_release(&self) -> Option<OldRelease<'a>> {
        OldRelease::of(self.spec, self.workload)
    }

    /// Bytes per token the LM head's matmul saves of its input: the input, for its weight's
    /// gradient; nothing when the head is frozen (LoRA), unless it is a 4-bit linear that keeps
    /// its input anyway (litgpt quantises its head; bitsandbytes before 0.43.2).
    fn head_input(&self) -> f64 {
        let h = self.spec.hidden as f64;
        if self.workload.lora.is_none() {
            self.bytes.linear_input(h, 1.0)
        } else if self.workload.four_bit_lm_head() && self.workload.four_bit_base_saves_inputs() {
            self.bytes.act * h
        } else {
            0.0
        }
    }

    fn head(&self) -> Unit {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, spec.hidden as f64);
        let tokens = self.batch * self.decoder_sequence();
        let vocab = spec.vocab as f64 / self.split.tp;
        let final_norm = if spec.final_norm {
            self.norm_saved()
        } else {
            0.0
        };
        let params = spec.params_of_head();
        let autocast_weight = |n: u64| {
            if self.bytes.autocast {
                act * n as f64 / self.split.tp
            } else {
                0.0
            }
        };
        match spec.head {
            Head::CausalLm | Head::Seq2SeqLm | Head::MaskedLm => {
                let lm_weights = spec.vocab * spec.hidden;
                let transform = if spec.head == Head::MaskedLm {
                    // dense → GELU → LayerNorm before the decoder.
                    self.bytes.linear_input(h, 1.0) + act * 2.0 * h + self.bytes.residual * h
                } else {
                    0.0
                };
                // T5 rescales the decoder output before the tied LM head: a fresh tensor.
                let rescale = if spec.rescaled_output {
                    self.bytes.residual * h
                } else {
                    0.0
                };
                let (full_prompt, upcast_all) = self.old_logits();
                let logits_tokens = if self.workload.mode == Mode::Generate && !full_prompt {
                    self.batch
                } else {
                    tokens
                };
                let logits = logits_tokens * vocab * act;
                // Soft-capped logits (`cap · tanh(logits / cap)`): the division's output, and
                // tanh's output saved for backward.
                let softcap = if spec.logit_softcap { logits } else { 0.0 };
                // Causal LMs upcast logits before the loss; autocast runs cross-entropy in fp32;
                // masked-LM and T5 heads take the loss in the activation dtype.
                let upcast = spec.head == Head::CausalLm || self.workload.amp.is_some();
                // Except CUDA's autocast on half-precision logits that the model does not
                // upcast: `cross_entropy` names the logits' dtype for its log_softmax, which so
                // runs (and saves its output) in half precision, and nll_loss, an fp32 op,
                // saves the fp32 copy of the log-probabilities it reads. CPU's autocast casts
                // the logits to fp32 before log_softmax.
                let half_log_probs = upcast
                    && spec.head != Head::CausalLm
                    && self.workload.target == Target::Gpu
                    && act < 4.0;
                let loss_bytes = if upcast && !half_log_probs { 4.0 } else { act };
                let fp32_copy = if loss_bytes == act && !half_log_probs {
                    0.0
                } else {
                    logits_tokens * vocab * 4.0
                };
                // A masked-LM decoder's (or a biased LM head's) bias gradient sums the logits'
                // gradient through a staging buffer beside the input's gradient.
                let logits_gradient = logits
                    + if spec.head == Head::MaskedLm || spec.lm_head_bias {
                        self.bias_gradient_staging(logits_tokens, vocab)
                    } else {
                        0.0
                    };
                let saved_per_token = final_norm + transform + rescale + self.head_input();
                // What the head's matmul and the final norm save: alive while the head's
                // backward makes the gradient of its input and then of its weight (the final
                // norm's backward comes after).
                let head_saved = tokens * saved_per_token + autocast_weight(lm_weights);
                let input_gradient = tokens * act * h;
                if self.training && self.workload.loss == Loss::None {
                    // `outputs.logits.sum().backward()`: the outputs (and so the logits) stay
                    // referenced until backward has run; sum's gradient is an expanded scalar,
                    // which the LM head's matmul backward materialises as one logits-sized
                    // tensor (reshaping a stride-0 view copies). Autocast runs `sum` in fp32:
                    // an fp32 copy of the logits exists while it runs.
                    let autocast_sum = if self.workload.amp.is_some() && act < 4.0 {
                        tokens * vocab * 4.0
                    } else {
                        0.0
                    };
                    Unit {
                        name: "head",
                        saved: head_saved + softcap,
                        held: logits,
                        forward_transient: softcap + autocast_sum,
                        // Soft-capping's backward makes tanh's gradient while the gradient of
                        // the final `· cap` still lives: two logits-sized gradients.
                        backward_transient: logits + softcap,
                        gradient_transient: logits_gradient + input_gradient,
                        saved_through_gradients: head_saved,
                        params,
                        ..Unit::default()
                    }
                } else if self.training && self.workload.loss.chunked() {
                    let head = self.chunked_loss_head(tokens, vocab, head_saved + softcap, params);
                    // Chunk by chunk, the head's weight gradient is made (and summed) while the
                    // chunks' inputs and the final norm's saved tensors are still referenced.
                    let through = if self.workload.loss == Loss::Fused {
                        0.0
                    } else {
                        head_saved
                    };
                    Unit {
                        saved_through_gradients: through,
                        ..head
                    }
                } else if self.training {
                    let log_probs = tokens * vocab * loss_bytes;
                    // Kept: nll_loss's fp32 copy of half-precision log-probabilities, beside
                    // which its backward makes its fp32 gradient (the casts and log_softmax's
                    // backward that follow hold less). Otherwise the fp32 copy of the logits
                    // is transient, and backward starts with the gradients of nll_loss and of
                    // log_softmax beside log_softmax's saved output.
                    let (kept_copy, forward_copy, backward_start) = if half_log_probs {
                        (fp32_copy, 0.0, [fp32_copy, 0.0])
                    } else {
                        (0.0, fp32_copy, [log_probs, log_probs])
                    };
                    Unit {
                        name: "head",
                        saved: head_saved + log_probs + kept_copy + softcap,
                        // Only the loss leaves the model (as in the HF Trainer): logits and their fp32
                        // copy live until log_softmax has run.
                        forward_transient: logits + forward_copy + softcap,
                        backward_transient: backward_start.iter().sum(),
                        // The logits' gradient (cast back to the logits dtype) feeds the LM head,
                        // whose backward makes its input's gradient before its weight's.
                        gradient_transient: logits_gradient + input_gradient,
                        saved_through_gradients: head_saved,
                        whole: WholeTensors {
                            saved: [
                                SavedGroup {
                                    bytes: log_probs,
                                    tensor: log_probs,
                                },
                                SavedGroup {
                                    bytes: kept_copy,
                                    tensor: kept_copy,
                                },
                            ],
                            forward_transient: [logits, forward_copy],
                            backward_transient: backward_start,
                            gradient_transient: logits,
                            gradient_continues: loss_bytes == act && !half_log_probs,
                            ..WholeTensors::default()
                        },
                        params,
                        ..Unit::default()
                    }
                } else {
                    // Before transformers 4.45 a Llama-family forward returns all its logits
                    // upcast to fp32 (the activation-dtype logits exist beside their copy).
                    let (logits, upcasting) = if upcast_all && act < 4.0 && !self.workload.labels {
                        (logits_tokens * vocab * 4.0, logits)
                    } else {
                        (logits, 0.0)
                    };
                    // Generation copies the last logits to fp32 and a logits processor makes
                    // another fp32 tensor before picking the token; some releases first clone
                    // all the logits the model returned.
                    let selection = if self.workload.mode == Mode::Generate {
                        let clone = if self.old_release().is_some_and(|o| o.clones_all_logits()) {
                            logits
                        } else {
                            0.0
                        };
                        2.0 * 4.0 * self.batch * vocab + clone
                    } else {
                        0.0
                    };
                    let held = logits + selection;
                    // The final norm reads the last block's output; the head then runs on the
                    // body's output beside the logits (with a masked-LM transform's output, or
                    // T5's rescaled copy).
                    let hidden = tokens * self.bytes.residual * h;
                    let beside_logits = if transform > 0.0 || rescale > 0.0 {
                        2.0 * hidden
                    } else {
                        hidden
                    };
                    // With labels the model computes its loss: the fp32 copy of the logits and
                    // log_softmax's output, as in training.
                    let loss = if self.workload.mode == Mode::Infer && self.workload.labels {
                        fp32_copy + tokens * vocab * loss_bytes
                    } else {
                        0.0
                    };
                    Unit {
                        name: "head",
                        // The logits themselves are `held` (returned to the caller).
                        inference_live: (2.0 * hidden - held)
                            .max(beside_logits + loss + softcap + upcasting),
                        held,
                        params,
                        ..Unit::default()
                    }
                }
            }
            Head::Pooler
            | Head::AttentionPool
            | Head::None
            | Head::SequenceClassification { .. }
            | Head::ImageClassification { .. } => {
                // A classifier on the first token keeps the whole final-norm output alive through its view.
                let keeps_norm_output =
                    matches!(spec.head, Head::ImageClassification { .. }) && spec.final_norm;
                let pooled = self.batch * h * act * 2.0;
                let saved = tokens
                    * (final_norm
                        + if keeps_norm_output {
                            self.bytes.residual * h
                        } else {
                            0.0
                        })
                    + pooled;
                Unit {
                    name: "head",
                    saved: if self.training { saved } else { 0.0 },
                    inference_live: tokens * self.bytes.residual * h + pooled,
                    backward_transient: tokens * self.bytes.residual * h,
                    gradient_transient: tokens * self.bytes.residual * h,
                    params,
                    ..Unit::default()
                }
            }
        }
    }
}

/// Units of a torchvision ResNet: stem, one per residual block, classifier head.
fn resnet_units(spec: &ResnetSpec, workload: &Workload, batch: u64) -> Vec<Unit> {
    let act = workload.compute_dtype().bytes() as f64;
    let input_bytes = workload.dtype.bytes() as f64;
    let b = batch as f64;
    let training = workload.mode == Mode::Train;
    let image = workload.image_size;
    let mut units = Vec::new();
    // Stem: conv 7×7/2 → BN → ReLU (in place) → max-pool 3×3/2 (saves int64 indices).
    let stem = spec.stem();
    let stem_side = stem.output_side(image);
    let pooled_side = (stem_side + 2 - 3) / 2 + 1;
    let stem_out = b * (stem.outputs * stem_side * stem_side) as f64;
    let pooled = b * (stem.outputs * pooled_side * pooled_side) as f64;
    let pixels = b * (3 * image * image) as f64;
    let autocast_input = if workload.amp.is_some() && input_bytes != act {
        pixels * act
    } else {
        0.0
    };
    units.push(Unit {
        name: "stem",
        saved: if training {
            autocast_input + 2.0 * stem_out * act + pooled * (act + 8.0)
        } else {
            0.0
        },
        held: pixels * input_bytes,
        forward_transient: 0.0,
        backward_transient: 2.0 * stem_out * act,
        gradient_transient: 2.0 * stem_out * act,
        // Convolution output and BatchNorm output; the pooled map comes after the first is freed.
        inference_live: 2.0 * stem_out * act,
        params: stem.params(),
        ..Unit::default()
    });
    let mut side = pooled_side;
    for block in spec.blocks() {
        let mut saved = 0.0;
        let mut largest: f64 = 0.0;
        let mut conv_side = side;
        let mut outputs = Vec::new();
        // Each convolution's output is saved by its BatchNorm, and the BN/ReLU output by the next op.
        for conv in &block.convs {
            conv_side = conv.output_side(conv_side);
            let out = b * (conv.outputs * conv_side * conv_side) as f64;
            saved += 2.0 * out * act;
            largest = largest.max(out);
            outputs.push(out);
        }
        let shortcut = block.downsample.map_or(0.0, |down| {
            let out_side = down.output_side(side);
            b * (down.outputs * out_side * out_side) as f64
        });
        saved += shortcut * act;
        let input = b * (block.convs[0].inputs * side * side) as f64;
        // No-grad: input (kept for the shortcut), the previous ReLU output, the last conv and BN
        // outputs (BN is not in place), and the downsampled shortcut.
        let (last, middle) = match outputs.as_slice() {
            [.., middle, last] => (*last, *middle),
            _ => (largest, 0.0),
        };
        let params = block
            .convs
            .iter()
            .chain(block.downsample.iter())
            .map(ConvShape::params)
            .sum();
        units.push(Unit {
            name: "block",
            saved: if training { saved } else { 0.0 },
            checkpoint: Some(input * act),
            forward_transient: largest * act,
            backward_transient: 3.0 * largest * act,
            gradient_transient: 2.0 * largest * act,
            inference_live: (input + middle + 2.0 * last + shortcut) * act,
            params,
            ..Unit::default()
        });
        side = conv_side;
    }
    let features = b * spec.features() as f64;
    let logits = b * spec.num_classes as f64;
    units.push(Unit {
        name: "head",
        saved: if training {
            features * act + logits * 4.0
        } else {
            0.0
        },
        held: logits * act,
        backward_transient: 2.0 * logits * 4.0 + features * act,
        gradient_transient: logits * 4.0 + features * act,
        inference_live: features * act,
        params: spec.features() * spec.num_classes + spec.num_classes,
        ..Unit::default()
    });
    units
}
