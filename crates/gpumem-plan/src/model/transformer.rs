//! Transformers: their blocks' mechanisms as plain data, and their exact parameter counts.

use super::{linear, ParamCounts};
use serde::Serialize;

/// Per-element activation function of the MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// Exact GELU (`F.gelu`): saves its input.
    Gelu,
    /// Tanh GELU written as Python ops (`gelu_new`): saves four intermediates.
    GeluTanhPython,
    /// Tanh GELU as one kernel (`gelu_pytorch_tanh`).
    GeluTanh,
    /// ReLU: saves only its output.
    Relu,
    /// SiLU / swish: saves its input.
    Silu,
    /// `x * sigmoid(1.702 x)` as Python ops (CLIP's `quick_gelu`): saves the input and the
    /// sigmoid output.
    QuickGelu,
}

/// Layer normalisation flavour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    /// LayerNorm (weight, and bias when `norm_bias`).
    LayerNorm,
    /// RMSNorm written as Python ops that upcast the input to fp32 first (Llama).
    RmsNorm,
    /// RMSNorm that scales the input itself by the fp32 reciprocal root (T5): the product is
    /// promoted to fp32, so a half-precision input is saved beside its fp32 copy.
    RmsNormScaledInput,
    /// RMSNorm that scales by `1 + weight` in fp32 before casting back (Gemma): the fp32 copy
    /// of the input and the fp32 normalised values are both saved, whatever the input dtype.
    RmsNormOffset,
}

/// Which output module sits on top of the transformer body.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Head {
    /// Next-token logits over the vocabulary + cross-entropy.
    CausalLm,
    /// Encoder output plus a tanh pooler on the first token (BertModel, ViTModel).
    Pooler,
    /// No head (T5EncoderModel-like bodies, RobertaModel without pooler).
    None,
    /// Pooler + linear classifier (BertForSequenceClassification).
    SequenceClassification {
        /// Number of labels.
        labels: u64,
    },
    /// Masked-LM head: dense + GELU + LayerNorm + tied decoder with a bias.
    MaskedLm,
    /// Linear classifier on the CLS token (ViTForImageClassification).
    ImageClassification {
        /// Number of classes.
        classes: u64,
    },
    /// Encoder-decoder LM head (T5ForConditionalGeneration, WhisperForConditionalGeneration).
    Seq2SeqLm,
    /// Multi-head attention pooling over the final norm output (SigLIP's vision head): a learned
    /// probe, one `nn.MultiheadAttention`, a LayerNorm and an MLP of the block's width.
    AttentionPool,
}

/// Image patching of a vision transformer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Patches {
    /// Patch side in pixels.
    pub patch: u64,
    /// Input channels.
    pub channels: u64,
    /// Image side the position table was built for.
    pub image_size: u64,
    /// A learned class token is prepended (ViT, CLIP; not SigLIP).
    pub class_token: bool,
    /// The patch convolution has a bias (ViT, SigLIP; not CLIP).
    pub bias: bool,
}

impl Patches {
    /// Tokens the encoder sees: one per patch, plus the class token.
    pub fn tokens(&self) -> u64 {
        self.tokens_at(self.image_size)
    }

    /// Tokens the encoder sees for images of side `image_size`, which a tower may run at
    /// instead of its trained size.
    pub fn tokens_at(&self, image_size: u64) -> u64 {
        (image_size / self.patch).pow(2) + u64::from(self.class_token)
    }
}

/// Multi-head latent attention (DeepSeek-V2/V3): queries through an optional low-rank
/// bottleneck; keys and values decompressed from one shared latent per token, which is what the
/// KV cache holds (with the shared rotary key) instead of per-head keys and values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LatentAttention {
    /// Rank of the query bottleneck (`q_lora_rank`); 0 when queries are projected directly.
    pub query_rank: u64,
    /// Rank of the key/value latent (`kv_lora_rank`).
    pub kv_rank: u64,
    /// Per-head query/key width without rotary embedding (`qk_nope_head_dim`).
    pub nope_dim: u64,
    /// Per-head rotary query/key width, shared by all heads on the key side (`qk_rope_head_dim`).
    pub rope_dim: u64,
    /// Per-head value width (`v_head_dim`).
    pub value_dim: u64,
}

