//! The JSON schema of the reports (`gpumem plan/replay/tune/selftest/policies --json` and the
//! Python package's results) is pinned: each report type, filled as fully as its options
//! allow, is reduced to its shape — field names and JSON types, nested — and compared with
//! `testdata/schema/reports.json`. A change to a report's fields fails here until that file
//! is regenerated (`GPUMEM_UPDATE_SCHEMA=1 cargo test -p gpumem-replay --test report_schema`),
//! so it is deliberate; python/tests/test_results.py checks the Python dataclasses against
//! the same file.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpumem_device::sim::{SimConfig, SimDevice};
use gpumem_pool::PolicyKind;
use gpumem_replay::plan::{plan, PlanRequest};
use gpumem_replay::selftest::{selftest_policies, BUNDLED_TRACE};
use gpumem_replay::tune::{tune, Objective, TuneOptions};
use gpumem_replay::{replay_report, PolicyInfo, RanksReport, ReplayOptions, TraceInfo, TuneResult};
use gpumem_trace::{read, ReadOptions, Trace};
use serde_json::{json, Value};

/// The schema file, relative to the repository.
const SCHEMA: &str = "testdata/schema/reports.json";

fn repo(path: &str) -> String {
    format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"))
}

/// A JSON value's shape: objects keep their keys, arrays the merged shape of their items,
/// scalars their type's name.
fn shape(value: &Value) -> Value {
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(key, field)| (key.clone(), shape(field)))
                .collect(),
        ),
        Value::Array(items) => {
            let merged = items.iter().map(shape).reduce(|a, b| merge(&a, &b));
            Value::Array(merged.into_iter().collect())
        }
        Value::Null => json!("null"),
        Value::Bool(_) => json!("boolean"),
        Value::Number(n) if n.is_f64() => json!("number"),
        Value::Number(_) => json!("integer"),
        Value::String(_) => json!("string"),
    }
}

/// Two shapes of the same field as one: objects by key (a key one lacks is `absent` there),
/// arrays by item, scalars as the union of their type names (`integer|null`; an integer and
/// a number are a number); an object that may be absent or null keeps its fields and says so
/// under the key `?`.
fn merge(a: &Value, b: &Value) -> Value {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            Value::Object(
                keys.into_iter()
                    .map(|k| {
                        let absent = json!("absent");
                        let (p, q) = (x.get(k).unwrap_or(&absent), y.get(k).unwrap_or(&absent));
                        (k.clone(), merge(p, q))
                    })
                    .collect(),
            )
        }
        // An optional object or array: its shape, marked with what it may be instead.
        (Value::String(name), Value::Object(_) | Value::Array(_))
        | (Value::Object(_) | Value::Array(_), Value::String(name)) => {
            let structure = if a.is_string() { b } else { a };
            let mut marked = match structure {
                Value::Object(fields) => fields.clone(),
                other => [("items".to_string(), other.clone())].into_iter().collect(),
            };
            let previous = marked.remove("?").unwrap_or(json!(name));
            marked.insert("?".into(), merge(&previous, &json!(name)));
            Value::Object(marked)
        }
        (Value::Array(x), Value::Array(y)) => match (x.first(), y.first()) {
            (Some(p), Some(q)) => json!([merge(p, q)]),
            (p, q) => Value::Array(p.or(q).cloned().into_iter().collect()),
        },
        (Value::String(_), Value::String(_)) | (Value::String(_), _) | (_, Value::String(_)) => {
            let mut names: Vec<String> = [a, b]
                .iter()
                .flat_map(|v| match v {
                    Value::String(s) => s.split('|').map(str::to_string).collect(),
                    other => vec![type_of(other)],
                })
                .collect();
            if names.iter().any(|n| n == "number") {
                names.retain(|n| n != "integer");
            }
            names.sort();
            names.dedup();
            json!(names.join("|"))
        }
        _ => a.clone(),
    }
}

/// A shape that is an object or array, where a scalar's shape was expected.
fn type_of(value: &Value) -> String {
    match value {
        Value::Object(_) => "object".into(),
        Value::Array(_) => "array".into(),
        other => other.to_string(),
    }
}

/// The merged shape of several filled instances of one report.
fn shape_of(examples: &[Value]) -> Value {
    examples
        .iter()
        .map(shape)
        .reduce(|a, b| merge(&a, &b))
        .unwrap_or(Value::Null)
}

fn plan_json(request: Value) -> Value {
    let request = PlanRequest::from_json(&request.to_string()).unwrap();
    serde_json::to_value(plan(&request).unwrap()).unwrap()
}

fn small_trace() -> Trace {
    read(BUNDLED_TRACE, ReadOptions::default()).unwrap()
}

