//! A transformer's units in forward order: embeddings, blocks, head.

use super::sizes::AttentionShape;
use super::TransformerGraph;
use crate::model::{Head, LayerKind};
use crate::unit::Unit;

impl TransformerGraph<'_> {
    /// The stack's units in forward order: embeddings, blocks (an encoder's, then a
    /// decoder's), head.
    pub(super) fn units(&self) -> Vec<Unit> {
        let spec = self.spec;
        let mut units = vec![self.embeddings()];
        if spec.is_encoder_decoder() {
            self.push_encoder_decoder_blocks(&mut units);
        } else {
            self.push_blocks(&mut units);
        }
        if spec.head == Head::AttentionPool && self.training {
            units.extend(self.attention_pool());
        } else {
            units.push(self.four_bit_head(self.head()));
        }
        self.place_vocabulary_matrices(&mut units);
        units
    }

    /// Pushes an encoder-decoder's blocks: the encoder's, then the decoder's, whose
    /// cross-attentions read the encoder's output.
    fn push_encoder_decoder_blocks(&self, units: &mut Vec<Unit>) {
        let spec = self.spec;
        let seq = self.encoder_sequence();
        let encoder = AttentionShape {
            queries: seq,
            keys: seq,
            causal: false,
            cached_keys: None,
        };
        // Whisper's encoder holds its convolutions' output (`inputs_embeds`) through its
        // layers in a no-grad forward.
        let stem_output = match spec.audio {
            Some(_) if !self.training => {
                self.batch * seq * self.bytes.residual.0 * spec.hidden as f64
            }
            _ => 0.0,
        };
        for index in 0..spec.encoder_layers {
            let mut block = self.block(encoder, None, LayerKind::default());
            block.inference_live += stem_output;
            if index == 0 {
                block.saved -= self.frozen_prefix(encoder, LayerKind::default());
            }
            units.push(block);
        }
        if self.training && spec.final_norm {
            // The encoder's final norm saves its input (the last residual sum), and its
            // output is what every cross-attention's key and value projections read: saved
            // by them, or under autocast (each saves its own half-precision copy) held by
            // the model's output until the forward returns.
            if let Some(last) = units.last_mut() {
                let (tokens, h) = (self.batch * seq, spec.hidden as f64);
                last.saved += tokens * self.norm_saved();
                if self.bytes.autocast {
                    last.forward_held += tokens * self.bytes.residual.0 * h;
                } else {
                    last.saved += tokens * self.bytes.residual.0 * h;
                }
            }
        }
        // The encoder's output is returned (`encoder_last_hidden_state`), and the
        // decoder's cross-attention reads it: held from the first decoder block to the end
        // of the forward.
        let encoder_output = if self.training {
            0.0
        } else {
            self.batch * seq * self.bytes.residual.0 * spec.hidden as f64
        };
        let dec = self.decoder_sequence();
        let decoder = AttentionShape {
            queries: dec,
            keys: dec,
            causal: true,
            cached_keys: None,
        };
        let cross = AttentionShape {
            queries: dec,
            keys: seq,
            causal: false,
            cached_keys: None,
        };
        for index in 0..spec.layers {
            let mut block = self.block(decoder, Some(cross), LayerKind::default());
            if index == 0 {
                block.held += encoder_output;
                block.saved -= self.frozen_prefix(decoder, LayerKind::default());
            }
            units.push(block);
        }
    }

    /// Pushes the blocks of a decoder-only or encoder-only stack (sliding-window layers keep
    /// the last window of keys in their cache).
    fn push_blocks(&self, units: &mut Vec<Unit>) {
        let spec = self.spec;
        let seq = self.encoder_sequence();
        for index in 0..spec.layers {
            let layer = spec.layer_kind(index);
            let window = spec
                .sliding
                .filter(|_| layer.sliding)
                .map(|s| s.window.saturating_sub(1).max(1) as f64);
            let shape = AttentionShape {
                queries: seq,
                keys: seq,
                causal: spec.decoder,
                cached_keys: window,
            };
            let mut block = self.block(shape, None, layer);
            if index == 0 {
                block.saved -= self.frozen_prefix(shape, layer);
            }
            units.push(block);
        }
    }

    /// Sets the units' vocabulary matrices: the word embedding's and an untied LM head's are
    /// single tensors; a tied one moves to the head.
    fn place_vocabulary_matrices(&self, units: &mut [Unit]) {
        let spec = self.spec;
        // A tied LM head's backward makes the word embedding's gradient: it exists from the
        // head's backward on, not from the embedding's (which then accumulates into it).
        let lm_head = matches!(spec.head, Head::CausalLm | Head::Seq2SeqLm | Head::MaskedLm);
        // The vocabulary matrices are single tensors: the word embedding's, and an untied LM
        // head's (a tied one is the embedding's, counted with the head from here on).
        units[0].whole.params = (spec.vocab * spec.word_width()).min(units[0].params);
        if spec.tied_embeddings && lm_head && units.len() > 1 {
            let shared = (spec.vocab * spec.hidden).min(units[0].params);
            units[0].params -= shared;
            units[0].whole.params = 0;
            if let Some(head) = units.last_mut() {
                head.params += shared;
                head.whole.params = shared;
            }
        } else if matches!(spec.head, Head::CausalLm | Head::Seq2SeqLm) {
            if let Some(head) = units.last_mut() {
                head.whole.params = (spec.vocab * spec.hidden).min(head.params);
            }
        }
    }

    /// The stack's units, its last hidden state (and pooled output) held to the end of a
    /// no-grad forward: a dual encoder returns each tower's output in its own.
    pub(super) fn units_returning_output(&self) -> Vec<Unit> {
        let mut units = self.units();
        if !self.training {
            if let Some(head) = units.last_mut() {
                let h = self.spec.hidden as f64;
                head.held +=
                    self.batch * (self.sequence() * self.bytes.residual.0 + self.bytes.act.0) * h;
            }
        }
        units
    }
}