/// Mixture-of-experts layout beyond the routed experts themselves (`experts`,
/// `experts_per_token`, `intermediate` of [`TransformerSpec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct MoeLayout {
    /// The first this-many blocks have a dense MLP instead (DeepSeek's `first_k_dense_replace`).
    pub dense_layers: u64,
    /// MLP width of those dense blocks.
    pub dense_intermediate: u64,
    /// Width of the shared experts every token passes through (DeepSeek: `n_shared_experts ×
    /// moe_intermediate_size`); 0 without.
    pub shared_intermediate: u64,
    /// The router upcasts its input and weight to fp32 before its linear (DeepSeek-V2/V3's
    /// `F.linear(x.float(), w.float())`): in half-precision training it saves the fp32 input.
    pub fp32_router: bool,
}

/// Sliding-window attention on some layers (Gemma 2/3): those layers' KV cache keeps the last
/// `window − 1` tokens (transformers' `DynamicSlidingWindowLayer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SlidingWindow {
    /// Tokens each query attends to.
    pub window: u64,
    /// Every this-many-th layer attends to everything (Gemma 2: 2, Gemma 3: 6); 0: all layers
    /// slide.
    pub full_every: u64,
}

/// The audio front end of Whisper's encoder: two GELU convolutions over log-mel frames (the
/// second with stride 2) and a position table of the encoder's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AudioStem {
    /// Mel bins per frame (the first convolution's input channels).
    pub mel_bins: u64,
    /// Encoder positions (`max_source_positions`): frames after the stride-2 convolution; the
    /// input has twice as many.
    pub frames: u64,
}

/// The vision side of a vision-language model (LLaVA): a vision tower whose patch features a
/// projector maps into the language model's embedding space as image tokens.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VisionAdapter {
    /// The vision tower (a CLIP or SigLIP vision transformer).
    pub tower: TransformerSpec,
    /// Parameters of the projector (LLaVA: linear, GELU, linear, with biases).
    pub projector: u64,
    /// Image tokens each image contributes to the language model's sequence.
    pub image_tokens: u64,
    /// Tower layers whose output the projector reads (`vision_feature_layer`: -2, the
    /// default, reads the hidden states before the last layer); the layers after it run but
    /// get no gradient.
    pub feature_layers: u64,
}

/// The image side of a CLIP or SigLIP dual encoder: a vision tower run beside the text tower
/// (the spec that holds it). Each tower's pooled output is projected into a shared embedding
/// space, and every text of the batch is scored against every image (a batch × batch matrix).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DualEncoder {
    /// The vision tower (a CLIP or SigLIP vision transformer).
    pub tower: TransformerSpec,
    /// Parameters outside both towers: the projections into the shared space (CLIP's two
    /// bias-free projections; SigLIP's text head), the logit scale and SigLIP's logit bias.
    pub joint_params: u64,
    /// Width of the shared embedding space.
    pub embed_dim: u64,
    /// The contrastive loss `return_loss=True` computes over the batch × batch scores.
    pub loss: ContrastiveLoss,
}

/// The loss of a dual encoder over its batch × batch image-text scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContrastiveLoss {
    /// CLIP: cross-entropy over the rows and over the columns (the transpose), averaged.
    Softmax,
    /// SigLIP: a log-sigmoid of every score, signed +1 on the diagonal and −1 off it.
    Sigmoid,
}

/// What distinguishes one block of a stack from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayerKind {
    /// Attention is limited to a sliding window.
    pub sliding: bool,
    /// The MLP is a mixture of experts (else dense).
    pub moe: bool,
}

/// What a family's Hugging Face forward code keeps referenced in a no-grad forward besides the
/// tensor each step is computing: a Python name holds its tensor until it is rebound or its
/// function returns. Counted in hidden-state tensors (one per token, `hidden` wide).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HeldHidden {
    /// Embedding outputs the model's forward holds until its body returns: the token
    /// embeddings (`inputs_embeds`), and OPT's learned-position output.
    pub embeddings: u64,
    /// The learned position embedding's output is held too (GPT-2): one row per position in a
    /// plain forward (its default position ids have batch 1), one per token in generation
    /// (which passes position ids per sequence).
    pub positions: bool,
    /// Hidden states alive while attention runs, besides its projections: the block input (held
    /// by the caller's loop) and the norm output attention reads.
    pub at_attention: u64,
    /// Hidden states alive while the MLP runs, besides its intermediates: the block input, and as
    /// the block's code names them the residual sum, the norm output and the attention output.
    pub at_mlp: u64,
}

