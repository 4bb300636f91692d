//! PyTorch's caching-allocator options, parsed from `PYTORCH_ALLOC_CONF` syntax
//! (`opt:val,opt2:val2`, lists in brackets), with PyTorch's names, units (MB = MiB) and ranges.

use gpumem_snapshot::SettingValue;

use crate::config::ConfigError;

const MIB: u64 = 1 << 20;

/// Number of power-of-two intervals in the `roundup_power2_divisions` table (1 MiB … 64 GiB).
pub const ROUNDUP_INTERVALS: usize = 16;

/// The options of PyTorch's native allocator that change placement.
#[derive(Clone, Debug, PartialEq)]
pub struct TorchSettings {
    /// Blocks at least this large are never split (`max_split_size_mb`; `u64::MAX` = unlimited).
    pub max_split_size: u64,
    /// How much larger than the request an oversize cached block may be
    /// (`max_non_split_rounding_mb`, default 20 MiB).
    pub max_non_split_rounding: u64,
    /// Divisions per power-of-two interval, index = clamp(log2(size) − 20, 0, 15); 0 or 1 = off.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// Fraction of the allowed memory above which old cached blocks are freed
    /// (`garbage_collection_threshold`); `None` = off.
    pub garbage_collection_threshold: Option<f64>,
    /// Whether segments grow by mapping pages (`expandable_segments`).
    pub expandable_segments: bool,
    /// Segment size for mid-size large-pool requests (`large_segment_size_mb`, default 20 MiB).
    pub large_segment_size: u64,
}

impl Default for TorchSettings {
    fn default() -> Self {
        TorchSettings {
            max_split_size: u64::MAX,
            max_non_split_rounding: 20 * MIB,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: None,
            expandable_segments: false,
            large_segment_size: 20 * MIB,
        }
    }
}

/// Boolean options PyTorch accepts that only concern pinned host memory, locking or CUDA
/// graphs: checked and accepted (so existing settings strings work) but without effect on
/// device placement. So are `pinned_num_register_threads` and `pinned_reserve_segment_size_mb`.
const NO_PLACEMENT_EFFECT: [&str; 6] = [
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_use_background_threads",
    "graph_capture_record_stream_reuse",
];

const KNOWN_KEYS: &str = "backend, max_split_size_mb, max_non_split_rounding_mb, \
roundup_power2_divisions, garbage_collection_threshold, expandable_segments, \
large_segment_size_mb, release_lock_on_cudamalloc, pinned_use_cuda_host_register, \
pinned_num_register_threads, pinned_use_background_threads, pinned_reserve_segment_size_mb, \
graph_capture_record_stream_reuse";

impl TorchSettings {
    /// The settings as PyTorch writes them in a snapshot's `allocator_settings`: its key names,
    /// sizes in bytes, `roundup_power2_divisions` keyed by the interval's start in MiB; options
    /// left at "off" or "unlimited" are omitted.
    pub fn snapshot_settings(&self) -> Vec<(String, SettingValue)> {
        let int = |bytes: u64| SettingValue::Int(i64::try_from(bytes).unwrap_or(i64::MAX));
        let mut out = vec![
            (
                "expandable_segments".to_string(),
                SettingValue::Bool(self.expandable_segments),
            ),
            (
                "max_non_split_rounding".to_string(),
                int(self.max_non_split_rounding),
            ),
            (
                "large_segment_size".to_string(),
                int(self.large_segment_size),
            ),
        ];
        if self.max_split_size != u64::MAX {
            out.push(("max_split_size".to_string(), int(self.max_split_size)));
        }
        if let Some(threshold) = self.garbage_collection_threshold {
            out.push((
                "garbage_collection_threshold".to_string(),
                SettingValue::Float(threshold),
            ));
        }
        if self.roundup_power2_divisions.iter().any(|&d| d > 1) {
            let divisions = (0..ROUNDUP_INTERVALS)
                .map(|i| {
                    (
                        (1u64 << i).to_string(),
                        int(self.roundup_power2_divisions[i]),
                    )
                })
                .collect();
            out.push((
                "roundup_power2_divisions".to_string(),
                SettingValue::Map(divisions),
            ));
        }
        out
    }

