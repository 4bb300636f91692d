//! LoRA adapters on a chosen set of a block's linears (`--lora-targets`) and their dropout
//! (`--lora-dropout`), as PEFT builds them: which linears carry an adapter decides the trainable
//! parameters and which inputs are saved for backward — a frozen linear saves nothing, each
//! adapter saves its own input (PEFT's fp32 copy over a half-precision base, or dropout's output
//! and mask).

// The target set is defined below the workload, which holds one; re-exported here.
pub use crate::lora_targets::LoraTargets;
use crate::lora_targets::{ALL, DOWN, GATE, K, O, Q, ROUTER, UP, V};
use crate::model::{LayerKind, TransformerSpec};

/// The linears of one block of kind `layer` as (roles, inputs, outputs, how many): one entry
/// per module PEFT would adapt (a fused projection is one module).
fn block_linears(spec: &TransformerSpec, layer: LayerKind) -> Vec<(u16, u64, u64, u64)> {
    let (h, qw, kv) = (spec.hidden, spec.query_width(), spec.kv_width());
    let mut out = Vec::new();
    match spec.latent {
        Some(l) => {
            if l.query_rank > 0 {
                out.push((Q, h, l.query_rank, 1));
                out.push((Q, l.query_rank, qw, 1));
            } else {
                out.push((Q, h, qw, 1));
            }
            out.push((K | V, h, l.kv_rank + l.rope_dim, 1));
            out.push((K | V, l.kv_rank, spec.heads * (l.nope_dim + l.value_dim), 1));
            out.push((O, spec.value_width(), h, 1));
        }
        None if spec.fused_qkv => {
            out.push((Q | K | V, h, qw + 2 * kv, 1));
            out.push((O, qw, h, 1));
        }
        None => out.extend(separate_projections(spec)),
    }
    // In a mixture of experts the MLP names select the routed experts: its dense MLPs (shared
    // experts, first dense layers) cannot be targeted (role 0).
    let dense = |roles: u16| if spec.experts > 1 { 0 } else { roles };
    let mut mlp = |width: u64, count: u64| {
        if spec.gated_mlp && spec.fused_gate_up && !layer.moe {
            out.push((dense(GATE | UP), h, 2 * width, count));
        } else if spec.gated_mlp {
            out.extend([(dense(GATE), h, width, count), (dense(UP), h, width, count)]);
        } else {
            out.push((dense(UP), h, width, count));
        }
        out.push((dense(DOWN), width, h, count));
    };
    if layer.moe {
        if spec.moe.shared_intermediate > 0 {
            mlp(spec.moe.shared_intermediate, 1);
        }
        // PEFT's adapter on a fused expert stack has rank `rank × experts` (each expert its own
        // `rank` rows); the gate/up stack gets twice the rank (its `rank_pattern`).
        let (h, f, experts) = (spec.hidden, spec.intermediate, spec.experts);
        if spec.gated_mlp {
            out.push((GATE | UP, h, 2 * f, 2 * experts));
        } else {
            out.push((UP, h, f, experts));
        }
        out.push((DOWN, f, h, experts));
        out.push((ROUTER, h, experts, 1));
    } else {
        mlp(spec.routed_intermediate(layer), 1);
    }
    out
}

/// An attention's separate q, k, v and o projections, in the entries of [`block_linears`]: a
/// self-attention's without fused or latent projections, and an encoder-decoder's
/// cross-attention's (k and v read the encoder's output, of the same width in every supported
/// family), whose linears PEFT's names select as they select the self-attention's.
fn separate_projections(spec: &TransformerSpec) -> [(u16, u64, u64, u64); 4] {
    let (h, qw, kv) = (spec.hidden, spec.query_width(), spec.kv_width());
    [(Q, h, qw, 1), (K, h, kv, 1), (V, h, kv, 1), (O, qw, h, 1)]
}