/// A transformer, described by the facts that decide its parameters and activations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TransformerSpec {
    /// The Hugging Face `model_type` it was read as.
    pub model_type: String,
    /// Model width h.
    pub hidden: u64,
    /// Transformer blocks (the decoder's for encoder-decoders).
    pub layers: u64,
    /// Encoder blocks of an encoder-decoder (0 otherwise).
    pub encoder_layers: u64,
    /// Attention (query) heads.
    pub heads: u64,
    /// Key/value heads (< heads for grouped-query attention).
    pub kv_heads: u64,
    /// Width of one head.
    pub head_dim: u64,
    /// MLP inner width f (per expert for MoE).
    pub intermediate: u64,
    /// Vocabulary size V.
    pub vocab: u64,
    /// Rows of the learned position table (0 for rotary / relative positions).
    pub learned_positions: u64,
    /// Rows of the token-type table (BERT).
    pub token_types: u64,
    /// Tokens the positions cover (`max_position_embeddings`, less RoBERTa's padding offset): a
    /// hard limit with a learned table (`learned_positions > 0`), the trained length with rotary
    /// positions; None without a limit (T5's relative buckets, ViT's patch positions).
    pub max_positions: Option<u64>,
    /// MLP activation.
    pub activation: Activation,
    /// Gated MLP (SwiGLU / GeGLU: three matrices).
    pub gated_mlp: bool,
    /// Norm flavour.
    pub norm: Norm,
    /// Norms carry a bias.
    pub norm_bias: bool,
    /// Norm after the residual add (BERT) instead of before the sublayer.
    pub post_norm: bool,
    /// Attention and MLP read the same input and are added together (GPT-NeoX, Phi).
    pub parallel_residual: bool,
    /// One norm per block shared by attention and MLP (Phi).
    pub shared_block_norm: bool,
    /// q, k, v are one fused projection (GPT-2, GPT-NeoX).
    pub fused_qkv: bool,
    /// Biases on q, k, v.
    pub qkv_bias: bool,
    /// Bias on the attention output projection.
    pub out_bias: bool,
    /// Biases in the MLP.
    pub mlp_bias: bool,
    /// Fraction of each head rotated by RoPE (0 without rotary embeddings).
    pub rotary_fraction: f64,
    /// Eager attention computes the softmax in fp32 and casts back
    /// (`softmax(scores, dtype=torch.float32).to(dtype)`, transformers 5.x: Llama, Mistral,
    /// Qwen2, Mixtral, Gemma, Phi, GPT-NeoX, OPT, ViT); GPT-2, BERT and T5 keep the activation
    /// dtype.
    pub softmax_fp32: bool,
    /// Output embedding shares the input embedding.
    pub tied_embeddings: bool,
    /// The untied LM head has a bias (Phi).
    pub lm_head_bias: bool,
    /// LayerNorm right after the embeddings (BERT).
    pub embedding_norm: bool,
    /// Norm after the last block.
    pub final_norm: bool,
    /// Experts per MoE layer (1 = dense).
    pub experts: u64,
    /// Experts each token is routed to.
    pub experts_per_token: u64,
    /// Relative-position buckets per stack (T5).
    pub relative_attention_buckets: u64,
    /// Word-embedding width when it differs from h (OPT-350m projects in and out).
    pub embed_projection: u64,
    /// Dropout on attention probabilities.
    pub attention_dropout: f64,
    /// Dropout after attention and MLP outputs.
    pub hidden_dropout: f64,
    /// Dropout after the MLP activation.
    pub activation_dropout: f64,
    /// Dropout after the embeddings.
    pub embedding_dropout: f64,
    /// Output module.
    pub head: Head,
    /// `use_cache` of the config: Hugging Face decoders then build a KV cache even in training,
    /// and return it from an inference forward.
    pub use_cache: bool,
    /// The model has a decoder stack (causal self-attention, served by a KV cache): every
    /// decoder-only family and the decoder of an encoder-decoder; false for encoders (BERT, ViT).
    pub decoder: bool,
    /// What its forward keeps referenced without gradients.
    pub held: HeldHidden,
    /// Patching, for vision transformers.
    pub patches: Option<Patches>,
    /// The key projection has a bias like q and v (false for Whisper, whose k has none).
    pub key_bias: bool,
    /// RMSNorm over each head's queries and keys (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Four norms per block: before and after attention and MLP (Gemma 2/3).
    pub sandwich_norms: bool,
    /// Sliding-window attention, when some layers use it.
    pub sliding: Option<SlidingWindow>,
    /// `tanh` soft-capping of the attention scores (Gemma 2 eager attention).
    pub attention_softcap: bool,
    /// transformers has no SDPA path for the family (Gemma 2): `--attn sdpa` runs eager.
    pub eager_only: bool,
    /// The model calls PyTorch's SDPA itself whatever `--attn` says (torchvision's
    /// `nn.MultiheadAttention(need_weights=False)`).
    pub sdpa_only: bool,
    /// Gate and up projections are one matrix (Phi-3): its output stays whole behind the two
    /// halves while the activation and product are computed.
    pub fused_gate_up: bool,
    /// `tanh` soft-capping of the final logits (Gemma 2).
    pub logit_softcap: bool,
    /// Multi-head latent attention (DeepSeek-V2/V3).
    pub latent: Option<LatentAttention>,
    /// Dense blocks and shared experts of a mixture of experts.
    pub moe: MoeLayout,
    /// The decoder output is rescaled before a tied LM head (T5).
    pub rescaled_output: bool,
    /// Whisper's audio front end (the encoder reads mel frames, not tokens).
    pub audio: Option<AudioStem>,
    /// The attention makes its queries contiguous per head before the kernel (Whisper's
    /// `contiguous()`; GPT-NeoX, Phi and Phi-3 build rotated queries with `torch.cat`): the
    /// kernel's output then comes in head layout, and merging the heads for the output
    /// projection is a copy (which that projection saves).
    pub head_layout_queries: bool,
    /// Vision tower and projector of a vision-language model.
    pub vision: Option<Box<VisionAdapter>>,
    /// The vision tower of a dual encoder (CLIP, SigLIP) whose text tower this spec is.
    pub dual: Option<Box<DualEncoder>>,
}

