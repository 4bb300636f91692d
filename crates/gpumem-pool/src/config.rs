//! Pool configuration, from the library API or from the environment.
//!
//! Environment variables (read by [`PoolConfig::from_env`]):
//! - `GPUMEM_POOL` = `none` | `torch` | `expandable` | `gpumem` (default `expandable`, which needs a
//!   device with virtual memory management);
//! - `GPUMEM_SOFT_LIMIT`: cached memory above it is released at synchronisation points;
//! - `GPUMEM_HARD_LIMIT`: reserved memory never exceeds it; an allocation beyond it is an OOM;
//! - `GPUMEM_HISTORY`: number of events to record for snapshots (0 or unset: off);
//! - `GPUMEM_POLICY_CONF`: the `gpumem` policy's settings ([`GpumemSettings::parse`]);
//! - `PYTORCH_ALLOC_CONF`, or its older name `PYTORCH_CUDA_ALLOC_CONF`: PyTorch's allocator
//!   options, read by the `torch` and `expandable` policies.
//!
//! A malformed value is an error that names the variable, the value and the accepted forms.

use std::fmt;
use std::str::FromStr;

use crate::policies::torch_settings::TorchSettings;
use crate::policies::GpumemSettings;
use crate::size::{parse_limit, Bytes, Limit, ACCEPTED_SIZE_FORMS};

/// A built-in placement policy. Outside policies need no kind: they are passed to
/// [`crate::Pool::with_policy`] as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyKind {
    /// No caching: every allocation is a device allocation, every free a device free.
    None,
    /// PyTorch's native caching allocator policy (the compatibility baseline).
    Torch,
    /// PyTorch's policy with expandable segments over virtual-memory mapping (the default:
    /// the policy that passed the GPU checks with PyTorch's own figures).
    Expandable,
    /// gpumem's own policy.
    Gpumem,
}

/// The one table of built-in policies, in [`PolicyKind`] declaration order: the name used in
/// `GPUMEM_POOL` and on the command line, and what the policy is. Parsing, listing, help text
/// and error messages all read it.
const BUILT_IN: [(PolicyKind, &str, &str); 4] = [
    (
        PolicyKind::None,
        "none",
        "no caching: every allocation and free goes to the device",
    ),
    (
        PolicyKind::Torch,
        "torch",
        "PyTorch's caching allocator, faithfully (its options: PYTORCH_ALLOC_CONF in a process, --pytorch-alloc-conf in a replay)",
    ),
    (
        PolicyKind::Expandable,
        "expandable",
        "PyTorch's allocator with expandable_segments:True (default; needs VMM)",
    ),
    (
        PolicyKind::Gpumem,
        "gpumem",
        "gpumem's own policy: TLSF over per-stream VA, pages mapped on demand",
    ),
];

const _: () = {
    // The table is indexed by `kind as usize`: its order must be the declaration order.
    let mut i = 0;
    while i < BUILT_IN.len() {
        assert!(BUILT_IN[i].0 as usize == i);
        i += 1;
    }
};

impl PolicyKind {
    /// Every built-in policy, in the order reports list them.
    pub const ALL: [PolicyKind; BUILT_IN.len()] = {
        let mut all = [PolicyKind::None; BUILT_IN.len()];
        let mut i = 0;
        while i < BUILT_IN.len() {
            all[i] = BUILT_IN[i].0;
            i += 1;
        }
        all
    };

    /// The name used in `GPUMEM_POOL` and on the command line.
    pub fn as_str(self) -> &'static str {
        BUILT_IN[self as usize].1
    }

    /// One line saying what the policy is, for help texts.
    pub fn description(self) -> &'static str {
        BUILT_IN[self as usize].2
    }

    /// Every name, comma-separated: what `GPUMEM_POOL` and `--policy` accept.
    pub fn names() -> String {
        BUILT_IN.map(|entry| entry.1).join(", ")
    }

    /// One line per policy, `name: description`, for `--help`.
    pub fn help() -> String {
        BUILT_IN
            .map(|(_, name, what)| format!("{name}: {what}"))
            .join("\n")
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyKind {
    type Err = String;

    /// Parses a policy name; the error lists the accepted names.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BUILT_IN
            .iter()
            .find(|entry| entry.1 == s.trim())
            .map(|entry| entry.0)
            .ok_or_else(|| format!("one of {}", PolicyKind::names()))
    }
}

/// What the pool frame itself is configured with, whatever the policy: limits and history.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolOptions {
    /// Cached memory above this is released at synchronisation points.
    pub soft_limit: Option<Limit>,
    /// Reserved memory never exceeds this.
    pub hard_limit: Option<Limit>,
    /// Events to keep in the history ring (0: recording off).
    pub history_capacity: usize,
}

