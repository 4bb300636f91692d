//! Byte sizes as people write them (`100M`, `1.5GiB`, `50%`) and as messages print them.

use std::fmt;

/// The absolute forms [`parse_limit`] accepts (one literal for both constants below).
macro_rules! byte_forms {
    () => {
        "bytes (e.g. 10000), k/M/G/T with optional B (1000-based, e.g. 100M, 2GB), \
         KiB/MiB/GiB/TiB (1024-based, e.g. 1.5GiB); a fraction of a unit is rounded to whole \
         bytes, plain bytes must be whole"
    };
}

/// The absolute forms [`parse_limit`] accepts, for messages about a size that cannot be a
/// share of a device (a device's capacity).
pub const ACCEPTED_BYTE_FORMS: &str = byte_forms!();

/// Every form [`parse_limit`] accepts, for error messages.
pub const ACCEPTED_SIZE_FORMS: &str =
    concat!(byte_forms!(), ", or a percentage of the device (e.g. 50%)");

/// A memory amount: absolute, or a fraction of the device's total memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// A number of bytes.
    Bytes(u64),
    /// A fraction of device memory in (0, 1].
    Fraction(f64),
}

impl Limit {
    /// The limit in bytes on a device with `total` bytes: 0 for a percentage too small for
    /// it, which [`crate::PoolOptions::resolve_limits`] refuses.
    pub fn resolve(self, total: u64) -> u64 {
        match self {
            Limit::Bytes(b) => b,
            Limit::Fraction(f) => (f * total as f64).round() as u64,
        }
    }
}

/// A limit as it was given: `2.00 GiB` or `50%`.
impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Limit::Bytes(b) => Bytes(b).fmt(f),
            Limit::Fraction(share) => {
                // To 12 significant digits, off the float's last bits: 0.7 shows as 70%, not
                // 70.00000000000001%, and 1e-12 as 0.0000000001%, not 0%.
                let percent = share * 100.0;
                let rounded = format!("{percent:.11e}").parse().unwrap_or(percent);
                write!(f, "{rounded}%")
            }
        }
    }
}

/// Why a size string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct SizeParseError {
    /// What was wrong with it.
    pub reason: String,
}

/// Parses a size as CUDA.jl's memory limits accept it: plain bytes, SI suffixes (`k`, `M`, `G`,
/// `T`, optionally followed by `B`; 1000-based), IEC suffixes (`KiB` … `TiB`; 1024-based),
/// fractions of a unit rounded to the nearest byte (`1.1GiB`; plain bytes must be whole: not
/// `1.5` or `0.5B`), or a percentage of the device (`50%`; [`Limit::resolve`] may make a small
/// one 0 bytes).
pub fn parse_limit(text: &str) -> Result<Limit, SizeParseError> {
    let s = text.trim();
    let fail = |why: &str| SizeParseError {
        reason: format!("{why} in {text:?}"),
    };
    if s.is_empty() {
        return Err(fail("empty size"));
    }
    if let Some(number) = s.strip_suffix('%') {
        let pct: f64 = number
            .trim()
            .parse()
            .map_err(|_| fail("not a number before %"))?;
        if !(pct > 0.0 && pct <= 100.0) {
            return Err(fail("percentage must be in (0, 100]"));
        }
        return Ok(Limit::Fraction(pct / 100.0));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let multiplier: u64 = match unit.trim() {
        "" | "B" => 1,
        "k" | "K" | "kB" | "KB" => 1000,
        "M" | "MB" => 1000u64.pow(2),
        "G" | "GB" => 1000u64.pow(3),
        "T" | "TB" => 1000u64.pow(4),
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        other => return Err(fail(&format!("unknown unit {other:?}"))),
    };
    if number.is_empty() {
        return Err(fail("no number"));
    }
    let bytes = bytes_of(number, multiplier).map_err(fail)?;
    if bytes == 0 {
        return Err(fail("size must be greater than zero"));
    }
    Ok(Limit::Bytes(bytes))
}

/// `number` (decimal digits with an optional `.`) times `multiplier`, computed exactly in
/// decimal and rounded to the nearest byte (half up) where a unit's fraction leaves part of
/// one; an error for a fraction of plain bytes (`multiplier` 1) or a size past `u64`.
fn bytes_of(number: &str, multiplier: u64) -> Result<u64, &'static str> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if fraction.contains('.') || (whole.is_empty() && fraction.is_empty()) {
        return Err("not a number");
    }
    // The product's decimal digits, least significant first.
    let mut product = Vec::with_capacity(number.len() + 20);
    let mut carry = 0u128;
    for digit in whole.bytes().chain(fraction.bytes()).rev() {
        carry += u128::from(digit - b'0') * u128::from(multiplier);
        product.push((carry % 10) as u8);
        carry /= 10;
    }
    while carry > 0 {
        product.push((carry % 10) as u8);
        carry /= 10;
    }
    // Dividing by 10^(digits after the point) drops that many digits; the most significant
    // of them rounds.
    let (dropped, kept) = product.split_at(fraction.len());
    if multiplier == 1 && dropped.iter().any(|&digit| digit != 0) {
        return Err("not a whole number of bytes");
    }
    let round_up = dropped.last().is_some_and(|&digit| digit >= 5);
    kept.iter()
        .rev()
        .try_fold(0u64, |bytes, &digit| {
            bytes.checked_mul(10)?.checked_add(u64::from(digit))
        })
        .and_then(|bytes| bytes.checked_add(u64::from(round_up)))
        .ok_or("size too large")
}