    /// Parses a `PYTORCH_ALLOC_CONF` string. Errors name the option, its value and what PyTorch
    /// accepts for it.
    pub fn parse(conf: &str) -> Result<TorchSettings, ConfigError> {
        let mut settings = TorchSettings::default();
        for (key, value) in split_options(conf)? {
            settings.apply(&key, &value)?;
        }
        Ok(settings)
    }

    fn apply(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let err = |problem: &str, accepted: &str| ConfigError {
            source_name: key.to_string(),
            value: value.to_string(),
            problem: problem.to_string(),
            accepted: accepted.to_string(),
        };
        let mib_at_least_20 = |what: &str| -> Result<u64, ConfigError> {
            let mb: u64 = value
                .parse()
                .map_err(|_| err("not a whole number of MB", "an integer ≥ 20 (MB)"))?;
            if mb < 20 {
                return Err(err(
                    &format!("{what} must be at least 20 MB"),
                    "an integer ≥ 20 (MB)",
                ));
            }
            mb.checked_mul(MIB)
                .ok_or_else(|| err("too large", "an integer ≥ 20 (MB)"))
        };
        match key {
            "backend" => match value {
                "native" => {}
                "cudaMallocAsync" => {
                    return Err(err(
                        "the cudaMallocAsync backend is the driver's pool, not a placement policy gpumem reproduces",
                        "native",
                    ))
                }
                _ => return Err(err("unknown backend", "native or cudaMallocAsync")),
            },
            "max_split_size_mb" => self.max_split_size = mib_at_least_20("max_split_size_mb")?,
            "max_non_split_rounding_mb" => {
                self.max_non_split_rounding = mib_at_least_20("max_non_split_rounding_mb")?
            }
            "large_segment_size_mb" => {
                self.large_segment_size = mib_at_least_20("large_segment_size_mb")?
            }
            "garbage_collection_threshold" => {
                let t: f64 = value
                    .parse()
                    .map_err(|_| err("not a number", "a number strictly between 0.0 and 1.0"))?;
                if !(t > 0.0 && t < 1.0) {
                    return Err(err("out of range", "a number strictly between 0.0 and 1.0"));
                }
                self.garbage_collection_threshold = Some(t);
            }
            "expandable_segments" => {
                self.expandable_segments =
                    parse_bool(value).ok_or_else(|| err("not a boolean", "True or False"))?
            }
            "roundup_power2_divisions" => {
                self.roundup_power2_divisions = parse_divisions(value).map_err(|problem| {
                    err(
                        &problem,
                        "a power of two (e.g. 4), or a list like [256:1,512:2,1024:4,>:8] with MB keys and power-of-two values",
                    )
                })?
            }
            "pinned_num_register_threads" => {
                let threads: u64 = value.parse().map_err(|_| {
                    err("not a whole number", "a power of two from 1 to 128")
                })?;
                if !threads.is_power_of_two() || threads > 128 {
                    return Err(err("out of range", "a power of two from 1 to 128"));
                }
            }
            "pinned_reserve_segment_size_mb" => {
                value
                    .parse::<u64>()
                    .ok()
                    .filter(|&mb| mb > 0)
                    .ok_or_else(|| err("not a positive whole number of MB", "an integer > 0 (MB)"))?;
            }
            k if NO_PLACEMENT_EFFECT.contains(&k) => {
                parse_bool(value).ok_or_else(|| err("not a boolean", "True or False"))?;
            }
            _ => return Err(err("unknown option", KNOWN_KEYS)),
        }
        Ok(())
    }
}

/// A boolean as PyTorch's option parser accepts it.
fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "True" | "true" | "1" => Some(true),
        "False" | "false" | "0" => Some(false),
        _ => None,
    }
}

