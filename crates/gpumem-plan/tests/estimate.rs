//! Behaviour of the estimator, fit and advice on catalogue models.

use gpumem_plan::{
    advise, estimate, fewest_gpus, find_model, fit, Estimate, Estimated, FitTarget, KvCacheKind,
    Overheads, Phase, Settings, Workload,
};

fn plan(model: &str, settings: Settings) -> Estimate {
    estimate(
        &find_model(model).unwrap(),
        &settings.to_workload().unwrap(),
        &Overheads::default(),
    )
    .unwrap()
}

fn train(batch: u64, seq: u64) -> Settings {
    Settings {
        mode: Some("train".into()),
        batch: Some(batch),
        seq: Some(seq),
        ..Settings::default()
    }
}

#[test]
fn kv_cache_counts_grouped_query_heads() {
    // Llama-3-8B: 32 layers × 2 (k, v) × 8 KV heads × 128 dims × 2 bytes = 128 KiB per token.
    let settings = Settings {
        mode: Some("generate".into()),
        batch: Some(2),
        seq: Some(16),
        new_tokens: Some(4000),
        dtype: Some("bf16".into()),
        ..Settings::default()
    };
    let e = plan("llama-3-8b", settings);
    assert_eq!(e.peak_phase, Phase::Decode);
    let per_token = 32 * 2 * 8 * 128 * 2;
    let full_cache = (per_token * 2 * (16 + 4000 - 1)) as f64;
    let kv = e.breakdown.kv_cache as f64;
    assert!(
        (kv - full_cache).abs() / full_cache < 0.01,
        "{kv} vs {full_cache}"
    );
    assert_eq!(e.breakdown.weights, 8_030_261_248 * 2);
}

fn infer(batch: u64, seq: u64, dtype: &str) -> Settings {
    Settings {
        mode: Some("infer".into()),
        batch: Some(batch),
        seq: Some(seq),
        dtype: Some(dtype.into()),
        ..Settings::default()
    }
}

#[test]
fn inference_counts_the_kv_cache_the_forward_returns() {
    // Llama-2-7B in fp16: 32 layers × 2 (k, v) × 4096 × 2 bytes = 512 KiB per token.
    let with = plan("llama-2-7b", infer(2, 2048, "fp16"));
    let without = plan(
        "llama-2-7b",
        Settings {
            no_cache: true,
            ..infer(2, 2048, "fp16")
        },
    );
    let cache = 32 * 2 * 4096 * 2 * 2 * 2048;
    assert_eq!(with.breakdown.kv_cache, cache);
    assert_eq!(with.kv_cache_kind, Some(KvCacheKind::Returned));
    assert_eq!(
        (without.breakdown.kv_cache, without.kv_cache_kind),
        (0, None)
    );
    assert_eq!(
        with.peak_allocated_bytes - without.peak_allocated_bytes,
        cache
    );
    // An encoder-decoder with labels keeps its decoder's self- and cross-attention caches:
    // T5-small, 6 decoder layers × 2 × 512 × 4 bytes per decoder and per encoder token.
    let t5 = plan(
        "t5-small",
        Settings {
            labels: true,
            ..infer(4, 256, "fp32")
        },
    );
    assert_eq!(t5.breakdown.kv_cache, 6 * 2 * 512 * 4 * (4 * 256 + 4 * 256));
}

#[test]
fn labels_add_the_loss_over_the_vocabulary() {
    // Llama-3-8B in bf16: the causal-LM loss copies the logits to fp32 and takes log_softmax
    // in fp32 (8 bytes per logit); the caller holds the int64 labels.
    let tokens = 1024;
    let without = plan("llama-3-8b", infer(1, tokens, "bf16"));
    let with = plan(
        "llama-3-8b",
        Settings {
            labels: true,
            ..infer(1, tokens, "bf16")
        },
    );
    assert_eq!(
        with.peak_allocated_bytes - without.peak_allocated_bytes,
        tokens * 128_256 * 8 + tokens * 8
    );
}

#[test]
fn eager_softmax_in_fp32_copies_bf16_scores_but_not_fp16() {
    // Llama's eager attention takes softmax(scores, dtype=float32) and casts back. A bf16 input
    // is first converted to fp32 (PyTorch fuses the conversion for fp16 on CUDA only): 2 bytes
    // more per score at the softmax, 32 heads × 4096² scores.
    let eager = |dtype: &str, model: &str, seq| {
        plan(
            model,
            Settings {
                attn: Some("eager".into()),
                ..infer(1, seq, dtype)
            },
        )
        .peak_allocated_bytes
    };
    let scores = 32 * 4096 * 4096;
    assert_eq!(
        eager("bf16", "llama-2-7b", 4096) - eager("fp16", "llama-2-7b", 4096),
        2 * scores
    );
    // GPT-2's eager softmax stays in the activation dtype: bf16 and fp16 plan the same.
    assert_eq!(eager("bf16", "gpt2", 1024), eager("fp16", "gpt2", 1024));
}