impl TransformerSpec {
    /// Query width `heads × head_dim` (for latent attention, `head_dim` is the no-rope plus
    /// rotary width).
    pub fn query_width(&self) -> u64 {
        self.heads * self.head_dim
    }

    /// Key width `kv_heads × head_dim`: one head for multi-query attention, fewer than the
    /// query heads for grouped-query attention.
    pub fn kv_width(&self) -> u64 {
        self.kv_heads * self.head_dim
    }

    /// Value width: the key width, except for latent attention (`heads × v_head_dim`).
    pub fn value_width(&self) -> u64 {
        match self.latent {
            Some(l) => self.heads * l.value_dim,
            None => self.kv_width(),
        }
    }

    /// Elements per token and layer a KV cache holds (keys and values together): the
    /// compressed latent and the shared rotary key for latent attention.
    pub fn cache_width(&self) -> u64 {
        match self.latent {
            Some(l) => l.kv_rank + l.rope_dim,
            None => self.kv_width() + self.value_width(),
        }
    }

    /// Is this an encoder-decoder (T5, Whisper)?
    pub fn is_encoder_decoder(&self) -> bool {
        self.encoder_layers > 0
    }

    /// Is this a causal decoder-only LM?
    pub fn is_causal_lm(&self) -> bool {
        self.head == Head::CausalLm
    }

    /// The kind of decoder block `index` (0-based): sliding window, mixture of experts.
    pub fn layer_kind(&self, index: u64) -> LayerKind {
        LayerKind {
            sliding: self
                .sliding
                .is_some_and(|s| s.full_every == 0 || !(index + 1).is_multiple_of(s.full_every)),
            moe: self.experts > 1 && index >= self.moe.dense_layers,
        }
    }

    /// Decoder blocks with a mixture-of-experts MLP.
    fn moe_layers(&self) -> u64 {
        if self.experts > 1 {
            self.layers - self.moe.dense_layers.min(self.layers)
        } else {
            0
        }
    }

    pub(crate) fn norm_params(&self) -> u64 {
        self.hidden * if self.norm_bias { 2 } else { 1 }
    }

