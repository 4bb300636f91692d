//! What an LM head's loss keeps: cross-entropy over all the logits, chunked or fused losses,
//! backward from the logits' sum, or no loss in a no-grad forward.

use super::head::LmLogits;
use super::{TransformerGraph, Unit};
use crate::quantity::{Bytes, BytesPerElement, BytesPerToken, Elements, Tokens, Width};
use crate::unit::{SavedGroup, WholeTensors, ACCUMULATION_COPIES};
use crate::workload::{Loss, Mode, Workload};

/// Positions per LM-head chunk in litgpt's fine-tuning loops (`lm_head_chunk_size=128`).
const LITGPT_LM_HEAD_CHUNK: Tokens = Tokens(128.0);

/// Output chunks of torchtune's `CEWithChunkedOutputLoss` (`num_output_chunks`), along the
/// sequence.
const TORCHTUNE_OUTPUT_CHUNKS: f64 = 8.0;

/// How a step uses an LM head's logits: chosen once per workload, then matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LogitsUse {
    /// Training without a loss module (`--loss none`): `outputs.logits.sum().backward()`.
    Summed,
    /// Training with a loss that reads the logits chunk by chunk, or fused with the head.
    ChunkedLoss,
    /// Training with cross-entropy over all the logits.
    FullLoss,
    /// A no-grad forward: the logits are returned (with a loss where labels are given).
    NoGrad,
}

impl LogitsUse {
    /// How `workload` uses the logits.
    pub(super) fn of(workload: &Workload) -> Self {
        match workload.mode {
            Mode::Train if workload.loss == Loss::None => LogitsUse::Summed,
            Mode::Train if workload.loss.chunked() => LogitsUse::ChunkedLoss,
            Mode::Train => LogitsUse::FullLoss,
            Mode::Infer | Mode::Generate => LogitsUse::NoGrad,
        }
    }
}

