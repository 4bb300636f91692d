//! Units of a torchvision ResNet.

use super::cudnn::Convolutions;
use crate::model::{ConvShape, ResnetBlock, ResnetSpec};
use crate::quantity::{Bytes, BytesPerElement, Elements};
use crate::unit::{SavedGroup, Unit, WholeTensors};
use crate::workload::{Mode, Workload};

/// Element sizes and batch of a ResNet step.
struct ResnetStep {
    /// Bytes per activation element (the autocast dtype under AMP).
    act: BytesPerElement,
    /// Bytes per input pixel.
    input_bytes: BytesPerElement,
    /// Images in the micro-batch.
    batch: f64,
    /// A training step (else a no-grad forward).
    training: bool,
    /// Their convolutions' workspaces.
    convs: Convolutions,
}

/// Units of a torchvision ResNet: stem, one per residual block, classifier head.
pub(super) fn resnet_units(spec: &ResnetSpec, workload: &Workload, batch: u64) -> Vec<Unit> {
    let act = BytesPerElement(workload.compute_dtype().bytes() as f64);
    let step = ResnetStep {
        act,
        input_bytes: BytesPerElement(workload.dtype.bytes() as f64),
        batch: batch as f64,
        training: workload.mode == Mode::Train,
        convs: Convolutions::of(workload, batch as f64, act),
    };
    let autocast = workload.amp.is_some();
    let (stem, mut side) = stem_unit(spec, workload.image_size, autocast, &step);
    let mut units = vec![stem];
    for block in spec.blocks() {
        let (unit, out_side) = block_unit(&block, side, &step);
        units.push(unit);
        side = out_side;
    }
    units.push(head_unit(spec, &step));
    units
}

/// Stem: conv 7×7/2 → BN → ReLU (in place) → max-pool 3×3/2 (saves int64 indices); with the
/// side of its output.
fn stem_unit(spec: &ResnetSpec, image: u64, autocast: bool, step: &ResnetStep) -> (Unit, u64) {
    let (act, b) = (step.act, step.batch);
    let stem = spec.stem();
    let stem_side = stem.output_side(image);
    let pooled_side = (stem_side + 2 - 3) / 2 + 1;
    let stem_out = Elements(b * (stem.outputs * stem_side * stem_side) as f64);
    let pooled = Elements(b * (stem.outputs * pooled_side * pooled_side) as f64);
    let pixels = Elements(b * (3 * image * image) as f64);
    let autocast_input = if autocast && step.input_bytes != act {
        pixels * act
    } else {
        Bytes::ZERO
    };
    let two_maps = 2.0 * stem_out * act;
    let workspace = step.convs.workspace(&stem, image);
    // What the stem saves after its convolution's output (BatchNorm's output, the pooled map
    // and its indices): not yet made while the convolution's workspace lives.
    let saved_later = stem_out * act + pooled * (act + BytesPerElement::INT64);
    let inference_live = two_maps.max(stem_out * act + workspace.forward);
    let unit = Unit {
        name: "stem",
        saved: if step.training {
            (autocast_input + stem_out * act + saved_later).bytes()
        } else {
            0.0
        },
        held: (pixels * step.input_bytes).bytes(),
        forward_transient: (workspace.forward - saved_later).max(Bytes::ZERO).bytes(),
        backward_transient: two_maps.bytes(),
        // The first convolution's backward makes only the weight's gradient.
        gradient_transient: (two_maps + workspace.backward).bytes(),
        // Convolution output and BatchNorm output; the pooled map comes after the first is
        // freed. Before them, the convolution's output and its workspace.
        inference_live: inference_live.bytes(),
        whole: workspace_tensors(
            workspace.backward,
            (inference_live > two_maps).then_some(workspace.forward),
        ),
        params: stem.params(),
        ..Unit::default()
    };
    (unit, pooled_side)
}