    /// Calls `each(inputs, outputs, copies)` for every weight matrix of one attention module.
    fn attention_linears(&self, each: &mut impl FnMut(u64, u64, u64)) {
        let h = self.hidden;
        match self.latent {
            Some(l) => {
                if l.query_rank > 0 {
                    each(h, l.query_rank, 1);
                    each(l.query_rank, self.query_width(), 1);
                } else {
                    each(h, self.query_width(), 1);
                }
                each(h, l.kv_rank + l.rope_dim, 1);
                each(l.kv_rank, self.heads * (l.nope_dim + l.value_dim), 1);
                each(self.value_width(), h, 1);
            }
            None => {
                each(h, self.query_width(), 1);
                each(h, self.kv_width(), 2);
                each(self.query_width(), h, 1);
            }
        }
    }

    /// MLP width of a dense block.
    fn dense_intermediate(&self) -> u64 {
        if self.moe.dense_intermediate > 0 {
            self.moe.dense_intermediate
        } else {
            self.intermediate
        }
    }

    /// MLP width one token passes through in block `layer` (its routed experts and the shared
    /// ones), for activation memory.
    pub fn routed_intermediate(&self, layer: LayerKind) -> u64 {
        if layer.moe {
            self.intermediate * self.experts_per_token + self.moe.shared_intermediate
        } else {
            self.dense_intermediate()
        }
    }

    /// Calls `each(inputs, outputs, copies)` for every weight matrix of one MLP (all experts).
    fn mlp_linears(&self, layer: LayerKind, each: &mut impl FnMut(u64, u64, u64)) {
        let matrices = self.mlp_matrices();
        if layer.moe {
            each(self.hidden, self.intermediate, matrices * self.experts);
            if self.moe.shared_intermediate > 0 {
                each(self.hidden, self.moe.shared_intermediate, matrices);
            }
        } else {
            each(self.hidden, self.dense_intermediate(), matrices);
        }
    }

    /// Parameters of one attention module (self- or cross-attention).
    pub fn attention_params(&self) -> u64 {
        let mut weights = 0;
        self.attention_linears(&mut |i, o, n| weights += i * o * n);
        let (h, kv) = (self.hidden, self.kv_width());
        let extras = match self.latent {
            Some(l) => {
                let bias = if self.qkv_bias {
                    l.kv_rank + l.rope_dim + if l.query_rank > 0 { l.query_rank } else { 0 }
                } else {
                    0
                };
                // q_a_layernorm and kv_a_layernorm (RMSNorm, weight only).
                bias + l.query_rank + l.kv_rank + if self.out_bias { h } else { 0 }
            }
            None => {
                let bias = |on: bool, width: u64| if on { width } else { 0 };
                bias(self.qkv_bias, self.query_width() + kv)
                    + bias(self.key_bias, kv)
                    + bias(self.out_bias, h)
                    + if self.qk_norm { 2 * self.head_dim } else { 0 }
            }
        };
        weights + extras
    }

    /// Matrices of one (expert) MLP.
    fn mlp_matrices(&self) -> u64 {
        if self.gated_mlp {
            3
        } else {
            2
        }
    }

    /// Parameters of the MLP of a block of kind `layer` (all experts and the router for MoE).
    pub fn mlp_params(&self, layer: LayerKind) -> u64 {
        let mut weights = 0;
        self.mlp_linears(layer, &mut |i, o, n| weights += i * o * n);
        let h = self.hidden;
        if layer.moe {
            weights + h * self.experts
        } else if self.mlp_bias {
            weights + (self.mlp_matrices() - 1) * self.dense_intermediate() + h
        } else {
            weights
        }
    }

    /// Parameters of one block of kind `layer`; `cross_attention` for decoder blocks of an
    /// encoder-decoder.
    pub fn block_params(&self, cross_attention: bool, layer: LayerKind) -> u64 {
        let norms = self.block_norms() + u64::from(cross_attention);
        let attention = self.attention_params() * if cross_attention { 2 } else { 1 };
        attention + self.mlp_params(layer) + norms * self.norm_params()
    }

    /// Norms of a block without cross-attention.
    pub fn block_norms(&self) -> u64 {
        if self.sandwich_norms {
            4
        } else if self.shared_block_norm {
            1
        } else {
            2
        }
    }

