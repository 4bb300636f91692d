//! The planner's recipes in docs/architecture.md ("Add a model family", "Add a memory
//! mechanism"), each checked by adding a toy one the way the recipe says: the files and
//! functions a recipe names exist, a toy config of a family plans with the parameter count
//! derived by hand, and a toy buffer added through the extension points the recipe names
//! changes the peak by exactly its bytes.

use gpumem_plan::advice::MIN_SAVING_SHARE;
use gpumem_plan::hf::SUPPORTED_MODEL_TYPES;
use gpumem_plan::{
    advise, estimate, parse_config, Estimated, ModelSpec, Overheads, PeakMeasure, PlanError,
    Result, Workload,
};
use std::path::{Path, PathBuf};

/// The repository's root.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The text of the recipe `title`: from its heading to the next heading.
fn recipe(title: &str) -> String {
    let doc = std::fs::read_to_string(repo_root().join("docs/architecture.md")).unwrap();
    let heading = format!("### {title}\n");
    let start = doc
        .find(&heading)
        .unwrap_or_else(|| panic!("docs/architecture.md has no recipe \"{title}\""))
        + heading.len();
    let rest = &doc[start..];
    let end = rest.find("\n#").unwrap_or(rest.len());
    rest[..end].to_string()
}

/// The file a recipe names: relative to the planner's `src/`, the crate or the repository.
fn named_file(name: &str) -> Option<PathBuf> {
    let crate_dir = repo_root().join("crates/gpumem-plan");
    [crate_dir.join("src"), crate_dir, repo_root()]
        .into_iter()
        .map(|root| root.join(name))
        .find(|path| path.exists())
}

/// Asserts that every file `text` names in backticks exists, and that each `(item, file)`
/// of `items` is named by `text` and defined in `file`; returns how many files were named.
fn check_names(text: &str, items: &[(&str, &str)]) -> usize {
    let files: Vec<&str> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            [".rs", ".json", ".jsonl", ".py"]
                .iter()
                .any(|e| s.ends_with(e))
        })
        .collect();
    for file in &files {
        assert!(
            named_file(file).is_some(),
            "the recipe names `{file}`, which does not exist"
        );
    }
    for (item, file) in items {
        assert!(
            text.contains(&format!("`{item}`")),
            "the recipe does not name `{item}`"
        );
        let path = named_file(file).unwrap_or_else(|| panic!("no file {file}"));
        let source = std::fs::read_to_string(path).unwrap();
        let name = item.rsplit("::").next().unwrap();
        assert!(
            [
                format!("fn {name}("),
                format!("fn {name}<"),
                format!("const {name}:"),
                format!("struct {name} "),
                format!("enum {name} "),
                format!("trait {name} "),
                format!("def {name}("),
                format!("pub {name}:"),
            ]
            .iter()
            .any(|d| source.contains(d.as_str())),
            "`{item}` is not defined in {file}"
        );
    }
    files.len()
}

#[test]
fn model_family_recipe_names_what_exists() {
    let text = recipe("Add a model family");
    let named = check_names(
        &text,
        &[
            ("SUPPORTED_MODEL_TYPES", "src/hf/mod.rs"),
            ("architecture_from_json", "src/hf/mod.rs"),
            ("ConfigFields::transformer", "src/hf/fields.rs"),
            ("transformer_sizes", "src/hf/fields.rs"),
            ("default_transformer", "src/hf/fields.rs"),
            ("llama_family", "src/hf/families.rs"),
            ("dual_encoder", "src/hf/families.rs"),
            ("LLAMA_DEFAULTS", "src/hf/mod.rs"),
            ("TransformerSpec", "src/model/transformer.rs"),
            (
                "architectures_grid",
                "tools/src/gpumem_devtools/measure_peak.py",
            ),
        ],
    );
    assert!(named >= 6, "the recipe names {named} files");
}

#[test]
fn memory_mechanism_recipe_names_what_exists() {
    let text = recipe("Add a memory mechanism");
    let named = check_names(
        &text,
        &[
            ("AttentionKernel::choose", "src/graph/kernel.rs"),
            ("Unit", "src/unit.rs"),
            ("WholeTensors", "src/unit.rs"),
            ("forward_transient", "src/unit.rs"),
            ("simulate_training", "src/estimate.rs"),
            ("simulate_inference", "src/estimate.rs"),
            ("model_states", "src/states.rs"),
            ("Breakdown", "src/estimate.rs"),
            ("advise", "src/advice.rs"),
            ("allocation_sequence", "src/sequence/mod.rs"),
            ("Overheads::context_bytes", "src/estimate.rs"),
            ("PeakMeasure", "src/advice.rs"),
        ],
    );
    assert!(named >= 6, "the recipe names {named} files");
}

