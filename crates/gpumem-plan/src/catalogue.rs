//! Embedded catalogue of well-known models, stored as their Hugging Face config facts
//! (`data/models.json`) and read with the same parser as user configs.

use crate::error::{PlanError, Result};
use crate::hf::spec_from_json;
use crate::model::ModelSpec;
use crate::names::{nearest, normalise};
use serde_json::Value;
use std::io::Read;
use std::sync::OnceLock;

const CATALOGUE_JSON: &str = include_str!("../data/models.json");

struct Catalogue {
    models: serde_json::Map<String, Value>,
    aliases: serde_json::Map<String, Value>,
}

fn catalogue() -> &'static Catalogue {
    static CATALOGUE: OnceLock<Catalogue> = OnceLock::new();
    CATALOGUE.get_or_init(|| {
        // The embedded file is checked by the `catalogue_parses` test; an empty map is the fallback.
        let json: Value = serde_json::from_str(CATALOGUE_JSON).unwrap_or_default();
        let section = |key: &str| {
            json.get(key)
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default()
        };
        Catalogue {
            models: section("models"),
            aliases: section("aliases"),
        }
    })
}

/// Names of all catalogue models (aliases excluded), sorted.
pub fn model_names() -> Vec<&'static str> {
    catalogue().models.keys().map(String::as_str).collect()
}

/// Words of a Hugging Face id that name a fine-tuned variant of a base model (instruct, chat,
/// the `-hf` conversions, base/pretrained tags): the variant has the base's architecture.
const VARIANT_WORDS: [&str; 6] = ["instruct", "chat", "it", "hf", "base", "pt"];

/// `key` without its variant words and release dates (`qwen3-4b-instruct-2507` →
/// `qwen3-4b`): the id of the base model an instruct or chat variant was tuned from. Version
/// words (`v0.3`) stay: versions can change the architecture (Mistral 7B v0.3's vocabulary).
fn base_variant(key: &str) -> String {
    let (org, name) = key.rsplit_once('/').map_or(("", key), |(o, n)| (o, n));
    let kept: Vec<&str> = name
        .split('-')
        .filter(|word| {
            let date = word.len() == 4 && word.bytes().all(|b| b.is_ascii_digit());
            !date && !VARIANT_WORDS.contains(word)
        })
        .collect();
    match org {
        "" => kept.join("-"),
        _ => format!("{org}/{}", kept.join("-")),
    }
}

/// The catalogue name `key` resolves to: a name, an alias, or either after
/// [`base_variant`] (with and without the organisation).
fn canonical_name<'c>(cat: &'c Catalogue, key: &str) -> Option<&'c str> {
    let base = base_variant(key);
    let bare = base.rsplit_once('/').map_or(base.as_str(), |(_, n)| n);
    let found = [key, base.as_str(), bare].into_iter().find_map(|k| {
        cat.aliases
            .get(k)
            .and_then(Value::as_str)
            .or_else(|| cat.models.get_key_value(k).map(|(name, _)| name.as_str()))
    });
    found
}

/// Looks a model up by catalogue name, alias or Hugging Face id (case-insensitive); an instruct
/// or chat variant's id resolves to its base model.
pub fn find_model(name: &str) -> Result<ModelSpec> {
    let cat = catalogue();
    let key = normalise(name);
    let canonical = canonical_name(cat, &key).unwrap_or(&key);
    let config = cat.models.get(canonical).ok_or_else(|| {
        // Suggest from names and aliases; list only the canonical names.
        let all = cat
            .models
            .keys()
            .map(String::as_str)
            .chain(cat.aliases.keys().map(String::as_str));
        PlanError::UnknownName {
            kind: "model",
            given: name.to_string(),
            nearest: nearest(name, all),
            accepted: model_names().iter().map(|n| n.to_string()).collect(),
        }
    })?;
    spec_from_json(canonical, config)
}

/// Largest config file read (64 MiB): a config.json is a few kB, one with a 22,000-class
/// `id2label` under a MB; the bound keeps a wrong path (a device, a weights file) from being
/// read whole into memory.
const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// Reads a model from a config file: a Hugging Face `config.json` or the ResNet form
/// `{"model_type": "resnet", "depth": 50, "num_classes": 1000}`. An error in its content is a
/// [`PlanError::InConfig`] naming the file.
pub fn load_config(path: &std::path::Path) -> Result<ModelSpec> {
    let name = path.display().to_string();
    let unreadable = |reason: String| PlanError::Unreadable {
        path: name.clone(),
        reason,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| unreadable(e.to_string()))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(unreadable(format!(
            "larger than {} MiB: not a config.json",
            MAX_CONFIG_BYTES >> 20
        )));
    }
    crate::hf::parse_config(&name, &text).map_err(|error| match error {
        PlanError::Unreadable { .. } => error,
        error => PlanError::InConfig {
            path: name.clone(),
            error: Box::new(error),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_parses() {
        assert!(model_names().len() >= 50);
        for name in model_names() {
            assert!(find_model(name).is_ok(), "{name}");
        }
        for alias in catalogue().aliases.keys() {
            assert!(find_model(alias).is_ok(), "{alias}");
        }
    }

    #[test]
    fn variants_resolve_to_their_base_model() {
        for (variant, base) in [
            ("mistralai/Mixtral-8x22B-Instruct-v0.1", "mixtral-8x22b"),
            ("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b-v0.3"),
            ("mistralai/Mistral-7B-Instruct-v0.2", "mistral-7b"),
            ("Qwen/Qwen3-4B-Instruct-2507", "qwen3-4b"),
            ("Qwen/Qwen3-14B-Base", "qwen3-14b"),
            ("google/gemma-2-2b-it", "gemma-2-2b"),
            ("google/gemma-3-27b-it", "gemma-3-27b"),
            ("microsoft/Phi-3-mini-4k-instruct", "phi-3-mini-4k"),
            ("meta-llama/Llama-3.2-3B-Instruct", "llama-3.2-3b"),
        ] {
            assert_eq!(find_model(variant).unwrap().name, base, "{variant}");
        }
        // No base of that name: the error lists what is accepted.
        assert!(find_model("google/gemma-3n-e4b-it").is_err());
    }
}
