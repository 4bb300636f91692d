//! PyTorch's caching-allocator options, parsed from `PYTORCH_ALLOC_CONF` syntax
//! (`opt:val,opt2:val2`, lists in brackets), with PyTorch's names, units (MB = MiB) and ranges.

use gpumem_snapshot::SettingValue;

use super::options::{format_scaled, parse_bool, parse_scaled, split_options, MB};
use crate::config::ConfigError;

const MIB: u64 = 1 << 20;

/// PyTorch's `max_non_split_rounding_mb` when neither it nor `large_segment_size_mb` is given.
const DEFAULT_NON_SPLIT_ROUNDING: u64 = 20 * MIB;

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
            max_non_split_rounding: DEFAULT_NON_SPLIT_ROUNDING,
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

/// A valid settings string, quoted when one is malformed.
const EXAMPLE: &str = "max_split_size_mb:128,expandable_segments:True";

const KNOWN_KEYS: &str = "backend, max_split_size_mb, max_non_split_rounding_mb, \
roundup_power2_divisions, garbage_collection_threshold, expandable_segments, \
large_segment_size_mb, release_lock_on_cudamalloc, pinned_use_cuda_host_register, \
pinned_num_register_threads, pinned_use_background_threads, pinned_reserve_segment_size_mb, \
graph_capture_record_stream_reuse";

