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
    /// What its reduction kernels size their launches by.
    pub cores: Cores,
}

/// A GPU's multiprocessors as PyTorch's reduction kernels see them: they spread a long sum
/// over enough thread blocks to fill every multiprocessor, and the blocks' partial sums need
/// a staging buffer ([`column_sum_staging_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Cores {
    /// Streaming multiprocessors (NVIDIA) or compute units (AMD) one process sees.
    pub multiprocessors: u64,
    /// Threads resident on one multiprocessor at most.
    pub threads_per_multiprocessor: u64,
    /// AMD (HIP): 64-wide wavefronts, and PyTorch's ROCm settings of the reduction's split.
    pub amd: bool,
    /// NVIDIA Ampere or later: tensor cores take fp32 convolutions as TF32 (PyTorch's
    /// default `torch.backends.cudnn.allow_tf32`), so cuDNN runs them, as it runs half
    /// precision, on NHWC tensor-core engines (the planner's cuDNN convolution workspaces,
    /// `graph/cudnn.rs`).
    pub tf32: bool,
}

const fn nvidia(multiprocessors: u64, threads_per_multiprocessor: u64) -> Cores {
    Cores {
        multiprocessors,
        threads_per_multiprocessor,
        amd: false,
        tf32: true,
    }
}

/// A Volta or Turing GPU (V100, T4): tensor cores for half precision only.
const fn nvidia_before_ampere(multiprocessors: u64, threads_per_multiprocessor: u64) -> Cores {
    Cores {
        tf32: false,
        ..nvidia(multiprocessors, threads_per_multiprocessor)
    }
}

const fn amd(compute_units: u64) -> Cores {
    Cores {
        multiprocessors: compute_units,
        threads_per_multiprocessor: 2048,
        amd: true,
        tf32: false,
    }
}

/// The H100's (SXM) multiprocessors: the default GPU's.
pub const H100_CORES: Cores = nvidia(132, 2048);

const MIB: u64 = 1 << 20;

/// cuBLAS's workspace on Hopper and Blackwell: 32 MiB.
pub const HOPPER_WORKSPACE: u64 = 32 * MIB;
/// cuBLAS's workspace on earlier NVIDIA GPUs: `:4096:2:16:8`, 8 MiB + 128 KiB.
const PRE_HOPPER_WORKSPACE: u64 = 8 * MIB + 128 * 1024;
/// hipBLAS's workspace on MI300 (gfx942): 128 MiB.
const MI300_WORKSPACE: u64 = 128 * MIB;
/// hipBLAS's workspace on other AMD GPUs: 32 MiB.
const ROCM_WORKSPACE: u64 = 32 * MIB;

