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
    /// The cuBLAS (hipBLAS) workspace PyTorch allocates on it through its caching allocator
    /// for each thread and stream that runs a matrix product (PyTorch's default without
    /// `CUBLAS_WORKSPACE_CONFIG`).
    pub blas_workspace_bytes: u64,
}

const MIB: u64 = 1 << 20;

/// cuBLAS's workspace on Hopper and Blackwell: 32 MiB.
pub const HOPPER_WORKSPACE: u64 = 32 * MIB;
/// cuBLAS's workspace on earlier NVIDIA GPUs: `:4096:2:16:8`, 8 MiB + 128 KiB.
const PRE_HOPPER_WORKSPACE: u64 = 8 * MIB + 128 * 1024;
/// hipBLAS's workspace on MI300 (gfx942): 128 MiB.
const MI300_WORKSPACE: u64 = 128 * MIB;
/// hipBLAS's workspace on other AMD GPUs: 32 MiB.
const ROCM_WORKSPACE: u64 = 32 * MIB;

/// Known GPUs: (name, MiB reported by the driver, cuBLAS workspace). Aliases map to the same
/// capacity. A GPU known only by its size is planned with [`HOPPER_WORKSPACE`].
pub const GPUS: &[(&str, u64, u64)] = &[
    ("h100", 81_559, HOPPER_WORKSPACE),
    ("h100-80gb", 81_559, HOPPER_WORKSPACE),
    ("h100-sxm", 81_559, HOPPER_WORKSPACE),
    ("h100-pcie", 81_559, HOPPER_WORKSPACE),
    ("h100-nvl", 95_830, HOPPER_WORKSPACE),
    ("h200", 143_771, HOPPER_WORKSPACE),
    ("b200", 183_359, HOPPER_WORKSPACE),
    ("a100-40gb", 40_960, PRE_HOPPER_WORKSPACE),
    ("a100-80gb", 81_920, PRE_HOPPER_WORKSPACE),
    ("a100", 81_920, PRE_HOPPER_WORKSPACE),
    ("l4", 23_034, PRE_HOPPER_WORKSPACE),
    ("l40", 46_068, PRE_HOPPER_WORKSPACE),
    ("l40s", 46_068, PRE_HOPPER_WORKSPACE),
    ("a10g", 23_028, PRE_HOPPER_WORKSPACE),
    ("a10", 23_028, PRE_HOPPER_WORKSPACE),
    ("a6000", 49_140, PRE_HOPPER_WORKSPACE),
    ("rtx-a6000", 49_140, PRE_HOPPER_WORKSPACE),
    ("rtx-6000-ada", 49_140, PRE_HOPPER_WORKSPACE),
    ("rtx-4090", 24_564, PRE_HOPPER_WORKSPACE),
    ("rtx-4080", 16_376, PRE_HOPPER_WORKSPACE),
    ("rtx-3090", 24_576, PRE_HOPPER_WORKSPACE),
    ("rtx-3080", 10_240, PRE_HOPPER_WORKSPACE),
    ("t4", 15_360, PRE_HOPPER_WORKSPACE),
    ("v100", 16_384, PRE_HOPPER_WORKSPACE),
    ("v100-16gb", 16_384, PRE_HOPPER_WORKSPACE),
    ("v100-32gb", 32_768, PRE_HOPPER_WORKSPACE),
    ("mi250", 65_536, ROCM_WORKSPACE),
    ("mi250x", 65_536, ROCM_WORKSPACE),
    ("mi300x", 196_592, MI300_WORKSPACE),
];

/// Looks a GPU up by name ("H100", "rtx4090", "A100-80GB") or reads a size ("24GB", "80GiB").
pub fn find_gpu(name: &str) -> Result<Gpu> {
    if let Some(bytes) = parse_size(name)? {
        return Ok(Gpu {
            name: name.to_string(),
            memory_bytes: bytes,
            blas_workspace_bytes: HOPPER_WORKSPACE,
        });
    }
    let key = normalise(name)
        .replace("nvidia-", "")
        .replace("rtx", "rtx-")
        .replace("rtx--", "rtx-");
    let compact = |s: &str| s.replace('-', "");
    GPUS.iter()
        .find(|(known, _, _)| compact(known) == compact(&key))
        .map(|&(known, mib, workspace)| Gpu {
            name: known.to_string(),
            memory_bytes: mib * MIB,
            blas_workspace_bytes: workspace,
        })
        .ok_or_else(|| unknown("GPU", name, GPUS.iter().map(|(n, _, _)| *n)))
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
        assert_eq!(find_gpu("h200").unwrap().blas_workspace_bytes, 32 << 20);
        assert_eq!(
            find_gpu("a100").unwrap().blas_workspace_bytes,
            (8 << 20) + (128 << 10)
        );
        assert_eq!(find_gpu("24GB").unwrap().blas_workspace_bytes, 32 << 20);
        let err = find_gpu("h10").unwrap_err().to_string();
        assert!(err.contains("did you mean"), "{err}");
        assert!(find_gpu("0GB").is_err());
    }
}