#[test]
fn eager_attention_grows_quadratically_and_flash_does_not() {
    let with = |attn: &str, seq| {
        plan(
            "llama-2-7b",
            Settings {
                attn: Some(attn.into()),
                amp: Some("bf16".into()),
                ..train(1, seq)
            },
        )
    };
    let eager = with("eager", 4096).breakdown.activations as f64
        - with("eager", 2048).breakdown.activations as f64;
    let flash = with("flash", 4096).breakdown.activations as f64
        - with("flash", 2048).breakdown.activations as f64;
    assert!(eager > 1.5 * flash, "eager growth {eager} vs flash {flash}");
}

#[test]
fn checkpointing_trades_activations() {
    let full = plan(
        "llama-2-7b",
        Settings {
            dtype: Some("bf16".into()),
            ..train(4, 2048)
        },
    );
    let ckpt = plan(
        "llama-2-7b",
        Settings {
            dtype: Some("bf16".into()),
            grad_ckpt: true,
            ..train(4, 2048)
        },
    );
    let selective = plan(
        "llama-2-7b",
        Settings {
            dtype: Some("bf16".into()),
            grad_ckpt_selective: true,
            attn: Some("eager".into()),
            ..train(4, 2048)
        },
    );
    let eager = plan(
        "llama-2-7b",
        Settings {
            dtype: Some("bf16".into()),
            attn: Some("eager".into()),
            ..train(4, 2048)
        },
    );
    assert!(ckpt.peak_allocated_bytes < full.peak_allocated_bytes);
    assert!(selective.peak_allocated_bytes < eager.peak_allocated_bytes);
}

#[test]
fn peak_moves_from_optimizer_step_to_backward_with_batch() {
    let small = plan("gpt2", train(1, 64));
    let large = plan("gpt2", train(32, 1024));
    assert_eq!(small.peak_phase, Phase::OptimizerStep);
    assert_eq!(large.peak_phase, Phase::Backward);
    // AdamW foreach: weights + gradients + two moments + one parameter-sized temporary, the
    // two cuBLAS workspaces of training (32 MiB each by default) and the loss, a scalar the
    // loop still holds (one 512-byte block).
    let step = small
        .phases
        .iter()
        .find(|p| p.phase == Phase::OptimizerStep)
        .unwrap();
    assert_eq!(
        step.allocated_bytes,
        124_439_808 * 4 * 5 + 2 * (32 << 20) + 512
    );
}

#[test]
fn optimizer_implementations_and_states() {
    let with = |opt: &str, imp: &str| {
        plan(
            "gpt2",
            Settings {
                optimizer: Some(opt.into()),
                optimizer_impl: Some(imp.into()),
                ..train(1, 64)
            },
        )
    };
    let foreach = with("adamw", "foreach");
    let fused = with("adamw", "fused");
    assert!(fused.peak_allocated_bytes < foreach.peak_allocated_bytes);
    assert_eq!(
        with("adamw", "fused").breakdown.optimizer_states,
        124_439_808 * 8
    );
    assert_eq!(
        with("sgd", "foreach").breakdown.optimizer_states,
        124_439_808 * 4
    );
    assert!(with("adam8bit", "fused").breakdown.optimizer_states < 124_439_808 * 3);
}

/// What nvidia-smi shows of a rank: the pool's reserved bytes, the CUDA context and NCCL's
/// buffers (outside the pool), whether reserved is the estimate's or a replay's.
#[test]
fn total_counts_the_context_and_nccls_buffers() {
    let e = plan(
        "llama-2-7b",
        Settings {
            gpus: Some(2),
            fsdp: true,
            dtype: Some("bf16".into()),
            ..train(1, 1024)
        },
    );
    let outside = e.breakdown.framework + e.breakdown.communication;
    assert!(e.breakdown.communication > 0);
    assert_eq!(e.peak_total_bytes, e.peak_reserved_bytes + outside);
    let reserved = e.peak_allocated_bytes + (1 << 30);
    let replayed = e.with_reserved(reserved);
    assert_eq!(
        replayed.peak_total_bytes,
        replayed.peak_reserved_bytes + outside
    );
}

