//! `gpumem plan` inputs that fuzzing found accepted or silently ignored: each out-of-range or
//! malformed value is now a typed error (exit code 2) naming the flag and what is accepted, a
//! plan past the planner's bound is refused instead of saturating, and a flag that changes
//! nothing is warned about.

mod common;

use common::{gpumem, json_of};

/// Runs `gpumem plan ARGS`, checks that it failed as a typed error (exit code 2, no panic) and
/// returns what it printed on stderr.
fn refused(args: &[&str]) -> String {
    let out = gpumem(&[&["plan"], args].concat());
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    stderr
}

/// The messages of the warnings `gpumem plan ARGS --json` returns (the plan succeeds).
fn warnings(args: &[&str]) -> Vec<String> {
    let out = gpumem(&[&["plan"], args, &["--reserved", "estimate", "--json"]].concat());
    json_of(&out)["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["message"].as_str().unwrap().to_string())
        .collect()
}

/// Whether `messages` say that `flag` has no effect.
fn ignores(messages: &[String], flag: &str) -> bool {
    messages
        .iter()
        .any(|m| m.starts_with(&format!("{flag} has no effect: ")))
}

const MAX_U64: &str = "18446744073709551615";

/// vLLM's settings take the values vLLM accepts: a `u64::MAX` once wrapped the non-torch memory
/// into 17 billion GiB, gave a 17-billion-GiB activation peak or 0 blocks.
#[test]
fn serving_values_are_bounded_as_vllm_bounds_them() {
    let vllm = ["--model", "llama-3-8b", "--engine", "vllm", "--gpu", "h100"];
    for (flag, value, expected) in [
        (
            "--non-torch-bytes",
            MAX_U64,
            "between 0 and 1099511627776 bytes",
        ),
        ("--max-model-len", MAX_U64, "between 1 and 16777216"),
        (
            "--max-num-batched-tokens",
            MAX_U64,
            "between 1 and 16777216",
        ),
        ("--max-num-seqs", MAX_U64, "between 1 and 16777216"),
        ("--block-size", MAX_U64, "one of 8, 16, 32, 64, 128"),
        ("--block-size", "24", "one of 8, 16, 32, 64, 128"),
    ] {
        let stderr = refused(&[&vllm[..], &[flag, value]].concat());
        let name = flag.trim_start_matches("--");
        assert!(
            stderr.contains(&format!("invalid {name} = {value}")) && stderr.contains(expected),
            "{flag} {value}: {stderr}"
        );
    }
    // vLLM's own check: a step has at least one token per sequence.
    let stderr = refused(&[&vllm[..], &["--max-num-seqs", "100000"]].concat());
    assert!(
        stderr.contains(
            "--max-num-batched-tokens 8192 (the default) cannot be combined with \
             --max-num-seqs 100000"
        ),
        "{stderr}"
    );
    let planned = json_of(&gpumem(
        &[
            &["plan"],
            &vllm[..],
            &["--non-torch-bytes", "1921997864", "--json"],
        ]
        .concat(),
    ));
    assert!(planned["serving"]["gpu_blocks"].as_u64().unwrap() > 0);
}

/// The engine runs its own model code: the flags that choose PyTorch's (`--framework`,
/// `--transformers`) or its precision (`--amp`) are warned about, as `--batch` and `--attn`.
#[test]
fn serving_warns_about_the_flags_of_a_pytorch_process() {
    let messages = warnings(&[
        "--model",
        "llama-3-8b",
        "--engine",
        "vllm",
        "--framework",
        "litgpt",
        "--transformers",
        "4.44.2",
        "--amp",
        "bf16",
    ]);
    for flag in ["--framework", "--transformers", "--amp"] {
        assert!(ignores(&messages, flag), "{flag}: {messages:?}");
    }
}

/// A quantisation option that is not one, given twice or empty is an error naming it and the
/// options the format takes; GPTQ's per-column groups are spelt as its config spells them.
#[test]
fn malformed_quant_options_are_errors() {
    let infer = ["--model", "gpt2", "--mode", "infer", "--quant"];
    for (quant, named, accepted) in [
        (
            "fp8:block=0",
            "block=0",
            "block=N (1 to 1073741824 weights per scale)",
        ),
        ("gptq:bits=8,group=0", "group=0", "group=N (1 to 1048576"),
        (
            "nf4:double,double",
            "option double is given twice",
            "double, compute=",
        ),
        ("nf4:", "an option is empty", "double, compute="),
        (
            "nf4:double,,compute=bf16",
            "an option is empty",
            "double, compute=",
        ),
        ("none:double", "none takes no options", "none"),
    ] {
        let stderr = refused(&[&infer[..], &[quant]].concat());
        assert!(
            stderr.contains("invalid quant = ") && stderr.contains(named),
            "{quant}: {stderr}"
        );
        assert!(stderr.contains(accepted), "{quant}: {stderr}");
    }
    json_of(&gpumem(
        &[&["plan"], &infer[..], &["gptq:group=-1", "--json"]].concat(),
    ));
}

/// `--amp` lists only what it accepts; `--amp fp32` stays an invalid value with its reason.
#[test]
fn amp_lists_only_the_autocast_dtypes() {
    let stderr = refused(&["--model", "gpt2", "--amp", "int8"]);
    assert!(
        stderr.contains("unknown amp dtype `int8`") && stderr.contains("accepted: bf16"),
        "{stderr}"
    );
    assert!(!stderr.contains("fp32"), "{stderr}");
    let stderr = refused(&["--model", "gpt2", "--amp", "fp32"]);
    assert!(stderr.contains("invalid amp = fp32"), "{stderr}");
}

/// An unknown GPU's error says that a size is accepted, and how one is written.
#[test]
fn an_unknown_gpu_says_sizes_are_accepted() {
    for gpu in ["1B", "h1000"] {
        let stderr = refused(&["--model", "gpt2", "--gpu", gpu]);
        assert!(
            stderr.contains(&format!("unknown GPU `{gpu}`"))
                && stderr.contains("24GB")
                && stderr.contains("80GiB"),
            "{gpu}: {stderr}"
        );
    }
}

/// A plan past the planner's bound (256 TiB on one GPU) is refused, naming the phase and the
/// sizes, where it once printed figures saturated at 2⁵⁹ bytes (589,089,998 GiB for a ViT
/// over a 16777216-pixel image) or the replay's 1 PiB device.
#[test]
fn plans_past_the_bound_are_errors_not_saturated_figures() {
    for (args, sizes) in [
        (
            &["--model", "vit-base", "--image-size", "16777216"][..],
            "batch 1, image-size 16777216",
        ),
        (
            &[
                "--model",
                "llama-3-70b",
                "--mode",
                "generate",
                "--batch",
                "16777216",
            ][..],
            "batch 16777216, seq 512, new-tokens 128",
        ),
    ] {
        let stderr = refused(args);
        assert!(
            stderr.contains(&format!("invalid workload = {sizes}")) && stderr.contains("256 TiB"),
            "{args:?}: {stderr}"
        );
    }
}

/// Flags that change nothing in the plan are warned about: pipeline parallelism in inference
/// (every GPU holds the whole model, as ZeRO there), selective checkpointing where no
/// attention saves scores, `--hold-outputs` without a language-model head, and an optimizer
/// implementation for bitsandbytes' 8-bit Adam.
#[test]
fn flags_without_effect_are_warned_about() {
    let cases: [(&[&str], &str); 7] = [
        (
            &[
                "--model", "gpt2", "--mode", "infer", "--gpus", "2", "--pp", "2",
            ],
            "--pp",
        ),
        (
            &[
                "--model", "gpt2", "--mode", "generate", "--gpus", "2", "--pp", "2",
            ],
            "--pp",
        ),
        (
            &["--model", "vit-b-16", "--grad-ckpt-selective"],
            "--grad-ckpt-selective",
        ),
        (
            &["--model", "dit-xl-2-256", "--grad-ckpt-selective"],
            "--grad-ckpt-selective",
        ),
        (&["--model", "resnet50", "--hold-outputs"], "--hold-outputs"),
        (&["--model", "vit-base", "--hold-outputs"], "--hold-outputs"),
        (
            &[
                "--model",
                "gpt2",
                "--optimizer",
                "adam8bit",
                "--optimizer-impl",
                "fused",
            ],
            "--optimizer-impl",
        ),
    ];
    for (args, flag) in cases {
        assert!(ignores(&warnings(args), flag), "{args:?}");
    }
    // Where they do change the plan, no warning.
    let effective: [(&[&str], &str); 3] = [
        (
            &[
                "--model",
                "gpt2",
                "--attn",
                "eager",
                "--grad-ckpt-selective",
            ],
            "--grad-ckpt-selective",
        ),
        (&["--model", "gpt2", "--hold-outputs"], "--hold-outputs"),
        (
            &["--model", "gpt2", "--optimizer-impl", "fused"],
            "--optimizer-impl",
        ),
    ];
    for (args, flag) in effective {
        assert!(!ignores(&warnings(args), flag), "{args:?}");
    }
}