    /// Parameters of the embedding tables (token, position, type, patches, projections, norm,
    /// Whisper's audio convolutions and encoder positions).
    pub fn params_of_embeddings(&self) -> u64 {
        let h = self.hidden;
        let mut embeddings =
            self.vocab * self.word_width() + (self.learned_positions + self.token_types) * h;
        if self.embed_projection > 0 {
            embeddings += 2 * self.embed_projection * h; // project_in and project_out, no bias
        }
        if self.embedding_norm {
            embeddings += self.norm_params();
        }
        if let Some(p) = self.patches {
            embeddings += linear(p.channels * p.patch * p.patch, h, p.bias)
                + if p.class_token { h } else { 0 }
                + p.tokens() * h;
        }
        if let Some(a) = self.audio {
            embeddings += linear(3 * a.mel_bins, h, true) + linear(3 * h, h, true) + a.frames * h;
        }
        embeddings
    }

    /// Parameters after the last block: final norm(s), pooler, classifier, untied LM head.
    pub fn params_of_head(&self) -> u64 {
        let h = self.hidden;
        let stacks = if self.is_encoder_decoder() { 2 } else { 1 };
        let final_norms = if self.final_norm {
            stacks * self.norm_params()
        } else {
            0
        };
        final_norms
            + match self.head {
                Head::CausalLm | Head::Seq2SeqLm if !self.tied_embeddings => {
                    linear(h, self.vocab, self.lm_head_bias)
                }
                Head::CausalLm | Head::Seq2SeqLm | Head::None => 0,
                Head::Pooler => linear(h, h, true),
                Head::SequenceClassification { labels } => {
                    linear(h, h, true) + linear(h, labels, true)
                }
                Head::MaskedLm => linear(h, h, true) + self.norm_params() + self.vocab,
                Head::ImageClassification { classes } => linear(h, classes, true),
                Head::AttentionPool => {
                    let f = self.intermediate;
                    h + 4 * linear(h, h, true)
                        + self.norm_params()
                        + linear(h, f, true)
                        + linear(f, h, true)
                }
            }
    }

    /// Weights of the linear layers of one block of kind `layer` (what autocast copies and a
    /// quantised checkpoint stores in few bits), with `cross` an encoder-decoder's decoder
    /// block, whose cross-attention has the self-attention's linears.
    pub fn block_linear_params(&self, layer: LayerKind, cross: bool) -> u64 {
        let mut weights = 0;
        let mut add = |i: u64, o: u64, n: u64| weights += i * o * n;
        self.attention_linears(&mut add);
        if cross {
            self.attention_linears(&mut add);
        }
        self.mlp_linears(layer, &mut add);
        weights
    }

    /// Elements of each weight matrix of a dense block, a fused q/k/v projection as one: the
    /// tensors its parameters, gradients and optimizer states are.
    pub fn block_matrices(&self) -> Vec<u64> {
        let mut matrices = self.attention_matrices();
        self.mlp_linears(LayerKind::default(), &mut |i, o, n| {
            matrices.extend((0..n).map(|_| i * o))
        });
        matrices
    }

    /// Elements of each weight tensor of a mixture-of-experts block, as
    /// [`Self::block_matrices`] for a dense one: the attention's matrices, the router's, the
    /// shared experts' and the routed experts'. With `fused_experts` (transformers 5's
    /// `<Family>Experts`: `gate_up_proj` of experts × 2·intermediate × hidden and `down_proj`
    /// of experts × hidden × intermediate, both `nn.Parameter`s) the routed experts are those
    /// two tensors; otherwise (4.x's `nn.ModuleList` of expert MLPs) one matrix per expert and
    /// projection.
    pub fn moe_block_tensors(&self, fused_experts: bool) -> Vec<u64> {
        let mut tensors = self.attention_matrices();
        tensors.push(self.hidden * self.experts);
        let expert = self.hidden * self.intermediate;
        let projections = self.mlp_matrices();
        if fused_experts {
            tensors.push(self.experts * (projections - 1) * expert);
            tensors.push(self.experts * expert);
        } else {
            tensors.extend(std::iter::repeat_n(
                expert,
                (projections * self.experts) as usize,
            ));
        }
        let shared = self.hidden * self.moe.shared_intermediate;
        tensors.extend(std::iter::repeat_n(shared, projections as usize));
        tensors.retain(|&t| t > 0);
        tensors
    }

    /// Elements of each weight matrix of one attention module, a fused q/k/v projection as one.
    fn attention_matrices(&self) -> Vec<u64> {
        let mut matrices = Vec::new();
        self.attention_linears(&mut |i, o, n| matrices.extend((0..n).map(|_| i * o)));
        if self.fused_qkv && self.latent.is_none() {
            let qkv: u64 = matrices.drain(..3).sum();
            matrices.insert(0, qkv);
        }
        matrices
    }

