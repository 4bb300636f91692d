//! Reserved memory predicted by replaying the planner's allocation sequence, against the
//! reserved memory of the committed real traces (CPU allocation traces of PyTorch steps,
//! `testdata/traces/`) replayed through the same torch policy, with the settings each trace's
//! header records. Run with `--nocapture` for the table. `GPUMEM_EXTRA_TRACES` (paths, comma
//! separated) adds traces of your own to it; `GPUMEM_PLANNED_OUT` (a directory) writes each
//! trace's planned sequence there as a gpumem trace.

use gpumem_plan::{allocation_sequence, load_config, sequence::peak_live_bytes, Settings};
use gpumem_pool::PolicyKind;
use gpumem_replay::planned::planned_trace;
use gpumem_replay::{replay_peaks, ReplayOptions};
use gpumem_trace::ReadOptions;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The plan settings of a trace's header (`meta`, as gpumem-capture-trace writes it).
fn settings(meta: &BTreeMap<String, String>) -> Settings {
    let text = |key: &str| meta.get(key).cloned();
    let number = |key: &str| meta.get(key).and_then(|v| v.parse().ok());
    let mode = text("mode");
    Settings {
        batch: number("batch"),
        seq: number("seq"),
        image_size: number("image_size"),
        new_tokens: number("new_tokens"),
        dtype: text("dtype"),
        amp: text("amp"),
        optimizer: text("optimizer"),
        optimizer_impl: text("optimizer_impl"),
        grad_ckpt: text("grad_ckpt").as_deref() == Some("true"),
        attn: text("attn"),
        // The capture harness's plain inference forward passes use_cache=False unless the
        // header says otherwise (`--cache`).
        no_cache: match text("no_cache").as_deref() {
            Some(value) => value == "true",
            None => mode.as_deref() == Some("infer"),
        },
        labels: text("labels").as_deref() == Some("true"),
        loss: text("loss"),
        // A trace of your own (`GPUMEM_EXTRA_TRACES`) may name LoRA adapters, the releases
        // whose code ran and a loop that holds its outputs.
        lora_rank: number("lora_rank"),
        lora_targets: text("lora_targets"),
        lora_dropout: meta.get("lora_dropout").and_then(|v| v.parse().ok()),
        peft: text("peft"),
        quant: text("quant"),
        bitsandbytes: text("bitsandbytes"),
        transformers: text("transformers"),
        hold_outputs: text("hold_outputs").as_deref() == Some("true"),
        // And one rank of an FSDP run (gloo ranks on CPU).
        gpus: number("gpus"),
        fsdp: text("fsdp").as_deref() == Some("true"),
        fsdp_version: text("fsdp_version"),
        // A capture on a GPU (`scripts/gpu-sequence-traces.sh`) is planned for the GPU.
        target: Some(match text("device") {
            Some(device) if device.starts_with("cuda") => "gpu".into(),
            _ => "cpu".into(),
        }),
        mode,
        ..Settings::default()
    }
}

