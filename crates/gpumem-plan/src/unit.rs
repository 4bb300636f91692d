//! The forward pass as memory units: what each step saves for backward, holds and briefly
//! needs. Below the parts that make them (the transformer graph, diffusion models, ResNets) and
//! what reads them (the estimate, the allocation sequence, the distributed buffers).

/// One step of the forward pass, in bytes for the whole micro-batch on one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Unit {
    /// What the unit is ("embeddings", "block", "head").
    pub name: &'static str,
    /// Bytes saved for backward when nothing is recomputed.
    pub saved: f64,
    /// Part of `saved` inside the attention core (dropped by selective recomputation).
    pub attention_core: f64,
    /// Bytes kept under full checkpointing (the block input), for checkpointable units.
    pub checkpoint: Option<f64>,
    /// Bytes per-op selective checkpointing keeps besides the block input: the outputs of the
    /// attention kernel and of every other bias-free matmul (see `single_gpu`).
    pub per_op_saved: f64,
    /// Bytes the unit's output keeps alive until the step ends (logits held by the model output).
    pub held: f64,
    /// Bytes the step's outputs still reference once its backward has run (the logits, the KV
    /// cache a causal LM's training forward returns and what its tensors keep alive): a loop
    /// that keeps its last outputs (`Workload::keep_outputs`) has them alive through the next
    /// step's forward.
    pub retained: f64,
    /// Bytes the model's output keeps alive until the forward returns, released before backward
    /// (the caller keeps only the loss): cache copies of k and v that no kernel saves.
    pub forward_held: f64,
    /// Short-lived bytes at the unit's forward peak, on top of what it saves.
    pub forward_transient: f64,
    /// Short-lived bytes at the start of the unit's backward, before its parameter gradients
    /// exist (gradients of its activations, e.g. of the loss over the vocabulary).
    pub backward_transient: f64,
    /// Short-lived bytes while the unit's parameter gradients are produced (its own saved tensors
    /// are released by then).
    pub gradient_transient: f64,
    /// Gradient bytes the unit's last operations make from the gradient that arrived
    /// (`gradient_transient`) before one of them unpacks a saved tensor, which starts a
    /// checkpointed unit's recomputation: alive beside it through the recomputation.
    pub pre_recompute_gradient: f64,
    /// The bytes a block's first norm still holds as its backward ends, where a block is
    /// gathered then (FSDP1's late prefetch, [`crate::distributed`]): (what it saved, alive
    /// until its backward runs; its backward's own fp32 temporaries at their peak). The
    /// prefetch's all-gather runs before that backward, the temporaries after.
    pub first_norm: (f64, f64),
    /// Of `saved`, the bytes still referenced while the unit's parameter gradients are
    /// produced: the LM head's weight gradient comes from its matmul's backward, while that
    /// matmul's input and the final norm's saved tensors (whose backward comes after) live.
    pub saved_through_gradients: f64,
    /// Peak bytes alive inside the unit in a no-grad forward (besides weights and KV cache).
    pub inference_live: f64,
    /// Bytes a no-grad forward keeps referenced from this unit on while the model's body runs,
    /// released when the body returns, before the head (the embedding outputs).
    pub body_held: f64,
    /// KV-cache bytes the unit keeps in a no-grad forward.
    pub kv_cache: f64,
    /// Tokens per sequence the unit's cache keeps at most (a sliding-window layer keeps the
    /// last `window − 1`); None: every token.
    pub kv_window: Option<f64>,
    /// Single tensors inside the byte totals above, for the allocation sequence.
    pub whole: WholeTensors,
    /// Parameters of the unit (their gradients appear when its backward runs).
    pub params: u64,
    /// Of `params`, those that get no gradient or optimizer state in training: frozen ones
    /// (Whisper's sinusoidal encoder positions), or all of a unit no gradient reaches (a vision
    /// tower's layers after the one LLaVA reads its features from).
    pub untrained_params: u64,
}

