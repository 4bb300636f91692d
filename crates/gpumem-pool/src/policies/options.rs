//! The option-string syntax the policies' settings share: PyTorch's `PYTORCH_ALLOC_CONF` form
//! `opt:val,opt2:val2` (whitespace ignored, lists in brackets kept whole), booleans as PyTorch
//! writes them, and whole numbers in a unit checked against a range.

use crate::config::ConfigError;

/// Splits `a:1,b:[x:1,>:2]` into (key, value) pairs, keeping bracketed lists whole. A malformed
/// string is an error whose accepted forms quote `example`, a valid string for the caller's
/// settings.
pub(crate) fn split_options(
    conf: &str,
    example: &str,
) -> Result<Vec<(String, String)>, ConfigError> {
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
    let malformed = |piece: &str, problem: &str| ConfigError {
        source_name: "settings".into(),
        value: piece.to_string(),
        problem: problem.to_string(),
        accepted: format!("option:value pairs separated by commas, e.g. {example}"),
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

/// A boolean as PyTorch's option parser accepts it.
pub(crate) fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "True" | "true" | "1" => Some(true),
        "False" | "false" | "0" => Some(false),
        _ => None,
    }
}

/// The unit an option's whole number is written in, e.g. `MB` for 2^20 bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OptionUnit {
    /// How the unit is written in messages (`MB`, `KB`, `pages`).
    pub(crate) name: &'static str,
    /// What one of it is worth (2^20 for `MB`; 1 for counts).
    pub(crate) scale: u64,
}

/// Mebibytes, which PyTorch's options call MB.
pub(crate) const MB: OptionUnit = OptionUnit {
    name: "MB",
    scale: 1 << 20,
};

/// Kibibytes, written KB as PyTorch writes mebibytes MB.
pub(crate) const KB: OptionUnit = OptionUnit {
    name: "KB",
    scale: 1 << 10,
};

/// The value of option `key` written as a whole number of `unit` from `min` to `max` (no upper
/// bound when `None`), times the unit's scale. The error names the option, the value, what is
/// wrong and the accepted range.
pub(crate) fn parse_scaled(
    key: &str,
    value: &str,
    unit: OptionUnit,
    min: u64,
    max: Option<u64>,
) -> Result<u64, ConfigError> {
    let err = |problem: String| range_error(key, value, unit, min, max, problem);
    let n: u64 = value
        .parse()
        .map_err(|_| err(format!("not a whole number of {}", unit.name)))?;
    let bytes = n
        .checked_mul(unit.scale)
        .ok_or_else(|| err("too large".into()))?;
    check_scaled(key, bytes, unit, min, max)?;
    Ok(bytes)
}

/// Checks that `bytes`, the value of option `key`, is from `min` to `max` `unit`s (no upper
/// bound when `None`), with the error [`parse_scaled`] gives for it.
pub(crate) fn check_scaled(
    key: &str,
    bytes: u64,
    unit: OptionUnit,
    min: u64,
    max: Option<u64>,
) -> Result<(), ConfigError> {
    let err =
        |problem: String| range_error(key, &format_scaled(bytes, unit), unit, min, max, problem);
    if bytes < min.saturating_mul(unit.scale) {
        return Err(err(format!("{key} must be at least {min} {}", unit.name)));
    }
    if let Some(max) = max.filter(|&max| bytes > max.saturating_mul(unit.scale)) {
        return Err(err(format!("{key} must be at most {max} {}", unit.name)));
    }
    Ok(())
}

/// The error for option `key`'s `value`, which should be from `min` to `max` `unit`s.
fn range_error(
    key: &str,
    value: &str,
    unit: OptionUnit,
    min: u64,
    max: Option<u64>,
    problem: String,
) -> ConfigError {
    ConfigError {
        source_name: key.to_string(),
        value: value.to_string(),
        problem,
        accepted: match max {
            Some(max) => format!("an integer from {min} to {max} ({})", unit.name),
            None => format!("an integer ≥ {min} ({})", unit.name),
        },
    }
}

/// `bytes` written in `unit`: a whole number when it is a multiple of the unit (as every parsed
/// value is), else with three decimals.
pub(crate) fn format_scaled(bytes: u64, unit: OptionUnit) -> String {
    if bytes.is_multiple_of(unit.scale) {
        (bytes / unit.scale).to_string()
    } else {
        format!("{:.3}", bytes as f64 / unit.scale as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_pairs_and_keeps_lists_whole() {
        let pairs = split_options(" a:1, b:[x:1,>:2],,c:True ", "a:1").unwrap();
        let pairs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(pairs, [("a", "1"), ("b", "[x:1,>:2]"), ("c", "True")]);
        let e = split_options("a", "z:9").unwrap_err();
        assert!(e.to_string().contains("missing ':'") && e.accepted.contains("z:9"));
    }

    #[test]
    fn scaled_numbers_are_checked_against_their_range() {
        assert_eq!(parse_scaled("k", "3", MB, 1, Some(4)), Ok(3 << 20));
        for (value, needle) in [
            ("x", "not a whole number of MB"),
            ("0", "k must be at least 1 MB"),
            ("5", "k must be at most 4 MB"),
        ] {
            let e = parse_scaled("k", value, MB, 1, Some(4)).unwrap_err();
            assert_eq!((e.source_name.as_str(), e.value.as_str()), ("k", value));
            assert!(e.problem.contains(needle), "{e}");
            assert_eq!(e.accepted, "an integer from 1 to 4 (MB)");
        }
        let e = parse_scaled("k", &u64::MAX.to_string(), MB, 0, None).unwrap_err();
        assert_eq!(e.problem, "too large");
        let e = check_scaled("k", 5 << 19, MB, 1, Some(2)).unwrap_err();
        assert_eq!(
            (e.value.as_str(), e.problem.as_str()),
            ("2.500", "k must be at most 2 MB")
        );
        assert_eq!(check_scaled("k", 3 << 10, KB, 3, None), Ok(()));
        assert_eq!(format_scaled(3 << 20, MB), "3");
        assert_eq!(format_scaled(3 << 19, MB), "1.500");
    }
}