#[test]
fn zero_stages_shrink_model_states() {
    let layout = |zero: &str| {
        plan(
            "llama-2-7b",
            Settings {
                gpus: Some(8),
                zero: Some(zero.into()),
                dtype: Some("bf16".into()),
                amp: Some("bf16".into()),
                ..train(1, 1024)
            },
        )
        .peak_allocated_bytes
    };
    let (z0, z1, z2, z3) = (layout("0"), layout("1"), layout("2"), layout("3"));
    assert!(z0 > z1 && z1 > z2 && z2 > z3, "{z0} {z1} {z2} {z3}");
    // ZeRO-1 on 8 ranks: 12 bytes/param of master + Adam states become 1.5 bytes/param.
    let z1_states = plan(
        "llama-2-7b",
        Settings {
            gpus: Some(8),
            zero: Some("1".into()),
            dtype: Some("bf16".into()),
            amp: Some("bf16".into()),
            ..train(1, 1024)
        },
    )
    .breakdown
    .optimizer_states;
    assert_eq!(z1_states, (6_738_415_616.0 * 12.0 / 8.0) as u64);
}

#[test]
fn tensor_and_pipeline_parallel_split_weights() {
    let single = plan(
        "llama-2-13b",
        Settings {
            dtype: Some("bf16".into()),
            ..train(1, 2048)
        },
    );
    let tp = plan(
        "llama-2-13b",
        Settings {
            dtype: Some("bf16".into()),
            gpus: Some(4),
            tp: Some(4),
            ..train(1, 2048)
        },
    );
    let pp = plan(
        "llama-2-13b",
        Settings {
            dtype: Some("bf16".into()),
            gpus: Some(4),
            pp: Some(4),
            grad_accum: Some(8),
            ..train(1, 2048)
        },
    );
    let ratio = single.breakdown.weights as f64 / tp.breakdown.weights as f64;
    assert!((ratio - 4.0).abs() < 0.01, "{ratio}");
    assert!(pp.breakdown.weights < single.breakdown.weights / 2);
}

#[test]
fn lora_and_qlora_shrink_training() {
    let full = plan(
        "llama-2-7b",
        Settings {
            dtype: Some("bf16".into()),
            ..train(1, 512)
        },
    );
    let lora = plan(
        "llama-2-7b",
        Settings {
            dtype: Some("bf16".into()),
            lora_rank: Some(8),
            ..train(1, 512)
        },
    );
    let qlora = plan(
        "llama-2-7b",
        Settings {
            dtype: Some("bf16".into()),
            qlora: true,
            lora_rank: Some(8),
            ..train(1, 512)
        },
    );
    assert!(lora.trainable_params < full.trainable_params / 100);
    assert!(qlora.breakdown.weights < lora.breakdown.weights / 3);
    assert!(full.peak_total_bytes > 3 * lora.peak_total_bytes);
}

#[test]
fn fit_finds_the_boundary_and_accumulation() {
    let model = find_model("llama-3.2-1b").unwrap();
    let workload = Settings {
        amp: Some("bf16".into()),
        ..train(1, 2048)
    }
    .to_workload()
    .unwrap();
    let overheads = Overheads::default();
    let gpu = 80 << 30;
    let f = fit(
        &model,
        &workload,
        &overheads,
        FitTarget::Batch,
        gpu,
        0.1,
        None,
    )
    .unwrap();
    assert!(f.estimate.peak_total_bytes <= f.usable_bytes);
    let one_more = Workload {
        batch: f.value + 1,
        ..workload.clone()
    };
    assert!(
        estimate(&model, &one_more, &overheads)
            .unwrap()
            .peak_total_bytes
            > f.usable_bytes
    );
    // A global batch is reached exactly by a dividing micro-batch and accumulation.
    let g = fit(
        &model,
        &workload,
        &overheads,
        FitTarget::Batch,
        gpu,
        0.1,
        Some(256),
    )
    .unwrap();
    assert!(
        g.grad_accum > 1 && g.value * g.grad_accum == 256,
        "{} × {}",
        g.value,
        g.grad_accum
    );
    assert!(g.value <= f.value && g.estimate.peak_total_bytes <= g.usable_bytes);
    let seq = fit(
        &model,
        &workload,
        &overheads,
        FitTarget::Seq,
        gpu,
        0.1,
        None,
    )
    .unwrap();
    assert!(seq.value > 2048 && seq.estimate.peak_total_bytes <= seq.usable_bytes);
}