#[test]
fn planned_reserved_against_real_traces() {
    // `testdata/traces/`: the replay set; `testdata/traces/sequence/`: eager attention,
    // half precision and no-grad forwards, captured to check the planned sequence.
    let traces = [
        "gpt2-124m-train-b4-s256",
        "gpt2-12l-train-b4-s256",
        "gpt2-12l-train-ckpt-b4-s256",
        "bert-12l-train-b8-s128",
        "tinyllama-8l-train-amp-bf16-fused-b4-s512",
        "resnet50-train-b8-img128",
        "gpt2-12l-infer-b8-s256",
        "tinyllama-8l-generate-b4-s128-new64",
        "sequence/tinyllama-2l-train-b4-s256-bf16-eager",
        "sequence/phi3-4l-train-b2-s256-bf16-eager",
        "sequence/starcoder-4l-train-b2-s256-bf16-eager",
        "sequence/qwen3-4l-infer-b4-s512-bf16-eager",
        "sequence/gemma2-4l-infer-b4-s512-bf16-eager",
        "sequence/llama-8l-infer-b8-s512-bf16-sdpa",
        // Captured after the whole-tensor sequence was written, to check it: the block
        // matrices and block transients came from these.
        "sequence/bert-6l-train-b4-s512-bf16-eager",
        "sequence/gpt2-8l-train-b4-s256-fp32-sdpa",
        "sequence/t5-small-2l-train-b2-s128-fp32-eager",
        "sequence/mixtral-4l-train-b2-s256-bf16-eager",
        "sequence/vit-4l-train-b8-img224-bf16-eager",
        "sequence/llama-8l-train-b4-s256-bf16-ckpt-eager",
        "sequence/qwen2.5-6l-infer-b2-s1024-bf16-eager",
        "sequence/opt-6l-infer-b8-s256-bf16-sdpa",
        // Captured in session 21 (torch 2.15, transformers 5.23) to check the mixtures' fused
        // experts and routed copies.
        "sequence/qwen3moe-4l-train-b2-s512-bf16-sdpa",
        "sequence/deepseekv3-4l-train-b2-s512-bf16-sdpa",
        // And Whisper's encoder over 1500 frames beside a 64-token decoder.
        "sequence/whisper-4l-train-b2-s64-bf16-sdpa",
        // And a generation whose peak is in its decode (256 new tokens after 16).
        "sequence/gpt2-2l-generate-b8-s16-new256-fp32-sdpa",
        // Captured in session 22 to check a no-grad block's phases: evaluation forwards with
        // labels and the KV cache, the encoder's eager scores and the cross-attention's keys
        // and values over 1500 frames.
        "sequence/whisper-4l-infer-b4-s128-bf16-labels-cache-eager",
        "sequence/whisper-4l-infer-b4-s128-fp32-labels-cache-sdpa",
        // And, to check the H200 rows furthest off, a step without a loss, a vision-language
        // model, Whisper-v3 in fp32, a dual encoder and a vision tower's forward.
        "sequence/qwen2.5-2l-train-b2-s512-bf16-sdpa-loss-none",
        "sequence/llava-4l-train-b2-s512-fp32-sdpa",
        "sequence/whisper-v3-2l-train-b2-s64-fp32-sdpa",
        "sequence/clip-4l-train-b8-s77-img224-fp32-sdpa",
        "sequence/clip-vision-4l-infer-b16-img224-fp32-sdpa",
        // Captured in session 23 under transformers 4.39.3 and PEFT 0.10.0 to check
        // AnswerDotAI's fsdp_qlora rows at large micro-batches: Llama-2-7B's blocks (two of
        // them), LoRA r64 with dropout on six linears, checkpointing, fp32 logits held.
        "sequence/llama2-2l-train-b6-s2048-bf16-sdpa-ckpt-lora64-hold",
        // And its QLoRA step (NF4 with double quantisation, bitsandbytes 0.50.2 on CPU).
        "sequence/llama2-2l-train-b6-s2048-bf16-sdpa-ckpt-qlora64-hold",
        // Captured in session 24, after a checkpointed block's forward was planned as the
        // no-grad forward it is, to check that at batch 10 (the GPU row it moved most).
        "sequence/llama2-2l-train-b10-s2048-bf16-sdpa-ckpt-qlora64-hold",
        // Captured in session 25 with torchvision's Vision Transformer (vit_b_16's sizes, four
        // blocks) after its packed projection was planned.
        "sequence/vit-b-16-4l-train-b8-img224-bf16",
        // Captured in session 26 (`python -m gpumem_devtools.measure_distributed --traces`):
        // rank 0 of FSDP1 over two gloo ranks with PEFT LoRA and QLoRA on three Llama-2-7B
        // blocks, each adapter a unit of its own, to check where the block before is gathered
        // in backward.
        "sequence/llama2-3l-train-b2-s512-fsdp1-bf16-ckpt-lora8-gpus2",
        "sequence/llama2-3l-train-b2-s512-fsdp1-bf16-ckpt-nf4-double-lora8-gpus2",
    ];
    let committed = traces.len();
    let extra = std::env::var("GPUMEM_EXTRA_TRACES").unwrap_or_default();
    let traces: Vec<&str> = traces
        .into_iter()
        .chain(extra.split(',').filter(|s| !s.is_empty()))
        .collect();
    let options = ReplayOptions::default();
    println!(
        "{:<54} {:>14} {:>14} {:>14} {:>14} {:>9}",
        "trace", "real alloc", "planned alloc", "real reserved", "plan reserved", "error"
    );
    let mut errors = Vec::new();
    for name in traces {
        let path = if name.starts_with('/') {
            PathBuf::from(name)
        } else {
            repo().join(format!("testdata/traces/{name}.jsonl.gz"))
        };
        let real = gpumem_trace::read_path(&path, ReadOptions::default()).unwrap();
        let meta = &real.meta.extra;
        let model = load_config(&repo().join(&meta["config"])).unwrap();
        let workload = settings(meta).resolve(&model).unwrap().workload;
        let events = allocation_sequence(&model, &workload).unwrap();
        let planned_events = planned_trace(name, &events);
        if let Ok(dir) = std::env::var("GPUMEM_PLANNED_OUT") {
            let file = PathBuf::from(dir).join(format!("{}.jsonl", name.replace('/', "_")));
            gpumem_trace::write_path(&planned_events, &file, gpumem_trace::Format::Native).unwrap();
        }
        let planned = replay_peaks(&planned_events, PolicyKind::Torch, &options).unwrap();
        let measured = replay_peaks(&real, PolicyKind::Torch, &options).unwrap();
        let error = planned.peak_reserved_bytes as f64 / measured.peak_reserved_bytes as f64 - 1.0;
        println!(
            "{name:<54} {:>14} {:>14} {:>14} {:>14} {:>+8.1}%",
            measured.peak_allocated_bytes,
            peak_live_bytes(&events),
            measured.peak_reserved_bytes,
            planned.peak_reserved_bytes,
            100.0 * error
        );
        // The sequence carries the planner's allocated peak (validated elsewhere to a few %),
        // against the bytes the real trace asked for (a long generation's thousands of small
        // tensors round up to 512-byte blocks by megabytes).
        let allocated =
            peak_live_bytes(&events) as f64 / measured.peak_requested_bytes as f64 - 1.0;
        assert!(
            allocated.abs() < 0.05,
            "{name}: allocated off by {allocated}"
        );
        assert!(
            planned.peak_reserved_bytes >= planned.peak_allocated_bytes,
            "{name}"
        );
        errors.push(error.abs());
    }
    // The bounds hold the committed traces; traces of your own are printed only.
    errors.truncate(committed);
    // Reserved: docs/plan.md says where the sequence's tensors are still coarser than the
    // real ones (the largest, GPT-2-2l generating 256 tokens, −18.9 %: the harness's
    // `min_new_tokens` processor copies the scores at every step, and 255 decode steps' small
    // tensors fragment the small pool).
    errors.sort_by(f64::total_cmp);
    let median = errors[errors.len() / 2];
    let max = errors[errors.len() - 1];
    println!(
        "reserved: median |error| {:.1} %, max {:.1} %",
        100.0 * median,
        100.0 * max
    );
    assert!(median < 0.025, "median |error| {median}");
    assert!(max < 0.19, "max |error| {max}");
}