/// Trainable parameters of rank-`rank` adapters on `targets` in every block (of the language
/// model; a vision tower stays frozen), an encoder-decoder's cross-attentions included.
pub fn lora_params(spec: &TransformerSpec, rank: u64, targets: LoraTargets) -> u64 {
    let sum = |linears: &[(u16, u64, u64, u64)]| -> u64 {
        linears
            .iter()
            .filter(|(roles, ..)| targets.has(*roles))
            .map(|(_, i, o, n)| (i + o) * n)
            .sum()
    };
    let per_block = |layer: LayerKind| sum(&block_linears(spec, layer));
    let moe = LayerKind {
        sliding: false,
        moe: true,
    };
    let moe_layers = (0..spec.layers).filter(|&i| spec.layer_kind(i).moe).count() as u64;
    let dense_blocks = spec.layers - moe_layers + spec.encoder_layers;
    let cross = if spec.is_encoder_decoder() {
        spec.layers * sum(&separate_projections(spec))
    } else {
        0
    };
    rank * (dense_blocks * per_block(LayerKind::default()) + moe_layers * per_block(moe) + cross)
}

/// Elements of each adapter matrix of one layer of `layer`'s kind, in the order of its linears:
/// each adapted linear's `lora_A` (`rank × in`) then its `lora_B` (`out × rank`), once per copy
/// (expert).
pub fn adapter_matrices(
    spec: &TransformerSpec,
    layer: LayerKind,
    rank: u64,
    targets: LoraTargets,
) -> Vec<u64> {
    block_linears(spec, layer)
        .iter()
        .filter(|(roles, ..)| targets.has(*roles))
        .flat_map(|&(_, i, o, n)| (0..n).flat_map(move |_| [rank * i, o * rank]))
        .collect()
}

/// Trainable parameters in adapter matrices of fewer than `threshold` elements (each `lora_A`
/// of `rank × in`, each `lora_B` of `out × rank`) over every layer of the language model:
/// what DeepSpeed ZeRO-3 keeps whole on every rank (`stage3_param_persistence_threshold`,
/// `ds_persist`). Each layer is taken as the first layer's kind.
pub fn small_adapter_params(
    spec: &TransformerSpec,
    rank: u64,
    targets: LoraTargets,
    threshold: u64,
) -> u64 {
    let per_layer: u64 = adapter_matrices(spec, spec.layer_kind(0), rank, targets)
        .into_iter()
        .filter(|&numel| numel < threshold)
        .sum();
    per_layer * (spec.layers + spec.encoder_layers)
}

/// Bytes per token a dense block's saved inputs change by under LoRA, against full training
/// (where each input group — the norm output q/k/v read, the attention output o reads, the norm
/// output the MLP's first linears read, the activation down reads — is one tensor of `act`
/// bytes per element, saved by the trained linears):
/// * a group none of whose linears is adapted is saved by nothing (its linears are frozen);
/// * with dropout (`p > 0`), each adapter saves its dropout's output (in the adapters' dtype:
///   fp32 under PEFT's `autocast_adapter_dtype`) and 1-byte mask instead of the input;
/// * without, each fp32 adapter over a half-precision base saves its own fp32 copy of the
///   input, and otherwise the input itself (one tensor).
///
/// With `o_input_shared`, the output projection's input is the attention kernel's output, which
/// the kernel saves whether or not o is adapted. Each adapter also saves its `lora_A` output
/// (`rank` values per token) for `lora_B`.
pub struct LoraBlock {
    /// Bytes per activation element.
    pub act: f64,
    /// The base weights are in half precision (fp32 adapters then cast each input to fp32).
    pub half_base: bool,
    /// Bytes per element of the adapters and what they compute: 4 for PEFT's fp32 adapters
    /// (`Workload::fp32_adapters`), else the base's dtype (litgpt, PEFT before 0.12).
    pub adapter: f64,
    /// The output projection reads what the attention kernel saves anyway.
    pub o_input_shared: bool,
    /// litgpt's LoRA: adapters in the activation dtype (no fp32 copy); the fused qkv linear
    /// has one `lora_A` (behind one dropout) of `rank` rows per enabled projection, and unless
    /// all of q, k, v are enabled its `lora_B` output (their widths) is saved as well.
    pub litgpt: bool,
    /// Each frozen linear keeps its input, adapted or not: a bitsandbytes 4-bit base before
    /// 0.43.2 (its `MatMul4Bit` held `ctx.tensors = (A, B)`), so no input group is freed.
    pub base_saves_inputs: bool,
    /// The block is an encoder-decoder's decoder block, whose cross-attention reads the
    /// encoder's output.
    pub cross_attention: bool,
}

