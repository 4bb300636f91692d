//! The shapes of diffusion denoisers (a Stable Diffusion UNet, a DiT) and their parameter
//! counts: part of the model, below the diffusion module that reads them from diffusers
//! configs and plans their steps (re-exported there).

use crate::model::ParamCounts;
use serde::Serialize;

/// Pixels per latent pixel along each side (the Stable Diffusion VAE downsamples by 8).
pub const VAE_FACTOR: u64 = 8;

/// Tokens of the text encoder's hidden states the UNet cross-attends to (CLIP's 77: the Stable
/// Diffusion pipelines pad every prompt to the tokenizer's `model_max_length`).
pub const TEXT_TOKENS: u64 = 77;

/// `_class_name` values the planner understands.
pub const SUPPORTED_CLASSES: &[&str] = &[
    "UNet2DConditionModel",
    "DiTTransformer2DModel",
    "Transformer2DModel",
];

/// A diffusion denoiser.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DiffusionSpec {
    /// A Stable Diffusion style UNet with cross-attention transformers.
    Unet(UnetSpec),
    /// A class-conditional diffusion transformer on latent patches.
    Dit(DitSpec),
}

/// `UNet2DConditionModel`: resnet and cross-attention stages down, a middle block, and the
/// mirrored stages up, which concatenate the skip connections the down path kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnetSpec {
    /// Latent channels in.
    pub in_channels: u64,
    /// Channels out (the predicted noise).
    pub out_channels: u64,
    /// Latent side the model was trained at (`sample_size`).
    pub sample_size: u64,
    /// Kernel of `conv_in` and of `conv_out`.
    pub conv_kernels: (u64, u64),
    /// Channels of each stage (`block_out_channels`).
    pub channels: Vec<u64>,
    /// Resnets per down stage (`layers_per_block`); an up stage has one more.
    pub layers: Vec<u64>,
    /// Down stages with cross-attention (`CrossAttnDownBlock2D`).
    pub down_attention: Vec<bool>,
    /// Up stages with cross-attention, in up order (`CrossAttnUpBlock2D`).
    pub up_attention: Vec<bool>,
    /// Transformer blocks per attention of each down stage (`transformer_layers_per_block`).
    pub transformer_layers: Vec<u64>,
    /// The same for the up stages, in up order (`reverse_transformer_layers_per_block`, else
    /// the down stages' reversed).
    pub up_transformer_layers: Vec<u64>,
    /// Attention heads of each stage (`num_attention_heads`, which older configs spell
    /// `attention_head_dim`).
    pub heads: Vec<u64>,
    /// Width of the text hidden states each stage attends to (`cross_attention_dim`).
    pub cross_dim: Vec<u64>,
    /// Width of the time embedding (`time_embedding_dim`, else 4 × the first stage's channels).
    pub time_embed: u64,
    /// Input width of SDXL's added text-and-time embedding (`addition_embed_type: "text_time"`,
    /// `projection_class_embeddings_input_dim`); None without.
    pub addition: Option<u64>,
}

/// `DiTTransformer2DModel`: patches of the latent through adaLN-zero transformer blocks, each
/// with its own timestep and class embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DitSpec {
    /// Width (`num_attention_heads × attention_head_dim`).
    pub hidden: u64,
    /// Attention heads.
    pub heads: u64,
    /// Blocks.
    pub layers: u64,
    /// Patch side in latent pixels.
    pub patch: u64,
    /// Latent channels in.
    pub in_channels: u64,
    /// Channels out (noise and, with learned sigma, the variance).
    pub out_channels: u64,
    /// Latent side of the position table (`sample_size`).
    pub sample_size: u64,
    /// Class labels (`num_embeds_ada_norm`); the table has one more row, the unconditional one.
    pub classes: u64,
}

/// One module of a UNet, in forward order, with the shapes that decide its parameters and its
/// activations. `level` counts the downsamplings before it (side = latent side / 2^level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnetLayer {
    /// `conv_in`, the time embedding and SDXL's added embedding.
    Stem,
    /// `ResnetBlock2D`: GroupNorm, SiLU, conv, time projection, GroupNorm, SiLU, conv, and a
    /// 1×1 shortcut when the channels change. `inputs` includes a concatenated skip.
    Resnet {
        /// Input channels.
        inputs: u64,
        /// Output channels.
        outputs: u64,
        /// Downsamplings before it.
        level: u32,
    },
    /// `Transformer2DModel`: GroupNorm, projection in, `layers` transformer blocks
    /// (self-attention, cross-attention, GEGLU feed-forward), projection out, residual.
    Attention {
        /// Channels.
        channels: u64,
        /// Heads.
        heads: u64,
        /// Transformer blocks.
        layers: u64,
        /// Width of the text hidden states.
        cross_dim: u64,
        /// Downsamplings before it.
        level: u32,
    },
    /// `Downsample2D`: a 3×3 stride-2 convolution.
    Downsample {
        /// Channels.
        channels: u64,
        /// Downsamplings before it.
        level: u32,
    },
    /// `Upsample2D`: nearest ×2 interpolation and a 3×3 convolution.
    Upsample {
        /// Channels.
        channels: u64,
        /// Downsamplings before it (the input's level).
        level: u32,
    },
    /// GroupNorm, SiLU and `conv_out`.
    Out,
}