/// Splits `a:1,b:[x:1,>:2]` into (key, value) pairs, keeping bracketed lists whole.
fn split_options(conf: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let cleaned: String = conf.chars().filter(|c| !c.is_whitespace()).collect();
    let mut options = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let bytes = cleaned.as_bytes();
    let mut pieces = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b',' if depth == 0 => {
                pieces.push(&cleaned[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if depth < 0 {
            break;
        }
    }
    let malformed = |piece: &str, problem: &str| {
        ConfigError {
        source_name: "settings".into(),
        value: piece.to_string(),
        problem: problem.to_string(),
        accepted: "option:value pairs separated by commas, e.g. max_split_size_mb:128,expandable_segments:True".into(),
    }
    };
    if depth != 0 {
        return Err(malformed(conf, "unbalanced brackets"));
    }
    pieces.push(&cleaned[start..]);
    for piece in pieces.into_iter().filter(|p| !p.is_empty()) {
        let (key, value) = piece
            .split_once(':')
            .ok_or_else(|| malformed(piece, "missing ':' between option and value"))?;
        if key.is_empty() || value.is_empty() {
            return Err(malformed(piece, "empty option or value"));
        }
        options.push((key.to_string(), value.to_string()));
    }
    Ok(options)
}

fn parse_divisions(value: &str) -> Result<[u64; ROUNDUP_INTERVALS], String> {
    let power_of_two = |text: &str| -> Result<u64, String> {
        let v: u64 = text
            .parse()
            .map_err(|_| format!("{text:?} is not a whole number"))?;
        if v != 0 && !v.is_power_of_two() {
            return Err(format!("{v} is not a power of two"));
        }
        Ok(v)
    };
    let mut table = [0u64; ROUNDUP_INTERVALS];
    let Some(list) = value.strip_prefix('[') else {
        table = [power_of_two(value)?; ROUNDUP_INTERVALS];
        return Ok(table);
    };
    let list = list.strip_suffix(']').ok_or("missing closing ]")?;
    let mut last_index: Option<usize> = None;
    for entry in list.split(',') {
        let (key, divisions) = entry
            .split_once(':')
            .ok_or_else(|| format!("{entry:?} is not key:value"))?;
        let divisions = power_of_two(divisions)?;
        if key == ">" {
            let from = last_index.map_or(0, |i| i + 1);
            table[from..].fill(divisions);
            continue;
        }
        let mb = power_of_two(key)?;
        if mb == 0 {
            return Err("size key 0 is not a power of two".into());
        }
        let index = (mb.ilog2() as usize).min(ROUNDUP_INTERVALS - 1);
        if let Some(last) = last_index {
            if index <= last {
                return Err(format!(
                    "size keys must increase ({key} after a larger key)"
                ));
            }
        } else {
            table[..index].fill(divisions);
        }
        table[index] = divisions;
        last_index = Some(index);
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pytorch_examples() {
        let s = TorchSettings::parse(
            "max_split_size_mb:128, expandable_segments:True,garbage_collection_threshold:0.6",
        )
        .unwrap();
        assert_eq!(s.max_split_size, 128 * MIB);
        assert!(s.expandable_segments);
        assert_eq!(s.garbage_collection_threshold, Some(0.6));

        let s = TorchSettings::parse("roundup_power2_divisions:4").unwrap();
        assert_eq!(s.roundup_power2_divisions, [4; 16]);

        let s = TorchSettings::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        assert_eq!(s.roundup_power2_divisions[0], 1);
        assert_eq!(s.roundup_power2_divisions[8], 1);
        assert_eq!(s.roundup_power2_divisions[9], 2);
        assert_eq!(s.roundup_power2_divisions[10], 4);
        assert_eq!(s.roundup_power2_divisions[11], 8);
        assert_eq!(s.roundup_power2_divisions[15], 8);

        let s = TorchSettings::parse("release_lock_on_cudamalloc:True,backend:native").unwrap();
        assert_eq!(s, TorchSettings::default());
    }

    #[test]
    fn rejects_bad_options_with_context() {
        for (conf, needle) in [
            ("max_split_size_mb:10", "at least 20"),
            ("max_split_size_mb:abc", "whole number"),
            ("garbage_collection_threshold:1.5", "strictly between"),
            ("expandable_segments:yes", "True or False"),
            ("roundup_power2_divisions:3", "not a power of two"),
            ("roundup_power2_divisions:[512:2,256:1]", "must increase"),
            ("max_split_size", "missing ':'"),
            ("foo:1", "unknown option"),
            ("backend:cudaMallocAsync", "driver's pool"),
            ("roundup_power2_divisions:[256:1", "unbalanced"),
            ("release_lock_on_cudamalloc:none", "not a boolean"),
            ("pinned_num_register_threads:1024", "out of range"),
            ("pinned_num_register_threads:3", "out of range"),
            ("pinned_reserve_segment_size_mb:0", "positive"),
        ] {
            let e = TorchSettings::parse(conf).unwrap_err().to_string();
            assert!(e.contains(needle), "{conf}: {e}");
        }
    }
}