/// Bytes per token a block's saved tensors change by under LoRA (see [`LoraBlock`]), for its
/// attention's linears and for its MLP's (a mixture of experts' router and experts as PEFT
/// adapts them, see [`adapted_experts_bytes`] for what they save per step).
#[derive(Debug, Clone, Copy, Default)]
pub struct SavedChange {
    /// q, k, v and o.
    pub attention: f64,
    /// The MLP's linears.
    pub mlp: f64,
    /// A cross-attention's q and o, per decoder token.
    pub cross_queries: f64,
    /// A cross-attention's k and v, per encoder token: each adapter copies the encoder's
    /// output for itself (PEFT's fp32 copy, or dropout's output and mask), in every decoder
    /// block, while the output itself stays saved (it is the encoder's, read by every block).
    pub cross_keys: f64,
}

/// See [`LoraBlock`] and [`SavedChange`].
pub fn saved_change(
    spec: &TransformerSpec,
    layer: LayerKind,
    lora: &crate::workload::Lora,
    block: LoraBlock,
) -> SavedChange {
    let (h, qw) = (spec.hidden as f64, spec.query_width() as f64);
    let f = spec.routed_intermediate(layer) as f64;
    let (cross_attention, act) = (block.cross_attention, block.act);
    let inputs = AdaptedInputs { spec, lora, block };
    let linears = block_linears(spec, layer);
    let (cross_queries, cross_keys) = if cross_attention {
        let cross = separate_projections(spec);
        (
            inputs.input(Q, inputs.adapted_in(&cross, Q), h)
                + inputs.input(O, inputs.adapted_in(&cross, O), qw),
            inputs.copies(K | V, inputs.adapted_in(&cross, K | V), h, 0.0),
        )
    } else {
        (0.0, 0.0)
    };
    SavedChange {
        attention: inputs.attention(&linears),
        mlp: if !layer.moe {
            inputs.group(&linears, GATE | UP, h) + inputs.group(&linears, DOWN, f)
        } else {
            frozen_experts_change(spec, lora.targets, act)
        },
        cross_queries,
        cross_keys,
    }
}

/// The inputs of a block's linears under `lora`: the bytes per token each group's adapters
/// change ([`saved_change`]).
struct AdaptedInputs<'a> {
    spec: &'a TransformerSpec,
    lora: &'a crate::workload::Lora,
    block: LoraBlock,
}

