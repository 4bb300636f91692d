//! Embeddings (token, patch and audio stems) and a vision-language projector.

use super::TransformerGraph;
use crate::model::Head;
use crate::quantity::{Bytes, BytesPerElement, BytesPerToken, Elements, Tokens, Width};
use crate::unit::{SavedGroup, Unit, WholeTensors, ACCUMULATION_COPIES};
use crate::workload::{Checkpointing, Mode};

/// What an audio stem keeps, in bytes.
#[derive(Debug, Clone, Copy, Default)]
struct AudioStem {
    /// The features the caller (and `generate`'s copy) holds.
    held: Bytes,
    /// Saved for backward in training.
    saved: Bytes,
    /// Alive at its peak: the first convolution's outputs (its GELU's input and output).
    live: Bytes,
}

impl TransformerGraph<'_> {
    /// The embeddings unit: token (and position) embeddings, or a patch or audio stem, with
    /// the inputs the caller holds.
    pub(super) fn embeddings(&self) -> Unit {
        let spec = self.spec;
        let (act, residual) = (self.bytes.act, self.bytes.residual);
        let tokens = self.batch * self.sequence();
        let h = Width(spec.hidden as f64);
        let (mut held, mut saved) = self.model_inputs(tokens);
        let stem = self.audio_stem();
        held += stem.held;
        saved += stem.saved;
        if spec.embedding_norm {
            saved += tokens * residual * h;
        }
        if self.dropout_active(spec.embedding_dropout) {
            // A 1-byte mask per hidden element.
            saved += tokens * h * BytesPerElement::BOOL;
        }
        // A tied word embedding already holds the LM head's gradient: the embedding backward adds a
        // new gradient of the table (V × its width: OPT-350m's 512, projected to the hidden 1024
        // by `project_in`) and accumulating it allocates the sum.
        let tied_accumulation = if spec.tied_embeddings && spec.head != Head::None {
            // In the weights' dtype: the module dtype, the residual stream's.
            ACCUMULATION_COPIES * Elements((spec.vocab * spec.word_width()) as f64) / self.split.tp
                * residual
        } else {
            Bytes::ZERO
        };
        // The model's forward holds its embedding outputs (`inputs_embeds`, and a position
        // embedding's output where it is a separate tensor) until its body returns, and RoPE's
        // cos and sin tables. Position ids default to one row (batch 1); generate passes them
        // per sequence.
        let position_rows = match self.workload.mode {
            Mode::Generate => tokens,
            Mode::Train | Mode::Infer => self.sequence(),
        };
        let positions = if spec.held.positions {
            position_rows * residual * h
        } else {
            Bytes::ZERO
        };
        // Under LoRA the embeddings (and an audio or patch stem) are frozen and read nothing
        // that needs a gradient: autograd records none of their operations.
        if self.training && self.workload.lora.is_some() {
            saved = Bytes::ZERO;
        }
        // The cos and sin tables: a row per position, of the rotated part of a head.
        let rotary = 2.0 * position_rows * spec.rotary_fraction * Width(spec.head_dim as f64);
        let mut body_held =
            tokens * spec.held.embeddings as f64 * residual * h + positions + rotary * act;
        let hidden = tokens * residual * h;
        let mut forward_transient = (2.0 * tokens * residual * h).max(stem.live);
        let mut inference_live = (2.0 * tokens * residual * h).max(stem.live);
        let mut saved = saved / self.split.sequence;
        let mut forward_held = Bytes::ZERO;
        // An older release's mask over all positions (Llama 4.38): the batch's repeat of the
        // buffer and its cast exist together, then the cast and the product (the mask).
        let all_positions = self
            .old_release()
            .and_then(|o| o.all_positions_mask(self.workload.attention));
        if let Some(m) = all_positions {
            let elements = Elements(self.batch * m.elements_per_sample);
            let mask = elements * residual;
            let making = elements * BytesPerElement(m.buffer_element_bytes.max(residual.0));
            inference_live = inference_live.max(making);
            body_held += mask;
            if self.training && self.workload.checkpointing == Checkpointing::None {
                // Released when the body returns; it exists beside what makes it.
                forward_transient = forward_transient.max(making + mask);
                forward_held += mask;
            } else if self.training {
                // An input of every checkpointed layer, kept until the first one's backward.
                forward_transient = forward_transient.max(making);
                saved += mask;
            }
        }
        Unit {
            name: "embeddings",
            saved: saved.bytes(),
            held: held.bytes(),
            body_held: body_held.bytes(),
            forward_held: forward_held.bytes(),
            forward_transient: forward_transient.bytes(),
            backward_transient: hidden.bytes(),
            gradient_transient: (tied_accumulation + hidden).bytes(),
            inference_live: inference_live.bytes(),
            whole: WholeTensors {
                // A tied table's new gradient and the sum accumulating it, each the table's size.
                gradient_transient: [(tied_accumulation / ACCUMULATION_COPIES).bytes(); 2],
                // An audio stem's peak is its first convolution's outputs, each over twice the
                // encoder's frames.
                live: SavedGroup {
                    bytes: stem.live.bytes(),
                    tensor: (stem.live / 2.0).bytes(),
                },
                ..WholeTensors::default()
            },
            params: spec.params_of_embeddings(),
            // Whisper's sinusoidal encoder positions are a frozen parameter.
            untrained_params: spec.audio.map_or(0, |a| a.frames * spec.hidden),
            ..Unit::default()
        }
    }

    /// The model's inputs over `tokens`, as (held, saved): the caller holds the token ids
    /// (int64), and labels in an evaluation forward, for the whole step; a patch stem's pixels
    /// instead, with autocast's copy of them saved.
    fn model_inputs(&self, tokens: Tokens) -> (Bytes, Bytes) {
        let int64 = BytesPerToken(8.0);
        let labels = if self.workload.mode == Mode::Infer && self.workload.labels {
            tokens * int64
        } else {
            Bytes::ZERO
        };
        let mut held = tokens * int64 + labels;
        let mut saved = Bytes::ZERO;
        if let Some(p) = self.spec.patches {
            let pixels = Elements(
                self.batch * p.channels as f64 * (self.workload.image_size as f64).powi(2),
            );
            held = pixels * self.bytes.residual;
            saved = if self.bytes.autocast {
                pixels * self.bytes.act
            } else {
                Bytes::ZERO
            };
        }
        (held, saved)
    }

    /// The projector of a vision-language model: two linears with a GELU between them, from
    /// the tower's patch features to `image_tokens` tokens of width `width` per image.
    pub(super) fn projector(&self, params: u64, image_tokens: u64, width: u64) -> Unit {
        let act = self.bytes.act;
        let tokens = self.batch * Tokens(image_tokens as f64);
        let (v, t) = (Width(self.spec.hidden as f64), Width(width as f64));
        let output = tokens * act * t;
        Unit {
            name: "projector",
            // The selected features, the first linear's output (GELU input) and the GELU output.
            saved: if self.training {
                (tokens * act * (v + 2.0 * t)).bytes()
            } else {
                0.0
            },
            forward_transient: output.bytes(),
            backward_transient: (2.0 * tokens * act * t).bytes(),
            gradient_transient: output.bytes(),
            inference_live: (tokens * act * (v + 2.0 * t)).bytes(),
            // The image features are scattered into a copy of the language model's input
            // embeddings; their concatenation over the images (a copy) is returned with the
            // output (`image_hidden_states`). Training drops the output before its backward.
            held: if self.training { 0.0 } else { output.bytes() },
            // The tower's output (kept for `image_hidden_states`' source) stays referenced
            // while the language model runs: one tower hidden state and the projector's output.
            body_held: if self.training {
                0.0
            } else {
                (output + self.batch * self.sequence() * self.bytes.residual * v).bytes()
            },
            params,
            ..Unit::default()
        }
    }

    /// Whisper's encoder input: log-mel features over twice its frames, through two GELU
    /// convolutions (the second with stride 2). Zero for a model without an audio stem.
    fn audio_stem(&self) -> AudioStem {
        let Some(a) = self.spec.audio else {
            return AudioStem::default();
        };
        let (act, h) = (self.bytes.act, Width(self.spec.hidden as f64));
        let frames = self.batch * Tokens(a.frames as f64);
        // Two mel frames per encoder position.
        let features = 2.0 * frames * Width(a.mel_bins as f64);
        // Whisper's `generate` concatenates the batch's 30 s segments into a new tensor
        // (a copy of the features) that it keeps while it generates.
        let copies = if self.workload.mode == Mode::Generate {
            2.0
        } else {
            1.0
        };
        // The autocast copy of the features, both convolutions' outputs (GELU inputs)
        // and the first GELU's output (the second convolution's input).
        let autocast_copy = if self.bytes.autocast {
            features * act
        } else {
            Bytes::ZERO
        };
        let saved = if self.training {
            autocast_copy + 5.0 * frames * h * act
        } else {
            Bytes::ZERO
        };
        AudioStem {
            held: copies * features * self.bytes.residual,
            saved,
            live: 4.0 * frames * h * act,
        }
    }
}
