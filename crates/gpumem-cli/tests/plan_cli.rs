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