/// The single tensors inside a unit's byte totals whose sizes the planner knows. The
/// allocation sequence ([`crate::sequence`]) allocates them at those sizes and cuts only the
/// rest of a total into typical-size pieces: the caching allocator's segments follow real
/// tensor sizes, and the largest tensors (the loss's vocabulary-wide ones, the vocabulary
/// matrix, a block's weight matrices and score matrices) decide how many it needs.
/// Zero: no such tensor.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WholeTensors {
    /// Parts of `saved` made of tensors larger than a hidden state: the loss's
    /// log-probabilities; a block's score matrices and MLP intermediates (a mixture's routed
    /// copies and their intermediates).
    pub saved: [SavedGroup; 3],
    /// In `forward_transient`: the logits and their fp32 copy.
    pub forward_transient: [f64; 2],
    /// In `backward_transient`: the gradients of nll_loss and of log_softmax.
    pub backward_transient: [f64; 2],
    /// In `gradient_transient`: the logits' gradient; a tied vocabulary table's new gradient
    /// and the sum accumulating it makes.
    pub gradient_transient: [f64; 2],
    /// In `inference_live`: a no-grad unit's tensors larger than a hidden state at its peak (a
    /// convolution's workspace), where `no_grad` has no phases.
    pub live: SavedGroup,
    /// In `kv_cache`: a block's self-attention keys and values, and its cross-attention's
    /// (over the encoder's tokens), each a tensor of half a group's bytes.
    pub kv_cache: [SavedGroup; 2],
    /// A no-grad block's forward as its sublayers run: its attention, a decoder's
    /// cross-attention, its MLP. Empty (zero bytes): the unit is one phase of `inference_live`.
    pub no_grad: [NoGradPhase; 3],
    /// The gradient transient's whole tensor is the last of the backward transient's, kept
    /// alive rather than made anew (log_softmax's gradient is the logits' when no cast
    /// follows).
    pub gradient_continues: bool,
    /// Parameters of the unit's largest weight (the vocabulary matrix of an embedding table
    /// or an untied LM head): that weight, its gradient and each optimizer state are one
    /// tensor.
    pub params: u64,
    /// The unit is a dense block: its parameters are the matrices of
    /// `TransformerSpec::block_matrices`, each one tensor, and what its total holds besides
    /// (norms, biases, a decoder's cross-attention).
    pub block_matrices: bool,
    /// The dense block is a vision tower's (LLaVA's, a dual encoder's): its matrices are the
    /// tower's `block_matrices`, not the language model's.
    pub tower_block: bool,
    /// The unit is a mixture-of-experts block: its parameters are the tensors of
    /// `TransformerSpec::moe_block_tensors`, each one tensor.
    pub moe_tensors: bool,
    /// Bytes of one hidden state of an encoder block whose sequence is not the model's typical
    /// one (Whisper's 1500 frames against the decoder's tokens): what the rest of its
    /// activations are made of. Zero: the model's typical hidden state.
    pub encoder_hidden: f64,
    /// Of `held`, generation's selection of the next token (the last position's logits in
    /// fp32 and a logits processor's scores): `_sample` keeps them referenced until the next
    /// step's replace them, after its forward.
    pub selection: f64,
}

/// One sublayer of a no-grad block (see [`WholeTensors::no_grad`]). The allocation sequence
/// makes each phase's tensors and frees them before the next phase's, so that the caching
/// allocator sees the block's sizes in the order its code makes them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NoGradPhase {
    /// Bytes live at the phase's peak besides the KV cache, the probabilities an earlier
    /// phase's attention returned included (the block still holds them).
    pub bytes: f64,
    /// Of `bytes`, tensors larger than a hidden state: an MLP's intermediates.
    pub whole: SavedGroup,
    /// Of `bytes`, the score matrices of an attention kernel that materialises them.
    pub scores: ScoreTensors,
    /// Bytes of one of the block's hidden states (over its own tokens): what the rest of
    /// `bytes` is made of.
    pub hidden: f64,
}

