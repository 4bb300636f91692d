//! GPU catalogue: memory visible to CUDA/ROCm per device, and parsing of plain sizes ("24GB").

use crate::error::{PlanError, Result};
use crate::names::{normalise, unknown};
use serde::Serialize;

/// A GPU model and the memory one process can use on it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gpu {
    /// Catalogue name (or the size as typed).
    pub name: String,
    /// Device memory as reported by nvidia-smi / rocm-smi, bytes.
    pub memory_bytes: u64,
}

const MIB: u64 = 1 << 20;

/// Known GPUs: (name, MiB reported by the driver). Aliases map to the same capacity.
pub const GPUS: &[(&str, u64)] = &[
    ("h100", 81_559),
    ("h100-80gb", 81_559),
    ("h100-sxm", 81_559),
    ("h100-pcie", 81_559),
    ("h100-nvl", 95_830),
    ("h200", 143_771),
    ("b200", 183_359),
    ("a100-40gb", 40_960),
    ("a100-80gb", 81_920),
    ("a100", 81_920),
    ("l4", 23_034),
    ("l40", 46_068),
    ("l40s", 46_068),
    ("a10g", 23_028),
    ("a10", 23_028),
    ("a6000", 49_140),
    ("rtx-a6000", 49_140),
    ("rtx-6000-ada", 49_140),
    ("rtx-4090", 24_564),
    ("rtx-4080", 16_376),
    ("rtx-3090", 24_576),
    ("rtx-3080", 10_240),
    ("t4", 15_360),
    ("v100", 16_384),
    ("v100-16gb", 16_384),
    ("v100-32gb", 32_768),
    ("mi250", 65_536),
    ("mi250x", 65_536),
    ("mi300x", 196_592),
];

/// The cuBLAS (hipBLAS) workspace PyTorch allocates through its caching allocator for each
/// thread and stream that runs a matrix product, on the GPU of catalogue name `gpu`: 32 MiB on
/// Hopper and Blackwell, `:4096:2:16:8` (8 MiB + 128 KiB) on earlier NVIDIA GPUs, 128 MiB on
/// MI300 and 32 MiB on other AMD GPUs (PyTorch's defaults without `CUBLAS_WORKSPACE_CONFIG`).
/// A GPU known only by its size, or none, is planned with Hopper's.
pub fn blas_workspace_bytes(gpu: Option<&str>) -> u64 {
    const HOPPER: u64 = 32 * MIB;
    match gpu {
        Some(name) if name.starts_with("mi300") => 128 * MIB,
        Some(name)
            if name.starts_with("h1") || name.starts_with("h2") || name.starts_with("b2") =>
        {
            HOPPER
        }
        Some(name) if name.starts_with("mi") => HOPPER,
        Some(name) if GPUS.iter().any(|(known, _)| *known == name) => 8 * MIB + 128 * 1024,
        _ => HOPPER,
    }
}

/// Looks a GPU up by name ("H100", "rtx4090", "A100-80GB") or reads a size ("24GB", "80GiB").
pub fn find_gpu(name: &str) -> Result<Gpu> {
    if let Some(bytes) = parse_size(name)? {
        return Ok(Gpu {
            name: name.to_string(),
            memory_bytes: bytes,
        });
    }
    let key = normalise(name)
        .replace("nvidia-", "")
        .replace("rtx", "rtx-")
        .replace("rtx--", "rtx-");
    let compact = |s: &str| s.replace('-', "");
    GPUS.iter()
        .find(|(known, _)| compact(known) == compact(&key))
        .map(|(known, mib)| Gpu {
            name: known.to_string(),
            memory_bytes: mib * MIB,
        })
        .ok_or_else(|| unknown("GPU", name, GPUS.iter().map(|(n, _)| *n)))
}

/// Parses "24GB" (1e9), "24GiB"/"24G" (2^30) or "24000MB"/"MiB"; `None` if it is not a size.
pub fn parse_size(text: &str) -> Result<Option<u64>> {
    let t = text.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    if number.is_empty() {
        return Ok(None);
    }
    let scale = match unit.trim() {
        "gb" => 1e9,
        "gib" | "g" => (1u64 << 30) as f64,
        "mb" => 1e6,
        "mib" | "m" => MIB as f64,
        "tb" => 1e12,
        _ => return Ok(None),
    };
    let value: f64 = number.parse().map_err(|_| invalid_size(text))?;
    if !(value > 0.0 && value < 1e4 * if scale < 1e9 { 1e3 } else { 1.0 }) {
        return Err(invalid_size(text));
    }
    Ok(Some((value * scale) as u64))
}

fn invalid_size(text: &str) -> PlanError {
    PlanError::InvalidValue {
        name: "gpu".into(),
        value: text.into(),
        reason: "a size must be positive and below 10 TB, e.g. 24GB, 80GiB, 16000MiB".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_by_loose_name_and_size() {
        assert_eq!(find_gpu("RTX4090").unwrap().memory_bytes, 24_564 * MIB);
        assert_eq!(find_gpu("NVIDIA H100").unwrap().name, "h100");
        assert_eq!(find_gpu("24GB").unwrap().memory_bytes, 24_000_000_000);
        assert_eq!(find_gpu("80GiB").unwrap().memory_bytes, 80 << 30);
        let err = find_gpu("h10").unwrap_err().to_string();
        assert!(err.contains("did you mean"), "{err}");
        assert!(find_gpu("0GB").is_err());
    }
}
