//! MLPs and mixtures of experts.

use super::TransformerGraph;
use crate::model::{Activation, LayerKind};
use crate::quantity::{Bytes, BytesPerElement, BytesPerToken, Tokens, Width};

impl TransformerGraph<'_> {
    /// Saved bytes per token of the MLP of a block of kind `layer` (the experts each token is
    /// routed to, and the shared ones) and its activation.
    pub(super) fn mlp(&self, layer: LayerKind) -> BytesPerToken {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, Width(spec.hidden as f64));
        let fp32 = BytesPerElement::FP32;
        let consumers = if spec.gated_mlp { 2.0 } else { 1.0 };
        // Each expert gathers its tokens (`hidden_states[token_idx]`, saved by its first linear)
        // and scales its output by the routing weight (the product saves that output); the
        // router saves its fp32 softmax (and its input's fp32 copy, where it upcasts that).
        let routing = if layer.moe {
            let upcast_input = if spec.moe.fp32_router && act < fp32 {
                fp32 * h
            } else {
                BytesPerToken::ZERO
            };
            fp32 * Width(spec.experts as f64)
                + 2.0 * spec.experts_per_token as f64 * act * h
                + upcast_input
        } else {
            BytesPerToken::ZERO
        };
        self.bytes.linear_input(h, consumers) + self.mlp_intermediates(layer) + routing
    }

    /// Saved bytes per token of an MLP's intermediate-width tensors (the activation's input
    /// and output, the gated product, dropout's mask and output).
    pub(super) fn mlp_intermediates(&self, layer: LayerKind) -> BytesPerToken {
        let spec = self.spec;
        let act = self.bytes.act;
        let f = Width(spec.routed_intermediate(layer) as f64);
        let mut per_expert = f * match spec.activation {
            Activation::Gelu | Activation::GeluTanh | Activation::Silu => 2.0 * act,
            Activation::Relu => act,
            Activation::QuickGelu => 3.0 * act,
            // 0.5·x·(1 + tanh(…)) in Python ops. Plain: x, tanh(…), 0.5·x, 1 + tanh(…) and the
            // product. Autocast runs pow in fp32, which promotes the tanh branch to fp32: the fp32
            // copy of x, tanh(…), 1 + tanh(…), plus 0.5·x and the product's cast for the next linear.
            Activation::GeluTanhPython if self.bytes.autocast => {
                3.0 * BytesPerElement::FP32 + 2.0 * act
            }
            Activation::GeluTanhPython => 5.0 * act,
        };
        if spec.gated_mlp && self.liger() {
            // Liger's fused SiLU/GELU-tanh product saves the gate and up projections only; its
            // output is the down projection's saved input (no activation output is made).
            per_expert = act * 3.0 * f;
        } else if spec.gated_mlp {
            per_expert += act * 2.0 * f; // up projection and the gated product
        }
        if self.dropout_active(spec.activation_dropout) {
            // Its 1-byte mask, and with ReLU its output (else the activation's output).
            per_expert += f * BytesPerElement::BOOL
                + if spec.activation == Activation::Relu {
                    act * f
                } else {
                    BytesPerToken::ZERO
                };
        }
        per_expert
    }

    /// Bytes an MLP of kind `layer` has alive at its no-grad peak for `tokens` tokens, besides
    /// the hidden states its block holds. A dense MLP: its intermediates. A mixture of experts
    /// as transformers 5.x runs it (`grouped_mm` over the routed token copies, sorted by
    /// expert): the router's logits and fp32 probabilities, the top-k choices and their sort,
    /// then either the gathered copies with the gate/up output, its activation and product, or
    /// at the end the gathered copies, the down projection's output, its weighted copy and that
    /// reordered back; the shared experts' intermediates come after, over every token.
    pub(super) fn mlp_no_grad_live(&self, tokens: Tokens, layer: LayerKind) -> Bytes {
        let spec = self.spec;
        let (act, h) = (self.bytes.act, Width(spec.hidden as f64));
        if !layer.moe {
            let f = Width(spec.routed_intermediate(layer) as f64) / self.split.tp;
            return tokens * act * f * self.mlp_live_intermediates();
        }
        let (experts, k) = (Width(spec.experts as f64), spec.experts_per_token as f64);
        let f = Width(spec.intermediate as f64) / self.split.tp;
        let routed = tokens * k;
        // Per routed copy: its fp32 weight and three int64 indices.
        let router = tokens * experts * (act + BytesPerElement::FP32)
            + routed * BytesPerToken(4.0 + 3.0 * 8.0);
        let experts_live = routed * act * (h + 4.0 * f).max(4.0 * h);
        let shared = tokens * act * Width(spec.moe.shared_intermediate as f64) / self.split.tp
            * self.mlp_live_intermediates();
        router + experts_live.max(tokens * act * h + shared)
    }

    /// Intermediates of width f alive at once in a no-grad MLP forward.
    pub(super) fn mlp_live_intermediates(&self) -> f64 {
        match (self.spec.gated_mlp, self.spec.activation) {
            (true, _) if self.spec.fused_gate_up => 4.0, // gate|up (2f), activation, product
            (true, _) => 3.0,                            // activation(gate), up, product
            (false, Activation::GeluTanhPython) => 4.0,  // x, 0.5·x, two chained temporaries
            (false, Activation::QuickGelu) => 3.0,       // x, sigmoid(1.702·x), the product
            (false, _) => 2.0,                           // projection and activation
        }
    }

    /// Intermediate-sized gradients the MLP's activation backward adds to what the block
    /// saved. One for a single autograd node (GELU, SiLU: the new gradient, while the output's
    /// gradient replaces the freed output). CLIP's `x * sigmoid(1.702 x)` as Python ops: the
    /// product's backward makes both inputs' gradients while the output's gradient is alive,
    /// two more than the freed product.
    /// Liger's fused gated product also counts one: the down projection's backward makes the
    /// product's gradient (`grad_output @ W`, intermediate-wide) while the product it saved is
    /// still alive, before the fused backward writes the gate's and up projection's gradients
    /// into their saved tensors (liger-kernel 0.8.0 `ops/swiglu.py` `swiglu_backward` 89-107 and
    /// `LigerSiLUMulFunction.backward` 148-176, `ops/geglu.py` `geglu_backward` likewise), which
    /// adds none.
    pub(super) fn mlp_backward_intermediates(&self) -> f64 {
        match (self.spec.gated_mlp, self.spec.activation) {
            (false, Activation::QuickGelu) => 2.0,
            // ReLU saves its output, which is also the next linear's saved input: that
            // linear's backward frees nothing before ReLU's gradient is made beside its own.
            (false, Activation::Relu) => 2.0,
            _ => 1.0,
        }
    }
}