impl AdaptedInputs<'_> {
    /// One input of `width`, read by `adapted` adapters among the linears of `group`, of which
    /// full training saves `freed` bytes that frozen linears do not.
    fn copies(&self, group: u16, adapted: f64, width: f64, freed: f64) -> f64 {
        let (targets, dropout) = (self.lora.targets, self.lora.dropout);
        let rank = self.lora.rank as f64;
        if self.block.litgpt {
            return litgpt_group(
                self.spec,
                group,
                targets,
                adapted,
                dropout,
                self.block.act,
                rank,
                width,
                freed,
            );
        }
        let adapter = self.block.adapter;
        let inputs = if adapted == 0.0 {
            -freed
        } else if dropout > 0.0 {
            // Dropout's output in the adapters' dtype and its 1-byte mask.
            adapted * (adapter + 1.0) * width - freed
        } else if self.block.half_base && adapter > self.block.act {
            adapted * adapter * width - freed
        } else {
            0.0
        };
        // Each adapter's `lora_A` output, saved by its `lora_B`.
        inputs + adapted * adapter * rank
    }

    /// The group's input as full training saves it, which the frozen linears free unless they
    /// keep it themselves (or the attention kernel saves it anyway).
    fn input(&self, group: u16, adapted: f64, width: f64) -> f64 {
        let kept = (group == O && self.block.o_input_shared) || self.block.base_saves_inputs;
        let freed = if kept { 0.0 } else { self.block.act * width };
        self.copies(group, adapted, width, freed)
    }

    /// How many of `linears` in `group` are adapted.
    fn adapted_in(&self, linears: &[(u16, u64, u64, u64)], group: u16) -> f64 {
        linears
            .iter()
            .filter(|(roles, ..)| roles & group != 0 && self.lora.targets.has(*roles))
            .count() as f64
    }

    /// [`Self::input`] of `group` among `linears`, with its adapted count.
    fn group(&self, linears: &[(u16, u64, u64, u64)], group: u16, width: f64) -> f64 {
        self.input(group, self.adapted_in(linears, group), width)
    }

    /// The self-attention's change, among the block's `linears`.
    fn attention(&self, linears: &[(u16, u64, u64, u64)]) -> f64 {
        let spec = self.spec;
        let (h, qw) = (spec.hidden as f64, spec.query_width() as f64);
        match spec.latent {
            // Latent attention, adapted as a whole: q_a and kv_a read the block's input, q_b and
            // kv_b each their own normalised low-rank input, o the values.
            Some(l) if !self.block.litgpt => {
                let queries = if l.query_rank > 0 {
                    self.input(Q, 1.0, l.query_rank as f64)
                } else {
                    0.0
                };
                self.input(Q | K | V, 2.0, h)
                    + queries
                    + self.input(K | V, 1.0, l.kv_rank as f64)
                    + self.group(linears, O, spec.value_width() as f64)
            }
            _ => self.group(linears, Q | K | V, h) + self.group(linears, O, qw),
        }
    }
}

/// [`saved_change`] of a mixture-of-experts MLP as transformers 5.x runs it (`grouped_mm` over
/// fused expert parameters). PEFT folds an adapter into its weight, which then needs a gradient
/// as in full training; a weight without one is frozen and saves nothing for it:
/// * a frozen router: neither the norm output it reads nor its fp32 copy of it;
/// * frozen gate/up stacks: no expert's gathered copy of its tokens;
/// * frozen down stacks: no gated product; the shared experts are always frozen (their names
///   select the routed experts), so theirs is not saved either.
///
/// The gate/up output, the activation's output, each expert's output (scaled by its routing
/// weight) and the router's probabilities stay.
fn frozen_experts_change(spec: &TransformerSpec, targets: LoraTargets, act: f64) -> f64 {
    let h = spec.hidden as f64;
    let k = spec.experts_per_token as f64;
    let mut freed = act * spec.moe.shared_intermediate as f64;
    if !targets.has(ROUTER) {
        let upcast = if spec.moe.fp32_router && act < 4.0 {
            4.0 * h
        } else {
            0.0
        };
        freed += act * h + upcast;
    }
    if !targets.has(GATE | UP) {
        freed += k * act * h;
    }
    if !targets.has(DOWN) {
        freed += k * act * spec.intermediate as f64;
    }
    -freed
}

/// The weights PEFT folds adapters into in a mixture-of-experts layer of kind `layer` (the
/// experts' gate/up and down stacks, the router's), as (roles, elements of the folded weight,
/// elements of its two factors); empty for a dense layer.
fn folded_weights(
    spec: &TransformerSpec,
    layer: LayerKind,
    lora: &crate::workload::Lora,
) -> Vec<(u16, f64, f64)> {
    if !layer.moe {
        return Vec::new();
    }
    // In a mixture of experts only the routed experts and the router carry MLP roles.
    block_linears(spec, layer)
        .into_iter()
        .filter(|(roles, ..)| roles & (GATE | UP | DOWN | ROUTER) != 0 && lora.targets.has(*roles))
        .map(|(roles, inputs, outputs, count)| {
            let (i, o) = (inputs as f64, outputs as f64);
            // The gate/up stack counts twice (twice the rank), but its weight is one.
            let weights = if roles == ROUTER {
                1.0
            } else {
                spec.experts as f64
            };
            (
                roles,
                weights * i * o,
                lora.rank as f64 * count as f64 * (i + o),
            )
        })
        .collect()
}