#[test]
fn fewest_gpus_for_zero3() {
    let model = find_model("llama-2-70b").unwrap();
    let workload = Settings {
        dtype: Some("bf16".into()),
        amp: Some("bf16".into()),
        zero: Some("3".into()),
        grad_ckpt: true,
        ..train(1, 2048)
    }
    .to_workload()
    .unwrap();
    let n = fewest_gpus(&model, &workload, &Overheads::default(), 80 << 30, 0.1)
        .unwrap()
        .unwrap();
    // 16 bytes/param of model states = 1.1 TB: at least 14 GPUs of 72 GiB usable.
    assert!((14..=32).contains(&n), "{n}");
}

#[test]
fn advice_is_ranked_and_finds_a_plan_that_fits() {
    let model = find_model("llama-2-7b").unwrap();
    let workload = Settings {
        dtype: Some("bf16".into()),
        ..train(1, 1024)
    }
    .to_workload()
    .unwrap();
    let gpu = 24_000_000_000;
    let current = estimate(&model, &workload, &Overheads::default()).unwrap();
    assert!(current.peak_total_bytes > gpu);
    let advice = advise(
        &model,
        &workload,
        &Overheads::default(),
        Some(gpu),
        &Estimated,
    )
    .unwrap();
    assert!(advice
        .windows(2)
        .all(|w| w[0].saved_bytes >= w[1].saved_bytes));
    assert!(advice.iter().any(|s| s.fits == Some(true)), "{advice:?}");
    assert!(advice
        .iter()
        .all(|s| s.new_peak_total_bytes < current.peak_total_bytes));
}

#[test]
fn fsdp_accumulation_keeps_unsharded_gradients() {
    let with = |fsdp: bool, zero: &str, accumulate: u64| {
        plan(
            "llama-2-7b",
            Settings {
                gpus: Some(8),
                fsdp,
                zero: Some(zero.into()),
                dtype: Some("bf16".into()),
                grad_accum: Some(accumulate),
                ..train(1, 1024)
            },
        )
        .peak_allocated_bytes
    };
    // FSDP's no_sync holds full gradients (2 bytes × 6.7e9) while ZeRO-3 stays partitioned.
    let fsdp_gap = with(true, "0", 2) as f64 - with(true, "0", 1) as f64;
    let zero3_gap = with(false, "3", 2) as f64 - with(false, "3", 1) as f64;
    assert!(fsdp_gap > 10e9, "{fsdp_gap}");
    assert!(zero3_gap < 3e9, "{zero3_gap}");
}

