//! Run settings by the names of the `gpumem plan` flags (also the keys of the validation data),
//! and their conversion into a typed [`Workload`].

use crate::error::Result;
use crate::workload::choices::{self, parse};
use crate::workload::{
    Attention, BaseQuant, Checkpointing, Layout, Lora, OptimizerImpl, Sharding, Target, Workload,
};
use serde::Deserialize;

/// Settings as strings and numbers, exactly as typed on the command line or stored in
/// `testdata/plan/measured.jsonl`. Absent values take the [`Workload`] defaults.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// `--mode`: train, infer, generate.
    pub mode: Option<String>,
    /// `--batch`: micro-batch per data-parallel rank.
    pub batch: Option<u64>,
    /// `--seq`: sequence (prompt) length.
    pub seq: Option<u64>,
    /// `--image-size`: image side for vision models.
    pub image_size: Option<u64>,
    /// `--new-tokens`: generated tokens.
    pub new_tokens: Option<u64>,
    /// `--dtype`: weight dtype.
    pub dtype: Option<String>,
    /// `--amp`: autocast dtype.
    pub amp: Option<String>,
    /// `--optimizer`.
    pub optimizer: Option<String>,
    /// `--optimizer-impl`.
    pub optimizer_impl: Option<String>,
    /// `--grad-ckpt`: full activation checkpointing.
    pub grad_ckpt: bool,
    /// `--grad-ckpt-selective`: recompute the attention core only.
    pub grad_ckpt_selective: bool,
    /// `--attn`.
    pub attn: Option<String>,
    /// `--grad-accum`.
    pub grad_accum: Option<u64>,
    /// `--keep-grads`: gradients zeroed, not freed, between steps.
    pub keep_grads: bool,
    /// `--gpus`.
    pub gpus: Option<u64>,
    /// `--nodes`.
    pub nodes: Option<u64>,
    /// `--zero`: 0–3.
    pub zero: Option<String>,
    /// `--fsdp`: FSDP full sharding (instead of a ZeRO stage).
    pub fsdp: bool,
    /// `--offload`: optimizer states (and ZeRO-3/FSDP parameters) on CPU.
    pub offload: bool,
    /// `--tp`.
    pub tp: Option<u64>,
    /// `--pp`.
    pub pp: Option<u64>,
    /// `--sp`: sequence parallelism.
    pub sp: bool,
    /// `--lora-rank`.
    pub lora_rank: Option<u64>,
    /// `--qlora`: LoRA over an NF4 base.
    pub qlora: bool,
    /// `--lora-base-int8`: LoRA over an int8 base.
    pub lora_base_int8: bool,
    /// `--target cpu`: reproduce PyTorch-on-CPU measurements.
    pub target: Option<String>,
}

/// Default LoRA rank when `--qlora` is given without `--lora-rank`.
pub const DEFAULT_LORA_RANK: u64 = 16;

/// Parses an optional choice against its table of accepted names.
fn pick<T: Clone>(
    value: &Option<String>,
    kind: &'static str,
    table: &[(&str, T)],
) -> Result<Option<T>> {
    value.as_deref().map(|v| parse(kind, v, table)).transpose()
}

impl Settings {
    /// Converts to a validated [`Workload`]; every bad name or size is a typed error.
    pub fn to_workload(&self) -> Result<Workload> {
        let d = Workload::default();
        let mode = pick(&self.mode, "mode", choices::MODES)?.unwrap_or(d.mode);
        let zero = pick(&self.zero, "ZeRO stage", choices::ZERO_STAGES)?.unwrap_or(Sharding::None);
        let sharding = if self.fsdp { Sharding::Fsdp } else { zero };
        let target = match self.target.as_deref() {
            None | Some("gpu") | Some("cuda") => Target::Gpu,
            Some("cpu") => Target::Cpu,
            Some(other) => return Err(crate::names::unknown("target", other, ["gpu", "cpu"])),
        };
        let lora_base = if self.qlora {
            Some(BaseQuant::Nf4)
        } else if self.lora_base_int8 {
            Some(BaseQuant::Int8)
        } else {
            self.lora_rank.map(|_| BaseQuant::None)
        };
        let lora = lora_base.map(|base| Lora {
            rank: self.lora_rank.unwrap_or(DEFAULT_LORA_RANK),
            base,
        });
        let checkpointing = match (self.grad_ckpt, self.grad_ckpt_selective) {
            (true, _) => Checkpointing::Full,
            (false, true) => Checkpointing::Selective,
            (false, false) => Checkpointing::None,
        };
        let workload = Workload {
            mode,
            batch: self.batch.unwrap_or(d.batch),
            seq: self.seq.unwrap_or(d.seq),
            image_size: self.image_size.unwrap_or(d.image_size),
            new_tokens: self.new_tokens.unwrap_or(d.new_tokens),
            dtype: pick(&self.dtype, "dtype", choices::DTYPES)?.unwrap_or(d.dtype),
            amp: pick(&self.amp, "amp dtype", choices::DTYPES)?,
            optimizer: pick(&self.optimizer, "optimizer", choices::OPTIMIZERS)?
                .unwrap_or(d.optimizer),
            optimizer_impl: pick(
                &self.optimizer_impl,
                "optimizer implementation",
                choices::OPTIMIZER_IMPLS,
            )?
            .unwrap_or(match target {
                Target::Gpu => OptimizerImpl::Foreach,
                Target::Cpu => OptimizerImpl::ForLoop,
            }),
            grad_accum: self.grad_accum.unwrap_or(1),
            keep_grads: self.keep_grads,
            checkpointing,
            attention: pick(&self.attn, "attention", choices::ATTENTIONS)?
                .unwrap_or(Attention::Sdpa),
            lora,
            layout: Layout {
                gpus: self.gpus.unwrap_or(1),
                nodes: self.nodes.unwrap_or(1),
                tp: self.tp.unwrap_or(1),
                pp: self.pp.unwrap_or(1),
                sp: self.sp,
                sharding,
                offload: self.offload,
            },
            target,
        };
        workload.validate()?;
        Ok(workload)
    }
}
