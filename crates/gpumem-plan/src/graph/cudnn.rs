//! cuDNN's convolution workspaces on an NVIDIA GPU.
//!
//! PyTorch runs a CUDA convolution through cuDNN's v8 API (`aten/src/ATen/native/cudnn/
//! Conv_v8.cpp`): with `torch.backends.cudnn.benchmark` off (the default) it takes the engine
//! configurations cuDNN's heuristics rank first (`get_configs_from_heuristics`, mode
//! INSTANT), runs the first that builds and executes, and caches that plan per shape.
//! `run_conv_plan` allocates the plan's workspace through the caching allocator
//! (`CUDACachingAllocator::get()->allocate(plan.getWorkspaceSize())`) after the op's output
//! exists and frees it when it returns. A convolution's backward
//! (`cudnn_convolution_backward`, `ConvShared.cpp`) makes the input's gradient and runs the
//! backward-data plan, then makes the weight's gradient and runs the backward-filter plan.
//!
//! Which engine the heuristics pick is cuDNN's, not PyTorch's; what can be said without the GPU
//! is what its tensor-core engines need. They compute in NHWC (channels last), so on
//! contiguous (NCHW) tensors the workspace holds the input, the weight (a 1×1 weight is
//! already in that order) and the output transposed: the size H200 op logs show for most
//! forwards, to the byte plus 512 (`docs/plan.md`, "cuDNN convolution workspaces"). Those
//! engines run half precision on every NVIDIA GPU the catalogue knows and fp32 (as TF32,
//! PyTorch's default `allow_tf32`) from Ampere on; before Ampere fp32 runs on engines that
//! read NCHW, planned without a workspace, as is AMD's MIOpen.

use crate::model::ConvShape;
use crate::quantity::{Bytes, BytesPerElement, Elements};
use crate::workload::{Target, Workload};

/// Bytes cuDNN's workspaces hold beyond the transposed tensors (the H200 op logs' forwards).
const SLACK: Bytes = Bytes(512.0);

/// The workspaces of one convolution, bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct ConvWorkspace {
    /// Its forward's, while its output exists.
    pub forward: Bytes,
    /// Its backward's beyond the gradients it makes: the larger of the backward-data plan's,
    /// less the weight's gradient not yet made, and the backward-filter plan's.
    pub backward: Bytes,
}

/// How a workload's convolutions run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Convolutions {
    /// Bytes per element of their inputs, weights and outputs.
    act: BytesPerElement,
    /// Images in the micro-batch.
    batch: f64,
    /// cuDNN runs them on NHWC tensor-core engines.
    transposed: bool,
}

impl Convolutions {
    /// The convolutions of `workload` over `batch` images of `act`-byte elements.
    pub(super) fn of(workload: &Workload, batch: f64, act: BytesPerElement) -> Self {
        let transposed = workload.target == Target::Gpu
            && workload
                .cores
                .is_some_and(|cores| !cores.amd && (cores.tf32 || act < BytesPerElement::FP32));
        Convolutions {
            act,
            batch,
            transposed,
        }
    }

    /// The workspaces of `conv` on inputs of side `side`.
    pub(super) fn workspace(&self, conv: &ConvShape, side: u64) -> ConvWorkspace {
        if !self.transposed {
            return ConvWorkspace::default();
        }
        let out_side = conv.output_side(side);
        let input = Elements(self.batch * (conv.inputs * side * side) as f64);
        let output = Elements(self.batch * (conv.outputs * out_side * out_side) as f64);
        let weight = if conv.kernel > 1 {
            Elements((conv.inputs * conv.outputs * conv.kernel * conv.kernel) as f64)
        } else {
            Elements::ZERO
        };
        // Forward: x, w and y transposed. Backward data: dy, w and dx, made after dx and
        // before dw; backward filter: x, dy and dw, after both gradients exist.
        let transposed = (input + weight + output) * self.act + SLACK;
        ConvWorkspace {
            forward: transposed,
            backward: transposed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Dtype;

    /// A convolution by its weight's shape `[outputs, inputs, kernel, kernel]` and stride.
    fn conv(outputs: u64, inputs: u64, kernel: u64, stride: u64) -> ConvShape {
        ConvShape {
            inputs,
            outputs,
            kernel,
            stride,
        }
    }

    /// Forward workspaces of ResNet-18's convolutions in the H200 op logs
    /// (`testdata/plan/oplogs/h200.jsonl.gz`, batch 8, fp32): those whose engine is the
    /// transposing one, to the byte.
    #[test]
    fn forward_workspaces_match_the_h200_op_logs() {
        let workload = Workload::default();
        let convs = Convolutions::of(&workload, 8.0, BytesPerElement::FP32);
        for (shape, side, bytes) in [
            (conv(128, 128, 3, 1), 28, 7_012_864.0),
            (conv(256, 256, 3, 1), 14, 5_571_072.0),
            (conv(512, 256, 3, 2), 14, 7_127_552.0),
            (conv(512, 512, 3, 1), 7, 11_043_328.0),
            (conv(256, 128, 1, 2), 28, 4_817_408.0),
            (conv(128, 128, 3, 1), 16, 2_687_488.0),
            (conv(256, 128, 3, 2), 16, 2_753_024.0),
            (conv(512, 256, 3, 2), 8, 5_505_536.0),
            (conv(512, 512, 3, 1), 4, 9_961_984.0),
            (conv(256, 128, 1, 2), 16, 1_573_376.0),
            (conv(512, 256, 1, 2), 8, 786_944.0),
        ] {
            assert_eq!(
                convs.workspace(&shape, side).forward,
                Bytes(bytes),
                "{shape:?} at {side}"
            );
        }
    }

    #[test]
    fn none_on_the_cpu_nor_for_fp32_before_ampere() {
        let stem = conv(64, 3, 7, 2);
        let cpu = Workload {
            target: Target::Cpu,
            cores: None,
            ..Workload::default()
        };
        assert_eq!(
            Convolutions::of(&cpu, 8.0, BytesPerElement::FP32).workspace(&stem, 224),
            ConvWorkspace::default()
        );
        let v100 = Workload {
            cores: Some(crate::gpu::find_gpu("v100").unwrap().cores),
            ..Workload::default()
        };
        let fp32 = Convolutions::of(&v100, 8.0, BytesPerElement::FP32).workspace(&stem, 224);
        assert_eq!(fp32, ConvWorkspace::default());
        let half = Convolutions::of(&v100, 8.0, BytesPerElement(Dtype::Bf16.bytes() as f64))
            .workspace(&stem, 224);
        assert!(half.forward > Bytes::ZERO);
    }
}
