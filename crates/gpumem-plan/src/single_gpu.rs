//! Mechanisms of single-GPU settings that change what a block keeps or briefly holds:
//! torchtitan's per-op selective checkpointing (which matmul outputs it saves), the
//! bitsandbytes 4-bit dequantisation buffers under QLoRA, and the buffers today's modelling code
//! registers beside a family's parameters.

use crate::model::{LayerKind, TransformerSpec};

/// One linear layer of a block in forward order: its output width per token, whether it has a
/// bias, and whether it reads the key side (cross-attention's keys and values read the encoder).
#[derive(Debug, Clone, Copy, PartialEq)]
struct BlockLinear {
    width: f64,
    bias: bool,
    reads_keys: bool,
}

/// The linear layers of one attention sublayer in forward order (q, k, v or the fused qkv, then
/// the output projection), as the family's code calls them.
fn attention_linears(spec: &TransformerSpec, cross: bool, out: &mut Vec<BlockLinear>) {
    let (q, kv, value, h) = (
        spec.query_width() as f64,
        spec.kv_width() as f64,
        spec.value_width() as f64,
        spec.hidden as f64,
    );
    let linear = |width, bias, reads_keys| BlockLinear {
        width,
        bias,
        reads_keys,
    };
    if spec.fused_qkv && !cross {
        out.push(linear(q + kv + value, spec.qkv_bias, false));
    } else {
        out.push(linear(q, spec.qkv_bias, false));
        out.push(linear(kv, spec.key_bias, cross));
        out.push(linear(value, spec.qkv_bias, cross));
    }
    out.push(linear(h, spec.out_bias, false));
}

/// The linear layers of a dense MLP (or a mixture's shared experts) in forward order: the
/// gate and up projections (or the fused gate|up, or the single up projection), then down.
fn mlp_linears(spec: &TransformerSpec, layer: LayerKind, out: &mut Vec<BlockLinear>) {
    let h = spec.hidden as f64;
    let f = if layer.moe {
        spec.moe.shared_intermediate as f64
    } else {
        spec.routed_intermediate(layer) as f64
    };
    let linear = |width| BlockLinear {
        width,
        bias: spec.mlp_bias,
        reads_keys: false,
    };
    if layer.moe {
        // The router is a bias-free matmul; the routed experts run grouped matmuls, which the
        // policy does not save.
        out.push(BlockLinear {
            width: spec.experts as f64,
            bias: false,
            reads_keys: false,
        });
        if f == 0.0 {
            return;
        }
    }
    if spec.gated_mlp && spec.fused_gate_up {
        out.push(linear(2.0 * f));
    } else if spec.gated_mlp {
        out.push(linear(f));
        out.push(linear(f));
    } else {
        out.push(linear(f));
    }
    out.push(linear(h));
}

/// Elements per query token (and per key token) of the matmul outputs that torchtitan's per-op
/// policy saves in one block: PyTorch runs a bias-free linear on a 3-D input as `aten.mm` and
/// a linear with a bias as `aten.addmm`; the policy (`_save_list` in torchtitan's `apply_ac`,
/// over `torch.utils.checkpoint.create_selective_checkpoint_contexts`) counts the `mm` calls of
/// each checkpointed region and saves the outputs of the odd ones (the 1st, 3rd, ...), and no
/// `addmm` output.
pub(crate) fn per_op_saved_matmul_widths(
    spec: &TransformerSpec,
    layer: LayerKind,
    cross: bool,
) -> (f64, f64) {
    let mut linears = Vec::new();
    attention_linears(spec, false, &mut linears);
    if cross {
        attention_linears(spec, true, &mut linears);
    }
    mlp_linears(spec, layer, &mut linears);
    let mut count = 0;
    let (mut per_query, mut per_key) = (0.0, 0.0);
    for linear in linears.iter().filter(|l| !l.bias) {
        count += 1;
        if count % 2 == 1 {
            if linear.reads_keys {
                per_key += linear.width;
            } else {
                per_query += linear.width;
            }
        }
    }
    (per_query, per_key)
}

/// Bytes of the buffers today's modelling code of `spec`'s family registers beside its
/// parameters: GPTBigCode's model keeps a boolean causal mask of `max_positions²`
/// (`self.bias = nn.Buffer(torch.tril(...))`, transformers 5.x), 64 MiB for StarCoder's 8192
/// positions, in every mode.
pub(crate) fn model_buffer_bytes(spec: &TransformerSpec) -> f64 {
    let positions = spec.max_positions.unwrap_or(0) as f64;
    match spec.model_type.as_str() {
        "gpt_bigcode" => positions * positions,
        _ => 0.0,
    }
}