/// Bytes a mixture-of-experts layer of kind `layer` saves per step for PEFT's adapters on its
/// router and experts, whatever the tokens: for each adapted weight `nn.utils.parametrize`
/// folds the adapter in with one `baddbmm` (`W + scaling · lhs @ rhs`), whose output the expert
/// matmuls save, and the product saves its two factors, cast to the weights' dtype (`act` bytes
/// per element).
pub fn adapted_experts_bytes(
    spec: &TransformerSpec,
    layer: LayerKind,
    lora: &crate::workload::Lora,
    act: f64,
) -> f64 {
    folded_weights(spec, layer, lora)
        .into_iter()
        .map(|(_, weight, factors)| act * (weight + factors))
        .sum()
}

/// Bytes of [`adapted_experts_bytes`] a block does not keep when its MLP input needs no
/// gradient (the first block, with no adapter before its MLP): a matmul keeps its folded weight
/// only for its input's gradient, so the router's and the gate/up stack's are dropped (the down
/// stack reads the experts' activations, which depend on the gate/up weight).
pub fn folds_read_by_the_input(
    spec: &TransformerSpec,
    layer: LayerKind,
    lora: &crate::workload::Lora,
    act: f64,
) -> f64 {
    folded_weights(spec, layer, lora)
        .into_iter()
        .filter(|(roles, ..)| roles & DOWN == 0)
        .map(|(_, weight, _)| act * weight)
        .sum()
}

/// [`saved_change`] of one input group under litgpt's LoRA (adapters in the activation dtype):
/// each adapted linear's adapter reads the group's input behind its own dropout (its output and
/// a 1-byte mask, or the input itself without dropout); q, k and v share one `lora_A` of `rank` rows per enabled
/// projection, whose `lora_B` output is saved when only some of them are enabled.
#[allow(clippy::too_many_arguments)]
fn litgpt_group(
    spec: &TransformerSpec,
    group: u16,
    targets: LoraTargets,
    adapted: f64,
    dropout: f64,
    act: f64,
    rank: f64,
    width: f64,
    freed: f64,
) -> f64 {
    if adapted == 0.0 {
        return -freed;
    }
    // One adapter per linear, each behind its own dropout; q, k, v are one fused linear.
    let adapters = if group == Q | K | V { 1.0 } else { adapted };
    let inputs = if dropout > 0.0 {
        adapters * (act + 1.0) * width - freed
    } else {
        0.0
    };
    // The shared `lora_A`'s output (`rank` rows per enabled projection), which the `lora_B`
    // convolutions save. When only some of q, k, v are enabled, `zero_pad` copies the
    // convolutions' output (the enabled widths) into a zero tensor with `index_copy_`, which
    // saves it.
    let low_rank = if group == Q | K | V {
        let (qw, kv) = (spec.query_width() as f64, spec.kv_width() as f64);
        let enabled: Vec<f64> = [(Q, qw), (K, kv), (V, kv)]
            .into_iter()
            .filter(|(role, _)| targets.has(*role))
            .map(|(_, out)| out)
            .collect();
        let padded = if enabled.len() < 3 {
            act * enabled.iter().sum::<f64>()
        } else {
            0.0
        };
        enabled.len() as f64 * act * rank + padded
    } else {
        adapted * act * rank
    };
    inputs + low_rank
}

/// The widest input and output of a block's adapters (elements per token they read), the
/// short-lived tensors of an adapter's forward: its input's fp32 cast and dropout's mask before
/// `lora_A`, `lora_B`'s output and its scaled copy after (PEFT's
/// `result + lora_B(lora_A(dropout(x))) * scaling`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AdapterWidths {
    /// The widest input.
    pub input: f64,
    /// The widest output.
    pub output: f64,
}

