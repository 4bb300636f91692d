//! Units of a torchvision ResNet.

use crate::model::{ConvShape, ResnetBlock, ResnetSpec};
use crate::unit::Unit;
use crate::workload::{Mode, Workload};

/// Element sizes and batch of a ResNet step.
struct ResnetStep {
    /// Bytes per activation element (the autocast dtype under AMP).
    act: f64,
    /// Bytes per input pixel.
    input_bytes: f64,
    /// Images in the micro-batch.
    batch: f64,
    /// A training step (else a no-grad forward).
    training: bool,
}

/// Units of a torchvision ResNet: stem, one per residual block, classifier head.
pub(super) fn resnet_units(spec: &ResnetSpec, workload: &Workload, batch: u64) -> Vec<Unit> {
    let step = ResnetStep {
        act: workload.compute_dtype().bytes() as f64,
        input_bytes: workload.dtype.bytes() as f64,
        batch: batch as f64,
        training: workload.mode == Mode::Train,
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
    let stem_out = b * (stem.outputs * stem_side * stem_side) as f64;
    let pooled = b * (stem.outputs * pooled_side * pooled_side) as f64;
    let pixels = b * (3 * image * image) as f64;
    let autocast_input = if autocast && step.input_bytes != act {
        pixels * act
    } else {
        0.0
    };
    let unit = Unit {
        name: "stem",
        saved: if step.training {
            autocast_input + 2.0 * stem_out * act + pooled * (act + 8.0)
        } else {
            0.0
        },
        held: pixels * step.input_bytes,
        forward_transient: 0.0,
        backward_transient: 2.0 * stem_out * act,
        gradient_transient: 2.0 * stem_out * act,
        // Convolution output and BatchNorm output; the pooled map comes after the first is freed.
        inference_live: 2.0 * stem_out * act,
        params: stem.params(),
        ..Unit::default()
    };
    (unit, pooled_side)
}

/// One residual block on inputs of side `side`; with the side of its output.
fn block_unit(block: &ResnetBlock, side: u64, step: &ResnetStep) -> (Unit, u64) {
    let (act, b) = (step.act, step.batch);
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
    let unit = Unit {
        name: "block",
        saved: if step.training { saved } else { 0.0 },
        checkpoint: Some(input * act),
        forward_transient: largest * act,
        backward_transient: 3.0 * largest * act,
        gradient_transient: 2.0 * largest * act,
        inference_live: (input + middle + 2.0 * last + shortcut) * act,
        params,
        ..Unit::default()
    };
    (unit, conv_side)
}

/// The classifier: pooled features → logits.
fn head_unit(spec: &ResnetSpec, step: &ResnetStep) -> Unit {
    let (act, b) = (step.act, step.batch);
    let features = b * spec.features() as f64;
    let logits = b * spec.num_classes as f64;
    Unit {
        name: "head",
        saved: if step.training {
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
    }
}
