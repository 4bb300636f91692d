//! `gpumem tune` as a user runs it: the table with export lines, the JSON contract, the best
//! setting's figures equal to `gpumem replay` with its conf string, and clear errors for bad
//! input (a trace with nothing to tune, a capacity below the peak live bytes, bad flags).

mod common;

use common::{gpumem, json_of, testdata};

const SMALL: &str = "small-gpt2-2l-infer-b1-s32.jsonl.gz";

#[test]
fn the_table_shows_ranked_settings_with_export_lines() {
    let out = gpumem(&["tune", &testdata(SMALL), "--capacity", "80MiB"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "Objective: reserved",
        "fits 80.00 MiB",
        "export PYTORCH_CUDA_ALLOC_CONF='expandable_segments:",
        "(PyTorch's defaults)",
        "GPUMEM_POOL=gpumem",
        "garbage_collection_threshold",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
    let ranked = text.lines().filter(|l| l.starts_with("1 ")).count();
    assert_eq!(ranked, 1, "{text}");
}

#[test]
fn the_best_setting_replays_to_the_same_figures() {
    let trace = testdata(SMALL);
    let out = json_of(&gpumem(&[
        "tune",
        &trace,
        "--json",
        "--objective",
        "fit",
        "--capacity",
        "72MiB",
        "--top",
        "2",
    ]));
    let tune = &out["tune"];
    assert_eq!(tune["objective"], "fit");
    assert_eq!(out["trace"]["events"], 366);
    let ranked = tune["ranked"].as_array().unwrap();
    assert_eq!(ranked.len(), 2);
    for key in ["pytorch_default", "gpumem", "space", "replays", "seconds"] {
        assert!(tune.get(key).is_some(), "{key} missing in {tune}");
    }
    let best = &ranked[0];
    let conf = best["conf"].as_str().unwrap();
    assert_eq!(
        best["export"].as_str().unwrap(),
        format!("export PYTORCH_CUDA_ALLOC_CONF='{conf}'")
    );
    let policy = best["report"]["policy"].as_str().unwrap();
    let plain = json_of(&gpumem(&[
        "replay",
        &trace,
        "--json",
        "--policy",
        policy,
        "--capacity",
        "72MiB",
        "--smallest-capacity",
        "--pytorch-alloc-conf",
        conf,
    ]));
    let mut plain = plain["policies"][0].clone();
    let mut tuned = best["report"].clone();
    for report in [&mut plain, &mut tuned] {
        report["events_per_second"] = serde_json::Value::Null;
    }
    assert_eq!(plain, tuned);
    let margin = best["margin_bytes"].as_i64().unwrap();
    let smallest = tuned["smallest_capacity_bytes"].as_i64().unwrap();
    assert_eq!(margin, (72 << 20) - smallest);
}

#[test]
fn bad_input_is_a_clear_error() {
    let trace = testdata(SMALL);
    for (args, needles) in [
        (
            vec!["tune", trace.as_str(), "--capacity", "50MiB"],
            vec!["50.00 MiB (52428800 bytes)", "peak live bytes 62.27 MiB"],
        ),
        (
            vec!["tune", trace.as_str(), "--objective", "speed"],
            vec!["one of reserved, fit, calls"],
        ),
        (vec!["tune", trace.as_str(), "--top", "0"], vec!["0"]),
        (
            vec!["tune", "/nonexistent/trace.jsonl"],
            vec!["/nonexistent/trace.jsonl"],
        ),
    ] {
        let out = gpumem(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        for needle in needles {
            assert!(stderr.contains(needle), "{args:?}: {stderr}");
        }
    }
    let dir = std::env::temp_dir().join(format!("gpumem-tune-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("steps-only.jsonl");
    std::fs::write(
        &empty,
        "{\"gpumem_trace\": 1, \"name\": \"empty\"}\n{\"op\":\"step\",\"index\":0}\n",
    )
    .unwrap();
    let out = gpumem(&["tune", empty.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("allocates nothing"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