/// Everything that shapes a pool built from a built-in policy.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolConfig {
    /// The placement policy.
    pub policy: PolicyKind,
    /// PyTorch allocator options, used by the `torch` and `expandable` policies.
    pub torch: TorchSettings,
    /// The `gpumem` policy's settings.
    pub gpumem: GpumemSettings,
    /// Limits and history.
    pub options: PoolOptions,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            policy: PolicyKind::Expandable,
            torch: TorchSettings::default(),
            gpumem: GpumemSettings::default(),
            options: PoolOptions::default(),
        }
    }
}

/// A configuration value that could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}={value:?} is not valid: {problem}; accepted: {accepted}")]
pub struct ConfigError {
    /// The variable or option that held the value, e.g. `GPUMEM_HARD_LIMIT`.
    pub source_name: String,
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
    /// The forms that would be accepted.
    pub accepted: String,
}

impl PoolConfig {
    /// The configuration given by the process environment.
    pub fn from_env() -> Result<PoolConfig, ConfigError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The configuration given by `lookup` (a variable name → its value), so that callers and
    /// tests can supply the environment themselves.
    pub fn from_vars(lookup: impl Fn(&str) -> Option<String>) -> Result<PoolConfig, ConfigError> {
        let mut config = PoolConfig::default();
        if let Some(value) = lookup("GPUMEM_POOL") {
            config.policy = value.parse().map_err(|accepted| ConfigError {
                source_name: "GPUMEM_POOL".into(),
                problem: "unknown pool policy".into(),
                value: value.clone(),
                accepted,
            })?;
        }
        config.options.soft_limit = limit_var(&lookup, "GPUMEM_SOFT_LIMIT")?;
        config.options.hard_limit = limit_var(&lookup, "GPUMEM_HARD_LIMIT")?;
        if let Some(value) = lookup("GPUMEM_HISTORY") {
            config.options.history_capacity = value.trim().parse().map_err(|_| ConfigError {
                source_name: "GPUMEM_HISTORY".into(),
                value: value.clone(),
                problem: "not a whole number".into(),
                accepted: "a number of events to record, 0 for none".into(),
            })?;
        }
        if let Some(value) = lookup("GPUMEM_POLICY_CONF") {
            config.gpumem = GpumemSettings::parse(&value).map_err(|mut e| {
                e.source_name = format!("GPUMEM_POLICY_CONF option {}", e.source_name);
                e
            })?;
        }
        for name in ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"] {
            if let Some(value) = lookup(name) {
                config.torch = TorchSettings::parse(&value).map_err(|mut e| {
                    e.source_name = format!("{name} option {}", e.source_name);
                    e
                })?;
                break;
            }
        }
        config.options.validate()?;
        Ok(config)
    }
}

impl PoolOptions {
    /// Checks what can be checked without knowing the device: a soft limit above a hard limit
    /// of the same kind (both absolute, or both percentages).
    pub fn validate(&self) -> Result<(), ConfigError> {
        match (self.soft_limit, self.hard_limit) {
            (Some(Limit::Bytes(_)), Some(Limit::Bytes(_)))
            | (Some(Limit::Fraction(_)), Some(Limit::Fraction(_))) => {
                // The device size does not change the comparison of limits of one kind.
                let on_any = |limit: Option<Limit>| limit.map(|l| l.resolve(1 << 40));
                self.check_order(on_any(self.soft_limit), on_any(self.hard_limit))
            }
            _ => Ok(()),
        }
    }

    /// The soft and hard limits in bytes on a device of `total` bytes; an error if either is
    /// 0 bytes there (a percentage too small for the device) or the soft limit is above the
    /// hard one.
    pub fn resolve_limits(&self, total: u64) -> Result<(Option<u64>, Option<u64>), ConfigError> {
        let soft = resolve_limit("soft limit", self.soft_limit, total)?;
        let hard = resolve_limit("hard limit", self.hard_limit, total)?;
        self.check_order(soft, hard)?;
        Ok((soft, hard))
    }

    /// An error if the soft limit, resolved to `soft` bytes, is above the hard one (`hard`).
    fn check_order(&self, soft: Option<u64>, hard: Option<u64>) -> Result<(), ConfigError> {
        if let (Some(soft_limit), Some(hard_limit)) = (self.soft_limit, self.hard_limit) {
            if soft > hard {
                // Named as the caller wrote them, whether from the environment or a call.
                return Err(ConfigError {
                    source_name: "soft limit".into(),
                    value: soft_limit.to_string(),
                    problem: format!("above the hard limit {hard_limit}"),
                    accepted: "a soft limit no larger than the hard limit".into(),
                });
            }
        }
        Ok(())
    }
}