/// A config with a `model_type` outside `SUPPORTED_MODEL_TYPES` (step 1 of the family
/// recipe) fails with the error that lists every supported type.
#[test]
fn an_unlisted_family_is_refused_with_the_supported_types() {
    let err = parse_config("toy", r#"{"model_type": "toyformer", "hidden_size": 64}"#).unwrap_err();
    match &err {
        PlanError::UnsupportedModelType {
            given, accepted, ..
        } => {
            assert_eq!(given, "toyformer");
            assert_eq!(accepted, SUPPORTED_MODEL_TYPES);
        }
        other => panic!("expected UnsupportedModelType, got {other:?}"),
    }
    let message = err.to_string();
    for model_type in SUPPORTED_MODEL_TYPES {
        assert!(message.contains(model_type), "{message} lacks {model_type}");
    }
}

/// A toy config of an existing family with its own sizes: read through the family's function
/// over the shared sizes and defaults, it plans, with the parameter count derived by hand.
#[test]
fn a_toy_family_config_plans_with_its_hand_count() {
    let model = parse_config(
        "toy-llama",
        r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 160,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 1000, "max_position_embeddings": 128, "tie_word_embeddings": false}"#,
    )
    .unwrap();
    let counts = model.params();
    // Embeddings 1000·64; per block q and o 64·64 each, k and v 64·(2·16) each, gate, up and
    // down 3·64·160, two RMSNorm weights 2·64; the final norm 64 and an untied LM head 1000·64.
    let block = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 160 + 2 * 64;
    assert_eq!(counts.embeddings, 64_000);
    assert_eq!(counts.body, 3 * block);
    assert_eq!(counts.head, 64 + 64_000);
    assert_eq!(counts.total(), 257_472);
    let planned = estimate(&model, &Workload::default(), &Overheads::default()).unwrap();
    assert_eq!(planned.total_params, 257_472);
    assert!(planned.peak_allocated_bytes > 0);
}

/// The smallest catalogue-free model the mechanism tests plan.
fn toy_model() -> ModelSpec {
    parse_config(
        "toy-gpt2",
        r#"{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
            "n_positions": 1024, "vocab_size": 1000}"#,
    )
    .unwrap()
}

/// A toy buffer held outside the allocator through the whole step, added through
/// `Overheads::context_bytes`: the total peak rises by exactly its bytes, the tensors'
/// peaks not at all.
#[test]
fn a_toy_buffer_outside_the_allocator_adds_exactly_its_bytes() {
    const BUFFER: u64 = 123_456_789;
    let model = toy_model();
    let workload = Workload::default();
    let base = Overheads::default();
    let with_buffer = Overheads {
        context_bytes: base.context_bytes + BUFFER,
        ..base
    };
    let before = estimate(&model, &workload, &base).unwrap();
    let after = estimate(&model, &workload, &with_buffer).unwrap();
    assert_eq!(after.peak_total_bytes, before.peak_total_bytes + BUFFER);
    assert_eq!(
        after.breakdown.framework,
        before.breakdown.framework + BUFFER
    );
    assert_eq!(after.peak_allocated_bytes, before.peak_allocated_bytes);
    assert_eq!(after.peak_reserved_bytes, before.peak_reserved_bytes);
    assert_eq!(after.phases, before.phases);
}

/// A peak measure with a toy buffer of `bytes` on top of the estimate's.
struct WithBuffer {
    /// The buffer's bytes.
    bytes: u64,
}

impl PeakMeasure for WithBuffer {
    fn peak_total(
        &self,
        model: &ModelSpec,
        workload: &Workload,
        overheads: &Overheads,
    ) -> Result<u64> {
        Ok(Estimated.peak_total(model, workload, overheads)? + self.bytes)
    }
}

/// A toy buffer tried through a `PeakMeasure` handed to `advise`: every suggestion's new peak
/// is the estimate's plus exactly the buffer, and (a buffer no change removes) saves the same;
/// the only changes left out are those below the share of the larger peak worth advising.
#[test]
fn a_toy_buffer_through_a_peak_measure_reaches_the_advice() {
    const BUFFER: u64 = 1 << 28;
    let model = toy_model();
    let workload = Workload::default();
    let overheads = Overheads::default();
    let plain = advise(&model, &workload, &overheads, None, &Estimated).unwrap();
    let buffered = advise(
        &model,
        &workload,
        &overheads,
        None,
        &WithBuffer { bytes: BUFFER },
    )
    .unwrap();
    assert!(
        !buffered.is_empty(),
        "the toy model gets no advice to compare"
    );
    let buffered_peak = Estimated.peak_total(&model, &workload, &overheads).unwrap() + BUFFER;
    for p in &plain {
        match buffered.iter().find(|b| b.change == p.change) {
            Some(b) => {
                assert_eq!(b.new_peak_total_bytes, p.new_peak_total_bytes + BUFFER);
                assert_eq!(b.saved_bytes, p.saved_bytes);
            }
            None => assert!(
                (p.saved_bytes as f64) < buffered_peak as f64 * MIN_SAVING_SHARE,
                "{} left out",
                p.change
            ),
        }
    }
    assert!(buffered
        .iter()
        .all(|b| plain.iter().any(|p| p.change == b.change)));
}
