//! `gpumem plan` as a user runs it: the JSON contract, a fit that finds nothing still shows the
//! plan and its advice before failing, `--help` shows every default, and arguments users get
//! wrong are errors (fast, even for an absurd config) or warnings in the table and the JSON.

mod common;

use common::{gpumem, json_of};

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn json_has_the_contract_keys() {
    let out = gpumem(&[
        "plan",
        "--model",
        "gpt2",
        "--mode",
        "train",
        "--batch",
        "8",
        "--seq",
        "512",
        "--gpu",
        "a100-80gb",
        "--fit",
        "batch",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "peak_total_bytes",
    ] {
        assert!(v[key].as_u64().unwrap() > 0, "{key}");
    }
    assert!(v["peak_reserved_bytes"].as_u64() >= v["peak_allocated_bytes"].as_u64());
    assert!(v["peak_phase"].is_string());
    assert!(v["breakdown"]["weights"].as_u64().unwrap() > 0);
    assert!(
        v["fit"]["value"].as_u64().unwrap() >= 8,
        "gpt2 fits more than 8 on 80 GB"
    );
}

/// Full training of a 7B model on a 16 GB T4: not even batch 1 fits.
const NOTHING_FITS: [&str; 14] = [
    "plan",
    "--model",
    "llama-2-7b",
    "--mode",
    "train",
    "--batch",
    "1",
    "--seq",
    "1024",
    "--gpu",
    "t4",
    "--fit",
    "batch",
    "--json",
];

#[test]
fn a_fit_that_finds_nothing_shows_the_advice_then_fails() {
    let out = gpumem(&NOTHING_FITS[..13]);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("does NOT fit") && stdout.contains("advice"),
        "{stdout}"
    );
    assert!(stdout.contains("plan that fits"), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing fits"));

    let out = gpumem(&NOTHING_FITS);
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["fit_error"].as_str().unwrap().contains("nothing fits"));
    assert!(!v["advice"].as_array().unwrap().is_empty());
}

/// Options without a default: the model, and what to do with the estimate when asked.
const NO_DEFAULT: [&str; 7] = [
    "--model",
    "--config",
    "--global-batch",
    "--gpu",
    "--fit",
    "--report",
    "--trace-out",
];