/// [`AdapterWidths`] of a block of kind `layer`, as (per token of the block, per encoder token
/// for a cross-attention's k and v). Adapters folded into a mixture of experts' weights have
/// none.
pub fn adapter_widths(
    spec: &TransformerSpec,
    layer: LayerKind,
    targets: LoraTargets,
    cross_attention: bool,
) -> (AdapterWidths, AdapterWidths) {
    let widest = |linears: &[(u16, u64, u64, u64)], group: u16| {
        widest_adapter(spec, linears, targets, group)
    };
    let own = widest(&block_linears(spec, layer), ALL);
    if !cross_attention {
        return (own, AdapterWidths::default());
    }
    let cross = separate_projections(spec);
    let queries = widest(&cross, Q | O);
    (
        AdapterWidths {
            input: own.input.max(queries.input),
            output: own.output.max(queries.output),
        },
        widest(&cross, K | V),
    )
}

/// Whether the block's last linear, a dense MLP's output projection (`DOWN`), carries an
/// adapter (not one folded into a mixture of experts' weights).
pub fn adapts_last_linear(spec: &TransformerSpec, layer: LayerKind, targets: LoraTargets) -> bool {
    widest_adapter(spec, &block_linears(spec, layer), targets, DOWN).output > 0.0
}

/// [`AdapterWidths`] of the adapters of a block's own attention (`mlp` false: q, k, v, o) or of
/// its MLP (`mlp` true: gate, up, down): what each sublayer of a no-grad forward adds.
pub fn sublayer_adapter_widths(
    spec: &TransformerSpec,
    layer: LayerKind,
    targets: LoraTargets,
    mlp: bool,
) -> AdapterWidths {
    let group = if mlp { GATE | UP | DOWN } else { Q | K | V | O };
    widest_adapter(spec, &block_linears(spec, layer), targets, group)
}

/// The widest input and output of the adapted `linears` of `group` (roles), leaving out those
/// folded into a mixture of experts' weights.
fn widest_adapter(
    spec: &TransformerSpec,
    linears: &[(u16, u64, u64, u64)],
    targets: LoraTargets,
    group: u16,
) -> AdapterWidths {
    let folded = |roles: u16| spec.experts > 1 && roles & (GATE | UP | DOWN | ROUTER) != 0;
    linears
        .iter()
        .filter(|(roles, ..)| roles & group != 0 && targets.has(*roles) && !folded(*roles))
        .fold(AdapterWidths::default(), |w, &(_, input, output, _)| {
            AdapterWidths {
                input: w.input.max(input as f64),
                output: w.output.max(output as f64),
            }
        })
}

/// Whether any of an attention's linears (q, k, v, o) carries an adapter.
pub fn adapts_attention(targets: LoraTargets) -> bool {
    targets.has(Q | K | V | O)
}