/// The score matrices of a materialising attention kernel (eager attention, SDPA's math path)
/// in a no-grad forward, in bytes of one tensor each, made in this order: the scores (and
/// their scaled or masked copy), a soft-capped copy, the softmax's fp32 conversion of its
/// input, the softmax's output, the output's cast; each released once the next has read it.
/// Zero: no such tensor.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScoreTensors {
    /// The scores in the activation dtype.
    pub input: f64,
    /// The scores are copied once before the softmax (scaled or masked out of place, as the
    /// model families' eager code does), both alive while the copy is made.
    pub copied: bool,
    /// Their soft-capped copy (`tanh`), alive beside them.
    pub softcap: f64,
    /// The fp32 copy the softmax makes of a half-precision input first.
    pub conversion: f64,
    /// The softmax's output.
    pub probs: f64,
    /// The output cast back to the activation dtype.
    pub cast: f64,
    /// The attention returns its probabilities (the cast, else the output) and the block
    /// holds them until it returns.
    pub returned: bool,
}

impl ScoreTensors {
    /// Bytes alive at once at the kernel's peak: the scores beside the softmax's output and
    /// whichever of the conversion and the cast is larger.
    pub fn peak(&self) -> f64 {
        let copying = if self.copied { 2.0 * self.input } else { 0.0 };
        (self.input + self.softcap + self.probs + self.conversion.max(self.cast)).max(copying)
    }

    /// Bytes of the probabilities the block holds after the kernel (zero where it returns
    /// none).
    pub fn returned_bytes(&self) -> f64 {
        match (self.returned, self.cast > 0.0) {
            (false, _) => 0.0,
            (true, true) => self.cast,
            (true, false) => self.probs,
        }
    }
}

/// Saved bytes of one kind, kept as tensors of one size.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SavedGroup {
    /// Bytes of all of them.
    pub bytes: f64,
    /// Bytes of one.
    pub tensor: f64,
}

impl Unit {
    /// The unit as a vision tower's (see [`WholeTensors::tower_block`]).
    pub(crate) fn in_a_tower(mut self) -> Unit {
        self.whole.tower_block = self.whole.block_matrices;
        self
    }

    /// Adds `bytes` a no-grad forward holds alive through the whole unit: to its peak and to
    /// each of its phases.
    pub(crate) fn hold_through_no_grad(&mut self, bytes: f64) {
        self.inference_live += bytes;
        for phase in self.whole.no_grad.iter_mut().filter(|p| p.bytes > 0.0) {
            phase.bytes += bytes;
        }
    }

    /// A checkpointed block's forward phases: it keeps nothing for its backward, so it makes
    /// its tensors as a no-grad forward does, sublayer by sublayer (its no-grad phases, each
    /// less the block input, which the checkpoint keeps). None: the unit has no phases.
    pub(crate) fn checkpointed_forward(&self) -> Option<[NoGradPhase; 3]> {
        self.whole.no_grad.iter().any(|p| p.bytes > 0.0).then(|| {
            self.whole.no_grad.map(|p| NoGradPhase {
                bytes: if p.bytes > 0.0 {
                    (p.bytes - p.hidden).max(1.0)
                } else {
                    0.0
                },
                ..p
            })
        })
    }

    /// The peak of [`Self::checkpointed_forward`] beside the kept block input, else the
    /// grad-mode forward's transient.
    pub(crate) fn checkpointed_forward_transient(&self) -> f64 {
        self.checkpointed_forward()
            .map_or(self.forward_transient, |phases| {
                phases.iter().map(|p| p.bytes).fold(0.0, f64::max)
            })
    }

    /// Parameters that receive a gradient in training.
    pub fn trained_params(&self) -> u64 {
        self.params - self.untrained_params
    }

    /// The unit as it runs when nothing reads its output in training: what it would save
    /// lives only while it runs, and its backward never does.
    pub(crate) fn unused_in_training(self) -> Unit {
        Unit {
            forward_transient: self.forward_transient + self.saved,
            saved: 0.0,
            attention_core: 0.0,
            checkpoint: Some(0.0),
            backward_transient: 0.0,
            gradient_transient: 0.0,
            saved_through_gradients: 0.0,
            untrained_params: self.params,
            ..self
        }
    }
}

/// Gradient-sized tensors alive while a new gradient is added to an existing one (the new
/// gradient and the out-of-place sum), as measured for tied embeddings.
pub const ACCUMULATION_COPIES: f64 = 2.0;
