//! Embeddings (token, patch and audio stems) and a vision-language projector.

use super::TransformerGraph;
use crate::model::Head;
use crate::unit::{Unit, ACCUMULATION_COPIES};
use crate::workload::Mode;

/// What an audio stem keeps, in bytes.
#[derive(Debug, Clone, Copy, Default)]
struct AudioStem {
    /// The features the caller (and `generate`'s copy) holds.
    held: f64,
    /// Saved for backward in training.
    saved: f64,
    /// Alive at its peak.
    live: f64,
}

impl TransformerGraph<'_> {
    /// The embeddings unit: token (and position) embeddings, or a patch or audio stem, with
    /// the inputs the caller holds.
    pub(super) fn embeddings(&self) -> Unit {
        let spec = self.spec;
        let tokens = self.batch * self.sequence();
        let h = spec.hidden as f64;
        // Token ids (int64), and labels in an evaluation forward, are held by the caller for the
        // whole step.
        let labels = if self.workload.mode == Mode::Infer && self.workload.labels {
            tokens * 8.0
        } else {
            0.0
        };
        let mut held = tokens * 8.0 + labels;
        let mut saved = 0.0;
        if let Some(p) = spec.patches {
            let pixels = self.batch * p.channels as f64 * (self.workload.image_size as f64).powi(2);
            held = pixels * self.bytes.residual.0;
            saved = if self.bytes.autocast {
                pixels * self.bytes.act.0
            } else {
                0.0
            };
        }
        let stem = self.audio_stem();
        held += stem.held;
        saved += stem.saved;
        if spec.embedding_norm {
            saved += tokens * self.bytes.residual.0 * h;
        }
        if self.dropout_active(spec.embedding_dropout) {
            saved += tokens * h;
        }
        // A tied word embedding already holds the LM head's gradient: the embedding backward adds a
        // new gradient of the table (V × its width: OPT-350m's 512, projected to the hidden 1024
        // by `project_in`) and accumulating it allocates the sum.
        let tied_accumulation = if spec.tied_embeddings && spec.head != Head::None {
            ACCUMULATION_COPIES * (spec.vocab * spec.word_width()) as f64 / self.split.tp
                * self.workload.module_dtype().bytes() as f64
        } else {
            0.0
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
            position_rows * self.bytes.residual.0 * h
        } else {
            0.0
        };
        // Under LoRA the embeddings (and an audio or patch stem) are frozen and read nothing
        // that needs a gradient: autograd records none of their operations.
        if self.training && self.workload.lora.is_some() {
            saved = 0.0;
        }
        let rotary = 2.0 * position_rows * spec.rotary_fraction * spec.head_dim as f64;
        let body_held = tokens * spec.held.embeddings as f64 * self.bytes.residual.0 * h
            + positions
            + rotary * self.bytes.act.0;
        Unit {
            name: "embeddings",
            saved: saved / self.split.sequence,
            held,
            body_held,
            forward_transient: (2.0 * tokens * self.bytes.residual.0 * h).max(stem.live),
            backward_transient: tokens * self.bytes.residual.0 * h,
            gradient_transient: tied_accumulation + tokens * self.bytes.residual.0 * h,
            inference_live: (2.0 * tokens * self.bytes.residual.0 * h).max(stem.live),
            params: spec.params_of_embeddings(),
            // Whisper's sinusoidal encoder positions are a frozen parameter.
            untrained_params: spec.audio.map_or(0, |a| a.frames * spec.hidden),
            ..Unit::default()
        }
    }

    /// The projector of a vision-language model: two linears with a GELU between them, from
    /// the tower's patch features to `image_tokens` tokens of width `width` per image.
    pub(super) fn projector(&self, params: u64, image_tokens: u64, width: u64) -> Unit {
        let act = self.bytes.act.0;
        let tokens = self.batch * image_tokens as f64;
        let (v, t) = (self.spec.hidden as f64, width as f64);
        Unit {
            name: "projector",
            // The selected features, the first linear's output (GELU input) and the GELU output.
            saved: if self.training {
                tokens * act * (v + 2.0 * t)
            } else {
                0.0
            },
            forward_transient: tokens * act * t,
            backward_transient: 2.0 * tokens * act * t,
            gradient_transient: tokens * act * t,
            inference_live: tokens * act * (v + 2.0 * t),
            // The image features are scattered into a copy of the language model's input
            // embeddings; their concatenation over the images (a copy) is returned with the
            // output (`image_hidden_states`). Training drops the output before its backward.
            held: if self.training { 0.0 } else { tokens * act * t },
            // The tower's output (kept for `image_hidden_states`' source) stays referenced
            // while the language model runs: one tower hidden state and the projector's output.
            body_held: if self.training {
                0.0
            } else {
                tokens * act * t + self.batch * self.sequence() * self.bytes.residual.0 * v
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
        let (act, h) = (self.bytes.act.0, self.spec.hidden as f64);
        let frames = self.batch * a.frames as f64;
        let features = 2.0 * frames * a.mel_bins as f64;
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
            0.0
        };
        let saved = if self.training {
            autocast_copy + 5.0 * frames * h * act
        } else {
            0.0
        };
        AudioStem {
            held: copies * features * self.bytes.residual.0,
            saved,
            live: 4.0 * frames * h * act,
        }
    }
}
