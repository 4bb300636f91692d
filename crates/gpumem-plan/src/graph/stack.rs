//! A transformer's units in forward order: embeddings, blocks, head.

use super::sizes::AttentionShape;
use super::TransformerGraph;
use crate::model::{Head, LayerKind};
use crate::quantity::{Bytes, Tokens, Width};
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
        let h = Width(spec.hidden as f64);
        let stem_output = match spec.audio {
            Some(_) if !self.training => self.batch * seq * self.bytes.residual * h,
            _ => Bytes::ZERO,
        };
        for index in 0..spec.encoder_layers {
            let mut block = self.block(encoder, None, LayerKind::default());
            block.hold_through_no_grad(stem_output.bytes());
            if index == 0 {
                block.saved -= self.frozen_prefix(encoder, LayerKind::default()).bytes();
            }
            units.push(block);
        }
        if self.training && spec.final_norm {
            // The encoder's final norm saves its input (the last residual sum), and its
            // output is what every cross-attention's key and value projections read: saved
            // by them, or under autocast (each saves its own half-precision copy) held by
            // the model's output until the forward returns.
            if let Some(last) = units.last_mut() {
                let tokens = self.batch * seq;
                last.saved += (tokens * self.norm_saved()).bytes();
                let output = (tokens * self.bytes.residual * h).bytes();
                if self.bytes.autocast {
                    last.forward_held += output;
                } else {
                    last.saved += output;
                }
            }
        }
        // The encoder's output is returned (`encoder_last_hidden_state`), and the
        // decoder's cross-attention reads it: held from the first decoder block to the end
        // of the forward.
        let encoder_output = if self.training {
            Bytes::ZERO
        } else {
            self.batch * seq * self.bytes.residual * h
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
                block.held += encoder_output.bytes();
                block.saved -= self.frozen_prefix(decoder, LayerKind::default()).bytes();
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
                .map(|s| Tokens(s.window.saturating_sub(1).max(1) as f64));
            let shape = AttentionShape {
                queries: seq,
                keys: seq,
                causal: spec.decoder,
                cached_keys: window,
            };
            let mut block = self.block(shape, None, layer);
            if index == 0 {
                block.saved -= self.frozen_prefix(shape, layer).bytes();
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
                // Per sample: the sequence's hidden states and the pooled output (one row).
                let (h, pooled) = (Width(self.spec.hidden as f64), Tokens(1.0));
                let per_column = self.sequence() * self.bytes.residual + pooled * self.bytes.act;
                head.held += (self.batch * per_column * h).bytes();
            }
        }
        units
    }
}