/// A step of the UNet walk: the module and what happens to the skip connections around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnetStep {
    /// The module.
    pub layer: UnetLayer,
    /// Its output is kept as a skip connection for the up path.
    pub pushes_skip: bool,
    /// It starts an up stage, which takes this many skips off the stack (the UNet's forward
    /// holds them until the next stage starts).
    pub takes_skips: u64,
    /// It concatenates this many channels of a skip onto its input (an up-path resnet).
    pub skip_channels: u64,
}

/// Parameters of a GroupNorm over `channels`: a scale and a shift each.
pub(crate) fn groupnorm(channels: u64) -> u64 {
    2 * channels
}

/// Parameters of a biased linear.
pub(crate) fn linear(inputs: u64, outputs: u64) -> u64 {
    inputs * outputs + outputs
}

/// Parameters of a biased square convolution.
pub(crate) fn conv(inputs: u64, outputs: u64, kernel: u64) -> u64 {
    inputs * outputs * kernel * kernel + outputs
}

impl UnetSpec {
    /// The modules in forward order (down stages, middle block, up stages).
    pub fn walk(&self) -> Vec<UnetStep> {
        let step = |layer| UnetStep {
            layer,
            pushes_skip: false,
            takes_skips: 0,
            skip_channels: 0,
        };
        let pushed = |layer| UnetStep {
            pushes_skip: true,
            ..step(layer)
        };
        let stages = self.channels.len();
        let mut steps = vec![pushed(UnetLayer::Stem)];
        let mut channels = self.channels[0];
        let mut skips = vec![channels];
        for stage in 0..stages {
            let outputs = self.channels[stage];
            let level = stage as u32;
            for _ in 0..self.layers[stage] {
                let resnet = UnetLayer::Resnet {
                    inputs: channels,
                    outputs,
                    level,
                };
                channels = outputs;
                if self.down_attention[stage] {
                    steps.push(step(resnet));
                    steps.push(pushed(self.attention(stage, level, false)));
                } else {
                    steps.push(pushed(resnet));
                }
                skips.push(outputs);
            }
            if stage + 1 < stages {
                steps.push(pushed(UnetLayer::Downsample { channels, level }));
                skips.push(channels);
            }
        }
        steps.extend(self.middle_block(channels).map(step));
        for up in 0..stages {
            let stage = stages - 1 - up;
            let level = stage as u32;
            let outputs = self.channels[stage];
            let resnets = self.layers[stage] + 1;
            for index in 0..resnets {
                let skip = skips.pop().unwrap_or(0);
                steps.push(UnetStep {
                    takes_skips: if index == 0 { resnets } else { 0 },
                    skip_channels: skip,
                    ..step(UnetLayer::Resnet {
                        inputs: channels + skip,
                        outputs,
                        level,
                    })
                });
                channels = outputs;
                if self.up_attention[up] {
                    steps.push(step(self.attention(stage, level, true)));
                }
            }
            if stage > 0 {
                steps.push(step(UnetLayer::Upsample { channels, level }));
            }
        }
        steps.push(step(UnetLayer::Out));
        steps
    }

    /// The middle block, at the bottom level over `channels`: a resnet, the bottom stage's
    /// attention and a second resnet.
    fn middle_block(&self, channels: u64) -> [UnetLayer; 3] {
        let stages = self.channels.len();
        let bottom = (stages - 1) as u32;
        let mid = UnetLayer::Resnet {
            inputs: channels,
            outputs: channels,
            level: bottom,
        };
        let attention = UnetLayer::Attention {
            channels,
            heads: self.heads[stages - 1],
            layers: self.transformer_layers[stages - 1],
            cross_dim: self.cross_dim[stages - 1],
            level: bottom,
        };
        [mid, attention, mid]
    }

    /// The attention of stage `stage` (down or up).
    fn attention(&self, stage: usize, level: u32, up: bool) -> UnetLayer {
        let stages = self.channels.len();
        UnetLayer::Attention {
            channels: self.channels[stage],
            heads: self.heads[stage],
            layers: if up {
                self.up_transformer_layers[stages - 1 - stage]
            } else {
                self.transformer_layers[stage]
            },
            cross_dim: self.cross_dim[stage],
            level,
        }
    }

