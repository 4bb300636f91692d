//! `--lora-targets`: which of a block's linears carry a LoRA adapter, by role. Below the
//! workload (which holds a set) and the LoRA memory model (`lora`, which reads it).

use crate::error::{PlanError, Result};
use crate::model::TransformerSpec;
use serde::{Serialize, Serializer};

/// A set of a block's linears by role, as a bit set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraTargets(u16);

/// The query projection.
pub(crate) const Q: u16 = 1;
/// The key projection.
pub(crate) const K: u16 = 2;
/// The value projection.
pub(crate) const V: u16 = 4;
/// The output projection.
pub(crate) const O: u16 = 8;
/// The MLP's gate projection (a mixture of experts' routed ones).
pub(crate) const GATE: u16 = 16;
/// The MLP's up projection.
pub(crate) const UP: u16 = 32;
/// The MLP's down projection.
pub(crate) const DOWN: u16 = 64;
/// A mixture of experts' router (its `gate`).
pub(crate) const ROUTER: u16 = 128;
/// Every role: `all-linear`.
pub(crate) const ALL: u16 = Q | K | V | O | GATE | UP | DOWN | ROUTER;

/// Role names in the order they are printed.
const ROLES: [(u16, &str); 8] = [
    (Q, "q"),
    (K, "k"),
    (V, "v"),
    (O, "o"),
    (GATE, "gate"),
    (UP, "up"),
    (DOWN, "down"),
    (ROUTER, "router"),
];

impl Serialize for LoraTargets {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl std::fmt::Display for LoraTargets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 == ALL {
            return f.write_str("all-linear");
        }
        let names: Vec<&str> = ROLES
            .iter()
            .filter(|(bit, _)| self.0 & bit != 0)
            .map(|(_, name)| *name)
            .collect();
        f.write_str(&names.join(","))
    }
}

impl Default for LoraTargets {
    /// Every linear of the blocks (PEFT's `target_modules="all-linear"`).
    fn default() -> Self {
        LoraTargets(ALL)
    }
}

/// Whether transformers 5.x stores `model_type`'s experts as fused 3-D parameters, onto which
/// PEFT (its v5 conversion, `_MOE_TARGET_MODULE_MAPPING`) maps the MLP names of a target list
/// (and the router's `gate`): the routed experts' gate/up and down stacks are then adapted
/// through `target_parameters`, and the dense linears of the same names (shared experts, the
/// first dense layers) are no longer targeted at all, `all-linear` included.
fn fused_experts(model_type: &str) -> bool {
    matches!(
        model_type,
        "mixtral" | "qwen2_moe" | "qwen3_moe" | "deepseek_v2" | "deepseek_v3" | "olmoe"
    )
}

/// What a module name of a PEFT `target_modules` list (or one of our role names) adapts in a
/// block of `model_type`; None for a name no supported family uses. In a mixture of experts
/// (`fused_experts`), the MLP roles are its routed experts' and `gate` is the router.
fn roles_of(name: &str, model_type: &str) -> Option<u16> {
    Some(match name {
        "all-linear" => ALL,
        "router" => ROUTER,
        "gate" if fused_experts(model_type) => ROUTER,
        "q" | "q_proj" | "query" => Q,
        "k" | "k_proj" | "key" => K,
        "v" | "v_proj" | "value" => V,
        "o" | "o_proj" | "out_proj" => O,
        "gate" | "gate_proj" | "w1" | "wi_0" => GATE,
        "up" | "up_proj" | "w3" | "wi_1" | "fc1" | "c_fc" | "dense_h_to_4h" | "wi" => UP,
        "down" | "down_proj" | "w2" | "fc2" | "dense_4h_to_h" | "wo" => DOWN,
        "qkv" | "qkv_proj" | "c_attn" | "query_key_value" => Q | K | V,
        "gate_up" | "gate_up_proj" => GATE | UP,
        // GPT-2 and BigCode name both the attention's and the MLP's output projection `c_proj`;
        // BERT names three linears `dense`, GPT-NeoX and Phi the attention's output only.
        "c_proj" => O | DOWN,
        "dense" if matches!(model_type, "bert" | "roberta") => O | UP | DOWN,
        "dense" => O,
        _ => return None,
    })
}

impl LoraTargets {
    /// Parses a comma-separated list of role names (q, k, v, o, gate, up, down, qkv, gate_up),
    /// module names as PEFT configs write them for `model_type`'s family (q_proj, c_attn,
    /// query_key_value, …) or `all-linear`.
    pub fn parse(text: &str, model_type: &str) -> Result<Self> {
        let mut roles = 0;
        for name in text.split(',').map(str::trim) {
            roles |= roles_of(name, model_type).ok_or_else(|| PlanError::InvalidValue {
                name: "lora-targets".into(),
                value: name.to_string(),
                reason: "not a linear of a transformer block; accepted: all-linear, q, k, v, o, \
                         gate, up, down, qkv, gate_up, or the module names of PEFT's \
                         target_modules (q_proj, v_proj, c_attn, query_key_value, fc1, …)"
                    .into(),
            })?;
        }
        Ok(LoraTargets(roles))
    }

    /// Whether every linear of a block is adapted.
    pub fn all(self) -> bool {
        self.0 == ALL
    }

    /// Checks the set against `spec`: a role the family has not (a gate in a plain MLP), or
    /// part of a fused projection (q alone in GPT-2's `c_attn`), is an error; `all-linear`
    /// adapts whatever the family has.
    pub fn check(self, spec: &TransformerSpec, model: &str) -> Result<()> {
        if self.all() {
            return Ok(());
        }
        let invalid = |reason: String| PlanError::InvalidValue {
            name: "lora-targets".into(),
            value: self.to_string(),
            reason,
        };
        if spec.latent.is_some() {
            return Err(invalid(format!(
                "{model}'s latent attention is adapted as a whole: use all-linear"
            )));
        }
        if !spec.gated_mlp && self.0 & GATE != 0 {
            return Err(invalid(format!(
                "{model}'s MLP has no gate projection (its linears: up, down)"
            )));
        }
        let partial = |group: u16| self.0 & group != 0 && self.0 & group != group;
        if spec.fused_qkv && partial(Q | K | V) {
            return Err(invalid(format!(
                "{model} computes q, k and v with one linear: adapt all three (qkv) or none"
            )));
        }
        if spec.fused_gate_up && spec.gated_mlp && partial(GATE | UP) {
            return Err(invalid(format!(
                "{model} computes gate and up with one linear: adapt both (gate_up) or neither"
            )));
        }
        if spec.experts > 1 && partial(GATE | UP) {
            return Err(invalid(format!(
                "{model} stores its experts' gate and up in one fused parameter (PEFT refuses to \
                 adapt one without the other): adapt both or neither"
            )));
        }
        if spec.experts <= 1 && self.0 & ROUTER != 0 {
            return Err(invalid(format!(
                "{model} has no mixture of experts to route"
            )));
        }
        Ok(())
    }

    /// Does the set hold any of `roles` (a union of the role bits)?
    pub(crate) fn has(self, roles: u16) -> bool {
        self.0 & roles != 0
    }

    /// Whether PEFT adapts a parameter, not a module, of `spec`: a mixture of experts' router
    /// or fused expert stacks (its `ParamWrapper`, which takes no dropout).
    pub fn adapts_parameters(self, spec: &TransformerSpec) -> bool {
        spec.experts > 1 && self.has(GATE | UP | DOWN | ROUTER)
    }
}
