//! Typed errors of the planner: every bad input names what is accepted and the nearest names.

use thiserror::Error;

/// Everything that can go wrong while planning. Never a panic: callers print these to users.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlanError {
    /// A name (model, GPU, optimizer, ...) that is not in the accepted list.
    #[error("unknown {kind} `{given}`{}; accepted: {}", suggestion(nearest), accepted.join(", "))]
    UnknownName {
        /// What was being looked up ("model", "GPU", "optimizer", ...).
        kind: &'static str,
        /// The name as given.
        given: String,
        /// Accepted names closest to `given`, best first.
        nearest: Vec<String>,
        /// Every accepted name.
        accepted: Vec<String>,
    },
    /// A config.json whose `model_type` the planner does not model.
    #[error("unsupported model_type `{given}`{}; supported: {}", suggestion(nearest), accepted.join(", "))]
    UnsupportedModelType {
        /// The `model_type` found in the config.
        given: String,
        /// Supported model types closest to `given`.
        nearest: Vec<String>,
        /// Every supported model type.
        accepted: Vec<String>,
    },
    /// A config.json that lacks a field the architecture needs.
    #[error("config for model_type `{model_type}` is missing `{field}` (accepted spellings: {})", spellings.join(" / "))]
    MissingField {
        /// The architecture being parsed.
        model_type: String,
        /// The field, by its canonical name.
        field: &'static str,
        /// Names the field may have in config.json.
        spellings: Vec<&'static str>,
    },
    /// A field or setting with a value outside its valid range.
    #[error("invalid {name} = {value}: {reason}")]
    InvalidValue {
        /// The setting or field.
        name: String,
        /// The value as given.
        value: String,
        /// Why it is rejected and what is accepted.
        reason: String,
    },
    /// Two settings that no real run can combine.
    #[error("{first} cannot be combined with {second}: {reason}")]
    Conflict {
        /// The first setting, as a flag (`--zero 2`).
        first: String,
        /// The setting it conflicts with (`--fsdp`).
        second: String,
        /// Why, and what to keep instead.
        reason: String,
    },
    /// A file that cannot be read or is not the expected format.
    #[error("cannot read {path}: {reason}")]
    Unreadable {
        /// The file.
        path: String,
        /// The reason.
        reason: String,
    },
    /// An error in a config file, with the file it is in.
    #[error("{path}: {error}")]
    InConfig {
        /// The config file.
        path: String,
        /// What is wrong in it.
        error: Box<PlanError>,
    },
    /// A fit search for which not even the smallest value fits.
    #[error("nothing fits: {what} = {smallest} already needs {needed_gib:.2} GiB of {usable_gib:.2} GiB usable (after margin)")]
    NothingFits {
        /// The searched quantity ("batch" or "seq").
        what: &'static str,
        /// The smallest value tried.
        smallest: u64,
        /// Memory that value needs, GiB.
        needed_gib: f64,
        /// Memory available, GiB.
        usable_gib: f64,
    },
}

fn suggestion(nearest: &[String]) -> String {
    if nearest.is_empty() {
        String::new()
    } else {
        format!(" (did you mean {}?)", nearest.join(", "))
    }
}

/// Result alias for planner functions.
pub type Result<T> = std::result::Result<T, PlanError>;
