//! Architecture descriptions (plain data) and exact parameter counts.

use crate::workload::Dtype;
use serde::Serialize;

/// A model the planner can reason about.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    /// Display name (catalogue name or config path).
    pub name: String,
    /// The architecture.
    pub arch: Architecture,
    /// The config's `torch_dtype`, the dtype its weights are published in: what inference loads
    /// by default (`Settings::resolve` makes it the default weight dtype of inference plans).
    /// None when the config does not say.
    pub torch_dtype: Option<Dtype>,
}

/// Transformer or convolutional network.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Architecture {
    /// Decoder-only, encoder-only, encoder-decoder or vision transformer (boxed: it has many
    /// more fields than a ResNet).
    Transformer(Box<TransformerSpec>),
    /// torchvision-style ResNet.
    Resnet(ResnetSpec),
}

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
    /// Encoder-decoder LM head (T5ForConditionalGeneration).
    Seq2SeqLm,
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
}

/// torchvision ResNet: a stem, four stages of blocks, global pooling and a classifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ResnetSpec {
    /// Blocks per stage.
    pub blocks: [u64; 4],
    /// Bottleneck blocks (ResNet-50 and deeper) instead of basic blocks.
    pub bottleneck: bool,
    /// Classifier outputs.
    pub num_classes: u64,
}

/// Parameter counts by role; sums are exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ParamCounts {
    /// Embedding tables (token, position, type, patch) and their norm.
    pub embeddings: u64,
    /// All blocks (or convolutional stages).
    pub body: u64,
    /// Final norm, pooler, classifier and untied LM head.
    pub head: u64,
    /// Largest single block, for ZeRO-3/FSDP gathering and pipeline stages.
    pub largest_block: u64,
    /// Largest single tensor, for per-parameter optimizer temporaries.
    pub largest_tensor: u64,
    /// Parameters inside linear layers of the blocks (what LoRA adapts and quantization shrinks).
    pub block_linear: u64,
    /// Non-parameter buffers (BatchNorm running statistics), elements.
    pub buffers: u64,
}

impl ParamCounts {
    /// Total parameters.
    pub fn total(&self) -> u64 {
        self.embeddings + self.body + self.head
    }
}

impl ModelSpec {
    /// The same encoder with a pooler + classifier head (what `…ForSequenceClassification`
    /// trains); decoders and CNNs are returned unchanged.
    pub fn with_sequence_classification_head(mut self, labels: u64) -> Self {
        if let Architecture::Transformer(t) = &mut self.arch {
            if matches!(t.head, Head::Pooler | Head::MaskedLm | Head::None)
                && !t.is_encoder_decoder()
            {
                t.head = Head::SequenceClassification { labels };
            }
        }
        self
    }

    /// Most tokens one sequence may have: the rows of a learned position table (beyond them a
    /// run fails). None for CNNs and for rotary or relative positions.
    pub fn token_limit(&self) -> Option<u64> {
        match &self.arch {
            Architecture::Transformer(t) if t.learned_positions > 0 => t.max_positions,
            _ => None,
        }
    }

    /// Whether the input is a token sequence (`seq`) rather than an image (`image_size`).
    pub fn reads_tokens(&self) -> bool {
        matches!(&self.arch, Architecture::Transformer(t) if t.patches.is_none())
    }

    /// Whether a forward of the model can build a KV cache (it has a decoder stack).
    pub fn has_decoder(&self) -> bool {
        matches!(&self.arch, Architecture::Transformer(t) if t.decoder)
    }

    /// Whether the model's head computes a language-model loss over the vocabulary when the
    /// batch carries labels (causal, masked and encoder-decoder LM heads).
    pub fn has_lm_loss(&self) -> bool {
        matches!(&self.arch, Architecture::Transformer(t)
            if matches!(t.head, Head::CausalLm | Head::Seq2SeqLm | Head::MaskedLm))
    }

    /// Blocks of the body (both stacks of an encoder-decoder): at most this many pipeline stages.
    pub fn blocks(&self) -> u64 {
        match &self.arch {
            Architecture::Transformer(t) => t.layers + t.encoder_layers,
            Architecture::Resnet(r) => r.blocks.iter().sum(),
        }
    }

    /// Exact parameter counts of the model.
    pub fn params(&self) -> ParamCounts {
        match &self.arch {
            Architecture::Transformer(t) => t.params(),
            Architecture::Resnet(r) => r.params(),
        }
    }
}