/// Whether any of an MLP's linears (gate, up, down) carries an adapter.
pub fn adapts_mlp(targets: LoraTargets) -> bool {
    targets.has(GATE | UP | DOWN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Architecture;
    use crate::workload::{BaseQuant, Lora};

    #[test]
    fn litgpt_saves_lora_b_output_only_when_qkv_is_partly_adapted() {
        // litgpt 0.5.13, measured on CPU (llama-8l shapes: 512 wide, 2 of 8 key/value heads):
        // with q, k and v all adapted `zero_pad` returns the `lora_B` output unsaved; with only
        // some, its `index_copy_` saves it. The MLP's two input linears each have a dropout.
        let spec = &catalogue_transformer("llama-3.2-1b");
        let layer = spec.layer_kind(0);
        let change = |targets: &str, dropout: f64| {
            let lora = Lora {
                targets: LoraTargets::parse(targets, "llama").unwrap(),
                dropout,
                ..Lora::new(16, BaseQuant::None)
            };
            let block = LoraBlock {
                act: 2.0,
                half_base: true,
                adapter: 4.0,
                o_input_shared: false,
                litgpt: true,
                base_saves_inputs: false,
                cross_attention: false,
            };
            saved_change(spec, layer, &lora, block)
        };
        let (q, kv) = (spec.query_width() as f64, spec.kv_width() as f64);
        let partly = change("q,v", 0.0).attention;
        let whole = change("q,k,v", 0.0).attention;
        assert_eq!(partly - whole, 2.0 * (q + kv) - 2.0 * 16.0);
        // With dropout, gate's and up's adapters each save a dropout output and a 1-byte mask
        // of the hidden input (3 bytes per element) in place of the input itself (2), and
        // down's adapter one of the intermediate.
        let h = spec.hidden as f64;
        let mlp = change("gate,up,down", 0.1).mlp - change("gate,up,down", 0.0).mlp;
        let f = spec.intermediate as f64;
        assert_eq!(mlp, (2.0 * 3.0 - 2.0) * h + (3.0 - 2.0) * f);
    }

    #[test]
    fn parses_role_and_module_names() {
        let peft_default = LoraTargets::parse("q_proj,v_proj", "llama").unwrap();
        assert_eq!(peft_default.to_string(), "q,v");
        assert_eq!(
            LoraTargets::parse("c_proj", "gpt2").unwrap().to_string(),
            "o,down"
        );
        assert_eq!(
            LoraTargets::parse("dense", "gpt_neox").unwrap().to_string(),
            "o"
        );
        assert!(LoraTargets::parse("all-linear", "llama").unwrap().all());
        let err = LoraTargets::parse("q,lm_head", "llama")
            .unwrap_err()
            .to_string();
        assert!(err.contains("lm_head") && err.contains("accepted"), "{err}");
    }

    /// A shrunk mixture of experts of the measured sets (`testdata/plan/configs`).
    /// The transformer of catalogue model `name`.
    fn catalogue_transformer(name: &str) -> TransformerSpec {
        let model = crate::catalogue::find_model(name).unwrap();
        let Architecture::Transformer(spec) = model.arch else {
            panic!("a transformer")
        };
        *spec
    }

    fn moe_config(name: &str) -> TransformerSpec {
        let path = format!(
            "{}/../../testdata/plan/configs/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let model = crate::catalogue::load_config(std::path::Path::new(&path)).unwrap();
        let Architecture::Transformer(spec) = model.arch else {
            panic!("a transformer")
        };
        *spec
    }

    #[test]
    fn all_linear_adapts_fused_experts_and_router_as_peft_does() {
        // PEFT 0.21 over transformers 5.23 (`get_peft_model(..., LoraConfig(r=8,
        // target_modules="all-linear"))`): trainable parameters counted on the real models.
        for (name, peft) in [("mixtral-4l", 1_827_072), ("qwen3moe-4l", 1_565_184)] {
            let spec = moe_config(name);
            assert_eq!(
                lora_params(&spec, 8, LoraTargets::default()),
                peft,
                "{name}"
            );
        }
        // Attention-only targets leave router and experts without adapters.
        let spec = moe_config("mixtral-4l");
        let qv = LoraTargets::parse("q_proj,v_proj", "mixtral").unwrap();
        assert_eq!(lora_params(&spec, 8, qv), 4 * 8 * (2 * 512 + 512 + 128));
    }

    #[test]
    fn experts_save_their_folded_weights_or_nothing_frozen_needs() {
        let spec = moe_config("qwen3moe-4l");
        let layer = spec.layer_kind(1);
        assert!(layer.moe);
        let (h, f, e, k) = (512.0, 256.0, 16.0, 4.0);
        let all = Lora::new(16, BaseQuant::None);
        // Each layer saves its folded gate/up (h x 2f) and down (f x h) stacks, the router's
        // folded weight (h x E) and every adapter's two factors in bf16.
        let factors = 16.0 * (2.0 * e * (h + 2.0 * f) + e * (f + h) + (h + e));
        let folded = e * 3.0 * h * f + h * e + factors;
        assert_eq!(adapted_experts_bytes(&spec, layer, &all, 2.0), 2.0 * folded);
        // A first block whose MLP input needs no gradient keeps neither the router's nor the
        // gate/up stack's folded weight (only the down stack's, read by the activations).
        let read_by_input = e * h * 2.0 * f + h * e;
        assert_eq!(
            folds_read_by_the_input(&spec, layer, &all, 2.0),
            2.0 * read_by_input
        );
        // Without adapters on them, the experts and the router keep neither the norm output,
        // nor the gathered tokens, nor the gated products.
        let qv = Lora {
            targets: LoraTargets::parse("q_proj,v_proj", "qwen3_moe").unwrap(),
            ..all
        };
        assert_eq!(adapted_experts_bytes(&spec, layer, &qv, 2.0), 0.0);
        let block = LoraBlock {
            act: 2.0,
            half_base: true,
            adapter: 4.0,
            o_input_shared: true,
            litgpt: false,
            base_saves_inputs: false,
            cross_attention: false,
        };
        let mlp = saved_change(&spec, layer, &qv, block).mlp;
        assert_eq!(mlp, -2.0 * (h + k * (f + h)));
    }

    #[test]
    fn mixture_of_experts_names_select_router_and_fused_stacks() {
        let spec = moe_config("mixtral-4l");
        // Mixtral's `gate` is its router; w1 and w3 are fused into one stack, so one alone is
        // refused as PEFT refuses it.
        let router = LoraTargets::parse("gate", "mixtral").unwrap();
        assert_eq!(router.to_string(), "router");
        assert!(router.check(&spec, "mixtral-4l").is_ok());
        assert_eq!(lora_params(&spec, 8, router), 4 * 8 * (512 + 8));
        let w1 = LoraTargets::parse("w1", "mixtral").unwrap();
        let err = w1.check(&spec, "mixtral-4l").unwrap_err().to_string();
        assert!(err.contains("fused"), "{err}");
        assert!(LoraTargets::parse("w1,w3,w2", "mixtral")
            .unwrap()
            .check(&spec, "mixtral-4l")
            .is_ok());
        // A dense model's `gate` is its MLP's gate projection, and it has no router.
        assert_eq!(
            LoraTargets::parse("gate", "llama").unwrap().to_string(),
            "gate"
        );
        let dense = &catalogue_transformer("llama-3.2-1b");
        let err = LoraTargets::parse("router", "llama")
            .unwrap()
            .check(dense, "llama");
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("no mixture of experts"));
    }

    #[test]
    fn cross_attention_adapters_copy_the_encoder_output_in_every_decoder_block() {
        // Whisper, q_proj and v_proj over a bf16 base (traced on CPU, peft 0.21.2): the
        // decoder's cross-attention q adapter copies its norm output per decoder token, its v
        // adapter the encoder's output per encoder token, in every decoder block; the frozen o
        // frees the merged heads it would save; k reads the encoder output without an adapter.
        let spec = &catalogue_transformer("whisper-tiny");
        let layer = spec.layer_kind(0);
        let lora = Lora {
            targets: LoraTargets::parse("q_proj,v_proj", "whisper").unwrap(),
            ..Lora::new(16, BaseQuant::None)
        };
        let block = |cross_attention: bool, dropout: f64| {
            let lora = Lora { dropout, ..lora };
            let block = LoraBlock {
                act: 2.0,
                half_base: true,
                adapter: 4.0,
                o_input_shared: false,
                litgpt: false,
                base_saves_inputs: false,
                cross_attention,
            };
            saved_change(spec, layer, &lora, block)
        };
        let h = spec.hidden as f64;
        let lora_a = 4.0 * 16.0;
        let decoder = block(true, 0.0);
        assert_eq!(decoder.cross_keys, 4.0 * h + lora_a);
        assert_eq!(decoder.cross_queries, (4.0 - 2.0) * h + lora_a - 2.0 * h);
        // With dropout each copy is dropout's fp32 output and its 1-byte mask.
        assert_eq!(block(true, 0.1).cross_keys, 5.0 * h + lora_a);
        // An encoder block has no cross-attention.
        let encoder = block(false, 0.0);
        assert_eq!((encoder.cross_keys, encoder.cross_queries), (0.0, 0.0));
        assert_eq!(encoder.attention, decoder.attention);
        // The cross-attention's adapters are trainable parameters too.
        let self_only = (spec.encoder_layers + spec.layers) * 2 * (h as u64 + h as u64) * 16;
        let cross = spec.layers * 2 * 2 * h as u64 * 16;
        assert_eq!(lora_params(spec, 16, lora.targets), self_only + cross);
    }
}
