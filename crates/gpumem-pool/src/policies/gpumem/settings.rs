//! The gpumem policy's tuned settings, parsed from the `GPUMEM_POLICY_CONF` syntax — the one
//! `PYTORCH_ALLOC_CONF` uses, `key:value,key:value`, with the unit in the key (`_mb`, `_kb`).
//! Every default is the value measurements chose (see each field, and
//! `docs/gpumem-policy.md`); the rest are PyTorch's segment sizes, used without VMM.

use crate::config::ConfigError;
use crate::policies::options::{
    check_scaled, format_scaled, parse_scaled, split_options, OptionUnit, KB, MB,
};

const MIB: u64 = 1 << 20;
const KIB: u64 = 1 << 10;

/// The tuning knobs of the `gpumem` policy. Sizes are in bytes; the option keys give them in
/// KB or MB (binary units, as PyTorch's options do).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpumemSettings {
    /// A block at least this large that needs fresh pages takes idle chunks of its own arena
    /// first, even without pressure (the moved chunks' old range leaves the index for good, so
    /// this happens once, not every step): for logits and their gradients, larger than any
    /// hole and arriving while activations' pages sit idle. Key `stitch_on_growth_min_mb`
    /// (0: every block), default 128 MiB. Measured: applied to every size, it displaces blocks
    /// whose new places cost device calls for more steps (calls in the repeated steps of
    /// several synthetic traces, 1 on GPT-2 inference); from 64 or 96 MiB the synthetic
    /// checkpointing trace's 147 MiB embedding gradient wanders from step to step (1 call in a
    /// repeated step); from 160 MiB that trace drops to 95.0 % utilisation. The real traces'
    /// big blocks (147, 196, 250 MiB) are above 128 MiB, the synthetic growing batch's logits
    /// (24–96 MiB) below it.
    pub stitch_on_growth_min: u64,
    /// A smaller block that needs fresh pages takes idle chunks of its own arena only from
    /// leftover holes: free ranges at most `1 / stitch_hole_divisor` of the bytes its pages
    /// span that are not exactly one freed block (those are the holes a repeated request of
    /// the same size refills; retiring their chunks would displace it, and it would displace
    /// the next, step after step). Key `stitch_hole_divisor` (0: never), default 16. With 2 MiB
    /// chunks only blocks of 32 MiB and more can take any. Measured (2026-11-28): it takes the
    /// H200 GPT-2 snapshot from 96.6 to 97.5 % (its 64 MiB logits take 2 idle pages of 3.2
    /// and 3.5 MiB holes); the synthetic checkpointing trace keeps 97.3 % and 0 calls per
    /// repeated step. Without the whole-block rule the H200 logits stitch one page a step for
    /// ever (the page is the first of a 3.98 MiB hole whose block then moves into the logits'
    /// range, shifting them a page). A narrow window: with 8 checkpointing makes 10 calls per
    /// repeated step, with 32 the H200 snapshot stays at 96.6 %; 0 is the policy before.
    pub stitch_hole_divisor: u64,
    /// Bytes of address space each paged arena reserves per byte of device memory. Key
    /// `va_per_device_byte`, 1 to 64, default 4. Not measured, a margin: address space is
    /// cheap, and four times the device means that however the ranges fragment, physical
    /// memory runs out before addresses do (if they ever run out, the ranges retired by
    /// stitching return to the index).
    pub va_per_device_byte: u64,
    /// With VMM, small-pool requests up to this size are packed into slabs; larger ones go to
    /// the stream's large arena like any block. Key `slab_max_request_kb`, 1 to 1024, default
    /// 64 KiB. Tiny blocks (norm weights, scalars, index tensors) would leave sub-page holes
    /// between large blocks; requests of 64 KiB – 1 MiB (KV-cache slices, biases) fill such
    /// holes better than they fill slabs. Measured against every request ≤ 1 MiB in 2 MiB
    /// slabs: ResNet-50 95.4 → 97.4 %, TinyLlama generate 96.1 → 98.2 %, GPT-2 124M
    /// 99.4 → 99.8 % utilisation; limits of 128, 256 and 512 KiB were each worse on one of
    /// the first two.
    pub slab_max_request: u64,
    /// With VMM, the slab tiny blocks are packed into: a block of the stream's large arena,
    /// handed back once empty. Key `slab_size_kb`, at least `slab_max_request_kb`, default
    /// 1 MiB. Measured: 2 MiB slabs (with the 64 KiB limit) left the small GPT-2 inference
    /// trace at 94.4 % utilisation, 1 MiB slabs reach 97.3 %.
    pub slab_size: u64,
    /// The largest physical chunk mapped at once, in pages (granularity units: 2 MiB each on
    /// current GPUs). Larger chunks save device calls when growing; smaller ones can be moved
    /// or freed as soon as that much of a free range is idle. Key `max_chunk_pages`, at least
    /// 1, default 2. Measured with 16 / 8 / 4 / 2 pages: the checkpointed GPT-2 trace reaches
    /// 92.1 / 95.4 / 97.1 / 98.0 % utilisation for 146 / 194 / 296 / 496 device calls in all
    /// (all in warm-up); the other real traces change by at most 1.5 points, upwards, as chunks
    /// shrink, and their warm-up calls grow (GPT-2 124M: 1115 / 1197 / 1497 / 2045).
    pub max_chunk_pages: u64,
    /// Without VMM, the segment small-pool requests (≤ 1 MiB) are placed in. Key
    /// `small_segment_mb`, at least 1, default 2 MiB: PyTorch's `kSmallBuffer`, not measured
    /// here (without VMM the policy aims at PyTorch-like utilisation).
    pub small_segment: u64,
    /// Without VMM, the segment large-pool requests below `large_request` are placed in. Key
    /// `mid_segment_mb`, at least `large_request_mb`, default 20 MiB: PyTorch's
    /// `kLargeBuffer`, not measured here.
    pub mid_segment: u64,
    /// Without VMM, requests from this size get a segment of their own size, rounded to
    /// `segment_rounding`. Key `large_request_mb`, at least 1, default 10 MiB: PyTorch's
    /// `kMinLargeAlloc`, not measured here.
    pub large_request: u64,
    /// Without VMM, the rounding of the segments of large requests. Key
    /// `segment_rounding_mb`, at least 1, default 2 MiB: PyTorch's `kRoundLarge`, not
    /// measured here.
    pub segment_rounding: u64,
}