fn linear(inputs: u64, outputs: u64, bias: bool) -> u64 {
    inputs * outputs + if bias { outputs } else { 0 }
}

impl TransformerSpec {
    /// Query width `heads × head_dim`.
    pub fn query_width(&self) -> u64 {
        self.heads * self.head_dim
    }

    /// Key (or value) width `kv_heads × head_dim`.
    pub fn kv_width(&self) -> u64 {
        self.kv_heads * self.head_dim
    }

    /// Is this an encoder-decoder (T5)?
    pub fn is_encoder_decoder(&self) -> bool {
        self.encoder_layers > 0
    }

    /// Is this a causal decoder-only LM?
    pub fn is_causal_lm(&self) -> bool {
        self.head == Head::CausalLm
    }

    fn norm_params(&self) -> u64 {
        self.hidden * if self.norm_bias { 2 } else { 1 }
    }

    /// Parameters of one attention module (self- or cross-attention).
    pub fn attention_params(&self) -> u64 {
        let (h, q, kv) = (self.hidden, self.query_width(), self.kv_width());
        linear(h, q, self.qkv_bias) + 2 * linear(h, kv, self.qkv_bias) + linear(q, h, self.out_bias)
    }

    /// Matrices of one (expert) MLP.
    fn mlp_matrices(&self) -> u64 {
        if self.gated_mlp {
            3
        } else {
            2
        }
    }

    /// Parameters of one MLP (all experts and the router for MoE).
    pub fn mlp_params(&self) -> u64 {
        let (h, f) = (self.hidden, self.intermediate);
        let biases = if self.mlp_bias {
            (self.mlp_matrices() - 1) * f + h
        } else {
            0
        };
        let one = self.mlp_matrices() * h * f + biases;
        if self.experts > 1 {
            self.experts * one + h * self.experts
        } else {
            one
        }
    }

    /// Parameters of one block; `cross_attention` for decoder blocks of an encoder-decoder.
    pub fn block_params(&self, cross_attention: bool) -> u64 {
        let norms = if self.shared_block_norm { 1 } else { 2 } + u64::from(cross_attention);
        let attention = self.attention_params() * if cross_attention { 2 } else { 1 };
        attention + self.mlp_params() + norms * self.norm_params()
    }

    /// Parameters of the embedding tables (token, position, type, patches, projections, norm).
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
            let positions = (p.image_size / p.patch).pow(2) + 1;
            embeddings += linear(p.channels * p.patch * p.patch, h, true) + h + positions * h;
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
            }
    }

    /// Weights of the linear layers of one block (what LoRA adapts and autocast copies).
    pub fn block_linear_params(&self) -> u64 {
        let (h, q, kv) = (self.hidden, self.query_width(), self.kv_width());
        2 * h * q + 2 * h * kv + self.mlp_matrices() * h * self.intermediate * self.experts
    }

    fn word_width(&self) -> u64 {
        if self.embed_projection > 0 {
            self.embed_projection
        } else {
            self.hidden
        }
    }

    fn params(&self) -> ParamCounts {
        let stacks = if self.is_encoder_decoder() { 2 } else { 1 };
        let encoder = self.encoder_layers * self.block_params(false);
        let decoder = self.layers * self.block_params(self.is_encoder_decoder());
        let mlp_tensor = self.hidden * self.intermediate;
        ParamCounts {
            embeddings: self.params_of_embeddings(),
            body: encoder + decoder + stacks * self.relative_attention_buckets * self.heads,
            head: self.params_of_head(),
            largest_block: self.block_params(self.is_encoder_decoder()),
            largest_tensor: (self.vocab * self.word_width())
                .max(mlp_tensor)
                .max(self.hidden * self.query_width()),
            block_linear: self.block_linear_params() * (self.layers + self.encoder_layers),
            buffers: 0,
        }
    }
}

/// One convolution (+ BatchNorm) of a ResNet, as shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvShape {
    /// Input channels.
    pub inputs: u64,
    /// Output channels.
    pub outputs: u64,
    /// Kernel side.
    pub kernel: u64,
    /// Stride.
    pub stride: u64,
}

impl ConvShape {
    /// Weights of the convolution (no bias) plus its BatchNorm weight and bias.
    pub fn params(&self) -> u64 {
        self.inputs * self.outputs * self.kernel * self.kernel + 2 * self.outputs
    }