impl TransformerGraph<'_> {
    /// `outputs.logits.sum().backward()`: the outputs (and so the logits) stay referenced
    /// until backward has run; sum's gradient is an expanded scalar, which the LM head's
    /// matmul backward materialises as one logits-sized tensor (reshaping a stride-0 view
    /// copies). Autocast runs `sum` in fp32: an fp32 copy of the logits exists while it runs.
    pub(super) fn summed_logits_head(&self, t: &LmLogits) -> Unit {
        let fp32 = BytesPerElement::FP32;
        let autocast_sum = if self.workload.amp.is_some() && self.bytes.act < fp32 {
            t.tokens * t.vocab * fp32
        } else {
            Bytes::ZERO
        };
        Unit {
            name: "head",
            saved: (t.head_saved + t.softcap).bytes(),
            held: t.logits.bytes(),
            retained: t.logits.bytes(),
            forward_transient: (t.softcap + autocast_sum).bytes(),
            // Soft-capping's backward makes tanh's gradient while the gradient of
            // the final `· cap` still lives: two logits-sized gradients.
            backward_transient: (t.logits + t.softcap).bytes(),
            gradient_transient: (t.logits_gradient + t.input_gradient).bytes(),
            saved_through_gradients: t.head_saved.bytes(),
            // The logits-sized gradient the backward starts with is the one the head's matmul
            // reads: one tensor, not a second beside it.
            whole: WholeTensors {
                backward_transient: [t.softcap.bytes(), t.logits.bytes()],
                gradient_transient: [t.logits.bytes(), 0.0],
                gradient_continues: true,
                ..WholeTensors::default()
            },
            params: t.params,
            ..Unit::default()
        }
    }

    /// The LM head of a training step whose loss reads the logits in chunks (or fused).
    pub(super) fn chunked_lm_head(&self, t: &LmLogits) -> Unit {
        // Liger's fused loss caps each chunk's logits inside its cross-entropy kernel
        // (`HAS_SOFTCAPPING` in `ops/cross_entropy.py`): no capped logits are saved.
        let softcap = if self.workload.loss == Loss::Fused {
            Bytes::ZERO
        } else {
            t.softcap
        };
        let head = self.chunked_loss_head(t.tokens, t.vocab, t.head_saved + softcap, t.params);
        // Chunk by chunk, the head's weight gradient is made (and summed) while the
        // chunks' inputs and the final norm's saved tensors are still referenced.
        let through = if self.workload.loss == Loss::Fused {
            Bytes::ZERO
        } else {
            t.head_saved
        };
        Unit {
            saved_through_gradients: through.bytes(),
            ..head
        }
    }

    /// The LM head of a training step with cross-entropy over all the logits.
    pub(super) fn full_loss_head(&self, t: &LmLogits) -> Unit {
        let log_probs = t.tokens * t.vocab * t.loss_bytes;
        // Kept: nll_loss's fp32 copy of half-precision log-probabilities, beside
        // which its backward makes its fp32 gradient (the casts and log_softmax's
        // backward that follow hold less). Otherwise the fp32 copy of the logits
        // is transient, and backward starts with the gradients of nll_loss and of
        // log_softmax beside log_softmax's saved output.
        let (kept_copy, forward_copy, backward_start) = if t.half_log_probs {
            (t.fp32_copy, Bytes::ZERO, [t.fp32_copy, Bytes::ZERO])
        } else {
            (Bytes::ZERO, t.fp32_copy, [log_probs, log_probs])
        };
        let backward_start = backward_start.map(Bytes::bytes);
        // A loop that holds the outputs (`--hold-outputs`) keeps the logits they return until
        // the step ends: the fp32 copy where the forward upcasts them all (transformers before
        // 4.45: `logits = logits.float()` before the loss), else as the head made them.
        let held = match (self.workload.hold_outputs, t.upcast_all) {
            (false, _) => Bytes::ZERO,
            (true, true) => t.logits_tokens * t.vocab * BytesPerElement::FP32,
            (true, false) => t.logits,
        };
        Unit {
            name: "head",
            saved: (t.head_saved + log_probs + kept_copy + t.softcap).bytes(),
            held: held.bytes(),
            // Unless held, only the loss leaves the model (as in the HF Trainer): logits and
            // their fp32 copy live until log_softmax has run.
            forward_transient: (t.logits + forward_copy + t.softcap).bytes(),
            backward_transient: backward_start.iter().sum(),
            // The logits' gradient (cast back to the logits dtype) feeds the LM head,
            // whose backward makes its input's gradient before its weight's.
            gradient_transient: (t.logits_gradient + t.input_gradient).bytes(),
            saved_through_gradients: t.head_saved.bytes(),
            whole: WholeTensors {
                saved: [
                    SavedGroup {
                        bytes: log_probs.bytes(),
                        tensor: log_probs.bytes(),
                    },
                    SavedGroup {
                        bytes: kept_copy.bytes(),
                        tensor: kept_copy.bytes(),
                    },
                    SavedGroup::default(),
                ],
                forward_transient: [t.logits.bytes(), forward_copy.bytes()],
                backward_transient: backward_start,
                gradient_transient: [t.logits.bytes(), 0.0],
                gradient_continues: t.loss_bytes == self.bytes.act && !t.half_log_probs,
                ..WholeTensors::default()
            },
            params: t.params,
            ..Unit::default()
        }
    }

    /// The LM head of a no-grad forward: the returned logits, generation's token selection,
    /// and the loss where labels are given.
    pub(super) fn no_grad_lm_head(&self, t: &LmLogits) -> Unit {
        let (act, fp32) = (self.bytes.act, BytesPerElement::FP32);
        // Before transformers 4.45 a Llama-family forward returns all its logits
        // upcast to fp32 (the activation-dtype logits exist beside their copy).
        let (logits, upcasting) = if t.upcast_all && act < fp32 && !self.workload.labels {
            (t.logits_tokens * t.vocab * fp32, t.logits)
        } else {
            (t.logits, Bytes::ZERO)
        };
        // Generation copies the last logits to fp32 and a logits processor makes
        // another fp32 tensor before picking the token; some releases first clone
        // all the logits the model returned.
        // Two fp32 tensors of the last position's logits.
        let last_position = 2.0 * fp32 * Tokens(self.batch) * t.vocab;
        let selection = if self.workload.mode == Mode::Generate {
            let clone = if self.old_release().is_some_and(|o| o.clones_all_logits()) {
                logits
            } else {
                Bytes::ZERO
            };
            last_position + clone
        } else {
            Bytes::ZERO
        };
        let held = logits + selection;
        // The final norm reads the last block's output; the head then runs on the
        // body's output beside the logits (with a masked-LM transform's output, or
        // T5's rescaled copy).
        let hidden = t.tokens * self.bytes.residual * Width(self.spec.hidden as f64);
        let beside_logits = if t.transform > BytesPerToken::ZERO || t.rescale > BytesPerToken::ZERO
        {
            2.0 * hidden
        } else {
            hidden
        };
        // With labels the model computes its loss: the fp32 copy of the logits and
        // log_softmax's output, as in training.
        let loss = if self.workload.mode == Mode::Infer && self.workload.labels {
            t.fp32_copy + t.tokens * t.vocab * t.loss_bytes
        } else {
            Bytes::ZERO
        };
        Unit {
            name: "head",
            // The logits themselves are `held` (returned to the caller).
            inference_live: (2.0 * hidden - held)
                .max(beside_logits + loss + t.softcap + upcasting)
                .bytes(),
            held: held.bytes(),
            whole: WholeTensors {
                selection: if self.workload.mode == Mode::Generate {
                    last_position.bytes()
                } else {
                    0.0
                },
                ..WholeTensors::default()
            },
            params: t.params,
            ..Unit::default()
        }
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
    fn chunked_loss_head(&self, tokens: Tokens, vocab: Width, saved: Bytes, params: u64) -> Unit {
        let (act, fp32) = (self.bytes.act, BytesPerElement::FP32);
        let h = Width(self.spec.hidden as f64);
        let positions = self.decoder_sequence();
        let logits = tokens * vocab;
        // Elements of one chunk's logits, and the number of chunks.
        let chunk = |default: Tokens| {
            let per_chunk = self
                .workload
                .loss_chunk
                .map_or(default, |c| Tokens(c as f64));
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
            Bytes::ZERO
        };
        let accumulating = |chunk: Elements, chunks: f64| {
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
                let (log_bytes, copy) = if self.workload.amp.is_some() && act < fp32 {
                    (fp32, fp32 * chunk)
                } else {
                    (act, Bytes::ZERO)
                };
                Unit {
                    saved: (saved + logits * log_bytes).bytes(),
                    held: (logits * act).bytes(),
                    forward_transient: copy.bytes(),
                    backward_transient: (2.0 * chunk * log_bytes).bytes(),
                    gradient_transient: accumulating(chunk, chunks).bytes(),
                    ..unit
                }
            }
            Loss::ChunkedFp32 => {
                let (chunk, chunks) = chunk((positions / TORCHTUNE_OUTPUT_CHUNKS).ceil());
                // `.float()` of fp32 logits returns them (no copy).
                let copy = if act < fp32 {
                    fp32 * chunk
                } else {
                    Bytes::ZERO
                };
                Unit {
                    saved: (saved + logits * fp32).bytes(),
                    forward_transient: (logits * act + copy).bytes(),
                    backward_transient: (2.0 * fp32 * chunk).bytes(),
                    gradient_transient: accumulating(chunk, chunks).bytes(),
                    ..unit
                }
            }
            Loss::Fused | Loss::Hf | Loss::None | Loss::CrossEntropy => {
                self.fused_loss_head(tokens, vocab, saved, head_gradient, unit)
            }
        }
    }

    /// `unit` as Liger-Kernel's fused linear cross-entropy runs it (see `chunked_loss_head`):
    /// `saved` less the head's input, plus the gradients of the hidden states and (when it
    /// trains) of the head's weight, `head_gradient`. Since liger-kernel 0.6.2 each chunk adds
    /// its weight gradient as `grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk)
    /// .float()` (0.8.0 `ops/fused_linear_cross_entropy.py`, in the chunk loop of
    /// `fused_linear_cross_entropy_forward`): a vocabulary × hidden product in the compute dtype
    /// and its fp32 copy exist beside the chunk's logits (releases up to 0.6.1 accumulated in
    /// place with `torch.addmm(..., out=grad_weight)`; the latest is planned).
    fn fused_loss_head(
        &self,
        tokens: Tokens,
        vocab: Width,
        saved: Bytes,
        head_gradient: Bytes,
        unit: Unit,
    ) -> Unit {
        let act = self.bytes.act;
        let h = Width(self.spec.hidden as f64);
        let factor = (self.spec.vocab as f64 / self.spec.hidden as f64)
            .ceil()
            .max(1.0);
        let rows = Tokens(((tokens / factor).ceil().count() as u64).next_power_of_two() as f64);
        let head_input = tokens * self.head_input();
        let weight_gradient_product = if head_gradient > Bytes::ZERO {
            vocab * h * (act + BytesPerElement::FP32)
        } else {
            Bytes::ZERO
        };
        Unit {
            saved: (saved - head_input + tokens * h * act + head_gradient).bytes(),
            // The chunk's logits, the per-row fp32 loss and the chunk's weight-gradient product
            // with its fp32 copy.
            forward_transient: (rows.min(tokens) * vocab * act
                + tokens * BytesPerToken(4.0)
                + weight_gradient_product)
                .bytes(),
            ..unit
        }
    }
}