#[test]
fn help_shows_every_default() {
    let out = gpumem(&["plan", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = help.lines().collect();
    let mut options = 0;
    for (i, line) in lines.iter().enumerate() {
        let Some(flag) = line
            .trim()
            .split(' ')
            .next()
            .filter(|f| f.starts_with("--"))
        else {
            continue;
        };
        if !line.contains('<') || NO_DEFAULT.contains(&flag) {
            continue;
        }
        options += 1;
        assert!(
            lines[i + 1].contains("[default: "),
            "{flag}: {}",
            lines[i + 1]
        );
    }
    assert!(options >= 19, "{help}");
}

#[test]
fn tensor_parallel_not_dividing_the_heads_is_an_error() {
    let out = gpumem(&["plan", "--model", "gpt2", "--tp", "5", "--gpus", "5"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid tp = 5: must divide the 12 attention heads"),
        "{stderr}"
    );
}

#[test]
fn warnings_are_printed_and_in_the_json() {
    let args = [
        "plan",
        "--model",
        "llama-3-8b",
        "--mode",
        "infer",
        "--optimizer",
        "sgd",
        "--zero",
        "2",
    ];
    let out = gpumem(&args);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("warning: --optimizer has no effect: infer mode"),
        "{stdout}"
    );
    let out = gpumem(&[&args[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let warnings = v["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings.iter().all(|w| w["kind"] == "ignored"));
    assert!(warnings[1]["message"]
        .as_str()
        .unwrap()
        .starts_with("--zero"));
    // Inference loads the checkpoint's dtype (bfloat16 for Llama 3), not fp32.
    assert_eq!(v["workload"]["dtype"], "bf16");

    let out = gpumem(&["plan", "--model", "gpt2", "--zero", "3", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["warnings"][0]["kind"], "sharding_over_one_rank");
}

#[test]
fn an_absurd_config_fails_fast() {
    let path = std::env::temp_dir().join(format!("gpumem-absurd-{}.json", std::process::id()));
    std::fs::write(
        &path,
        r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 1000000000,
            "num_attention_heads": 32, "vocab_size": 32000}"#,
    )
    .unwrap();
    let answer = plan_within_20_s(&["--config", path.to_str().unwrap()], "10^9 layers");
    let _ = std::fs::remove_file(&path);
    assert_eq!(answer.status.code(), Some(2));
    assert!(
        answer
            .stderr
            .contains("invalid num_hidden_layers = 1000000000: must be between 1 and 10000"),
        "{}",
        answer.stderr
    );
}

/// What `gpumem plan` answered.
struct Answer {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `gpumem plan` with `args`, failing the test if it has not answered within 20 s.
fn plan_within_20_s(args: &[&str], what: &str) -> Answer {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpumem"))
        .arg("plan")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            pipe.read_to_string(&mut text).map(|_| text)
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("gpumem plan hangs on {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Answer {
        status,
        stdout: stdout.join().unwrap().unwrap(),
        stderr: stderr.join().unwrap().unwrap(),
    }
}

#[test]
fn a_plan_far_past_every_gpu_answers_at_once() {
    // 65536 tokens of eager attention on Llama-3.1-8B: 20 TB of score matrices. Replaying
    // them page by page took minutes and gigabytes before replays of a trace past 512 GiB
    // moved to coarser pages.
    let args = [
        "--model",
        "llama-3.1-8b",
        "--seq",
        "65536",
        "--attn",
        "eager",
        "--json",
    ];
    let answer = plan_within_20_s(&args, "20 TB of attention scores");
    assert!(answer.status.success(), "{}", answer.stderr);
    let v: serde_json::Value = serde_json::from_str(&answer.stdout).unwrap();
    let allocated = v["peak_allocated_bytes"].as_u64().unwrap();
    assert!(allocated > 16 << 40, "{allocated}");
    for policy in v["replay"].as_array().unwrap() {
        assert!(
            policy["peak_reserved_bytes"].as_u64() >= policy["peak_allocated_bytes"].as_u64(),
            "{policy}"
        );
    }
}

#[test]
fn advice_leaves_out_changes_that_save_next_to_nothing() {
    // A four-token training step: checkpointing saves a few megabytes of reserved memory
    // for a third more compute, while the optimizer's states are worth changing.
    let plan = |extra: &[&str]| {
        let mut args = vec!["plan", "--model", "llama-3.2-1b", "--seq", "4", "--json"];
        args.extend(extra);
        json_of(&gpumem(&args))
    };
    let total = |v: &serde_json::Value| v["peak_total_bytes"].as_u64().unwrap();
    let plain = plan(&[]);
    let checkpointed = plan(&["--grad-ckpt"]);
    assert!(
        total(&checkpointed) < total(&plain),
        "checkpointing saves something"
    );
    let advice = plain["advice"].as_array().unwrap();
    let changes: Vec<&str> = advice
        .iter()
        .map(|s| s["change"].as_str().unwrap())
        .collect();
    assert!(
        changes.iter().any(|c| c.starts_with("--optimizer ")),
        "{changes:?}"
    );
    assert!(
        !changes.iter().any(|c| c.contains("--grad-ckpt")),
        "{changes:?}"
    );
}

#[test]
fn trace_out_writes_the_planned_sequence_that_replay_reads() {
    let dir = std::env::temp_dir().join(format!("gpumem-plan-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plan.jsonl");
    let path_text = path.to_str().unwrap();
    let args = [
        "plan", "--model", "gpt2", "--mode", "train", "--batch", "2", "--seq", "256",
    ];
    let out = gpumem(&[&args[..], &["--json", "--trace-out", path_text]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let replayed = plan["replay"].as_array().unwrap();
    let policies: Vec<&str> = replayed
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(policies, ["torch", "expandable", "gpumem"]);
    for r in replayed {
        assert!(r["peak_reserved_bytes"].as_u64() >= r["peak_allocated_bytes"].as_u64());
    }
    // The plan's reserved memory is the torch replay's, its allocator line what that holds
    // beyond the tensors, and total adds the context.
    let reserved = replayed[0]["peak_reserved_bytes"].as_u64().unwrap();
    let allocated = plan["peak_allocated_bytes"].as_u64().unwrap();
    assert_eq!(plan["peak_reserved_bytes"].as_u64(), Some(reserved));
    assert_eq!(
        plan["breakdown"]["allocator"].as_u64(),
        Some(reserved - allocated)
    );
    assert_eq!(
        plan["peak_total_bytes"].as_u64(),
        Some(reserved + plan["breakdown"]["framework"].as_u64().unwrap())
    );
    // `gpumem replay` reads the written trace and finds the same torch peaks.
    let replay = gpumem(&["replay", path_text, "--policy", "torch", "--json"]);
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&replay.stdout).unwrap();
    let torch = &report["policies"][0];
    assert_eq!(
        torch["peak_reserved_bytes"],
        replayed[0]["peak_reserved_bytes"]
    );
    assert_eq!(
        torch["peak_allocated_bytes"],
        replayed[0]["peak_allocated_bytes"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn single_gpu_settings_errors_name_what_is_accepted() {
    let cases: [(&[&str], &str); 3] = [
        (
            &["--transformers", "4.45.0.dev0"],
            "invalid transformers = 4.45.0.dev0: must be a transformers release as MAJOR.MINOR \
             or MAJOR.MINOR.PATCH",
        ),
        (
            &["--grad-ckpt", "--grad-ckpt-per-op"],
            "--grad-ckpt cannot be combined with --grad-ckpt-per-op",
        ),
        (&["--grad-ckpt-every", "-2"], "must be a positive integer"),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["plan", "--model", "gpt2"];
        args.extend_from_slice(flags);
        let out = gpumem(&args);
        assert_eq!(out.status.code(), Some(2), "{flags:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
    let out = gpumem(&[
        "plan",
        "--model",
        "gpt2",
        "--optimizer",
        "none",
        "--grad-ckpt-every",
        "4",
        "--json",
    ]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["breakdown"]["optimizer_states"], 0);
    assert_eq!(
        v["phases"].as_array().unwrap().last().unwrap()["phase"],
        "backward"
    );
}

#[test]
fn quantised_inference_is_planned_and_bad_formats_are_errors() {
    let plan = |quant: &str| {
        gpumem(&[
            "plan", "--model", "gpt2", "--mode", "infer", "--quant", quant, "--json",
        ])
    };
    let weights = |quant: &str| {
        let out = plan(quant);
        assert!(out.status.success(), "{quant}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["breakdown"]["weights"].as_u64().unwrap()
    };
    assert!(weights("nf4:double,compute=bf16") < weights("int8"));
    assert!(weights("int8") < weights("none"));
    for (quant, expected) in [
        ("int4", "unknown quant `int4`"),
        ("gptq:bits=5", "bits must be 2, 3, 4 or 8"),
        ("int8:double", "not an option of int8"),
    ] {
        let out = plan(quant);
        assert_eq!(out.status.code(), Some(2), "{quant}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{quant}: {stderr}");
    }
}

#[test]
fn chunked_and_fused_losses_keep_fewer_logits() {
    let peak = |loss: &str| {
        let out = gpumem(&[
            "plan",
            "--model",
            "llama-3-8b",
            "--dtype",
            "bf16",
            "--batch",
            "2",
            "--seq",
            "4096",
            "--loss",
            loss,
            "--json",
        ]);
        assert!(out.status.success(), "{loss}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["peak_allocated_bytes"].as_u64().unwrap()
    };
    // 8192 tokens × 128256 logits: HF's fp32 upcast keeps the most, Liger's fused loss none.
    assert!(peak("fused") < peak("chunked"));
    assert!(peak("chunked") < peak("hf"));
    assert!(peak("chunked-fp32") < peak("hf"));
    let out = gpumem(&["plan", "--model", "bert-base", "--loss", "chunked"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no causal LM head"), "{stderr}");
}

#[test]
fn lora_targets_and_dropout_are_planned_and_checked() {
    let trainable = |targets: &str| {
        let out = gpumem(&[
            "plan",
            "--model",
            "llama-2-7b",
            "--lora-rank",
            "16",
            "--lora-targets",
            targets,
            "--json",
        ]);
        assert!(out.status.success(), "{targets}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["trainable_params"].as_u64().unwrap()
    };
    // PEFT's default for Llama: q_proj and v_proj, 2 × 16 × (4096 + 4096) per block.
    assert_eq!(trainable("q_proj,v_proj"), 32 * 2 * 16 * 8192);
    assert!(trainable("q,v") < trainable("all-linear"));
    for (args, expected) in [
        (
            &["--model", "gpt2", "--lora-rank", "8", "--lora-targets", "q"][..],
            "computes q, k and v with one linear",
        ),
        (
            &[
                "--model",
                "gpt2",
                "--lora-rank",
                "8",
                "--lora-targets",
                "lm_head",
            ][..],
            "not a linear of a transformer block",
        ),
        (
            &["--model", "gpt2", "--lora-rank", "8", "--lora-dropout", "1"][..],
            "must be a probability",
        ),
    ] {
        let mut full = vec!["plan"];
        full.extend_from_slice(args);
        let out = gpumem(&full);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn litgpt_framework_plans_its_own_lora() {
    let peak = |framework: &str| {
        let out = gpumem(&[
            "plan",
            "--model",
            "llama-2-7b",
            "--dtype",
            "bf16",
            "--batch",
            "2",
            "--seq",
            "512",
            "--lora-rank",
            "32",
            "--lora-targets",
            "q,v",
            "--lora-dropout",
            "0.05",
            "--loss",
            "chunked",
            "--framework",
            framework,
            "--json",
        ]);
        assert!(out.status.success(), "{framework}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["peak_allocated_bytes"].as_u64().unwrap()
    };
    // litgpt's own model and LoRA are planned, not PEFT's: one bf16 dropout and lora_A over
    // q and v (against two fp32 adapters), the fused qkv output kept whole by the values
    // (Llama 2 has as many key/value heads as query heads), the heads merged by a copy.
    assert_ne!(peak("litgpt"), peak("hf"));
    let out = gpumem(&["plan", "--model", "gpt2", "--framework", "nemo"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("accepted: hf, litgpt"), "{stderr}");
}

/// `--reserved estimate` replays nothing: the same allocated peak and advice changes, reserved
/// memory from the planner's allocator share, and the fit on it.
#[test]
fn reserved_by_estimate_replays_nothing() {
    let args = [
        "plan", "--model", "gpt2", "--mode", "train", "--batch", "2", "--seq", "256", "--gpu",
        "4GiB", "--fit", "batch", "--json",
    ];
    let replayed = json_of(&gpumem(&args));
    let estimated = json_of(&gpumem(&[&args[..], &["--reserved", "estimate"]].concat()));
    assert_eq!(replayed["reserved_by"], "replay");
    assert_eq!(estimated["reserved_by"], "estimate");
    assert_eq!(estimated["replay"], serde_json::json!([]));
    assert_eq!(replayed["replay"].as_array().unwrap().len(), 3);
    let allocated = estimated["peak_allocated_bytes"].as_u64().unwrap();
    let reserved = estimated["peak_reserved_bytes"].as_u64().unwrap();
    assert!(reserved > allocated, "{estimated}");
    assert!(estimated["fit"]["value"].as_u64().unwrap() >= 1);
    let out = gpumem(&["plan", "--model", "gpt2", "--reserved", "guess"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("replay"));
}

#[test]
fn the_vllm_engine_prints_the_kv_cache_it_leaves() {
    let args = |extra: &[&str]| {
        let mut a = vec![
            "plan",
            "--model",
            "llama-3-8b",
            "--engine",
            "vllm",
            "--gpu",
            "h100",
        ];
        a.extend_from_slice(extra);
        gpumem(&a)
    };
    let out = args(&["--max-model-len", "8192"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "model weights take",
        "activation peak",
        "# GPU blocks:",
        "GPU KV cache size:",
        "Maximum concurrency for 8192 tokens per request:",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    let json = json_of(&args(&["--max-model-len", "8192", "--json"]));
    let serving = &json["serving"];
    let blocks = serving["gpu_blocks"].as_u64().unwrap();
    assert_eq!(serving["kv_tokens"].as_u64().unwrap(), blocks * 16);
    // Less memory for the instance, fewer blocks.
    let less = json_of(&args(&[
        "--max-model-len",
        "8192",
        "--gpu-memory-utilization",
        "0.5",
        "--json",
    ]));
    assert!(less["serving"]["gpu_blocks"].as_u64().unwrap() < blocks);
    // A share above 1 and engine flags without an engine are errors naming the flag.
    let bad = args(&["--gpu-memory-utilization", "1.5"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("gpu-memory-utilization"));
    let alone = gpumem(&["plan", "--model", "llama-3-8b", "--max-num-seqs", "64"]);
    assert_eq!(alone.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&alone.stderr).contains("--engine"));
    // The shape of a PyTorch forward is not the profile's: said, not silently dropped.
    let batch = args(&["--batch", "8"]);
    assert!(String::from_utf8_lossy(&batch.stdout).contains("warning: --batch"));
    // A model the profile does not cover is refused by name.
    let bert = gpumem(&["plan", "--model", "bert-base-uncased", "--engine", "vllm"]);
    assert_eq!(bert.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bert.stderr).contains("decoder-only"));
}

/// A run that fills its GPU: AnswerDotAI's fsdp_qlora step on Mistral-7B at 24,576 tokens,
/// which ran on RTX 3090s (22.54 GiB reserved). Its cache would outgrow the card; PyTorch's
/// allocator empties it and retries instead, so the plan fits the card and says what that
/// costs.
#[test]
fn a_run_that_fills_the_gpu_fits_by_emptying_the_cache() {
    let args = [
        "plan",
        "--model",
        "mistralai/Mistral-7B-v0.2",
        "--mode",
        "train",
        "--batch",
        "1",
        "--seq",
        "24576",
        "--dtype",
        "bf16",
        "--grad-ckpt",
        "--gpus",
        "2",
        "--fsdp",
        "--fsdp-version",
        "1",
        "--offload",
        "--quant",
        "nf4:double",
        "--lora-rank",
        "64",
        "--lora-targets",
        "q,k,v,gate,up,down",
        "--lora-dropout",
        "0.1",
        "--transformers",
        "4.39",
        "--bitsandbytes",
        "0.43.0",
        "--peft",
        "0.10",
        "--hold-outputs",
        "--fsdp-cpu-ram-efficient-loading",
        "--json",
    ];
    let plan = |gpu: &[&str]| json_of(&gpumem(&[&args[..], gpu].concat()));
    let unbounded = plan(&[]);
    let card = plan(&["--gpu", "rtx-3090"]);
    let gib = |v: &serde_json::Value| v.as_u64().unwrap() as f64 / (1u64 << 30) as f64;
    assert!(gib(&unbounded["peak_total_bytes"]) > 24.0, "{unbounded}");
    assert!(gib(&card["peak_total_bytes"]) <= 24.0, "{card}");
    assert_eq!(card["gpu"]["fits"], true);
    let torch = &card["replay"][0];
    assert_eq!(torch["policy"], "torch");
    assert!(torch["alloc_retries"].as_u64().unwrap() > 0, "{torch}");
    assert!(
        card["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["kind"] == "cache_flushes"),
        "{card}"
    );
}

/// Runs `gpumem plan` with `flags` and returns its standard error after checking that it
/// failed as a usage error (exit code 2).
fn plan_error(flags: &[&str]) -> String {
    let mut args = vec!["plan"];
    args.extend_from_slice(flags);
    let out = gpumem(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
    stderr
}

/// A value no run accepts is an error naming the flag and the range, also where the mode or
/// the rest of the command ignores the flag (it used to pass with an "ignored" warning, or
/// silently: a margin without a fit, a context of 95 TiB planned as a 536-million-GiB peak).
#[test]
fn out_of_range_values_are_errors_even_where_ignored() {
    let cases: [(&[&str], &str); 9] = [
        (
            &["--lora-dropout", "1.5"],
            "invalid lora-dropout = 1.5: must be a probability",
        ),
        (&["--lora-dropout", "nan"], "invalid lora-dropout = NaN"),
        (&["--lora-dropout", "-0.1"], "invalid lora-dropout = -0.1"),
        (
            &[
                "--mode",
                "infer",
                "--lora-rank",
                "8",
                "--lora-dropout",
                "-inf",
            ],
            "invalid lora-dropout = -inf",
        ),
        (
            &["--new-tokens", "0"],
            "invalid new-tokens = 0: must be between 1 and 16777216",
        ),
        (
            &["--mode", "infer", "--cache-len", "18446744073709551615"],
            "invalid cache-len = 18446744073709551615: must be between 1 and 16777216",
        ),
        (
            &["--context-mib", "99999999999999"],
            "invalid context-mib = 99999999999999: must be between 0 and 1048576 MiB",
        ),
        (
            &["--margin", "nan"],
            "invalid margin = NaN: must be a fraction in [0, 0.9)",
        ),
        (&["--margin", "1.5"], "invalid margin = 1.5"),
    ];
    for (flags, expected) in cases {
        let stderr = plan_error(&[&["--model", "gpt2"], flags].concat());
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
}

/// A negative count is refused by the flag's name with the reason, not as clap's "unexpected
/// argument '-1'" that names no flag; a negative ZeRO stage or FSDP version is an unknown one.
#[test]
fn negative_counts_name_their_flag() {
    for (flag, kind) in [("--zero", "ZeRO stage"), ("--fsdp-version", "FSDP version")] {
        let stderr = plan_error(&["--model", "gpt2", flag, "-1"]);
        assert!(
            stderr.contains(&format!("unknown {kind} `-1`")),
            "{flag}: {stderr}"
        );
    }
    for flag in [
        "--image-size",
        "--new-tokens",
        "--grad-accum",
        "--gpus",
        "--nodes",
        "--nccl-buffsize",
        "--tp",
        "--pp",
        "--lora-rank",
        "--loss-chunk",
        "--max-model-len",
        "--non-torch-bytes",
    ] {
        let stderr = plan_error(&["--model", "gpt2", flag, "-1"]);
        assert!(
            stderr.contains(&format!("invalid value '-1' for '{flag} <"))
                && stderr.contains("must be a positive integer"),
            "{flag}: {stderr}"
        );
    }
}

/// `--global-batch` is between 1 and the batch bound: 0 was fitted as if not given, and 10¹¹
/// failed naming `grad-accum`, a flag not typed.
#[test]
fn a_global_batch_out_of_range_is_an_error_naming_it() {
    for value in ["0", "100000000000"] {
        let stderr = plan_error(&[
            "--model",
            "gpt2",
            "--gpu",
            "h100",
            "--fit",
            "batch",
            "--reserved",
            "estimate",
            "--global-batch",
            value,
        ]);
        assert!(
            stderr.contains(&format!(
                "invalid global-batch = {value}: must be between 1 and 16777216"
            )),
            "{value}: {stderr}"
        );
    }
}

/// Flags a run does not use change nothing, or are refused: ZeRO and offloading in
/// generation (warned as ignored, yet they changed the replayed peak), `--seq` on a vision
/// transformer (the same), `--sp` without tensor parallelism (silently nothing), and
/// `--offload` without ZeRO or FSDP (planned as an offload no run can do).
#[test]
fn flags_a_run_ignores_change_nothing_or_are_refused() {
    let plan = |extra: &[&str]| {
        json_of(&gpumem(
            &[
                &[
                    "plan",
                    "--model",
                    "llama-3.2-1b",
                    "--dtype",
                    "bf16",
                    "--json",
                ],
                extra,
            ]
            .concat(),
        ))
    };
    let unchanged =
        |base: &[&str], flags: &[&str]| {
            let plain = plan(base);
            let with = plan(&[base, flags].concat());
            for key in ["peak_total_bytes", "breakdown", "replay"] {
                assert_eq!(plain[key], with[key], "{flags:?}: {key}");
            }
            let warnings = with["warnings"].as_array().unwrap();
            assert!(
                warnings.iter().any(|w| w["kind"] == "ignored"
                    && w["message"].as_str().unwrap().starts_with(flags[0])),
                "{flags:?}: {warnings:?}"
            );
        };
    let generate = ["--mode", "generate"];
    unchanged(&generate, &["--zero", "1"]);
    unchanged(&generate, &["--offload", "all"]);
    unchanged(&[], &["--sp"]);
    let vit = |extra: &[&str]| {
        json_of(&gpumem(
            &[&["plan", "--model", "vit-b-16", "--json"], extra].concat(),
        ))
    };
    assert_eq!(vit(&[])["replay"], vit(&["--seq", "2048"])["replay"]);
    let stderr = plan_error(&["--model", "gpt2", "--offload"]);
    assert!(
        stderr.contains("--offload all cannot be combined with no --zero or --fsdp"),
        "{stderr}"
    );
}

/// A serving engine's profile is one inference forward on one GPU over the base weights: a
/// mode, tensor or pipeline parallelism, adapters, and outputs that draw a PyTorch process
/// are refused (they used to be dropped silently: `--tp 2` printed a whole model's weights
/// per GPU).
#[test]
fn engine_settings_it_does_not_plan_are_refused() {
    let dir = std::env::temp_dir();
    let page = dir.join("gpumem-engine-plan.html");
    let trace = dir.join("gpumem-engine-plan.jsonl");
    let cases: [(&[&str], &str); 6] = [
        (&["--mode", "generate"], "--mode generate"),
        (&["--gpus", "2", "--tp", "2"], "--tp 2"),
        (&["--gpus", "2", "--pp", "2"], "--pp 2"),
        (&["--lora-rank", "8"], "--lora-rank 8"),
        (&["--report", page.to_str().unwrap()], "--report"),
        (&["--trace-out", trace.to_str().unwrap()], "--trace-out"),
    ];
    for (flags, second) in cases {
        let stderr = plan_error(
            &[
                &["--model", "llama-3-8b", "--engine", "vllm", "--gpu", "h100"],
                flags,
            ]
            .concat(),
        );
        assert!(
            stderr.contains(&format!("--engine vllm cannot be combined with {second}")),
            "{flags:?}: {stderr}"
        );
    }
}

/// An image smaller than a vision transformer's patch has no patch (PyTorch's convolution
/// raises); it was planned as a sequence of the class token alone.
#[test]
fn an_image_smaller_than_a_patch_is_an_error() {
    for (model, size, patch) in [("vit-base", "8", 16), ("clip-vit-base-patch32", "16", 32)] {
        let stderr = plan_error(&["--model", model, "--image-size", size]);
        assert!(
            stderr.contains(&format!(
                "invalid image-size = {size}: must be at least the {patch}-pixel patch side"
            )),
            "{model}: {stderr}"
        );
    }
}

/// A trace that cannot be written names `--trace-out` and says it cannot write (it said
/// "cannot read").
#[test]
fn an_unwritable_trace_out_names_the_flag() {
    let dir = std::env::temp_dir();
    let stderr = plan_error(&[
        "--model",
        "gpt2",
        "--reserved",
        "estimate",
        "--trace-out",
        dir.to_str().unwrap(),
    ]);
    assert!(
        stderr.contains(&format!(
            "--trace-out {}: cannot write the trace",
            dir.display()
        )),
        "{stderr}"
    );
}

/// `gpumem plan --json` with `args`, after checking that it succeeded.
fn plan_json(args: &[&str]) -> serde_json::Value {
    json_of(&gpumem(&[&["plan", "--json"], args].concat()))
}

/// `args` with each `--flag [value]` of `changes` set, as a user adds an advice line to the
/// command: a flag already given takes the new value, the others are added.
fn with_changes(args: &[&str], changes: &str) -> Vec<String> {
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    for flag in changes.split(" --") {
        let mut words = flag.trim_start_matches("--").splitn(2, ' ');
        let name = format!("--{}", words.next().unwrap());
        let value = words.next().map(str::to_string);
        match args.iter().position(|a| *a == name) {
            Some(i) => {
                if let Some(value) = value {
                    args[i + 1] = value;
                }
            }
            None => args.extend([name].into_iter().chain(value)),
        }
    }
    args
}

/// Every advice line and the plan that fits are the plan their flags give: `--qlora` on an fp32
/// plan also moved it to bf16 without saying so (gemma-3-1b on a T4: "plan that fits: add
/// --qlora --grad-ckpt → 14.27 GiB", 19.35 GiB with those flags), and halving a batch twice
/// printed `--batch` twice, which no command line takes.
#[test]
fn every_advice_change_is_the_plan_its_flags_give() {
    let cases: [&[&str]; 2] = [
        &[
            "--model",
            "gemma-3-1b",
            "--gpu",
            "t4",
            "--mode",
            "train",
            "--batch",
            "4",
            "--seq",
            "1024",
        ],
        &[
            "--model",
            "qwen2.5-7b",
            "--mode",
            "infer",
            "--batch",
            "32",
            "--seq",
            "4096",
            "--gpu",
            "a10g",
        ],
    ];
    for base in cases {
        let report = plan_json(base);
        let fits = &report["plan_that_fits"];
        let flags: Vec<&str> = fits["changes"]
            .as_array()
            .unwrap_or_else(|| panic!("{base:?}: no plan that fits"))
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        let names: std::collections::BTreeSet<&str> =
            flags.iter().map(|f| f.split(' ').next().unwrap()).collect();
        assert_eq!(names.len(), flags.len(), "a flag set twice: {flags:?}");
        let mut changes: Vec<(String, &serde_json::Value)> = report["advice"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["change"].as_str().unwrap().into(),
                    &a["new_peak_total_bytes"],
                )
            })
            .collect();
        changes.push((flags.join(" "), &fits["peak_total_bytes"]));
        for (change, peak) in changes {
            let args = with_changes(base, &change);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            assert_eq!(
                &plan_json(&args)["peak_total_bytes"],
                peak,
                "{base:?} + {change}"
            );
        }
    }
}

/// The larger batch suggested for an idle GPU keeps the 10 % margin it promises, by the
/// replay the plan prints, and is the largest that does: it was fitted on the estimate and
/// then replayed (`--batch 68 → 24.01 GiB (10% margin kept)` on a GPU of 22.35 GiB).
#[test]
fn the_batch_for_idle_memory_keeps_its_margin() {
    let base = [
        "--model", "gpt2", "--gpu", "24GB", "--mode", "infer", "--seq", "1024",
    ];
    let report = plan_json(&base);
    let usable = (report["gpu"]["memory_bytes"].as_u64().unwrap() as f64 * 0.9) as u64;
    let larger = report["advice"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["cost"].as_str().unwrap().contains("idle memory"))
        .expect("a larger batch for the idle GPU");
    let peak = larger["new_peak_total_bytes"].as_u64().unwrap();
    assert!(peak <= usable, "{larger}: {peak} > {usable}");
    let batch: u64 = larger["change"].as_str().unwrap()["--batch ".len()..]
        .parse()
        .unwrap();
    let next = with_changes(&base, &format!("--batch {}", batch + 1));
    let next: Vec<&str> = next.iter().map(String::as_str).collect();
    assert!(plan_json(&next)["peak_total_bytes"].as_u64().unwrap() > usable);
}

/// The fit and the plan it prints are one replay: the fit's reserved and total are the plan's
/// (a ResNet-50 on a T4 fitted at 13.22 GiB printed 14.14 GiB: the fit replayed within the
/// usable memory, the plan within the GPU), and the value is the largest that fits (Pythia-1B
/// stopped at batch 73 and sequence 37443 where 74 and 37444 fit).
#[test]
fn the_fit_is_the_largest_value_the_printed_plan_fits() {
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "--model",
                "resnet50",
                "--amp",
                "bf16",
                "--optimizer",
                "sgd",
                "--gpu",
                "t4",
            ],
            "batch",
        ),
        (
            &["--model", "pythia-1b", "--gpu", "t4", "--mode", "infer"],
            "batch",
        ),
        (
            &["--model", "pythia-1b", "--gpu", "t4", "--mode", "infer"],
            "seq",
        ),
    ];
    for (base, target) in cases {
        let report = plan_json(&[base, &["--fit", target]].concat());
        let fit = &report["fit"];
        let usable = fit["usable_bytes"].as_u64().unwrap();
        assert_eq!(fit["total_bytes"], report["peak_total_bytes"], "{base:?}");
        assert_eq!(fit["reserved_bytes"], report["peak_reserved_bytes"]);
        assert!(fit["total_bytes"].as_u64().unwrap() <= usable, "{fit}");
        let value = fit["value"].as_u64().unwrap();
        let flag = format!("--{target}");
        let at = |v: u64| {
            let args = with_changes(base, &format!("{flag} {v}"));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            plan_json(&args)["peak_total_bytes"].as_u64().unwrap()
        };
        assert_eq!(at(value), fit["total_bytes"].as_u64().unwrap());
        assert!(
            at(value + 1) > usable,
            "{base:?}: {target} {} fits",
            value + 1
        );
    }
}

/// A GPU no larger than the context (and NCCL's memory) leaves the replay no device: an error
/// naming `--gpu` and `--context-mib` with the sizes (it failed as "invalid planned allocation
/// sequence … simulated device capacity 0 bytes"). Without the replay the plan just does not
/// fit.
#[test]
fn a_gpu_smaller_than_the_context_is_an_error_naming_both() {
    for extra in [&[][..], &["--fit", "batch"]] {
        let stderr = plan_error(&[&["--model", "gpt2", "--gpu", "100MiB"], extra].concat());
        assert!(
            stderr.contains(
                "--gpu of 100.00 MiB cannot be combined with --context-mib 500: the CUDA \
                 context and framework take 500.00 MiB"
            ),
            "{extra:?}: {stderr}"
        );
    }
    let smaller = plan_json(&["--model", "gpt2", "--gpu", "100MiB", "--context-mib", "50"]);
    assert_eq!(smaller["gpu"]["fits"], false);
    let estimated = plan_json(&[
        "--model",
        "gpt2",
        "--gpu",
        "100MiB",
        "--reserved",
        "estimate",
    ]);
    assert_eq!(estimated["gpu"]["fits"], false);
}

/// The request's own flags: a negative value names its flag (it was clap's "unexpected
/// argument '-1'"); a global batch is checked without a fit too; a margin without a fit, and a
/// `--batch` that `--fit batch` replaces, are warned about (they were dropped silently); a
/// serving engine refuses a fit and a GPU count of a PyTorch process, and its PyTorch figures
/// do not move with the flags it ignores.
#[test]
fn request_flags_are_checked_warned_or_refused() {
    for flag in ["--global-batch", "--context-mib"] {
        let stderr = plan_error(&["--model", "gpt2", flag, "-1"]);
        assert!(
            stderr.contains(&format!("invalid value '-1' for '{flag} <"))
                && stderr.contains("must be a non-negative integer"),
            "{flag}: {stderr}"
        );
    }
    let stderr = plan_error(&["--model", "gpt2", "--margin", "-1"]);
    assert!(stderr.contains("invalid margin = -1"), "{stderr}");
    let stderr = plan_error(&["--model", "gpt2", "--global-batch", "0"]);
    assert!(stderr.contains("invalid global-batch = 0"), "{stderr}");
    let warned = |args: &[&str], flag: &str| {
        let warnings = plan_json(args)["warnings"].to_string();
        warnings.contains(&format!("{flag} has no effect"))
    };
    assert!(warned(&["--model", "gpt2", "--margin", "0.2"], "--margin"));
    let fit = [
        "--model", "gpt2", "--gpu", "t4", "--fit", "batch", "--margin", "0.2",
    ];
    assert!(!warned(&fit, "--margin"));
    assert!(warned(&[&fit[..], &["--batch", "4"]].concat(), "--batch"));
    let engine = ["--model", "llama-3-8b", "--engine", "vllm", "--gpu", "h100"];
    for (flags, second) in [
        (&["--fit", "batch"][..], "--fit batch"),
        (&["--min-gpus"], "--min-gpus"),
    ] {
        let stderr = plan_error(&[&engine[..], flags].concat());
        assert!(
            stderr.contains(&format!("--engine vllm cannot be combined with {second}")),
            "{stderr}"
        );
    }
    let plain = plan_json(&engine);
    let ignored = plan_json(
        &[
            &engine[..],
            &[
                "--batch",
                "64",
                "--seq",
                "4096",
                "--new-tokens",
                "5",
                "--attn",
                "eager",
                "--no-cache",
                "--labels",
            ],
        ]
        .concat(),
    );
    for key in [
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "peak_total_bytes",
        "breakdown",
        "replay",
        "gpu",
        "serving",
    ] {
        assert_eq!(plain[key], ignored[key], "{key}");
    }
    assert_eq!(ignored["advice"], serde_json::json!([]));
}