/// Known GPUs: (name, MiB reported by the driver, cuBLAS workspace, multiprocessors; an MI250's
/// are one die's, the device a process sees). Aliases map to the same capacity. A GPU known
/// only by its size is planned with [`HOPPER_WORKSPACE`] and [`H100_CORES`].
pub const GPUS: &[(&str, u64, u64, Cores)] = &[
    ("h100", 81_559, HOPPER_WORKSPACE, H100_CORES),
    ("h100-80gb", 81_559, HOPPER_WORKSPACE, H100_CORES),
    ("h100-sxm", 81_559, HOPPER_WORKSPACE, H100_CORES),
    ("h100-pcie", 81_559, HOPPER_WORKSPACE, nvidia(114, 2048)),
    ("h100-nvl", 95_830, HOPPER_WORKSPACE, H100_CORES),
    ("h200", 143_771, HOPPER_WORKSPACE, H100_CORES),
    ("b200", 183_359, HOPPER_WORKSPACE, nvidia(148, 2048)),
    ("a100-40gb", 40_960, PRE_HOPPER_WORKSPACE, nvidia(108, 2048)),
    ("a100-80gb", 81_920, PRE_HOPPER_WORKSPACE, nvidia(108, 2048)),
    ("a100", 81_920, PRE_HOPPER_WORKSPACE, nvidia(108, 2048)),
    ("l4", 23_034, PRE_HOPPER_WORKSPACE, nvidia(58, 1536)),
    ("l40", 46_068, PRE_HOPPER_WORKSPACE, nvidia(142, 1536)),
    ("l40s", 46_068, PRE_HOPPER_WORKSPACE, nvidia(142, 1536)),
    ("a10g", 23_028, PRE_HOPPER_WORKSPACE, nvidia(80, 1536)),
    ("a10", 23_028, PRE_HOPPER_WORKSPACE, nvidia(72, 1536)),
    ("a6000", 49_140, PRE_HOPPER_WORKSPACE, nvidia(84, 1536)),
    ("rtx-a6000", 49_140, PRE_HOPPER_WORKSPACE, nvidia(84, 1536)),
    (
        "rtx-6000-ada",
        49_140,
        PRE_HOPPER_WORKSPACE,
        nvidia(142, 1536),
    ),
    ("rtx-4090", 24_564, PRE_HOPPER_WORKSPACE, nvidia(128, 1536)),
    ("rtx-4080", 16_376, PRE_HOPPER_WORKSPACE, nvidia(76, 1536)),
    ("rtx-3090", 24_576, PRE_HOPPER_WORKSPACE, nvidia(82, 1536)),
    ("rtx-3080", 10_240, PRE_HOPPER_WORKSPACE, nvidia(68, 1536)),
    (
        "t4",
        15_360,
        PRE_HOPPER_WORKSPACE,
        nvidia_before_ampere(40, 1024),
    ),
    (
        "v100",
        16_384,
        PRE_HOPPER_WORKSPACE,
        nvidia_before_ampere(80, 2048),
    ),
    (
        "v100-16gb",
        16_384,
        PRE_HOPPER_WORKSPACE,
        nvidia_before_ampere(80, 2048),
    ),
    (
        "v100-32gb",
        32_768,
        PRE_HOPPER_WORKSPACE,
        nvidia_before_ampere(80, 2048),
    ),
    ("mi250", 65_536, ROCM_WORKSPACE, amd(104)),
    ("mi250x", 65_536, ROCM_WORKSPACE, amd(110)),
    ("mi300x", 196_592, MI300_WORKSPACE, amd(304)),
];

/// How `--gpu` is given besides a catalogue name, as errors list it.
const SIZES: &str = "a size: a number and a unit, GB, TB or MB (powers of 10) or GiB (G), MiB (M) \
                     (powers of 2), e.g. 24GB, 80GiB, 16000MiB";

/// Looks a GPU up by name ("H100", "rtx4090", "A100-80GB") or reads a size ("24GB", "80GiB");
/// anything else is a typed error listing the names and saying how a size is written.
pub fn find_gpu(name: &str) -> Result<Gpu> {
    if let Some(bytes) = parse_size(name)? {
        return Ok(Gpu {
            name: name.to_string(),
            memory_bytes: bytes,
            blas_workspace_bytes: HOPPER_WORKSPACE,
            cores: H100_CORES,
        });
    }
    let key = normalise(name)
        .replace("nvidia-", "")
        .replace("rtx", "rtx-")
        .replace("rtx--", "rtx-");
    let compact = |s: &str| s.replace('-', "");
    GPUS.iter()
        .find(|(known, ..)| compact(known) == compact(&key))
        .map(|&(known, mib, workspace, cores)| Gpu {
            name: known.to_string(),
            memory_bytes: mib * MIB,
            blas_workspace_bytes: workspace,
            cores,
        })
        .ok_or_else(|| unknown("GPU", name, GPUS.iter().map(|(n, ..)| *n).chain([SIZES])))
}

/// Bytes PyTorch's CUDA (HIP) reduction kernel allocates, through the caching allocator, for
/// its thread blocks' partial sums and their semaphores while it sums the `rows` rows of a
/// contiguous `rows × cols` tensor into `cols` outputs: how a linear's bias gradient is made
/// (`grad.sum(0)`). It splits the rows across blocks when each thread would otherwise sum 256
/// values or more, into as many blocks as fill the device, each thread left 16 values at
/// least (128 on ROCm) and 256 at most (`setReduceConfig`, aten/src/ATen/native/cuda/Reduce.cuh;
/// the partial sums are fp32). 0 when the rows are summed within one block. The sum of
/// [`column_sum_staging`]'s buffers.
pub fn column_sum_staging_bytes(rows: u64, cols: u64, cores: &Cores) -> u64 {
    column_sum_staging(rows, cols, cores).map_or(0, |[partials, semaphores]| partials + semaphores)
}