/// `limit` (the `name`d one) in bytes on a device of `total` bytes; an error if that is 0.
fn resolve_limit(name: &str, limit: Option<Limit>, total: u64) -> Result<Option<u64>, ConfigError> {
    let Some(limit) = limit else {
        return Ok(None);
    };
    match limit.resolve(total) {
        0 => Err(ConfigError {
            source_name: name.into(),
            value: limit.to_string(),
            problem: format!("0 bytes on a device of {}", Bytes(total)),
            accepted: "a limit of at least 1 byte (a larger percentage, or a byte count)".into(),
        }),
        bytes => Ok(Some(bytes)),
    }
}

fn limit_var(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<Limit>, ConfigError> {
    let Some(value) = lookup(name) else {
        return Ok(None);
    };
    parse_limit(&value).map(Some).map_err(|e| ConfigError {
        source_name: name.into(),
        value: value.clone(),
        problem: e.reason,
        accepted: ACCEPTED_SIZE_FORMS.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Result<PoolConfig, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        PoolConfig::from_vars(|name| map.get(name).cloned())
    }

    #[test]
    fn reads_policy_and_limits() {
        let c = from(&[
            ("GPUMEM_POOL", "torch"),
            ("GPUMEM_SOFT_LIMIT", "50%"),
            ("GPUMEM_HARD_LIMIT", "2GiB"),
            ("GPUMEM_HISTORY", "1000"),
        ])
        .unwrap();
        assert_eq!(c.policy, PolicyKind::Torch);
        assert_eq!(c.options.soft_limit, Some(Limit::Fraction(0.5)));
        assert_eq!(c.options.hard_limit, Some(Limit::Bytes(2 << 30)));
        assert_eq!(c.options.history_capacity, 1000);
        assert_eq!(from(&[]).unwrap(), PoolConfig::default());
        let c = from(&[(
            "GPUMEM_POLICY_CONF",
            "slab_max_request_kb:32,max_chunk_pages:4",
        )])
        .unwrap();
        assert_eq!(c.gpumem.slab_max_request, 32 << 10);
        assert_eq!(c.gpumem.max_chunk_pages, 4);
    }

    #[test]
    fn bad_values_name_variable_value_and_forms() {
        let e = from(&[("GPUMEM_POOL", "cuda")]).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("GPUMEM_POOL") && text.contains("\"cuda\""),
            "{text}"
        );
        assert!(text.contains("none, torch, expandable, gpumem"), "{text}");

        let e = from(&[("GPUMEM_HARD_LIMIT", "12 bananas")]).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("GPUMEM_HARD_LIMIT") && text.contains("KiB/MiB/GiB"),
            "{text}"
        );

        let e = from(&[("GPUMEM_SOFT_LIMIT", "3G"), ("GPUMEM_HARD_LIMIT", "2G")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "soft limit=\"2.79 GiB\" is not valid: above the hard limit 1.86 GiB; \
             accepted: a soft limit no larger than the hard limit"
        );
        let e = from(&[("GPUMEM_SOFT_LIMIT", "70%"), ("GPUMEM_HARD_LIMIT", "55%")]).unwrap_err();
        assert!(
            e.to_string()
                .contains("\"70%\" is not valid: above the hard limit 55%"),
            "{e}"
        );

        // Fractional bytes are refused, not rounded.
        let e = from(&[("GPUMEM_HARD_LIMIT", "0.5B")]).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "GPUMEM_HARD_LIMIT=\"0.5B\" is not valid: not a whole number of bytes"
            ),
            "{e}"
        );

        let e = from(&[("GPUMEM_HISTORY", "lots")]).unwrap_err();
        assert!(e.to_string().contains("GPUMEM_HISTORY"), "{e}");

        let e = from(&[("GPUMEM_POLICY_CONF", "slab_max_request_kb:lots")]).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("GPUMEM_POLICY_CONF option slab_max_request_kb") && text.contains("lots"),
            "{text}"
        );
    }

    #[test]
    fn a_percentage_that_is_0_bytes_on_the_device_is_refused() {
        // Accepted without a device; refused where it is resolved.
        let c = from(&[
            ("GPUMEM_SOFT_LIMIT", "0.00000000001%"),
            ("GPUMEM_HARD_LIMIT", "0.0000000001%"),
        ])
        .unwrap();
        let e = c.options.resolve_limits(80 << 30).unwrap_err();
        assert_eq!(
            e.to_string(),
            "soft limit=\"0.00000000001%\" is not valid: 0 bytes on a device of 80.00 GiB; \
             accepted: a limit of at least 1 byte (a larger percentage, or a byte count)"
        );
        let hard_only = PoolOptions {
            soft_limit: None,
            ..c.options.clone()
        };
        let e = hard_only.resolve_limits(80 << 30).unwrap_err();
        assert_eq!(e.source_name, "hard limit");
        assert_eq!(e.value, "0.0000000001%");
        // On a device large enough for a byte, it is one.
        assert_eq!(hard_only.resolve_limits(1 << 40), Ok((None, Some(1))));
    }
}