/// Displays a byte count the way PyTorch's OOM message does: `N bytes`, then KiB/MiB/GiB with
/// two decimals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b <= 1024 {
            write!(f, "{b} bytes")
        } else if b <= 1 << 20 {
            write!(f, "{:.2} KiB", b as f64 / 1024.0)
        } else if b <= 1 << 30 {
            write!(f, "{:.2} MiB", b as f64 / (1u64 << 20) as f64)
        } else {
            write!(f, "{:.2} GiB", b as f64 / (1u64 << 30) as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_every_documented_form() {
        assert_eq!(parse_limit("10000"), Ok(Limit::Bytes(10_000)));
        assert_eq!(parse_limit("100M"), Ok(Limit::Bytes(100_000_000)));
        assert_eq!(parse_limit("2GB"), Ok(Limit::Bytes(2_000_000_000)));
        assert_eq!(parse_limit("4k"), Ok(Limit::Bytes(4_000)));
        assert_eq!(parse_limit("4K"), Ok(Limit::Bytes(4_000)));
        assert_eq!(parse_limit("1.5GiB"), Ok(Limit::Bytes(3 << 29)));
        assert_eq!(parse_limit("512 MiB"), Ok(Limit::Bytes(512 << 20)));
        assert_eq!(parse_limit("50%"), Ok(Limit::Fraction(0.5)));
        assert_eq!(Limit::Fraction(0.25).resolve(80 << 30), 20 << 30);
    }

    #[test]
    fn rejects_nonsense_with_a_reason() {
        for bad in [
            "",
            "abc",
            "10X",
            "-5",
            "0",
            "0%",
            "150%",
            "1.2.3G",
            "GiB",
            "99999999999999999999",
        ] {
            let err = parse_limit(bad).unwrap_err();
            assert!(err.reason.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }

    #[test]
    fn fractions_of_a_unit_round_to_whole_bytes() {
        assert_eq!(parse_limit("1.5k"), Ok(Limit::Bytes(1_500)));
        assert_eq!(parse_limit("0.001GB"), Ok(Limit::Bytes(1_000_000)));
        assert_eq!(parse_limit("2.0"), Ok(Limit::Bytes(2)));
        assert_eq!(parse_limit("3.GiB"), Ok(Limit::Bytes(3 << 30)));
        assert_eq!(parse_limit(".5KiB"), Ok(Limit::Bytes(512)));
        // 2^-40 TiB, 40 digits after the point: exactly one byte.
        assert_eq!(
            parse_limit("0.0000000000009094947017729282379150390625TiB"),
            Ok(Limit::Bytes(1))
        );
        // A unit's fraction rounds to the nearest byte, half up.
        assert_eq!(parse_limit("1.1GiB"), Ok(Limit::Bytes(1_181_116_006)));
        assert_eq!(parse_limit("0.3KiB"), Ok(Limit::Bytes(307)));
        assert_eq!(parse_limit("1.0005k"), Ok(Limit::Bytes(1_001)));
        assert_eq!(parse_limit("1.0004999k"), Ok(Limit::Bytes(1_000)));
        assert_eq!(parse_limit("0.0000000000009TiB"), Ok(Limit::Bytes(1)));
        let err = parse_limit("0.0000000000004TiB").unwrap_err();
        assert!(err.reason.contains("greater than zero"), "{err}");
        for bad in ["1.5", "0.5B", "2.000001B"] {
            let err = parse_limit(bad).unwrap_err();
            assert_eq!(
                err.reason,
                format!("not a whole number of bytes in {bad:?}"),
                "{bad}"
            );
        }
        for bad in [".", "0.0", "18446744073709551616", "16777216.1TiB"] {
            assert!(parse_limit(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_tiny_percentage_shows_as_given() {
        let tiny = parse_limit("0.0000000001%").unwrap();
        assert_eq!(tiny.to_string(), "0.0000000001%");
        assert_eq!(tiny.resolve(80 << 30), 0);
        assert_eq!(Limit::Fraction(0.7).to_string(), "70%");
    }

    #[test]
    fn formats_like_pytorch() {
        assert_eq!(Bytes(512).to_string(), "512 bytes");
        assert_eq!(Bytes(1536).to_string(), "1.50 KiB");
        assert_eq!(Bytes(20 << 20).to_string(), "20.00 MiB");
        assert_eq!(Bytes(3 << 30).to_string(), "3.00 GiB");
    }
}