/// A shrunk checkpoint's config.json from `testdata/plan/configs`.
fn config(name: &str) -> gpumem_plan::ModelSpec {
    let path = format!(
        "{}/../../testdata/plan/configs/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    gpumem_plan::load_config(std::path::Path::new(&path)).unwrap()
}

/// A step of `model` in `mode` on `gpu` (`None`: on the CPU) in `dtype` with `amp` and `attn`.
fn step_on(
    model: &gpumem_plan::ModelSpec,
    mode: &str,
    gpu: Option<&str>,
    (dtype, amp, attn): (&str, Option<&str>, &str),
    (batch, seq): (u64, u64),
) -> Estimate {
    let settings = Settings {
        mode: Some(mode.into()),
        target: Some(if gpu.is_some() { "gpu" } else { "cpu" }.into()),
        gpu: gpu.map(Into::into),
        dtype: Some(dtype.into()),
        amp: amp.map(Into::into),
        attn: Some(attn.into()),
        ..train(batch, seq)
    };
    estimate(
        model,
        &settings.to_workload().unwrap(),
        &Overheads::default(),
    )
    .unwrap()
}

/// Peak allocated bytes of `e` in `phase`.
fn phase_peak(e: &Estimate, phase: Phase) -> u64 {
    e.phases
        .iter()
        .find(|p| p.phase == phase)
        .unwrap()
        .allocated_bytes
}

/// Peak allocated bytes of `e` less its cuBLAS workspaces.
fn without_workspace(e: &Estimate) -> u64 {
    e.peak_allocated_bytes - e.breakdown.blas_workspace
}

#[test]
fn gpu_bias_gradients_stage_partial_sums_by_multiprocessor() {
    // A masked-LM decoder's bias gradient sums 2048 rows of the logits' gradient (vocabulary
    // 8192) through a staging buffer sized by the GPU's multiprocessors (132 on an H100 SXM,
    // 114 on a PCIe card, which has the same memory and cuBLAS workspace), at the backward's
    // peak.
    let bert = config("bert-6l");
    let backward = |gpu| {
        phase_peak(
            &step_on(&bert, "train", Some(gpu), ("bf16", None, "sdpa"), (4, 512)),
            Phase::Backward,
        )
    };
    let staging = |gpu| {
        let cores = gpumem_plan::find_gpu(gpu).unwrap().cores;
        gpumem_plan::column_sum_staging_bytes(2048, 8192, &cores)
    };
    assert!(staging("h100-pcie") > 0 && staging("h100") > staging("h100-pcie"));
    assert_eq!(
        backward("h100") - backward("h100-pcie"),
        staging("h100") - staging("h100-pcie")
    );
}

#[test]
fn cuda_autocast_keeps_half_log_probabilities_of_unupcast_logits() {
    // Under CUDA's autocast a masked-LM's bf16 logits go through log_softmax in bf16 (its saved
    // output) and nll_loss saves an fp32 copy: 2 bytes per logit more than the CPU's fp32
    // log-probabilities, beyond what the GPU adds without autocast (its cuBLAS workspaces).
    let bert = config("bert-6l");
    let gpu_excess = |dtype, amp| {
        let at_forward_end = |gpu| {
            phase_peak(
                &step_on(&bert, "train", gpu, (dtype, amp, "sdpa"), (4, 512)),
                Phase::ForwardEnd,
            )
        };
        at_forward_end(Some("h100")) - at_forward_end(None)
    };
    assert_eq!(
        gpu_excess("fp32", Some("bf16")) - gpu_excess("bf16", None),
        2 * 2048 * 8192
    );
}

#[test]
fn cuda_softmax_backward_makes_the_gradient_output_product() {
    // CUDA's softmax backward first makes `grad * output`: in an fp32 eager attention's
    // backward one more score-sized tensor than on the CPU (8 heads × 2048² scores), beyond
    // what the GPU holds at the forward's end (its cuBLAS workspaces).
    let llama = config("llama-8l");
    let gpu_excess = |phase| {
        let peak = |gpu| {
            phase_peak(
                &step_on(&llama, "train", gpu, ("fp32", None, "eager"), (1, 2048)),
                phase,
            )
        };
        peak(Some("h100")) - peak(None)
    };
    assert_eq!(
        gpu_excess(Phase::Backward) - gpu_excess(Phase::ForwardEnd),
        8 * 2048 * 2048 * 4
    );
}

#[test]
fn cuda_t5_self_attention_runs_sdpa_math_path_in_inference() {
    // T5's relative position bias sends its self-attentions to SDPA's math path on CUDA even
    // without gradients (the CPU's flash kernel takes it as a mask): bf16 inference
    // materialises fp32 scores there, so what the GPU holds beyond the CPU grows with the
    // square of the sequence.
    let t5 = config("t5-small-4l");
    let excess = |seq| {
        let peak = |gpu| {
            without_workspace(&step_on(
                &t5,
                "infer",
                gpu,
                ("bf16", None, "sdpa"),
                (4, seq),
            ))
        };
        peak(Some("h100")) as i64 - peak(None) as i64
    };
    assert!(excess(256) > 0);
    assert!(excess(512) as f64 > 3.5 * excess(256) as f64);
}

#[test]
fn cuda_t5_cross_attention_runs_a_fused_kernel_in_training() {
    // On CUDA a T5 decoder's cross-attention (no position bias) runs a fused kernel that
    // saves no scores, where eager attention saves 9 bytes per fp32 score (probabilities,
    // dropout's mask and output): 4 decoder layers × 4 × 8 heads × 256² scores.
    let t5 = config("t5-small-4l");
    let peak = |attn| {
        without_workspace(&step_on(
            &t5,
            "train",
            Some("h100"),
            ("fp32", None, attn),
            (4, 256),
        ))
    };
    let cross_scores = 4 * 4 * 8 * 256 * 256 * 9;
    assert!(peak("eager") - peak("sdpa") > cross_scores * 4 / 5);
}

#[test]
fn cuda_memory_efficient_attention_returns_token_major_output() {
    // Whisper makes its queries contiguous per head. CPU's flash kernel returns its output in
    // that layout, so merging the heads copies it for the output projection to save; CUDA's
    // memory-efficient kernel (fp32) allocates it token-major and the merge is a view: one
    // fp32 hidden-sized tensor less per attention: 4 encoder layers over 4 × 1500 audio
    // frames, 4 decoder layers (self- and cross-attention) over 4 × 128 tokens, width 384.
    let whisper = config("whisper-4l");
    let at_forward_end = |gpu| {
        let e = step_on(&whisper, "train", gpu, ("fp32", None, "sdpa"), (4, 128));
        phase_peak(&e, Phase::ForwardEnd) as i64 - e.breakdown.blas_workspace as i64
    };
    let merges = (4 * 4 * 1500 + 4 * 2 * 4 * 128) * 384 * 4;
    assert_eq!(at_forward_end(None) - at_forward_end(Some("h100")), merges);
}

/// The peak at the forward's end of OPT-6l's fp16 SDPA step without an optimizer or a loss on
/// `gpu`, with `more`'s other settings.
fn opt_fp16_forward_end(gpu: &str, more: Settings) -> u64 {
    let settings = Settings {
        mode: Some("train".into()),
        target: Some("gpu".into()),
        gpu: Some(gpu.into()),
        dtype: Some("fp16".into()),
        attn: Some("sdpa".into()),
        optimizer: Some("none".into()),
        loss: Some("none".into()),
        ..more
    };
    let workload = settings.to_workload().unwrap();
    let e = estimate(&config("opt-6l"), &workload, &Overheads::default()).unwrap();
    phase_peak(&e, Phase::ForwardEnd)
}

#[test]
fn old_opt_releases_merge_a_per_head_flash_output_with_a_copy() {
    // Before 4.49 OPT makes q, k and v contiguous per head (`_shape`'s `.contiguous()`); CUDA's
    // flash kernel lays its output out as the queries (`out = at::empty_like(q)`), so the
    // head merge copies it and the output projection saves the copy: one fp16 hidden-sized
    // tensor more per layer by the end of the forward (6 layers, 2 × 256 tokens, width 512).
    // 4.49 keeps the transposed views and the merge is a view.
    let at_forward_end = |release: &str| {
        let settings = Settings {
            transformers: Some(release.into()),
            ..train(2, 256)
        };
        opt_fp16_forward_end("l40s", settings)
    };
    let merges = 6 * 2 * 256 * 512 * 2;
    assert_eq!(at_forward_end("4.48") - at_forward_end("4.49"), merges);
}

#[test]
fn llama_generate_before_4_42_keeps_the_previous_steps_cache() {
    // Until 4.42 `generate` handed a Llama-family model the legacy tuple cache every step: the
    // forward concatenates each layer's keys and values into new tensors while the previous
    // step's tuple stays referenced, so at a decode step's end two whole caches are alive where
    // a `DynamicCache` replaces one layer at a time. Llama-8l, fp16: 8 layers × 2 (k, v) × 2 KV
    // heads × 64 dims × 2 bytes per token, batch 2, 256 prompt + 64 new tokens: the last step
    // grows the cache from 318 to 319 tokens.
    let decode_peak = |release: &str| {
        let settings = Settings {
            mode: Some("generate".into()),
            batch: Some(2),
            seq: Some(256),
            new_tokens: Some(64),
            dtype: Some("fp16".into()),
            attn: Some("sdpa".into()),
            transformers: Some(release.into()),
            ..Settings::default()
        };
        let workload = settings.to_workload().unwrap();
        let e = estimate(&config("llama-8l"), &workload, &Overheads::default()).unwrap();
        phase_peak(&e, Phase::Decode)
    };
    let per_token_layer = 2 * 2 * 2 * 64 * 2;
    let whole_cache = 8 * per_token_layer * 318;
    let one_layer = per_token_layer * 319;
    assert_eq!(
        decode_peak("4.41") - decode_peak("4.42"),
        whole_cache - one_layer
    );
}

#[test]
fn a_loop_that_keeps_its_last_outputs_holds_them_through_the_next_forward() {
    // `outputs = model(...)` in a loop rebinds only when the forward returns: the previous
    // step's logits and the KV cache a causal LM returns in training (each layer's k and v
    // copies) are alive at the forward's end beside the new step's (OPT-6l, fp16, 2 × 256
    // tokens, width 512, vocabulary 4096).
    let at_forward_end = |keep_outputs: bool| {
        let settings = Settings {
            keep_outputs,
            ..train(2, 256)
        };
        opt_fp16_forward_end("a100", settings)
    };
    let tokens = 2 * 256;
    let logits = tokens * 4096 * 2;
    let cache = 6 * tokens * 2 * 512 * 2;
    assert_eq!(at_forward_end(true) - at_forward_end(false), logits + cache);
}

/// Generation settings for Llama-3-8B in bf16: a 16-token prompt and `new_tokens` more.
fn generate_bf16(new_tokens: u64) -> Settings {
    Settings {
        mode: Some("generate".into()),
        seq: Some(16),
        new_tokens: Some(new_tokens),
        dtype: Some("bf16".into()),
        ..Settings::default()
    }
}

/// Eager fp16 generation for Llama-2-7B: batch 2, a 512-token prompt and `new_tokens` more.
fn generate_eager(new_tokens: u64) -> Settings {
    Settings {
        mode: Some("generate".into()),
        batch: Some(2),
        seq: Some(512),
        new_tokens: Some(new_tokens),
        dtype: Some("fp16".into()),
        attn: Some("eager".into()),
        ..Settings::default()
    }
}

#[test]
fn a_static_cache_holds_its_positions_whatever_the_tokens() {
    // Llama-3-8B: 128 KiB of keys and values per position, preallocated for all 4096.
    let per_position = 32 * 2 * 8 * 128 * 2;
    let static_cache = |new_tokens: u64| {
        plan(
            "llama-3-8b",
            Settings {
                cache_len: Some(4096),
                ..generate_bf16(new_tokens)
            },
        )
    };
    for new_tokens in [8, 2000] {
        let e = static_cache(new_tokens);
        assert_eq!(e.breakdown.kv_cache, per_position * 4096, "{new_tokens}");
    }
    // The prompt's dynamic cache gives way to the static one; nothing else grows: the prefill
    // reads only the prompt's keys, and a decode step folds the grouped query heads onto the
    // key heads (`pack_gqa`) instead of repeating the keys.
    let dynamic = plan("llama-3-8b", generate_bf16(8));
    let grown = static_cache(8).peak_allocated_bytes - dynamic.peak_allocated_bytes;
    let expected = per_position * (4096 - 16);
    assert!(
        grown.abs_diff(expected) < expected / 100,
        "{grown} vs {expected}"
    );
}

#[test]
fn gpt_fast_keeps_a_square_causal_mask_and_decodes_in_the_math_path() {
    let gpt_fast = |cache_len: u64| {
        plan(
            "llama-3-8b",
            Settings {
                framework: Some("gpt-fast".into()),
                cache_len: Some(cache_len),
                ..generate_bf16(200)
            },
        )
    };
    let (small, large) = (gpt_fast(8192), gpt_fast(16384));
    assert_eq!(large.peak_phase, Phase::Decode);
    // The mask (N² bytes) is counted with the cache it is made with.
    let per_position = 32 * 2 * 8 * 128 * 2;
    assert_eq!(
        large.breakdown.kv_cache,
        16384 * 16384 + per_position * 16384
    );
    // Per position read: the repeated keys and values (bf16) and, in the math path, fp32
    // copies of both and the scaled keys: 8 × 8 KiB.
    let per_read = 8 * 32 * 128 * 2;
    let grown = large.peak_allocated_bytes - small.peak_allocated_bytes;
    let expected = (16384 * 16384 - 8192 * 8192) + (per_position + per_read) * 8192;
    assert!(
        grown.abs_diff(expected) < expected / 100,
        "{grown} vs {expected}"
    );
    // Without --cache-len, gpt-fast's own: prompt + new tokens rounded up to 8 positions.
    let default = plan(
        "llama-3-8b",
        Settings {
            framework: Some("gpt-fast".into()),
            ..generate_bf16(200)
        },
    );
    assert_eq!(default.breakdown.kv_cache, 216 * 216 + per_position * 216);
}

/// transformers' StaticCache on the CPU (PyTorch 2.15, transformers 5.23, one thread): the
/// llama-8l config (`testdata/plan/configs/llama-8l.json`, grouped heads) generating with
/// `past_key_values=StaticCache(config, max_cache_len=N)`, greedy, `min_new_tokens =
/// max_new_tokens`; peak live bytes of the second of two `generate` calls, from the
/// torch.profiler allocation trace (`gpumem_devtools.recorder.CpuRecorder`), which starts after
/// the model is built, so the weights are not in it. SDPA's prefill reads only the prompt's keys;
/// eager attention reads every position.
#[test]
fn a_static_cache_matches_cpu_allocation_traces() {
    let model = config("llama-8l");
    // (dtype, attention, batch, prompt, new tokens, cache positions, measured bytes)
    let measured = [
        ("fp32", "sdpa", 2, 64, 32, 1024, 20_057_192),
        ("bf16", "sdpa", 2, 64, 32, 1024, 10_030_184),
        ("fp32", "sdpa", 1, 16, 16, 4096, 33_964_512),
        ("bf16", "sdpa", 4, 128, 16, 2048, 40_120_440),
        ("fp32", "eager", 2, 64, 32, 1024, 35_196_020),
        ("fp32", "eager", 1, 16, 16, 4096, 54_927_852),
        ("bf16", "eager", 2, 64, 32, 1024, 23_891_048),
        ("bf16", "eager", 4, 128, 16, 2048, 138_555_512),
    ];
    for (dtype, attn, batch, seq, new_tokens, cache_len, bytes) in measured {
        let settings = Settings {
            mode: Some("generate".into()),
            batch: Some(batch),
            seq: Some(seq),
            new_tokens: Some(new_tokens),
            dtype: Some(dtype.into()),
            attn: Some(attn.into()),
            cache_len: Some(cache_len),
            target: Some("cpu".into()),
            ..Settings::default()
        };
        let e = estimate(
            &model,
            &settings.resolve(&model).unwrap().workload,
            &Overheads::default(),
        )
        .unwrap();
        let planned = e.peak_allocated_bytes - e.breakdown.weights;
        let error = (planned as f64 - bytes as f64) / bytes as f64;
        assert!(
            error.abs() < 0.01,
            "{dtype} {attn} b{batch} s{seq}+{new_tokens} cache {cache_len}: {planned} vs {bytes}"
        );
    }
}

#[test]
fn generate_of_one_token_is_its_prefill() {
    // The first new token comes from the prefill's logits: no decode step, no second cache.
    let one = plan("llama-2-7b", generate_eager(1));
    assert_eq!(one.peak_phase, Phase::Prefill);
    assert!(one.phases.iter().all(|p| p.phase == Phase::Prefill));
    let two = plan("llama-2-7b", generate_eager(2));
    assert!(two.phases.iter().any(|p| p.phase == Phase::Decode));
}

#[test]
fn llama_releases_keep_the_rotary_tables_and_causal_mask_buffers_they_registered() {
    let at = |release: &str| {
        plan(
            "llama-2-7b",
            Settings {
                transformers: Some(release.into()),
                ..generate_eager(512)
            },
        )
    };
    let weights = |release: &str| at(release).breakdown.weights;
    let none = weights("4.41");
    // 32 layers × cos and sin tables of 4096 positions × 128 in fp16: 4.35 to 4.37, and
    // 4.38.2 to 4.40 ("for BC"); 4.38's model-wide causal mask of 4096² int64, boolean from
    // 4.38.2.
    let tables = 32 * 2 * 4096 * 128 * 2;
    let mask = 4096 * 4096;
    assert_eq!(weights("4.37") - none, tables);
    assert_eq!(weights("4.38") - none, 8 * mask);
    assert_eq!(weights("4.38.2") - none, tables + mask);
    assert_eq!(weights("4.39") - none, tables);
    assert_eq!(weights("4.40.2") - none, tables);
    assert_eq!(weights("4.35"), weights("4.37"));
    // The tuple cache of those releases is
    // `llama_generate_before_4_42_keeps_the_previous_steps_cache`'s.
    assert_eq!(
        at("4.35").peak_allocated_bytes,
        at("4.37").peak_allocated_bytes
    );
}

#[test]
fn sharded_training_keeps_module_buffers_whole_on_every_rank() {
    // FSDP and ZeRO-3 shard (and offload) parameters, never buffers: 4.37's rotary tables
    // are on each of the 4 GPUs whole, with or without parameter offload.
    let tables = 32 * 2 * 4096 * 128 * 2;
    for (zero, fsdp, offload) in [(None, true, None), (Some("3"), false, Some("all"))] {
        let at = |release: &str| {
            plan(
                "llama-2-7b",
                Settings {
                    transformers: Some(release.into()),
                    dtype: Some("bf16".into()),
                    gpus: Some(4),
                    zero: zero.map(Into::into),
                    fsdp,
                    offload: offload.map(Into::into),
                    ..train(1, 512)
                },
            )
            .breakdown
            .weights
        };
        assert_eq!(
            at("4.37") - at("4.41"),
            tables,
            "{zero:?} {fsdp} {offload:?}"
        );
    }
}

#[test]
fn llama_4_38_builds_its_causal_mask_over_all_positions_at_every_forward() {
    let at = |release: &str, attn: &str| {
        plan(
            "llama-2-7b",
            Settings {
                transformers: Some(release.into()),
                dtype: Some("bf16".into()),
                attn: Some(attn.into()),
                grad_ckpt: true,
                lora_rank: Some(16),
                ..train(4, 512)
            },
        )
        .peak_allocated_bytes
    };
    // 4.38.2 keeps a 4096² boolean buffer (4.39 none) and, under SDPA or eager attention,
    // builds 4 × 4096² bf16 at every forward, which checkpointing keeps as every layer's
    // input into the backward (LoRA: its peak is there); FlashAttention-2 gets no mask.
    let (buffer, mask) = (4096 * 4096, 4 * 4096 * 4096 * 2);
    assert_eq!(at("4.38.2", "flash") - at("4.39", "flash"), buffer);
    assert!(at("4.38.2", "sdpa") - at("4.39", "sdpa") >= buffer + mask);
    assert!(at("4.38.2", "eager") - at("4.39", "eager") >= buffer + mask);
}
