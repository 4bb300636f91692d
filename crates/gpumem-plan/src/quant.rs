//! Quantised checkpoints for inference: how a format stores the linear weights of the blocks
//! (bitsandbytes LLM.int8 and 4-bit, GPTQ, AWQ, block-scaled FP8), read from a config's
//! `quantization_config` or from `--quant FORMAT[:OPTION,...]`, and the weight its matmul
//! dequantises while it runs. Embeddings, norms, biases and the LM head stay in the weight dtype
//! (every format leaves them out: bitsandbytes' `llm_int8_skip_modules`, GPTQ's and AWQ's
//! `modules_to_not_convert`).

use crate::dtype::{Dtype, DTYPES};
use crate::error::{PlanError, Result};
use crate::model::TransformerSpec;
use crate::names::lookup;
use serde::Serialize;
use serde_json::Value;

/// How the quantised linear weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QuantFormat {
    /// bitsandbytes LLM.int8 (`load_in_8bit`): int8 weights and one fp32 scale per output row.
    Int8,
    /// bitsandbytes 4-bit float (`load_in_4bit`'s default `bnb_4bit_quant_type`).
    Fp4,
    /// bitsandbytes 4-bit NormalFloat.
    Nf4,
    /// GPTQ: packed `bits`-bit weights, an fp16 scale and a packed zero per `group` input rows.
    Gptq,
    /// AWQ: stored as GPTQ is (packed weights, fp16 scales, packed zeros per group).
    Awq,
    /// FP8 (e4m3) weights with an fp32 inverse scale per `block` weights (DeepSeek-V3's
    /// `weight_block_size` [128, 128]); one scale per matrix without blocks.
    Fp8,
}

/// The kernel a GPTQ checkpoint's linears run (AutoGPTQ's `QuantLinear` classes, chosen by
/// transformers' `GPTQConfig(use_exllama, exllama_config={"version"})`), which decides what
/// each allocates beside the packed weights (AutoGPTQ v0.5.0, commit c70d29f).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GptqKernel {
    /// `qlinear_exllama.py`: 4-bit only; one fp16 `temp_dq` per device as large as the
    /// largest linear's weight (`autogptq_post_init`, `modeling/_utils.py` 303 and 329),
    /// into which `q4_matmul` reconstructs a weight for 8 rows or more before cuBLAS
    /// (`exllama_ext.cpp` 194-213).
    Exllama,
    /// `qlinear_exllamav2.py`: 4-bit only; one fp16 scratch per device sized by
    /// `scratch_space_fixed()` (a weight's `temp_dq` plus a forward buffer for 2048 tokens × 8
    /// sequences, lines 168-176; `modeling/_utils.py` 352-366), reconstructed into for more
    /// than 50 rows (`MAX_Q_GEMM_ROWS`, `q_gemm.cu` 118).
    Exllamav2,
    /// `qlinear_cuda_old.py`: the CUDA kernel below 128 rows (`kernel_switch_threshold`), above
    /// it the weight dequantised with torch ops (lines 231-273).
    CudaOld,
}

/// The accepted GPTQ `kernel=` names.
const KERNELS: &[(&str, GptqKernel)] = &[
    ("exllama", GptqKernel::Exllama),
    ("exllamav2", GptqKernel::Exllamav2),
    ("cuda-old", GptqKernel::CudaOld),
];

/// AutoGPTQ v0.5.0's exllamav2 forward buffer is sized for this many tokens per sequence and
/// sequences (`scratch_space_fixed(max_input_len=2048, max_batch_size=8)`), whatever runs.
const EXLLAMAV2_SCRATCH_TOKENS: u64 = 2048 * 8;

/// Rows (tokens) from which AutoGPTQ's `cuda-old` linear dequantises its weight with torch ops
/// instead of its CUDA kernel (`kernel_switch_threshold`).
const CUDA_OLD_SWITCH_ROWS: f64 = 128.0;