#[test]
fn fit_on_reserved_memory_stays_within_the_usable_memory() {
    use gpumem_plan::{find_model, fit, FitTarget, Overheads};
    use gpumem_replay::planned::fit_reserved;
    let model = find_model("gpt2").unwrap();
    let workload = Settings {
        mode: Some("train".into()),
        batch: Some(8),
        seq: Some(512),
        ..Settings::default()
    }
    .resolve(&model)
    .unwrap()
    .workload;
    let overheads = Overheads::default();
    let gpu = 80 << 30;
    let on_allocated = fit(
        &model,
        &workload,
        &overheads,
        FitTarget::Batch,
        gpu,
        0.1,
        None,
    )
    .unwrap();
    let on_reserved = fit_reserved(
        &model,
        &workload,
        &overheads,
        FitTarget::Batch,
        gpu,
        0.1,
        None,
    )
    .unwrap();
    // The allocator's rounding and caching take more than the planner's 6 %: a smaller batch.
    assert!(on_reserved.fit.value < on_allocated.value);
    assert!(on_reserved.total_bytes <= on_reserved.fit.usable_bytes);
    assert_eq!(on_reserved.fit.usable_bytes, on_allocated.usable_bytes);
    assert_eq!(
        on_reserved.total_bytes,
        on_reserved.reserved_bytes + overheads.context_bytes
    );
}