/// A trace recorded mid-process: the small snapshot with its first half cut off, so the
/// replay begins from the segments held then.
fn mid_process_trace() -> Trace {
    let bytes = std::fs::read(repo(
        "testdata/traces/small-gpt2-2l-infer-b1-s32.snapshot.p4.pickle",
    ))
    .unwrap();
    let mut snapshot = gpumem_trace::snapshot::read(bytes.as_slice()).unwrap();
    let half = snapshot.device_traces[0].len() / 2;
    snapshot.device_traces[0].drain(..half);
    gpumem_trace::snapshot::to_trace(&snapshot, None).unwrap()
}

/// Every report, filled as fully as its options allow, by name.
fn reports() -> BTreeMap<&'static str, Value> {
    let mut reports = BTreeMap::new();
    reports.insert(
        "plan",
        shape_of(&[
            plan_json(json!({"model": "gpt2", "gpu": "rtx-4090", "batch": 4})),
            plan_json(
                json!({"model": "llama-3.2-3b", "grad_ckpt": true, "gpu": "h100",
                "fit": "batch", "global_batch": 64, "min_gpus": true}),
            ),
            plan_json(json!({"model": "llama-3-8b", "gpu": "8GiB", "fit": "batch",
                "min_gpus": true, "reserved": "estimate"})),
            plan_json(json!({"model": "gpt2", "mode": "generate", "zero": "3"})),
            plan_json(
                json!({"model": "llama-3-8b", "engine": "vllm", "gpu": "h100",
                "max_model_len": 8192}),
            ),
        ]),
    );
    let small = small_trace();
    let options = ReplayOptions {
        capacity: Some(40 << 20),
        smallest_capacity: true,
        ..ReplayOptions::default()
    };
    let replayed = replay_report(&small, &PolicyKind::ALL, &options, &mut |_| {}).unwrap();
    let mid = replay_report(
        &mid_process_trace(),
        &[PolicyKind::Torch, PolicyKind::Gpumem],
        &ReplayOptions::default(),
        &mut |_| {},
    )
    .unwrap();
    assert!(mid.policies.iter().any(|p| p.initial_state.is_some()));
    let (a, b) = (
        serde_json::to_value(&replayed).unwrap(),
        serde_json::to_value(&mid).unwrap(),
    );
    reports.insert("replay", shape_of(&[a, b]));
    reports.insert(
        "ranks",
        shape(&serde_json::to_value(RanksReport::new(Some(1 << 30), vec![replayed, mid])).unwrap()),
    );
    let tuned = tune(
        &small,
        &TuneOptions {
            objective: Objective::Fit,
            capacity: Some(64 << 20),
            top: 2,
            max_replays: Some(6),
        },
        &|_| {},
    )
    .unwrap();
    let tuned = TuneResult {
        trace: TraceInfo::of(&small),
        tune: tuned,
    };
    reports.insert("tune", shape(&serde_json::to_value(&tuned).unwrap()));
    let device = Arc::new(SimDevice::new(SimConfig::host(1 << 30)).unwrap());
    let checked =
        selftest_policies(device, &[PolicyKind::Torch], &small, 4096, &mut |_| {}).unwrap();
    reports.insert("selftest", shape(&serde_json::to_value(&checked).unwrap()));
    reports.insert(
        "policies",
        shape(&serde_json::to_value(PolicyInfo::all()).unwrap()),
    );
    reports
}

#[test]
fn the_reports_json_schema_is_the_committed_one() {
    let got = serde_json::to_string_pretty(&reports()).unwrap() + "\n";
    let path = repo(SCHEMA);
    if std::env::var_os("GPUMEM_UPDATE_SCHEMA").is_some() {
        std::fs::create_dir_all(repo("testdata/schema")).unwrap();
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        want == got,
        "the reports' JSON schema changed ({SCHEMA}); if deliberate, regenerate it with \
         GPUMEM_UPDATE_SCHEMA=1 cargo test -p gpumem-replay --test report_schema, and update \
         python/gpumem/results.py:\n{}",
        diff_lines(&want, &got).join("\n")
    );
}

/// The lines of `got` not in `want` (+) and of `want` not in `got` (−).
fn diff_lines(want: &str, got: &str) -> Vec<String> {
    let added = got
        .lines()
        .filter(|l| !want.lines().any(|w| w == *l))
        .map(|l| format!("+ {l}"));
    let removed = want
        .lines()
        .filter(|l| !got.lines().any(|g| g == *l))
        .map(|l| format!("- {l}"));
    added.chain(removed).collect()
}

#[test]
fn a_field_added_to_a_report_changes_its_shape() {
    let before = plan_json(json!({"model": "gpt2"}));
    let mut after = before.clone();
    after["new_field"] = json!(1);
    assert_ne!(shape(&before), shape(&after));
    // A field that is sometimes absent is marked so, not dropped.
    let merged = shape_of(&[before, after]);
    assert_eq!(merged["new_field"], json!("absent|integer"));
    // The estimate-only plan replays nothing.
    let estimated = plan_json(json!({"model": "gpt2", "reserved": "estimate"}));
    assert_eq!(estimated["replay"], json!([]));
    assert_eq!(estimated["reserved_by"], json!("estimate"));
}