/// A quantised checkpoint's storage and compute settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Quantization {
    /// The format of the block linears.
    pub format: QuantFormat,
    /// bitsandbytes 4-bit: the 64-weight blocks' absmax stored as int8 with one fp32 scale per
    /// 256 of them (`bnb_4bit_use_double_quant`) instead of one fp32 each.
    pub double_quant: bool,
    /// bitsandbytes 4-bit: the dtype its matmul runs in (`bnb_4bit_compute_dtype`;
    /// transformers' default fp32): the input and the dequantised weight are cast to it.
    pub compute: Dtype,
    /// GPTQ/AWQ: bits per weight.
    pub bits: u64,
    /// GPTQ/AWQ: input rows sharing a scale and a zero; 0 = one per output column
    /// (`group_size: -1`).
    pub group: u64,
    /// FP8: weights sharing one scale (rows × columns of `weight_block_size`); 0 = one per
    /// matrix.
    pub block: u64,
    /// GPTQ: the kernel its linears run; None: a dequantised fp16 copy of a weight while its
    /// matmul runs on several tokens, and no buffers.
    pub kernel: Option<GptqKernel>,
}

/// The accepted `--quant` formats.
const FORMATS: &[(&str, QuantFormat)] = &[
    ("int8", QuantFormat::Int8),
    ("fp4", QuantFormat::Fp4),
    ("nf4", QuantFormat::Nf4),
    ("gptq", QuantFormat::Gptq),
    ("awq", QuantFormat::Awq),
    ("fp8", QuantFormat::Fp8),
];

impl QuantFormat {
    /// The format's `--quant` name.
    pub fn name(self) -> &'static str {
        FORMATS
            .iter()
            .find(|(_, format)| *format == self)
            .map_or("?", |(name, _)| name)
    }

    /// The `--quant` options the format takes, as an error lists them.
    fn options(self) -> &'static str {
        match self {
            QuantFormat::Fp4 | QuantFormat::Nf4 => "double, compute=fp32|bf16|fp16",
            QuantFormat::Gptq => {
                "bits=2|3|4|8, group=N (1 to 1048576 input rows per scale, or -1: one per \
                 column), kernel=exllama|exllamav2|cuda-old"
            }
            QuantFormat::Awq => {
                "bits=2|3|4|8, group=N (1 to 1048576 input rows per scale, or -1: one per \
                 column)"
            }
            QuantFormat::Fp8 => "block=N (1 to 1073741824 weights per scale)",
            QuantFormat::Int8 => "none",
        }
    }
}

/// The `quant_method`s of a `quantization_config` that are planned.
const METHODS: &str = "bitsandbytes, gptq, awq, fp8";

/// What a checkpoint's `quantization_config` says.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CheckpointQuant {
    /// A format the planner models.
    Known(Quantization),
    /// A `quant_method` it does not: planning inference then needs `--quant`.
    Unknown {
        /// The config's `quant_method`.
        method: String,
    },
}

impl Quantization {
    /// A format with its producers' defaults: bitsandbytes 4-bit without double quantisation
    /// computing in fp32 (`BitsAndBytesConfig`), 4-bit GPTQ/AWQ in groups of 128, FP8 in
    /// 128 × 128 blocks.
    pub fn of(format: QuantFormat) -> Self {
        Quantization {
            format,
            double_quant: false,
            compute: Dtype::Fp32,
            bits: 4,
            group: 128,
            block: 128 * 128,
            kernel: None,
        }
    }

    /// Parses `FORMAT[:OPTION,...]` (`nf4:double,compute=bf16`, `gptq:bits=8,group=64`,
    /// `gptq:bits=4,group=128,kernel=exllamav2`, `fp8:block=16384`); `none` is `Ok(None)`. An
    /// option the format has not, given twice or empty (`nf4:`, `nf4:double,,`) is a typed
    /// error naming the options the format takes.
    pub fn parse(text: &str) -> Result<Option<Self>> {
        let (name, options) = match text.split_once(':') {
            Some((name, options)) => (name.trim(), Some(options)),
            None => (text.trim(), None),
        };
        if name == "none" {
            return match options {
                None => Ok(None),
                Some(_) => Err(invalid(text, "none takes no options".into())),
            };
        }
        let mut quant = Self::of(lookup("quant", name, FORMATS)?);
        let mut given: Vec<&str> = Vec::new();
        for option in options
            .into_iter()
            .flat_map(|o| o.split(','))
            .map(str::trim)
        {
            let key = option.split_once('=').map_or(option, |(key, _)| key);
            let wrong = if option.is_empty() {
                Some("an option is empty".to_string())
            } else if given.contains(&key) {
                Some(format!("option {key} is given twice"))
            } else {
                None
            };
            if let Some(wrong) = wrong {
                return Err(invalid(
                    text,
                    format!(
                        "{wrong}; give each option of {name} once, after the colon and separated \
                         by commas: {}",
                        quant.format.options()
                    ),
                ));
            }
            given.push(key);
            quant.set(option)?;
        }
        // AutoGPTQ's exllama linears refuse other widths (`QuantLinear.__init__`).
        if let Some(kernel @ (GptqKernel::Exllama | GptqKernel::Exllamav2)) = quant.kernel {
            if quant.bits != 4 {
                let name = KERNELS
                    .iter()
                    .find(|(_, k)| *k == kernel)
                    .map_or("?", |k| k.0);
                return Err(invalid(
                    text,
                    format!("kernel={name} runs 4-bit weights only (bits=4)"),
                ));
            }
        }
        Ok(Some(quant))
    }

