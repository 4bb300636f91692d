//! Embedded catalogue of well-known models, stored as their Hugging Face config facts
//! (`data/models.json`) and read with the same parser as user configs.

use crate::error::{PlanError, Result};
use crate::hf::spec_from_json;
use crate::model::ModelSpec;
use crate::names::{nearest, normalise};
use serde_json::Value;
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

/// Looks a model up by catalogue name, alias or Hugging Face id (case-insensitive).
pub fn find_model(name: &str) -> Result<ModelSpec> {
    let cat = catalogue();
    let key = normalise(name);
    let canonical = cat
        .aliases
        .get(&key)
        .and_then(Value::as_str)
        .unwrap_or(&key);
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

/// Reads a model from a config file: a Hugging Face `config.json` or the ResNet form
/// `{"model_type": "resnet", "depth": 50, "num_classes": 1000}`.
pub fn load_config(path: &std::path::Path) -> Result<ModelSpec> {
    let text = std::fs::read_to_string(path).map_err(|e| PlanError::Unreadable {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    crate::hf::parse_config(&path.display().to_string(), &text)
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
}