/// The two buffers of [`column_sum_staging_bytes`] as the caching allocator hands them out,
/// each rounded up to 512 bytes: the blocks' fp32 partial sums and their semaphores (one per
/// output block); `None` when one block sums the rows. `gpumem.torch.trace` records them as two
/// allocations inside the sum.
pub fn column_sum_staging(rows: u64, cols: u64, cores: &Cores) -> Option<[u64; 2]> {
    const MAX_THREADS: u64 = 512;
    const MAX_VALUES_PER_THREAD: u64 = 256;
    if rows == 0 || cols == 0 {
        return None;
    }
    let (warp, min_values, min_blocks) = if cores.amd {
        (64, 128, 64)
    } else {
        (32, 16, 1)
    };
    // Each thread loads up to four neighbouring outputs at once.
    let vector = [4, 2, 1]
        .into_iter()
        .find(|v| cols.is_multiple_of(*v))
        .unwrap_or(1);
    let max_threads = MAX_THREADS / vector;
    let power_of_two_below = |n: u64| {
        if n < max_threads {
            1 << (63 - n.leading_zeros())
        } else {
            max_threads
        }
    };
    let (outputs, inputs) = (power_of_two_below(cols / vector), power_of_two_below(rows));
    let height = inputs.min(max_threads / outputs.min(warp));
    let width = outputs.min(max_threads / height);
    let split_rows = rows >= (height * 16).min(MAX_VALUES_PER_THREAD);
    let (step_input, step_output) = if split_rows {
        (height, width)
    } else {
        (1, width * height)
    };
    let values_per_thread = rows.div_ceil(step_input);
    let grid = (cols / vector).div_ceil(step_output);
    let target = cores.multiprocessors * (cores.threads_per_multiprocessor / (width * height));
    if !split_rows || values_per_thread < MAX_VALUES_PER_THREAD || grid > target {
        return None;
    }
    let blocks = target
        .div_ceil(grid)
        .min(values_per_thread.div_ceil(min_values))
        .max(values_per_thread.div_ceil(MAX_VALUES_PER_THREAD));
    if blocks <= 1 {
        return None;
    }
    let blocks = blocks.max(min_blocks);
    let rounded = |bytes: u64| bytes.div_ceil(512) * 512;
    Some([
        rounded(4 * cols * blocks * width * vector),
        rounded(4 * grid),
    ])
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
        reason: format!(
            "a GPU is a catalogue name (h100, a100-80gb, rtx-4090, ...) or {SIZES}, positive and \
             below 10 TB"
        ),
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

    /// The staging PyTorch 2.11's column sums took on an H200 (132 multiprocessors), read from
    /// its allocation history: a bias gradient over 1024 … 3000 rows.
    #[test]
    fn column_sum_staging_matches_h200_traces() {
        let h200 = find_gpu("h200").unwrap().cores;
        assert_eq!(column_sum_staging_bytes(1024, 1024, &h200), 8_389_120);
        assert_eq!(column_sum_staging_bytes(2048, 8192, &h200), 134_218_240);
        assert_eq!(column_sum_staging_bytes(1576, 1024, &h200), 13_107_712);
        assert_eq!(column_sum_staging_bytes(3000, 1536, &h200), 36_962_816);
        // Few rows are summed within one block: no staging.
        assert_eq!(column_sum_staging_bytes(64, 1024, &h200), 0);
        assert_eq!(column_sum_staging_bytes(0, 1024, &h200), 0);
        // Fewer multiprocessors, fewer blocks: less staging.
        let t4 = find_gpu("t4").unwrap().cores;
        assert!(column_sum_staging_bytes(2048, 8192, &t4) < 134_218_240);
    }
}