    /// Elements of the largest weight matrix of a block of kind `layer` (one expert's for a
    /// mixture): the largest one bitsandbytes dequantises at a time under QLoRA.
    pub fn largest_block_matrix(&self, layer: LayerKind) -> u64 {
        self.largest_in(&[layer], |i, o| i * o)
    }

    /// The largest `size(inputs, outputs)` over the weight matrices of every kind of block the
    /// model has: a buffer one kernel sizes for all its linears (AutoGPTQ's exllama scratch).
    /// An MLP's matrices are all given as (hidden, intermediate).
    pub fn largest_linear(&self, size: impl Fn(u64, u64) -> u64) -> u64 {
        let moe = LayerKind {
            sliding: false,
            moe: true,
        };
        if self.moe_layers() > 0 {
            self.largest_in(&[LayerKind::default(), moe], size)
        } else {
            self.largest_in(&[LayerKind::default()], size)
        }
    }

    /// The largest `size(inputs, outputs)` over the weight matrices of blocks of the `layers`
    /// kinds.
    fn largest_in(&self, layers: &[LayerKind], size: impl Fn(u64, u64) -> u64) -> u64 {
        let mut largest = 0;
        let mut each = |i: u64, o: u64, _: u64| largest = largest.max(size(i, o));
        self.attention_linears(&mut each);
        for layer in layers {
            self.mlp_linears(*layer, &mut each);
        }
        largest
    }

    pub(crate) fn word_width(&self) -> u64 {
        if self.embed_projection > 0 {
            self.embed_projection
        } else {
            self.hidden
        }
    }

    pub(super) fn params(&self) -> ParamCounts {
        let stacks = if self.is_encoder_decoder() { 2 } else { 1 };
        let cross = self.is_encoder_decoder();
        let (dense, moe) = (
            LayerKind::default(),
            LayerKind {
                sliding: false,
                moe: true,
            },
        );
        let moe_layers = self.moe_layers();
        let dense_layers = self.layers - moe_layers;
        let encoder = self.encoder_layers * self.block_params(false, dense);
        let decoder = dense_layers * self.block_params(cross, dense)
            + moe_layers * self.block_params(cross, moe);
        let largest_block = [
            (dense_layers, self.block_params(cross, dense)),
            (moe_layers, self.block_params(cross, moe)),
            (self.encoder_layers, self.block_params(false, dense)),
        ]
        .into_iter()
        .filter(|(count, _)| *count > 0)
        .map(|(_, params)| params)
        .max()
        .unwrap_or(0);
        let mut largest_tensor = (self.vocab * self.word_width())
            .max(self.hidden * self.query_width())
            .max(self.hidden * self.dense_intermediate());
        let mut widest = |i: u64, o: u64, _: u64| largest_tensor = largest_tensor.max(i * o);
        self.attention_linears(&mut widest);
        self.mlp_linears(if moe_layers > 0 { moe } else { dense }, &mut widest);
        let cross = self.is_encoder_decoder();
        let block_linear = self.encoder_layers * self.block_linear_params(dense, false)
            + dense_layers * self.block_linear_params(dense, cross)
            + moe_layers * self.block_linear_params(moe, false);
        let own = ParamCounts {
            embeddings: self.params_of_embeddings(),
            body: encoder + decoder + stacks * self.relative_attention_buckets * self.heads,
            head: self.params_of_head(),
            largest_block,
            largest_tensor,
            block_linear,
            buffers: 0,
        };
        let beside = |tower: &TransformerSpec, embeddings: u64, head: u64| {
            let tower = tower.params();
            ParamCounts {
                embeddings: own.embeddings + tower.embeddings + embeddings,
                body: own.body + tower.body,
                head: own.head + tower.head + head,
                largest_block: own.largest_block.max(tower.largest_block),
                largest_tensor: own.largest_tensor.max(tower.largest_tensor),
                block_linear: own.block_linear + tower.block_linear,
                buffers: 0,
            }
        };
        match (&self.vision, &self.dual) {
            (Some(vision), _) => beside(&vision.tower, vision.projector, 0),
            (None, Some(dual)) => beside(&dual.tower, 0, dual.joint_params),
            (None, None) => own,
        }
    }
}
