//! Warnings: settings a real run would accept but that are probably not what was meant. The plan
//! is still computed; each warning travels with it (in [`crate::Estimate`] and
//! [`crate::settings::Resolved`]) and says why it may mislead.

use crate::workload::{choices, Dtype, Sharding};
use serde::ser::{Serialize, SerializeStruct, Serializer};
use std::fmt;

/// One thing the plan was given that a run would do, but probably not as meant.
#[derive(Debug, Clone, PartialEq)]
pub enum Warning {
    /// A flag that the mode or the model ignores.
    Ignored {
        /// The flag, as typed (`--optimizer`).
        flag: &'static str,
        /// Why it has no effect.
        reason: String,
    },
    /// ZeRO or FSDP over a single data-parallel rank: nothing is divided, so nothing is saved.
    ShardingOverOneRank {
        /// The sharding asked for.
        sharding: Sharding,
    },
    /// Autocast to one 16-bit type over weights stored in the other.
    MixedHalfTypes {
        /// The weight dtype.
        dtype: Dtype,
        /// The autocast dtype.
        amp: Dtype,
    },
    /// More tokens than the positions a rotary model was trained for.
    PastTrainedPositions {
        /// Tokens one sequence reaches (prompt plus new tokens when generating).
        tokens: u64,
        /// The model's `max_position_embeddings`.
        positions: u64,
    },
    /// A default lowered to what the model can run: the default sequence is longer than the
    /// model's learned positions (Whisper's decoder has 448, CLIP's text tower 77).
    DefaultLowered {
        /// The flag whose default was lowered (`--seq`).
        flag: &'static str,
        /// The default.
        default: u64,
        /// The value planned.
        planned: u64,
        /// Why the default cannot run.
        reason: String,
    },
    /// The run fits the GPU only because PyTorch's allocator frees its cached blocks and
    /// retries when the device runs out (`num_alloc_retries`): each time a device-wide
    /// synchronisation and fresh `cudaMalloc`s, a slower step.
    CacheFlushes {
        /// Times the allocator emptied its cache over the planned two steps.
        retries: u64,
        /// The GPU planned for.
        gpu: String,
    },
}

impl Warning {
    /// A stable snake_case name of the kind, for JSON consumers.
    pub fn kind(&self) -> &'static str {
        match self {
            Warning::Ignored { .. } => "ignored",
            Warning::ShardingOverOneRank { .. } => "sharding_over_one_rank",
            Warning::MixedHalfTypes { .. } => "mixed_half_types",
            Warning::PastTrainedPositions { .. } => "past_trained_positions",
            Warning::DefaultLowered { .. } => "default_lowered",
            Warning::CacheFlushes { .. } => "cache_flushes",
        }
    }
}

/// The name a choice table gives `value` (every value in the tables has one).
fn name_of<T: PartialEq>(table: &[(&'static str, T)], value: T) -> &'static str {
    choices::name(table, value).unwrap_or("?")
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::Ignored { flag, reason } => write!(f, "{flag} has no effect: {reason}"),
            Warning::ShardingOverOneRank { sharding } => write!(
                f,
                "{} shards model states over the data-parallel ranks, and this layout has one \
                 (gpus / (tp × pp) = 1): it saves no memory; add GPUs, or --offload",
                sharding.flag()
            ),
            Warning::MixedHalfTypes { dtype, amp } => {
                let (dtype, amp) = (
                    name_of(choices::DTYPES, *dtype),
                    name_of(choices::DTYPES, *amp),
                );
                write!(
                    f,
                    "--amp {amp} with --dtype {dtype}: autocast casts every {dtype} weight to \
                     {amp} for each matmul, a second 16-bit format with a different range; use \
                     --amp {dtype}, or --dtype fp32 --amp {amp}"
                )
            }
            Warning::PastTrainedPositions { tokens, positions } => write!(
                f,
                "{tokens} tokens per sequence exceed the {positions} positions the model was \
                 trained for (max_position_embeddings): rotary attention runs, but quality \
                 degrades without RoPE scaling"
            ),
            Warning::DefaultLowered {
                flag,
                default,
                planned,
                reason,
            } => write!(
                f,
                "{flag} not given: planned with {planned} instead of the default {default}, \
                 because {reason}; give {flag} to choose"
            ),
            Warning::CacheFlushes { retries, gpu } => write!(
                f,
                "fits the {gpu} only because PyTorch's allocator empties its cache to retry \
                 allocations that find the device full ({retries} in the two planned steps, \
                 num_alloc_retries): each empties the cache with a device-wide \
                 synchronisation, so steps run slower; a smaller batch or sequence keeps it"
            ),
        }
    }
}

/// JSON form: `{"kind": "...", "message": "..."}`, the message as printed.
impl Serialize for Warning {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("Warning", 2)?;
        s.serialize_field("kind", self.kind())?;
        s.serialize_field("message", &self.to_string())?;
        s.end()
    }
}