impl Default for GpumemSettings {
    fn default() -> Self {
        GpumemSettings {
            stitch_on_growth_min: 128 * MIB,
            stitch_hole_divisor: 16,
            va_per_device_byte: 4,
            slab_max_request: 64 * KIB,
            slab_size: MIB,
            max_chunk_pages: 2,
            small_segment: 2 * MIB,
            mid_segment: 20 * MIB,
            large_request: 10 * MIB,
            segment_rounding: 2 * MIB,
        }
    }
}

/// One option: its key, unit, range (in units) and field.
struct Knob {
    key: &'static str,
    unit: OptionUnit,
    min: u64,
    max: Option<u64>,
    field: fn(&mut GpumemSettings) -> &mut u64,
}

impl Knob {
    /// The option's value in `settings`.
    fn get(&self, settings: &GpumemSettings) -> u64 {
        let mut copy = *settings;
        *(self.field)(&mut copy)
    }
}

/// A count of pages.
const PAGES: OptionUnit = OptionUnit {
    name: "pages",
    scale: 1,
};

/// A divisor of a block's size.
const DIVISOR: OptionUnit = OptionUnit {
    name: "divisor",
    scale: 1,
};

/// A ratio of address space to device memory.
const PER_DEVICE_BYTE: OptionUnit = OptionUnit {
    name: "bytes per device byte",
    scale: 1,
};

/// Every option, in the order [`GpumemSettings::options`] lists them.
const KNOBS: [Knob; 10] = [
    Knob {
        key: "stitch_on_growth_min_mb",
        unit: MB,
        min: 0,
        max: None,
        field: |s| &mut s.stitch_on_growth_min,
    },
    Knob {
        key: "stitch_hole_divisor",
        unit: DIVISOR,
        min: 0,
        max: None,
        field: |s| &mut s.stitch_hole_divisor,
    },
    Knob {
        key: "va_per_device_byte",
        unit: PER_DEVICE_BYTE,
        min: 1,
        max: Some(64),
        field: |s| &mut s.va_per_device_byte,
    },
    Knob {
        key: "slab_max_request_kb",
        unit: KB,
        min: 1,
        max: Some(1024),
        field: |s| &mut s.slab_max_request,
    },
    Knob {
        key: "slab_size_kb",
        unit: KB,
        min: 1,
        max: None,
        field: |s| &mut s.slab_size,
    },
    Knob {
        key: "max_chunk_pages",
        unit: PAGES,
        min: 1,
        max: None,
        field: |s| &mut s.max_chunk_pages,
    },
    Knob {
        key: "small_segment_mb",
        unit: MB,
        min: 1,
        max: None,
        field: |s| &mut s.small_segment,
    },
    Knob {
        key: "mid_segment_mb",
        unit: MB,
        min: 1,
        max: None,
        field: |s| &mut s.mid_segment,
    },
    Knob {
        key: "large_request_mb",
        unit: MB,
        min: 1,
        max: None,
        field: |s| &mut s.large_request,
    },
    Knob {
        key: "segment_rounding_mb",
        unit: MB,
        min: 1,
        max: None,
        field: |s| &mut s.segment_rounding,
    },
];