/// One residual block on inputs of side `side`; with the side of its output.
fn block_unit(block: &ResnetBlock, side: u64, step: &ResnetStep) -> (Unit, u64) {
    let (act, b) = (step.act, step.batch);
    let mut saved = Bytes::ZERO;
    let mut largest = Elements::ZERO;
    let mut conv_side = side;
    let mut outputs = Vec::new();
    // Workspaces: (forward and backward, bytes the block has saved once the convolution's
    // output exists, bytes live besides the block's input in a no-grad forward).
    let mut workspaces = Vec::new();
    // Each convolution's output is saved by its BatchNorm, and the BN/ReLU output by the next op.
    for conv in &block.convs {
        let workspace = step.convs.workspace(conv, conv_side);
        conv_side = conv.output_side(conv_side);
        let out = Elements(b * (conv.outputs * conv_side * conv_side) as f64);
        let previous = outputs.last().copied().unwrap_or(Elements::ZERO);
        workspaces.push((workspace, saved + out * act, (previous + out) * act));
        saved += 2.0 * out * act;
        largest = largest.max(out);
        outputs.push(out);
    }
    let shortcut = block.downsample.map_or(Elements::ZERO, |down| {
        let out_side = down.output_side(side);
        Elements(b * (down.outputs * out_side * out_side) as f64)
    });
    saved += shortcut * act;
    if let Some(down) = &block.downsample {
        // The shortcut's convolution runs after the main path, on the block's input.
        let last = outputs.last().copied().unwrap_or(Elements::ZERO);
        workspaces.push((
            step.convs.workspace(down, side),
            saved,
            (last + shortcut) * act,
        ));
    }
    let input = Elements(b * (block.convs[0].inputs * side * side) as f64);
    // A convolution's forward workspace on top of what the block has saved by then (the
    // unit's forward transient is counted on top of all it saves), or of what a no-grad
    // forward holds; its backward workspace while the block's gradients are made.
    let forward_workspace = workspaces
        .iter()
        .map(|(w, saved_by_then, _)| w.forward - (saved - *saved_by_then))
        .fold(Bytes::ZERO, Bytes::max);
    let inference_workspace = workspaces
        .iter()
        .map(|(w, _, live)| input * act + *live + w.forward)
        .fold(Bytes::ZERO, Bytes::max);
    let backward_workspace = workspaces
        .iter()
        .map(|(w, _, _)| w.backward)
        .fold(Bytes::ZERO, Bytes::max);
    // No-grad: input (kept for the shortcut), the previous ReLU output, the last conv and BN
    // outputs (BN is not in place), and the downsampled shortcut.
    let (last, middle) = match outputs.as_slice() {
        [.., middle, last] => (*last, *middle),
        _ => (largest, Elements::ZERO),
    };
    let params = block
        .convs
        .iter()
        .chain(block.downsample.iter())
        .map(ConvShape::params)
        .sum();
    let unit = Unit {
        name: "block",
        saved: if step.training { saved.bytes() } else { 0.0 },
        checkpoint: Some((input * act).bytes()),
        forward_transient: (largest * act).max(forward_workspace).bytes(),
        backward_transient: (3.0 * largest * act).bytes(),
        gradient_transient: (2.0 * largest * act + backward_workspace).bytes(),
        inference_live: ((input + middle + 2.0 * last + shortcut) * act)
            .max(inference_workspace)
            .bytes(),
        whole: workspace_tensors(backward_workspace, None),
        params,
        ..Unit::default()
    };
    (unit, conv_side)
}

/// The classifier: pooled features → logits.
fn head_unit(spec: &ResnetSpec, step: &ResnetStep) -> Unit {
    let (act, b) = (step.act, step.batch);
    let fp32 = BytesPerElement::FP32;
    let features = Elements(b * spec.features() as f64);
    let logits = Elements(b * spec.num_classes as f64);
    Unit {
        name: "head",
        saved: if step.training {
            (features * act + logits * fp32).bytes()
        } else {
            0.0
        },
        held: (logits * act).bytes(),
        backward_transient: (2.0 * logits * fp32 + features * act).bytes(),
        gradient_transient: (logits * fp32 + features * act).bytes(),
        inference_live: (features * act).bytes(),
        params: spec.features() * spec.num_classes + spec.num_classes,
        ..Unit::default()
    }
}

/// A unit's convolution workspaces as single tensors of the allocation sequence: the largest
/// backward one among its gradient transients, and in a no-grad forward the one at its peak.
fn workspace_tensors(backward: Bytes, inference: Option<Bytes>) -> WholeTensors {
    WholeTensors {
        gradient_transient: [backward.bytes(), 0.0],
        live: inference.map_or(SavedGroup::default(), |bytes| SavedGroup {
            bytes: bytes.bytes(),
            tensor: bytes.bytes(),
        }),
        ..WholeTensors::default()
    }
}
