//! gpumem-plan: predict the peak GPU memory of deep-learning training and inference before
//! running, find the batch size that fits, and say what to change.
//!
//! Pure functions over plain data: a [`ModelSpec`] (from the embedded catalogue or a Hugging
//! Face `config.json`), a [`Workload`], and [`Overheads`] give an [`Estimate`] whose peak is found
//! by replaying one step phase by phase. [`fit()`] and [`advise`] search over the estimator.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod advice;
pub mod catalogue;
pub mod checks;
pub mod diffusion;
pub mod distributed;
mod dtype;
pub mod error;
pub mod estimate;
pub mod fit;
pub mod gpu;
mod graph;
pub mod hf;
pub mod limits;
pub mod lora;
mod lora_targets;
pub mod model;
pub mod names;
pub mod quant;
mod quantity;
mod releases;
pub mod safetensors;
pub mod sequence;
pub mod serving;
pub mod settings;
mod single_gpu;
mod states;
mod unit;
pub mod warning;
pub mod workload;

pub use advice::{advise, combine_until_fits, Estimated, PeakMeasure, Suggestion};
pub use catalogue::{find_model, load_config, model_names};
pub use checks::check;
pub use error::{PlanError, Result};
pub use estimate::{estimate, Breakdown, Estimate, KvCacheKind, Overheads, Phase, PhasePeak};
pub use fit::{fewest_gpus, fit, Fit, FitTarget};
pub use gpu::{column_sum_staging, column_sum_staging_bytes, find_gpu, Cores, Gpu};
pub use hf::parse_config;
pub use model::{Architecture, ModelSpec, ParamCounts, ResnetSpec, TransformerSpec};
pub use quant::{CheckpointQuant, GptqKernel, QuantFormat, Quantization};
pub use sequence::{
    allocation_sequence, planned_run, startup_sequence, PlannedEvent, PlannedRun, Stream,
};
pub use serving::{serving_profile, Engine, ServeSettings, ServingProfile};
pub use settings::{Resolved, Settings};
pub use warning::Warning;
pub use workload::{
    Attention, BaseQuant, Checkpointing, Dtype, FsdpSharding, Layout, Lora, Loss, Mode, Offload,
    Optimizer, OptimizerImpl, Sharding, Target, Workload,
};