    /// Output side for an input side (padding `kernel / 2`).
    pub fn output_side(&self, side: u64) -> u64 {
        (side + 2 * (self.kernel / 2) - self.kernel) / self.stride + 1
    }
}

/// One residual block: its convolutions in order and an optional downsampling shortcut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResnetBlock {
    /// Main-path convolutions.
    pub convs: Vec<ConvShape>,
    /// 1×1 shortcut convolution when shape changes.
    pub downsample: Option<ConvShape>,
}

impl ResnetSpec {
    /// Channels the stem produces.
    pub const STEM_CHANNELS: u64 = 64;

    /// Channel growth of the last convolution in a block.
    pub fn expansion(&self) -> u64 {
        if self.bottleneck {
            4
        } else {
            1
        }
    }

    /// The stem convolution (7×7, stride 2).
    pub fn stem(&self) -> ConvShape {
        ConvShape {
            inputs: 3,
            outputs: Self::STEM_CHANNELS,
            kernel: 7,
            stride: 2,
        }
    }

    /// All residual blocks in order.
    pub fn blocks(&self) -> Vec<ResnetBlock> {
        let mut blocks = Vec::new();
        let mut channels = Self::STEM_CHANNELS;
        for (stage, &count) in self.blocks.iter().enumerate() {
            let width = Self::STEM_CHANNELS << stage;
            for index in 0..count {
                let stride = if stage > 0 && index == 0 { 2 } else { 1 };
                let out = width * self.expansion();
                let convs = if self.bottleneck {
                    vec![
                        ConvShape {
                            inputs: channels,
                            outputs: width,
                            kernel: 1,
                            stride: 1,
                        },
                        ConvShape {
                            inputs: width,
                            outputs: width,
                            kernel: 3,
                            stride,
                        },
                        ConvShape {
                            inputs: width,
                            outputs: out,
                            kernel: 1,
                            stride: 1,
                        },
                    ]
                } else {
                    vec![
                        ConvShape {
                            inputs: channels,
                            outputs: width,
                            kernel: 3,
                            stride,
                        },
                        ConvShape {
                            inputs: width,
                            outputs: width,
                            kernel: 3,
                            stride: 1,
                        },
                    ]
                };
                let downsample = (stride != 1 || channels != out).then_some(ConvShape {
                    inputs: channels,
                    outputs: out,
                    kernel: 1,
                    stride,
                });
                blocks.push(ResnetBlock { convs, downsample });
                channels = out;
            }
        }
        blocks
    }

    /// Features entering the classifier.
    pub fn features(&self) -> u64 {
        512 * self.expansion()
    }

    fn params(&self) -> ParamCounts {
        let blocks = self.blocks();
        let block_params = |b: &ResnetBlock| -> u64 {
            b.convs
                .iter()
                .chain(b.downsample.iter())
                .map(ConvShape::params)
                .sum()
        };
        let bn_channels: u64 = blocks
            .iter()
            .flat_map(|b| b.convs.iter().chain(b.downsample.iter()))
            .map(|c| c.outputs)
            .sum::<u64>()
            + Self::STEM_CHANNELS;
        let largest_tensor = blocks
            .iter()
            .flat_map(|b| b.convs.iter().chain(b.downsample.iter()))
            .map(|c| c.inputs * c.outputs * c.kernel * c.kernel)
            .chain([self.features() * self.num_classes])
            .max()
            .unwrap_or(0);
        ParamCounts {
            embeddings: self.stem().params(),
            body: blocks.iter().map(block_params).sum(),
            head: linear(self.features(), self.num_classes, true),
            largest_block: blocks.iter().map(block_params).max().unwrap_or(0),
            largest_tensor,
            block_linear: 0,
            // running_mean and running_var per BatchNorm channel (num_batches_tracked is negligible).
            buffers: 2 * bn_channels,
        }
    }
}

impl TransformerSpec {
    /// Trainable parameters that rank-`rank` LoRA adapters add to every linear layer of every block.
    pub fn lora_params(&self, rank: u64) -> u64 {
        let (h, q, kv, f) = (
            self.hidden,
            self.query_width(),
            self.kv_width(),
            self.intermediate,
        );
        let attention = (h + q) * 2 + (h + kv) * 2;
        let mlp = self.mlp_matrices() * (h + f) * self.experts;
        rank * (attention + mlp) * (self.layers + self.encoder_layers)
    }
}