impl TorchSettings {
    /// The `max_non_split_rounding` PyTorch uses when it is not given: 20 MiB, or the segment
    /// size when `large_segment_size_mb` is larger.
    pub fn default_rounding(&self) -> u64 {
        DEFAULT_NON_SPLIT_ROUNDING.max(self.large_segment_size)
    }
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
        let mut rounding_given = false;
        for (key, value) in split_options(conf, EXAMPLE)? {
            settings.apply(&key, &value)?;
            rounding_given |= key == "max_non_split_rounding_mb";
        }
        // As PyTorch's allocator config: the rounding follows the segment size unless given,
        // and neither threshold may be below the segment size, whatever the order of the keys.
        if !rounding_given {
            settings.max_non_split_rounding = settings.default_rounding();
        }
        let segment = settings.large_segment_size;
        for (key, bytes) in [
            ("max_split_size_mb", settings.max_split_size),
            ("max_non_split_rounding_mb", settings.max_non_split_rounding),
        ] {
            if bytes < segment {
                return Err(ConfigError {
                    source_name: key.to_string(),
                    value: format_scaled(bytes, MB),
                    problem: format!(
                        "below large_segment_size_mb ({})",
                        format_scaled(segment, MB)
                    ),
                    accepted: format!(
                        "at least large_segment_size_mb, {} here (PyTorch refuses less)",
                        format_scaled(segment, MB)
                    ),
                });
            }
        }
        Ok(settings)
    }

    /// The settings in `PYTORCH_CUDA_ALLOC_CONF` syntax, `expandable_segments` first and
    /// options at PyTorch's defaults left out: a line PyTorch's parser accepts and
    /// [`TorchSettings::parse`] reads back to these settings (sizes are whole MiB in every
    /// parsed setting).
    pub fn conf(&self) -> String {
        let default = TorchSettings::default();
        let flag = if self.expandable_segments {
            "True"
        } else {
            "False"
        };
        let mut options = vec![format!("expandable_segments:{flag}")];
        if self.max_split_size != default.max_split_size {
            let mb = format_scaled(self.max_split_size, MB);
            options.push(format!("max_split_size_mb:{mb}"));
        }
        if self.max_non_split_rounding != self.default_rounding() {
            let mb = format_scaled(self.max_non_split_rounding, MB);
            options.push(format!("max_non_split_rounding_mb:{mb}"));
        }
        if self.large_segment_size != default.large_segment_size {
            let mb = format_scaled(self.large_segment_size, MB);
            options.push(format!("large_segment_size_mb:{mb}"));
        }
        if let Some(threshold) = self.garbage_collection_threshold {
            options.push(format!("garbage_collection_threshold:{threshold}"));
        }
        if self.roundup_power2_divisions != default.roundup_power2_divisions {
            let divisions = divisions_conf(&self.roundup_power2_divisions);
            options.push(format!("roundup_power2_divisions:{divisions}"));
        }
        options.join(",")
    }

    fn apply(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let err = |problem: &str, accepted: &str| ConfigError {
            source_name: key.to_string(),
            value: value.to_string(),
            problem: problem.to_string(),
            accepted: accepted.to_string(),
        };
        let mib_at_least_20 = || parse_scaled(key, value, MB, 20, None);
        match key {
            "backend" => match value {
                "native" => {}
                "cudaMallocAsync" => {
                    return Err(err(
                        "the cudaMallocAsync backend is the driver's pool, not a placement policy gpumem reproduces",
                        "native",
                    ))
                }
                _ => {
                    return Err(err(
                        "unknown backend",
                        "native (PyTorch's other backend, cudaMallocAsync, is the driver's pool and not reproduced)",
                    ))
                }
            },
            "max_split_size_mb" => self.max_split_size = mib_at_least_20()?,
            "max_non_split_rounding_mb" => {
                self.max_non_split_rounding = mib_at_least_20()?
            }
            "large_segment_size_mb" => {
                // PyTorch: "must be > 10 MB".
                self.large_segment_size = parse_scaled(key, value, MB, 11, None)?
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

/// A divisions table in PyTorch's syntax, compactly: one number when every interval has the
/// same, else the intervals from the first change to the last, then `>` for the rest.
fn divisions_conf(table: &[u64; ROUNDUP_INTERVALS]) -> String {
    let first_end = table.iter().position(|&d| d != table[0]);
    let Some(first_end) = first_end else {
        return table[0].to_string();
    };
    let last = table[ROUNDUP_INTERVALS - 1];
    let last_start = (0..ROUNDUP_INTERVALS)
        .rev()
        .find(|&i| table[i] != last)
        .map_or(0, |i| i + 1);
    let mut entries: Vec<String> = (first_end - 1..last_start)
        .map(|i| format!("{}:{}", 1u64 << i, table[i]))
        .collect();
    entries.push(format!(">:{last}"));
    format!("[{}]", entries.join(","))
}

fn parse_divisions(value: &str) -> Result<[u64; ROUNDUP_INTERVALS], String> {
    let power_of_two = |text: &str| -> Result<u64, String> {
        let v: u64 = text
            .parse()
            .map_err(|_| format!("{text:?} is not a whole number"))?;
        if !v.is_power_of_two() {
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
    fn settings_are_written_in_the_syntax_they_are_parsed_from() {
        let conf = "max_split_size_mb:128,max_non_split_rounding_mb:64,\
            roundup_power2_divisions:[1:1,2:2,4:4,8:4,16:4,32:4,64:4,128:4,256:4,512:4,1024:4,\
            2048:4,4096:4,8192:4,16384:4,>:8],garbage_collection_threshold:0.6,\
            expandable_segments:True,large_segment_size_mb:40";
        let s = TorchSettings::parse(conf).unwrap();
        assert_eq!(
            s.conf(),
            "expandable_segments:True,max_split_size_mb:128,max_non_split_rounding_mb:64,\
             large_segment_size_mb:40,garbage_collection_threshold:0.6,\
             roundup_power2_divisions:[1:1,2:2,4:4,8:4,16:4,32:4,64:4,128:4,256:4,512:4,\
             1024:4,2048:4,4096:4,8192:4,16384:4,>:8]"
        );
        assert_eq!(TorchSettings::parse(&s.conf()).unwrap(), s);
        assert_eq!(TorchSettings::default().conf(), "expandable_segments:False");
        let mut table = [1; ROUNDUP_INTERVALS];
        table[5] = 8;
        table[8] = 2;
        assert_eq!(divisions_conf(&table), "[16:1,32:8,64:1,128:1,256:2,>:1]");
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
            (
                "backend:foo",
                "accepted: native (PyTorch's other backend, cudaMallocAsync, is",
            ),
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