/// The options that size PyTorch-like segments, which the policy uses only on a device without
/// virtual-memory management (VMM); with VMM it maps pages and never reads them.
const WITHOUT_VMM_KEYS: [&str; 4] = [
    "small_segment_mb",
    "mid_segment_mb",
    "large_request_mb",
    "segment_rounding_mb",
];

/// A valid settings string, quoted when one is malformed.
const EXAMPLE: &str = "slab_max_request_kb:32,max_chunk_pages:4";

impl GpumemSettings {
    /// Parses a `GPUMEM_POLICY_CONF` string (`key:value` pairs separated by commas; keys not
    /// given keep their defaults) and validates the result. Errors name the option, its value,
    /// the problem and the accepted forms.
    pub fn parse(conf: &str) -> Result<GpumemSettings, ConfigError> {
        Self::parse_for(conf, false)
    }

    /// [`parse`](Self::parse) for a device known to have VMM (a replay's): an option that sizes
    /// segments, read only without VMM, would change nothing there, so it is refused rather
    /// than ignored.
    pub fn parse_for_vmm(conf: &str) -> Result<GpumemSettings, ConfigError> {
        Self::parse_for(conf, true)
    }

    fn parse_for(conf: &str, vmm: bool) -> Result<GpumemSettings, ConfigError> {
        let mut settings = GpumemSettings::default();
        for (key, value) in split_options(conf, EXAMPLE)? {
            if vmm && WITHOUT_VMM_KEYS.contains(&key.as_str()) {
                return Err(ConfigError {
                    source_name: key,
                    value,
                    problem: "sizes segments only on a device without VMM, and this one maps \
                              pages (a replay's device has VMM, as every GPU since Pascal)"
                        .into(),
                    accepted: KNOBS
                        .map(|knob| knob.key)
                        .into_iter()
                        .filter(|key| !WITHOUT_VMM_KEYS.contains(key))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            let knob = KNOBS
                .iter()
                .find(|knob| knob.key == key)
                .ok_or_else(|| ConfigError {
                    source_name: key.clone(),
                    value: value.clone(),
                    problem: "unknown option".into(),
                    accepted: KNOBS.map(|knob| knob.key).join(", "),
                })?;
            *(knob.field)(&mut settings) =
                parse_scaled(&key, &value, knob.unit, knob.min, knob.max)?;
        }
        settings.validate()?;
        Ok(settings)
    }

    /// Checks every setting against its range, and the two that bound others: a slab holds the
    /// largest request it serves, and the mid-size segment the largest request below
    /// `large_request`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for knob in &KNOBS {
            check_scaled(knob.key, knob.get(self), knob.unit, knob.min, knob.max)?;
        }
        let at_least = |key: &str, value: u64, unit: OptionUnit, other: &str, bound: u64| {
            if value >= bound {
                return Ok(());
            }
            let bound = format_scaled(bound, unit);
            Err(ConfigError {
                source_name: key.to_string(),
                value: format_scaled(value, unit),
                problem: format!("smaller than {other} ({bound} {})", unit.name),
                accepted: format!("an integer ≥ {other} ({})", unit.name),
            })
        };
        at_least(
            "slab_size_kb",
            self.slab_size,
            KB,
            "slab_max_request_kb",
            self.slab_max_request,
        )?;
        at_least(
            "mid_segment_mb",
            self.mid_segment,
            MB,
            "large_request_mb",
            self.large_request,
        )
    }

    /// The settings as (option, value) pairs in `GPUMEM_POLICY_CONF` syntax, for display:
    /// joined as `key:value` with commas, they parse back to these settings.
    pub fn options(&self) -> Vec<(&'static str, String)> {
        KNOBS
            .iter()
            .map(|knob| (knob.key, format_scaled(knob.get(self), knob.unit)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(conf: &str) -> ConfigError {
        GpumemSettings::parse(conf).unwrap_err()
    }

    #[test]
    fn defaults_are_the_measured_values() {
        let s = GpumemSettings::default();
        assert_eq!(s.stitch_on_growth_min, 128 << 20);
        assert_eq!(s.stitch_hole_divisor, 16);
        assert_eq!(s.va_per_device_byte, 4);
        assert_eq!(s.slab_max_request, 64 << 10);
        assert_eq!(s.slab_size, 1 << 20);
        assert_eq!(s.max_chunk_pages, 2);
        assert_eq!(
            (
                s.small_segment,
                s.mid_segment,
                s.large_request,
                s.segment_rounding
            ),
            (2 << 20, 20 << 20, 10 << 20, 2 << 20)
        );
        assert_eq!(GpumemSettings::parse("").unwrap(), s);
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn every_key_round_trips() {
        let conf = "stitch_on_growth_min_mb:96,stitch_hole_divisor:8,va_per_device_byte:2,slab_max_request_kb:32,\
            slab_size_kb:512,max_chunk_pages:4,small_segment_mb:4,mid_segment_mb:16,\
            large_request_mb:8,segment_rounding_mb:1";
        let s = GpumemSettings::parse(conf).unwrap();
        assert_eq!(
            s,
            GpumemSettings {
                stitch_on_growth_min: 96 << 20,
                stitch_hole_divisor: 8,
                va_per_device_byte: 2,
                slab_max_request: 32 << 10,
                slab_size: 512 << 10,
                max_chunk_pages: 4,
                small_segment: 4 << 20,
                mid_segment: 16 << 20,
                large_request: 8 << 20,
                segment_rounding: 1 << 20,
            }
        );
        let shown: Vec<String> = s
            .options()
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        assert_eq!(shown.join(","), conf.replace(' ', ""));
        assert_eq!(GpumemSettings::parse(&shown.join(",")).unwrap(), s);
    }

    #[test]
    fn an_unknown_key_is_named_with_the_known_ones() {
        let e = error("max_chunk_pages:4,slab_kb:512");
        assert_eq!(
            (e.source_name.as_str(), e.value.as_str()),
            ("slab_kb", "512")
        );
        assert_eq!(e.problem, "unknown option");
        assert!(e.accepted.contains("slab_size_kb"), "{e}");
    }

    #[test]
    fn a_bad_value_is_named_with_its_key() {
        let e = error("max_chunk_pages:two");
        assert_eq!(
            (e.source_name.as_str(), e.value.as_str()),
            ("max_chunk_pages", "two")
        );
        assert!(e.problem.contains("not a whole number of pages"), "{e}");
        let e = error("slab_max_request_kb:32,,max_chunk_pages");
        assert!(e.problem.contains("missing ':'"), "{e}");
        assert!(e.accepted.contains(EXAMPLE), "{e}");
    }

    #[test]
    fn out_of_range_values_are_named_with_the_range() {
        for (conf, key, value, needle) in [
            (
                "max_chunk_pages:0",
                "max_chunk_pages",
                "0",
                "at least 1 pages",
            ),
            (
                "slab_max_request_kb:2048",
                "slab_max_request_kb",
                "2048",
                "at most 1024 KB",
            ),
            (
                "va_per_device_byte:0",
                "va_per_device_byte",
                "0",
                "at least 1",
            ),
            (
                "segment_rounding_mb:0",
                "segment_rounding_mb",
                "0",
                "at least 1 MB",
            ),
            (
                "slab_max_request_kb:512,slab_size_kb:256",
                "slab_size_kb",
                "256",
                "smaller than slab_max_request_kb (512 KB)",
            ),
            (
                "large_request_mb:32",
                "mid_segment_mb",
                "20",
                "smaller than large_request_mb (32 MB)",
            ),
        ] {
            let e = error(conf);
            assert_eq!(
                (e.source_name.as_str(), e.value.as_str()),
                (key, value),
                "{e}"
            );
            assert!(e.problem.contains(needle), "{conf}: {e}");
        }
        let built = GpumemSettings {
            max_chunk_pages: 0,
            ..GpumemSettings::default()
        };
        assert_eq!(built.validate().unwrap_err().source_name, "max_chunk_pages");
    }
}