    /// Parameters of one module.
    pub fn layer_params(&self, layer: UnetLayer) -> u64 {
        let c0 = self.channels[0];
        let t = self.time_embed;
        match layer {
            UnetLayer::Stem => {
                conv(self.in_channels, c0, self.conv_kernels.0)
                    + linear(c0, t)
                    + linear(t, t)
                    + self
                        .addition
                        .map_or(0, |inputs| linear(inputs, t) + linear(t, t))
            }
            UnetLayer::Resnet {
                inputs, outputs, ..
            } => {
                groupnorm(inputs)
                    + conv(inputs, outputs, 3)
                    + linear(t, outputs)
                    + groupnorm(outputs)
                    + conv(outputs, outputs, 3)
                    + if inputs != outputs {
                        conv(inputs, outputs, 1)
                    } else {
                        0
                    }
            }
            UnetLayer::Attention {
                channels,
                heads,
                layers,
                cross_dim,
                ..
            } => {
                let inner = heads * (channels / heads);
                let block = 3 * groupnorm(inner)
                    + 3 * inner * inner
                    + linear(inner, inner)
                    + inner * inner
                    + 2 * cross_dim * inner
                    + linear(inner, inner)
                    + linear(inner, 8 * inner)
                    + linear(4 * inner, inner);
                groupnorm(channels)
                    + linear(channels, inner)
                    + layers * block
                    + linear(inner, channels)
            }
            UnetLayer::Downsample { channels, .. } | UnetLayer::Upsample { channels, .. } => {
                conv(channels, channels, 3)
            }
            UnetLayer::Out => groupnorm(c0) + conv(c0, self.out_channels, self.conv_kernels.1),
        }
    }

    /// Largest single weight tensor of one module.
    fn largest_tensor(&self, layer: UnetLayer) -> u64 {
        match layer {
            UnetLayer::Stem => self.time_embed * self.time_embed,
            UnetLayer::Resnet {
                inputs, outputs, ..
            } => 9 * inputs.max(outputs) * outputs,
            UnetLayer::Attention { channels, .. } => 8 * channels * channels,
            UnetLayer::Downsample { channels, .. } | UnetLayer::Upsample { channels, .. } => {
                9 * channels * channels
            }
            UnetLayer::Out => 9 * self.channels[0] * self.out_channels,
        }
    }

    pub(crate) fn params(&self) -> ParamCounts {
        let steps = self.walk();
        let per: Vec<u64> = steps.iter().map(|s| self.layer_params(s.layer)).collect();
        let (stem, out) = (per[0], per[per.len() - 1]);
        let linear_weights: u64 = steps
            .iter()
            .map(|s| match s.layer {
                UnetLayer::Attention {
                    channels,
                    heads,
                    layers,
                    cross_dim,
                    ..
                } => {
                    // proj_in and proj_out, then per transformer layer: self-attention q, k,
                    // v, out; cross-attention q and out on the inner width, k and v from the
                    // text states; GEGLU's inner → 8·inner projection and its 4·inner → inner
                    // output (the same modules `layer_params` counts, without norms and biases).
                    let inner = heads * (channels / heads);
                    2 * channels * inner
                        + layers * (6 * inner * inner + 2 * cross_dim * inner + 12 * inner * inner)
                }
                _ => 0,
            })
            .sum();
        ParamCounts {
            embeddings: stem,
            body: per.iter().sum::<u64>() - stem - out,
            head: out,
            largest_block: per.iter().copied().max().unwrap_or(0),
            largest_tensor: steps
                .iter()
                .map(|s| self.largest_tensor(s.layer))
                .max()
                .unwrap_or(0),
            block_linear: linear_weights,
            buffers: 0,
        }
    }
}

impl DitSpec {
    /// Tokens of a latent of side `side`.
    pub fn tokens(&self, side: u64) -> u64 {
        (side / self.patch).pow(2)
    }

    /// Parameters of one block: its timestep MLP and class table, the adaLN projection to six
    /// modulations, attention with biases, and the tanh-GELU MLP.
    pub fn block_params(&self) -> u64 {
        let h = self.hidden;
        let embedding = linear(256, h) + linear(h, h) + (self.classes + 1) * h;
        embedding + linear(h, 6 * h) + 4 * linear(h, h) + linear(h, 4 * h) + linear(4 * h, h)
    }

    pub(crate) fn params(&self) -> ParamCounts {
        let h = self.hidden;
        let patch_out = self.patch * self.patch * self.out_channels;
        ParamCounts {
            embeddings: conv(self.in_channels, h, self.patch),
            body: self.layers * self.block_params(),
            head: linear(h, 2 * h) + linear(h, patch_out),
            largest_block: self.block_params(),
            largest_tensor: (6 * h * h).max(self.classes * h),
            block_linear: self.layers * (12 * h * h),
            // The sin-cos position table, a buffer of one row per patch.
            buffers: self.tokens(self.sample_size) * h,
        }
    }
}

impl DiffusionSpec {
    /// Exact parameter counts.
    pub fn params(&self) -> ParamCounts {
        match self {
            DiffusionSpec::Unet(u) => u.params(),
            DiffusionSpec::Dit(d) => d.params(),
        }
    }

    /// Blocks a pipeline could split at (resnets and transformer blocks).
    pub fn blocks(&self) -> u64 {
        match self {
            DiffusionSpec::Unet(u) => u.walk().len() as u64,
            DiffusionSpec::Dit(d) => d.layers,
        }
    }

    /// The image side the model was trained at, in pixels.
    pub fn native_image_size(&self) -> u64 {
        VAE_FACTOR
            * match self {
                DiffusionSpec::Unet(u) => u.sample_size,
                DiffusionSpec::Dit(d) => d.sample_size,
            }
    }
}
