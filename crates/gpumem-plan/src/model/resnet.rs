//! torchvision ResNets: stages of convolution blocks, and their exact parameter counts.

use super::{linear, ParamCounts};
use serde::Serialize;

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

    pub(super) fn params(&self) -> ParamCounts {
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
