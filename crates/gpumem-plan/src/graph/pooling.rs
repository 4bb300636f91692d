//! Heads of vision and dual encoders: SigLIP's attention pool, CLIP's contrastive head.

use super::TransformerGraph;
use crate::model::{ContrastiveLoss, DualEncoder};
use crate::quantity::{Bytes, BytesPerElement, Elements, Tokens, Width};
use crate::unit::Unit;
use crate::workload::{Loss, Target};

impl TransformerGraph<'_> {
    /// SigLIP's attention-pooling head in training, as two units in forward order:
    /// `nn.MultiheadAttention` over the final norm's output (one learned query), then its output
    /// projection, norm and MLP, whose gradients exist before the attention's backward runs.
    /// The attention's packed key/value projection reads a transposed view of the norm output
    /// (its matmul saves a contiguous copy) and makes its output contiguous (k and v are views
    /// of it, saved by the score and output products); in backward, the gradients of k and v
    /// each come back as a zero-filled tensor of the packed projection's size
    /// (`select_backward`) beside one of their gradients, after the packed output is released.
    pub(super) fn attention_pool(&self) -> [Unit; 2] {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, Width(spec.hidden as f64));
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
        let cpu_half = self.workload.target == Target::Cpu && act < BytesPerElement::FP32;
        let expanded_weight = if self.training && self.workload.freeze_vision_tower && cpu_half {
            // The 2h × h weight for every key position.
            let (positions, h) = (self.sequence().count(), h.elements());
            Elements(positions * 2.0 * h * h) * act
        } else {
            Bytes::ZERO
        };
        let attention = Unit {
            name: "head",
            forward_transient: expanded_weight.bytes(),
            saved: (tokens * (self.norm_saved() + act * h + act * 2.0 * h)).bytes(),
            backward_transient: (tokens * act * 3.0 * h).bytes(),
            gradient_transient: (tokens * self.bytes.residual * h).bytes(),
            params: attention_params,
            ..Unit::default()
        };
        let rest = Unit {
            name: "head",
            saved: pooled.saved - (tokens * self.norm_saved()).bytes(),
            params: pooled.params - attention_params,
            ..Unit::default()
        };
        [attention, rest]
    }

    /// A dual encoder's joint head: each tower's pooled output projected into the shared
    /// space and normalised, every text scored against every image (batch × batch), and in
    /// training the contrastive loss over those scores (`return_loss=True`).
    pub(super) fn contrastive(&self, dual: &DualEncoder) -> Unit {
        let act = self.bytes.act;
        // One embedding per sample and tower; a score for every text and image.
        let b = Tokens(self.batch);
        // The projections' outputs and their normalised copies, for both towers.
        let embeds = 4.0 * b * Width(dual.embed_dim as f64) * act;
        let scores = b * b.as_width();
        let loss = self.training && self.workload.loss != Loss::None;
        // Two fp32 tensors per score.
        let two_fp32 = BytesPerElement(8.0);
        let (saved, transient) = match (loss, dual.loss) {
            // The product of the scores with the exponentiated scale saves the matmul's output;
            // cross-entropy over the rows and over the transpose saves two log-softmax outputs.
            (true, ContrastiveLoss::Softmax) => (3.0 * act * scores, act * scores),
            // `logsigmoid(signs · (scores · scale + bias))`: the matmul's and the bias sum's
            // outputs, the fp32 ±1 matrix (built from an identity) and the product; on CUDA
            // `log_sigmoid_forward` keeps no buffer.
            (true, ContrastiveLoss::Sigmoid) => {
                ((2.0 * act + two_fp32) * scores, (act + two_fp32) * scores)
            }
            // No loss: the scores (and their scaled copy) are returned.
            (false, _) => (act * scores, act * scores),
        };
        Unit {
            name: "contrastive",
            saved: if self.training {
                (embeds + saved).bytes()
            } else {
                0.0
            },
            forward_transient: transient.bytes(),
            // The scores' gradient and log-softmax's (or the sigmoid's) in fp32 at most.
            backward_transient: (2.0 * BytesPerElement::FP32 * scores).bytes(),
            gradient_transient: (act * scores).bytes(),
            inference_live: (embeds + transient).bytes(),
            // The returned scores (the per-image ones are a transposed view) and embeddings.
            held: if self.training {
                0.0
            } else {
                (act * scores + embeds / 2.0).bytes()
            },
            params: dual.joint_params,
            ..Unit::default()
        }
    }
}