    /// Applies one `--quant` option, refusing those the format has not.
    fn set(&mut self, option: &str) -> Result<()> {
        let (key, value) = option.split_once('=').unwrap_or((option, ""));
        let bnb4 = matches!(self.format, QuantFormat::Fp4 | QuantFormat::Nf4);
        let grouped = matches!(self.format, QuantFormat::Gptq | QuantFormat::Awq);
        let number = |limit: u64| -> Result<u64> {
            value
                .parse::<u64>()
                .ok()
                .filter(|n| (1..=limit).contains(n))
                .ok_or_else(|| {
                    invalid(
                        option,
                        format!(
                            "{key} takes a number from 1 to {limit}; accepted options of {}: {}",
                            self.format.name(),
                            self.format.options()
                        ),
                    )
                })
        };
        match key {
            "double" if bnb4 && value.is_empty() => self.double_quant = true,
            "compute" if bnb4 => self.compute = lookup("quant compute", value, DTYPES)?,
            "bits" if grouped => {
                self.bits = number(8)?;
                if !matches!(self.bits, 2 | 3 | 4 | 8) {
                    return Err(invalid(option, "bits must be 2, 3, 4 or 8".into()));
                }
            }
            // GPTQ's and AWQ's `group_size: -1`: one scale per output column.
            "group" if grouped && value == "-1" => self.group = 0,
            "group" if grouped => self.group = number(1 << 20)?,
            "kernel" if self.format == QuantFormat::Gptq => {
                self.kernel = Some(lookup("quant kernel", value, KERNELS)?)
            }
            "block" if self.format == QuantFormat::Fp8 => self.block = number(1 << 30)?,
            _ => {
                return Err(invalid(
                    option,
                    format!(
                        "not an option of {}; accepted: {}",
                        self.format.name(),
                        self.format.options()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Stored bytes per quantised weight, scales and zeros included (rows of 4096 inputs for
    /// the per-row and per-column terms).
    pub fn bytes_per_weight(&self) -> f64 {
        const ROW: f64 = 4096.0;
        let per = |n: u64| if n == 0 { ROW } else { n as f64 };
        let packed = self.packed_bytes_per_weight();
        match self.format {
            // `SCB`: one fp32 absmax per output row.
            QuantFormat::Int8 => packed + 4.0 / ROW,
            QuantFormat::Fp4 | QuantFormat::Nf4 if self.double_quant => {
                packed + 1.0 / 64.0 + 4.0 / (64.0 * 256.0)
            }
            QuantFormat::Fp4 | QuantFormat::Nf4 => packed + 4.0 / 64.0,
            // `qweight`, then an fp16 scale and a `bits`-wide zero per group and column.
            QuantFormat::Gptq | QuantFormat::Awq => packed + (2.0 + packed) / per(self.group),
            QuantFormat::Fp8 => packed + 4.0 / per(self.block),
        }
    }

    /// Bytes per quantised weight of the packed data alone, without scales, zeros or absmax:
    /// what FSDP flattens and ZeRO-3 partitions of a bitsandbytes base (its statistics are
    /// attributes, not parameters).
    pub fn packed_bytes_per_weight(&self) -> f64 {
        match self.format {
            QuantFormat::Int8 | QuantFormat::Fp8 => 1.0,
            QuantFormat::Fp4 | QuantFormat::Nf4 => 0.5,
            QuantFormat::Gptq | QuantFormat::Awq => self.bits as f64 / 8.0,
        }
    }

    /// Bytes a quantised linear of `elements` weights allocates beside its packed weight while
    /// it runs on `tokens` tokens, its storage dtype `dtype`:
    /// * bitsandbytes 4-bit dequantises the whole weight into `dtype` (`dequantize_4bit`, after
    ///   the absmax when double-quantised) and casts it to the compute dtype, unless one token
    ///   runs the `gemv_4bit` kernel on the packed weight;
    /// * LLM.int8 transforms the row-major int8 weight into the tensor-core layout on its first
    ///   forward (the row-major copy is freed after it);
    /// * GPTQ/AWQ kernels dequantise to fp16 for more than one token; AutoGPTQ's exllama
    ///   kernels reconstruct into their persistent buffer instead ([`Self::kernel_buffer_bytes`]),
    ///   and its `cuda-old` linear, from 128 tokens, shifts the packed weight out into an int32
    ///   tensor of one element per weight and casts that to int8 (int16 for 8 bits) before the
    ///   fp16 product: the shift and its cast are its largest moment (`qlinear_cuda_old.py`
    ///   244-245; the 3-bit path is planned as the 4-bit one);
    /// * FP8 quantises the activations only (a small share).
    pub fn dequantised_bytes(&self, elements: f64, tokens: f64, dtype: Dtype) -> f64 {
        let several = tokens > 1.0;
        match (self.format, self.kernel) {
            (QuantFormat::Gptq, Some(GptqKernel::Exllama | GptqKernel::Exllamav2)) => return 0.0,
            (QuantFormat::Gptq, Some(GptqKernel::CudaOld)) => {
                let cast = if self.bits == 8 { 2.0 } else { 1.0 };
                return if tokens >= CUDA_OLD_SWITCH_ROWS {
                    elements * (4.0 + cast)
                } else {
                    0.0
                };
            }
            _ => {}
        }
        match self.format {
            QuantFormat::Fp4 | QuantFormat::Nf4 if several => {
                let cast = if self.compute == dtype {
                    0.0
                } else {
                    self.compute.bytes() as f64
                };
                let absmax = if self.double_quant { 4.0 / 64.0 } else { 0.0 };
                elements * (dtype.bytes() as f64 + cast + absmax)
            }
            QuantFormat::Int8 => elements,
            QuantFormat::Gptq | QuantFormat::Awq if several => 2.0 * elements,
            _ => 0.0,
        }
    }

    /// Bytes a GPTQ kernel allocates once per device when the model is loaded (AutoGPTQ's
    /// `autogptq_post_init`), sized by the largest linear of `spec`'s blocks (inputs × outputs):
    /// exllama's fp16 `temp_dq` of one weight; exllamav2's scratch of one weight (+128 bytes)
    /// and an fp32 forward buffer of its outputs for 2048 × 8 tokens (+128 bytes). Nothing for
    /// other formats and kernels.
    pub fn kernel_buffer_bytes(&self, spec: &TransformerSpec) -> f64 {
        if self.format != QuantFormat::Gptq {
            return 0.0;
        }
        let largest = match self.kernel {
            Some(GptqKernel::Exllama) => spec.largest_linear(|i, o| 2 * i * o),
            Some(GptqKernel::Exllamav2) => {
                spec.largest_linear(|i, o| 2 * i * o + 128 + 4 * o * EXLLAMAV2_SCRATCH_TOKENS + 128)
            }
            Some(GptqKernel::CudaOld) | None => 0,
        };
        largest as f64
    }
}

fn invalid(option: &str, reason: String) -> PlanError {
    PlanError::InvalidValue {
        name: "quant".into(),
        value: option.to_string(),
        reason,
    }
}

/// Reads a config's `quantization_config` (None without one). Only the fields a format's
/// storage depends on are read; the rest are ignored.
pub fn from_config(json: &Value) -> Result<Option<CheckpointQuant>> {
    let config = match json.get("quantization_config") {
        None | Some(Value::Null) => return Ok(None),
        Some(config) if config.is_object() => config,
        Some(other) => return Err(wrong_type("quantization_config", other, "an object")),
    };
    // Each field read is typed: null or absent is the producer's default, another type an error.
    let field = |key: &str| config.get(key).filter(|v| !v.is_null());
    let text = |key: &str| -> Result<Option<&str>> {
        field(key)
            .map(|v| v.as_str().ok_or_else(|| config_error(key, v, "a string")))
            .transpose()
    };
    let flag = |key: &str| -> Result<bool> {
        field(key).map_or(Ok(false), |v| {
            v.as_bool()
                .ok_or_else(|| config_error(key, v, "true or false"))
        })
    };
    let number = |keys: &[&str], default: i64| -> Result<i64> {
        keys.iter()
            .find_map(|k| field(k).map(|v| (k, v)))
            .map_or(Ok(default), |(k, v)| {
                v.as_i64().ok_or_else(|| config_error(k, v, "an integer"))
            })
    };
    // Configs written before `quant_method` existed name bitsandbytes by its load flags.
    let (load_4bit, load_8bit) = (flag("load_in_4bit")?, flag("load_in_8bit")?);
    let method = text("quant_method")?.unwrap_or(if load_4bit || load_8bit {
        "bitsandbytes"
    } else {
        ""
    });
    let quant = match method.to_ascii_lowercase().as_str() {
        "bitsandbytes" if load_8bit => Quantization::of(QuantFormat::Int8),
        "bitsandbytes" if load_4bit => {
            let kind = text("bnb_4bit_quant_type")?.unwrap_or("fp4");
            let mut quant = Quantization::of(lookup(
                "quantization_config.bnb_4bit_quant_type",
                kind,
                &FORMATS[1..3],
            )?);
            quant.double_quant = flag("bnb_4bit_use_double_quant")?;
            if let Some(compute) = text("bnb_4bit_compute_dtype")? {
                quant.compute = lookup(
                    "quantization_config.bnb_4bit_compute_dtype",
                    compute,
                    DTYPES,
                )?;
            }
            quant
        }
        "gptq" | "awq" => {
            let format = if method.eq_ignore_ascii_case("gptq") {
                QuantFormat::Gptq
            } else {
                QuantFormat::Awq
            };
            let mut quant = Quantization::of(format);
            let bits = number(&["bits", "w_bit"], 4)?;
            quant.bits = u64::try_from(bits)
                .ok()
                .filter(|b| matches!(b, 2 | 3 | 4 | 8))
                .ok_or_else(|| PlanError::InvalidValue {
                    name: "quantization_config.bits".into(),
                    value: bits.to_string(),
                    reason: "must be 2, 3, 4 or 8".into(),
                })?;
            // -1 is how GPTQ configs write one scale per column.
            let group = number(&["group_size", "q_group_size"], 128)?;
            quant.group = match group {
                -1 => 0,
                1..=MAX_GROUP => group as u64,
                _ => {
                    return Err(PlanError::InvalidValue {
                        name: "quantization_config.group_size".into(),
                        value: group.to_string(),
                        reason: format!("must be -1 (one scale per column) or 1 to {MAX_GROUP}"),
                    })
                }
            };
            quant
        }
        "fp8" => {
            let mut quant = Quantization::of(QuantFormat::Fp8);
            quant.block = fp8_block(field("weight_block_size"))?;
            quant
        }
        _ => {
            return Ok(Some(CheckpointQuant::Unknown {
                method: if method.is_empty() {
                    "(no quant_method)".into()
                } else {
                    method.to_string()
                },
            }))
        }
    };
    Ok(Some(CheckpointQuant::Known(quant)))
}

/// The largest quantisation group (weights per scale) a config may name: far above any
/// checkpoint's (GPTQ and AWQ use 32 to 1024).
const MAX_GROUP: i64 = 1 << 24;

/// The error for `quantization_config.KEY` holding `value` where `expected` belongs.
fn config_error(key: &str, value: &Value, expected: &str) -> PlanError {
    wrong_type(&format!("quantization_config.{key}"), value, expected)
}

/// The error for field `name` holding `value` where `expected` belongs.
fn wrong_type(name: &str, value: &Value, expected: &str) -> PlanError {
    PlanError::InvalidValue {
        name: name.into(),
        value: value.to_string(),
        reason: format!("must be {expected}"),
    }
}

/// Weights sharing one scale in an fp8 checkpoint: the product of `weight_block_size`'s
/// sides (rows × columns), or 0 without one (one scale per matrix).
fn fp8_block(sides: Option<&Value>) -> Result<u64> {
    let Some(value) = sides else {
        return Ok(0);
    };
    let expected = "a list of positive integers (rows, columns) whose product is at most 2^24";
    let refuse = || config_error("weight_block_size", value, expected);
    let sides = value.as_array().ok_or_else(refuse)?;
    sides
        .iter()
        .try_fold(1u64, |product, side| {
            side.as_u64()
                .filter(|&s| s > 0)
                .and_then(|s| product.checked_mul(s))
                .filter(|&p| p <= MAX_GROUP as u64)
        })
        .filter(|_| !sides.is_empty())
        .ok_or_else(refuse)
}

/// The error for inference on a checkpoint whose quantisation is not modelled.
pub fn unknown_method(model: &str, method: &str) -> PlanError {
    PlanError::InvalidValue {
        name: "quantization_config.quant_method".into(),
        value: method.to_string(),
        reason: format!(
            "{model}'s quantisation is not modelled (planned: {METHODS}); pass --quant FORMAT \
             to plan it as one of those, or --quant none for unquantised weights"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantization_config_fields_of_the_wrong_type_or_range_are_errors() {
        let read =
            |q: serde_json::Value| from_config(&serde_json::json!({ "quantization_config": q }));
        for (bad, field) in [
            (serde_json::json!("x"), "quantization_config"),
            (serde_json::json!([]), "quantization_config"),
            (
                serde_json::json!({"quant_method": "gptq", "bits": "8"}),
                "quantization_config.bits",
            ),
            (
                serde_json::json!({"quant_method": "gptq", "bits": 8.0}),
                "quantization_config.bits",
            ),
            (
                serde_json::json!({"quant_method": "gptq", "group_size": -5}),
                "quantization_config.group_size",
            ),
            (
                serde_json::json!({"quant_method": "awq", "q_group_size": 1e30}),
                "quantization_config.q_group_size",
            ),
            (
                serde_json::json!({"quant_method": "fp8", "weight_block_size": "x"}),
                "quantization_config.weight_block_size",
            ),
            (
                serde_json::json!({"quant_method": "fp8", "weight_block_size": [0, 128]}),
                "quantization_config.weight_block_size",
            ),
            (
                serde_json::json!({"quant_method": "fp8", "weight_block_size": [u64::MAX, 128]}),
                "quantization_config.weight_block_size",
            ),
            (
                serde_json::json!({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_use_double_quant": "true"}),
                "quantization_config.bnb_4bit_use_double_quant",
            ),
            (
                serde_json::json!({"load_in_4bit": "true"}),
                "quantization_config.load_in_4bit",
            ),
        ] {
            match read(bad.clone()) {
                Err(PlanError::InvalidValue { name, .. }) => assert_eq!(name, field, "{bad}"),
                other => panic!("{bad}: expected an error naming {field}, got {other:?}"),
            }
        }
        // What producers write stays accepted: null fields, -1 groups, fp8 blocks.
        assert!(read(serde_json::Value::Null).unwrap().is_none());
        for good in [
            serde_json::json!({"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": null}),
            serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128]}),
            serde_json::json!({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_compute_dtype": null}),
        ] {
            assert!(
                matches!(read(good.clone()), Ok(Some(CheckpointQuant::Known(_)))),
                "{good}"
            );
        }
    }

    #[test]
    fn parses_formats_with_their_options() {
        let nf4 = Quantization::parse("nf4:double,compute=bf16")
            .unwrap()
            .unwrap();
        assert!(nf4.double_quant);
        assert_eq!(nf4.compute, Dtype::Bf16);
        let gptq = Quantization::parse("gptq:bits=8,group=64")
            .unwrap()
            .unwrap();
        assert_eq!((gptq.bits, gptq.group), (8, 64));
        assert_eq!(Quantization::parse("none").unwrap(), None);
        let exllama = Quantization::parse("gptq:bits=4,group=128,kernel=exllamav2")
            .unwrap()
            .unwrap();
        assert_eq!(exllama.kernel, Some(GptqKernel::Exllamav2));
        for bad in [
            "int4",
            "nf4:bits=4",
            "gptq:bits=5",
            "gptq:kernel=marlin",
            "gptq:bits=8,kernel=exllama",
            "awq:kernel=exllama",
            "int8:double",
            "fp8:block=x",
        ] {
            let err = Quantization::parse(bad).expect_err(bad).to_string();
            assert!(err.contains("quant"), "{bad}: {err}");
        }
    }

    #[test]
    fn bytes_per_weight_follow_the_formats() {
        let of = |text: &str| {
            Quantization::parse(text)
                .unwrap()
                .unwrap()
                .bytes_per_weight()
        };
        assert_eq!(of("nf4"), 0.5625);
        assert!((of("nf4:double") - 0.516).abs() < 1e-3);
        assert_eq!(of("gptq"), 0.5 + 2.5 / 128.0);
        assert_eq!(of("fp8"), 1.0 + 4.0 / 16384.0);
    }

    #[test]
    fn gptq_kernels_allocate_as_autogptq_0_5_does() {
        let model = crate::find_model("llama-2-13b").unwrap();
        let crate::model::Architecture::Transformer(spec) = &model.arch else {
            panic!("llama-2-13b is a transformer")
        };
        let of = |text: &str| Quantization::parse(text).unwrap().unwrap();
        // The largest linears are the gate and up projections: 5120 inputs × 13824 outputs.
        let weight = 2.0 * 5120.0 * 13824.0;
        let buffer = |text: &str| of(text).kernel_buffer_bytes(spec);
        assert_eq!(buffer("gptq:kernel=exllama"), weight);
        assert_eq!(
            buffer("gptq:kernel=exllamav2"),
            weight + 256.0 + 4.0 * 13824.0 * 2048.0 * 8.0
        );
        for none in ["gptq:kernel=cuda-old", "gptq", "awq", "nf4"] {
            assert_eq!(buffer(none), 0.0, "{none}");
        }
        // Only cuda-old copies a weight while it runs, and only from 128 tokens.
        let cuda_old = of("gptq:kernel=cuda-old");
        assert_eq!(cuda_old.dequantised_bytes(100.0, 127.0, Dtype::Fp16), 0.0);
        assert_eq!(cuda_old.dequantised_bytes(100.0, 128.0, Dtype::Fp16), 500.0);
        let exllama = of("gptq:kernel=exllama");
        assert_eq!(exllama.dequantised_bytes(100.0, 512.0, Dtype::Fp16), 0.0);
        assert_eq!(
            of("gptq").dequantised_bytes(100.0, 512.0, Dtype::Fp16),
            200.0
        );
    }

    #[test]
    fn reads_quantization_configs_as_their_producers_write_them() {
        let read = |text: &str| from_config(&serde_json::from_str(text).unwrap()).unwrap();
        let bnb_old = r#"{"quantization_config": {"load_in_4bit": true,
            "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": true,
            "bnb_4bit_compute_dtype": "bfloat16"}}"#;
        let Some(CheckpointQuant::Known(q)) = read(bnb_old) else {
            panic!("bitsandbytes")
        };
        assert_eq!(
            (q.format, q.double_quant, q.compute),
            (QuantFormat::Nf4, true, Dtype::Bf16)
        );
        let deepseek = r#"{"quantization_config": {"activation_scheme": "dynamic",
            "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}}"#;
        let Some(CheckpointQuant::Known(q)) = read(deepseek) else {
            panic!("fp8")
        };
        assert_eq!((q.format, q.block), (QuantFormat::Fp8, 16384));
        let awq = r#"{"quantization_config": {"quant_method": "awq", "bits": 4,
            "group_size": 128, "version": "gemm", "zero_point": true}}"#;
        assert!(
            matches!(read(awq), Some(CheckpointQuant::Known(q)) if q.format == QuantFormat::Awq)
        );
        let other = r#"{"quantization_config": {"quant_method": "compressed-tensors"}}"#;
        assert!(matches!(read(other), Some(CheckpointQuant::Unknown { .. })));
        assert_eq!(read("{}"), None);
    }
}
