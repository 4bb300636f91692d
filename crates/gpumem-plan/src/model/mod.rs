//! Architecture descriptions (plain data) and exact parameter counts.

use crate::dtype::Dtype;
use crate::quant::CheckpointQuant;
use denoiser::DiffusionSpec;
use serde::Serialize;

pub(crate) mod denoiser;
mod resnet;
mod transformer;

pub use resnet::{ConvShape, ResnetBlock, ResnetSpec};
pub use transformer::{
    Activation, AudioStem, ContrastiveLoss, DualEncoder, Head, HeldHidden, LatentAttention,
    LayerKind, MoeLayout, Norm, Patches, SlidingWindow, TransformerSpec, VisionAdapter,
};

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
    /// The config's `quantization_config`: how a quantised checkpoint stores its block
    /// linears (what inference loads by default).
    pub quantization: Option<CheckpointQuant>,
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
    /// A diffusion UNet or DiT read from a diffusers config.
    Diffusion(Box<DiffusionSpec>),
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

    /// Whether an input is an image whose side `image_size` sets (vision transformers, dual
    /// encoders, CNNs, diffusion denoisers). A vision-language model reads its images at its
    /// tower's own size.
    pub fn reads_images(&self) -> bool {
        match &self.arch {
            Architecture::Transformer(t) => t.patches.is_some() || t.dual.is_some(),
            Architecture::Resnet(_) | Architecture::Diffusion(_) => true,
        }
    }

    /// The image side the model was trained at, where its config says: a vision
    /// transformer's or dual encoder's `image_size`, a diffusion model's sample size.
    pub fn native_image_size(&self) -> Option<u64> {
        match &self.arch {
            Architecture::Transformer(t) => t
                .patches
                .or(t.dual.as_ref().and_then(|d| d.tower.patches))
                .map(|p| p.image_size),
            Architecture::Diffusion(d) => Some(d.native_image_size()),
            Architecture::Resnet(_) => None,
        }
    }

    /// The diffusion denoiser, for a model read from a diffusers config.
    pub fn diffusion(&self) -> Option<&DiffusionSpec> {
        match &self.arch {
            Architecture::Diffusion(d) => Some(d),
            _ => None,
        }
    }

    /// Whether the model calls PyTorch's SDPA itself, so that `--attn` does not choose its
    /// attention (torchvision's Vision Transformer).
    pub fn calls_sdpa_itself(&self) -> bool {
        matches!(&self.arch, Architecture::Transformer(t) if t.sdpa_only)
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
            Architecture::Diffusion(d) => d.blocks(),
        }
    }

    /// Exact parameter counts of the model.
    pub fn params(&self) -> ParamCounts {
        match &self.arch {
            Architecture::Transformer(t) => t.params(),
            Architecture::Resnet(r) => r.params(),
            Architecture::Diffusion(d) => d.params(),
        }
    }
}

fn linear(inputs: u64, outputs: u64, bias: bool) -> u64 {
    inputs * outputs + if bias { outputs } else { 0 }
}
