//! Which given flags a run ignores, and why: the table behind `Warning::Ignored`, kept apart
//! from the parsing in `settings` because it grows with every flag.

use super::Settings;
use crate::model::ModelSpec;
use crate::warning::Warning;
use crate::workload::choices::{self, parse};
use crate::workload::{Framework, Kernels, Loss, Mode, Optimizer};

impl Settings {
    /// The flags given that `mode` or `model` ignores, each with the reason.
    pub(super) fn ignored(&self, model: &ModelSpec, mode: Mode) -> Vec<Warning> {
        let mode_name = choices::name(choices::MODES, mode).unwrap_or("?");
        let no_training = format!("{mode_name} mode has no backward pass and no optimizer step");
        let no_sharding = format!(
            "ZeRO, FSDP and offloading are planned for training; in {mode_name} mode every GPU \
             keeps the weights (its tensor-parallel share)"
        );
        let no_pipeline = format!(
            "pipeline parallelism is planned for training; in {mode_name} mode every GPU keeps the \
             whole model (its tensor-parallel share)"
        );
        let inference = mode != Mode::Train;
        let fsdp_inactive = inference || !self.fsdp;
        let one_gpu = "one GPU creates no NCCL communicator".to_string();
        let no_lora = self.lora_rank.is_none() && !self.qlora;
        let no_adapters = "no LoRA adapters are planned (add --lora-rank or --qlora)".to_string();
        let no_fsdp = "it sets up PyTorch FSDP, planned for training with --fsdp".to_string();
        let no_zero =
            "it sets DeepSpeed ZeRO's buckets, planned for training with --zero 1-3".to_string();
        let no_zero3 =
            "it says how DeepSpeed ZeRO-3 builds the model, planned for training with --zero 3"
                .to_string();
        let no_deepspeed =
            "it names the DeepSpeed release of a ZeRO run, planned for training with --zero 1-3"
                .to_string();
        let no_fsdp1 = "it says how FullyShardedDataParallel is set up, planned for training \
                        with --fsdp --fsdp-version 1"
            .to_string();
        let fsdp1_inactive = fsdp_inactive || self.fsdp_version.as_deref() != Some("1");
        let zero_inactive =
            inference || matches!(self.zero.as_deref(), None | Some("0")) || self.fsdp;
        let no_tp_group = "sequence parallelism splits activations over the tensor-parallel \
                           group, and --tp 1 makes none"
            .to_string();
        let tokens = format!(
            "{} reads tokens, not images: its input is --seq",
            model.name
        );
        let images = format!(
            "{} reads images, not tokens: its input is --image-size",
            model.name
        );
        let given = [
            (
                "--optimizer",
                inference && self.optimizer.is_some(),
                &no_training,
            ),
            (
                "--freeze-vision-tower",
                inference && self.freeze_vision_tower,
                &no_training,
            ),
            (
                "--lora-targets",
                self.lora_targets.is_some() && no_lora,
                &no_adapters,
            ),
            (
                "--lora-dropout",
                self.lora_dropout.is_some() && (no_lora || inference),
                if no_lora { &no_adapters } else { &no_training },
            ),
            (
                "--peft",
                self.peft.is_some() && (no_lora || inference),
                if no_lora { &no_adapters } else { &no_training },
            ),
            (
                "--optimizer-impl",
                inference && self.optimizer_impl.is_some(),
                &no_training,
            ),
            ("--torch", inference && self.torch.is_some(), &no_training),
            ("--grad-ckpt", inference && self.grad_ckpt, &no_training),
            (
                "--grad-ckpt-selective",
                inference && self.grad_ckpt_selective,
                &no_training,
            ),
            (
                "--grad-ckpt-every",
                inference && self.grad_ckpt_every.is_some(),
                &no_training,
            ),
            (
                "--grad-ckpt-per-op",
                inference && self.grad_ckpt_per_op,
                &no_training,
            ),
            (
                "--grad-accum",
                inference && self.grad_accum.is_some(),
                &no_training,
            ),
            ("--keep-grads", inference && self.keep_grads, &no_training),
            ("--pp", inference && self.pp.is_some(), &no_pipeline),
            ("--zero", inference && self.zero.is_some(), &no_sharding),
            ("--fsdp", inference && self.fsdp, &no_sharding),
            (
                "--offload",
                inference && self.offload.is_some(),
                &no_sharding,
            ),
            (
                "--fsdp-version",
                fsdp_inactive && self.fsdp_version.is_some(),
                &no_fsdp,
            ),
            (
                "--fsdp-sharding",
                fsdp_inactive && self.fsdp_sharding.is_some(),
                &no_fsdp,
            ),
            (
                "--nccl-buffsize",
                self.nccl_buffsize.is_some() && self.gpus.unwrap_or(1) <= 1,
                &one_gpu,
            ),
            (
                "--fsdp-mp",
                fsdp_inactive && self.fsdp_mp.is_some(),
                &no_fsdp,
            ),
            (
                "--zero-buckets",
                zero_inactive && self.zero_buckets.is_some(),
                &no_zero,
            ),
            (
                "--deepspeed",
                zero_inactive && self.deepspeed.is_some(),
                &no_deepspeed,
            ),
            (
                "--fsdp-cpu-ram-efficient-loading",
                fsdp1_inactive && self.fsdp_cpu_ram_efficient_loading,
                &no_fsdp1,
            ),
            (
                "--no-zero-init",
                (zero_inactive || self.zero.as_deref() != Some("3")) && self.no_zero_init,
                &no_zero3,
            ),
            ("--sp", self.sp && self.tp.unwrap_or(1) <= 1, &no_tp_group),
            (
                "--seq",
                !model.reads_tokens() && self.seq.is_some(),
                &images,
            ),
            (
                "--image-size",
                !model.reads_images() && self.image_size.is_some(),
                &tokens,
            ),
        ];
        let mut warnings: Vec<Warning> = given
            .into_iter()
            .filter(|(_, ignored, _)| *ignored)
            .map(|(flag, _, reason)| Warning::Ignored {
                flag,
                reason: reason.clone(),
            })
            .collect();
        if self.no_cache {
            let reason = if mode == Mode::Generate {
                Some("generate decodes with its KV cache".to_string())
            } else if !model.has_decoder() {
                Some(format!("{} has no decoder, so no KV cache", model.name))
            } else {
                None
            };
            if let Some(reason) = reason {
                warnings.push(Warning::Ignored {
                    flag: "--no-cache",
                    reason,
                });
            }
        }
        if self.labels {
            let reason = match mode {
                Mode::Train => Some("training always computes the loss".to_string()),
                Mode::Generate => Some("generate computes no loss".to_string()),
                Mode::Infer if !model.has_lm_loss() => Some(format!(
                    "{} has no language-model head: the loss modelled is that over the vocabulary",
                    model.name
                )),
                Mode::Infer => None,
            };
            if let Some(reason) = reason {
                warnings.push(Warning::Ignored {
                    flag: "--labels",
                    reason,
                });
            }
        }
        let optimizer = self
            .optimizer
            .as_deref()
            .and_then(|o| parse("optimizer", o, choices::OPTIMIZERS).ok());
        let own_step = match optimizer {
            Some(Optimizer::None) => Some("--optimizer none runs no optimizer step"),
            Some(Optimizer::Adam8bit) => Some(
                "bitsandbytes' 8-bit Adam runs its own step kernel (no foreach, fused or \
                 for-loop implementation)",
            ),
            _ => None,
        };
        if let Some(reason) = own_step.filter(|_| !inference && self.optimizer_impl.is_some()) {
            warnings.push(Warning::Ignored {
                flag: "--optimizer-impl",
                reason: reason.into(),
            });
        }
        if mode != Mode::Train && self.loss.is_some() {
            warnings.push(Warning::Ignored {
                flag: "--loss",
                reason: format!(
                    "{mode_name} mode computes no training loss (--labels adds the model's own)"
                ),
            });
        }
        let chunked = self.loss.as_deref().is_some_and(|l| {
            matches!(
                parse("loss", l, choices::LOSSES),
                Ok(Loss::Chunked | Loss::ChunkedFp32)
            )
        });
        let summed = self
            .loss
            .as_deref()
            .is_some_and(|l| parse("loss", l, choices::LOSSES).ok() == Some(Loss::None));
        if self.keep_outputs && (mode != Mode::Train || !summed) {
            warnings.push(Warning::Ignored {
                flag: "--keep-outputs",
                reason: "only a training step with --loss none returns outputs the loop keeps \
                         (the loss of the others is all the caller holds)"
                    .into(),
            });
        }
        let hf_loss = self
            .loss
            .as_deref()
            .is_none_or(|l| parse("loss", l, choices::LOSSES).ok() == Some(Loss::Hf));
        if self.hold_outputs {
            let reason = if mode != Mode::Train || !hf_loss {
                Some(
                    "only a training step with the model's own loss (--loss hf) returns logits \
                     beside the loss (--loss none holds its outputs anyway)"
                        .to_string(),
                )
            } else if !model.has_lm_loss() {
                Some(format!(
                    "{} has no language-model head: what it returns beside the loss holds no \
                     vocabulary-sized logits",
                    model.name
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                warnings.push(Warning::Ignored {
                    flag: "--hold-outputs",
                    reason,
                });
            }
        }
        if self.loss_chunk.is_some() && (mode != Mode::Train || !chunked) {
            warnings.push(Warning::Ignored {
                flag: "--loss-chunk",
                reason: "only --loss chunked and chunked-fp32 split the logits into chunks of \
                         positions (fused sizes its own chunks)"
                    .into(),
            });
        }
        let gpt_fast = self.framework.as_deref().is_some_and(|f| {
            parse("framework", f, choices::FRAMEWORKS).ok() == Some(Framework::GptFast)
        });
        if gpt_fast && self.attn.is_some() {
            warnings.push(Warning::Ignored {
                flag: "--attn",
                reason: "gpt-fast's model calls PyTorch's SDPA itself".into(),
            });
        } else if model.calls_sdpa_itself() && self.attn.is_some() {
            warnings.push(Warning::Ignored {
                flag: "--attn",
                reason: format!(
                    "{} calls PyTorch's SDPA itself (nn.MultiheadAttention with \
                     need_weights=False)",
                    model.name
                ),
            });
        }
        let liger = self
            .kernels
            .as_deref()
            .is_some_and(|k| parse("kernels", k, choices::KERNELS).ok() == Some(Kernels::Liger));
        if liger && mode != Mode::Train {
            warnings.push(Warning::Ignored {
                flag: "--kernels",
                reason: format!(
                    "Liger-Kernel changes what a training step saves for backward; {mode_name} \
                     mode is planned with the eager modules"
                ),
            });
        }
        if mode != Mode::Generate && self.cache_len.is_some() {
            warnings.push(Warning::Ignored {
                flag: "--cache-len",
                reason: format!(
                    "only generate mode keeps a KV cache it decodes with, not {mode_name}"
                ),
            });
        }
        if mode != Mode::Generate && self.new_tokens.is_some() {
            warnings.push(Warning::Ignored {
                flag: "--new-tokens",
                reason: format!("only generate mode produces new tokens, not {mode_name}"),
            });
        }
        warnings
    }
}
