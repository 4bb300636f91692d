//! Typed quantities for the planner's graph: byte counts, element counts, token counts,
//! widths (elements per token), bytes per element, bytes per token and bytes per column.
//!
//! Each is a plain `f64` underneath, and each operator is exactly the one `f64` operation it
//! wraps, in the same order, so typed arithmetic gives the same bits as the bare arithmetic it
//! replaces. Only the combinations that make sense exist: `Elements * BytesPerElement` is
//! `Bytes`, `BytesPerElement * Width` is `BytesPerToken`, `Tokens * BytesPerToken` is `Bytes`,
//! quantities add to quantities of their own kind, and adding bytes to elements does not
//! compile. A bare `f64` in an operation is a dimensionless factor: a number of tensors or
//! heads, a parallel degree.
//!
//! Products keep the order the planner always evaluated them in, so `tokens * act * width`
//! (tokens times bytes per element, then times a width) passes through [`BytesPerColumn`].

use std::ops::{Add, AddAssign, Div, Mul, Sub};

/// A number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub(crate) struct Bytes(pub(crate) f64);

/// A number of tensor elements.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub(crate) struct Elements(pub(crate) f64);

/// A number of tokens (sequence positions: of a sequence, or of a micro-batch).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub(crate) struct Tokens(pub(crate) f64);

/// A width: elements per token (the columns of a tensor with one row per token).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub(crate) struct Width(pub(crate) f64);

/// The size of one element in bytes (summed over the tensors that exist per element, where a
/// tally adds several).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub(crate) struct BytesPerElement(pub(crate) f64);

/// Bytes per token: what a tensor with one row per token holds for each of its rows.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub(crate) struct BytesPerToken(pub(crate) f64);

/// Bytes per column of a tensor with one row per token: tokens times bytes per element, which
/// a width (the tensor's columns) makes bytes.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub(crate) struct BytesPerColumn(pub(crate) f64);

impl Bytes {
    /// None: the tensor does not exist.
    pub(crate) const ZERO: Bytes = Bytes(0.0);

    /// The byte count as a bare number (what `Unit` takes).
    pub(crate) fn bytes(self) -> f64 {
        self.0
    }
}

impl Elements {
    /// No elements.
    pub(crate) const ZERO: Elements = Elements(0.0);

    /// The element count as a bare number (what `Quantization::dequantised_bytes` takes).
    pub(crate) fn count(self) -> f64 {
        self.0
    }
}

impl Tokens {
    /// No tokens.
    pub(crate) const ZERO: Tokens = Tokens(0.0);

    /// The token count as a bare number (what `Unit::kv_window` and the quantised matmuls
    /// take).
    pub(crate) fn count(self) -> f64 {
        self.0
    }

    /// A row with one element per token (a score row over the keys) as a width.
    pub(crate) fn as_width(self) -> Width {
        Width(self.0)
    }

    /// The next whole number of tokens (`f64::ceil`).
    pub(crate) fn ceil(self) -> Tokens {
        Tokens(self.0.ceil())
    }
}

impl Width {
    /// No columns.
    pub(crate) const ZERO: Width = Width(0.0);

    /// The width as a bare number of elements (what `column_sum_staging_bytes` takes).
    pub(crate) fn elements(self) -> f64 {
        self.0
    }
}

impl BytesPerElement {
    /// None: the tensor does not exist.
    pub(crate) const ZERO: BytesPerElement = BytesPerElement(0.0);

    /// A boolean mask's element (`torch.bool`).
    pub(crate) const BOOL: BytesPerElement = BytesPerElement(1.0);

    /// An fp32 element.
    pub(crate) const FP32: BytesPerElement = BytesPerElement(4.0);

    /// An int64 element (indices).
    pub(crate) const INT64: BytesPerElement = BytesPerElement(8.0);

    /// The size as a bare number (what the public `lora` functions take).
    pub(crate) fn bytes(self) -> f64 {
        self.0
    }
}

impl BytesPerToken {
    /// None: no tensor with a row per token.
    pub(crate) const ZERO: BytesPerToken = BytesPerToken(0.0);
}

/// `a.max(b)` of one kind: `f64::max`.
macro_rules! max {
    ($t:ident) => {
        impl $t {
            /// The larger of two (`f64::max`).
            pub(crate) fn max(self, other: $t) -> $t {
                $t(self.0.max(other.0))
            }
        }
    };
}

/// `a.min(b)` of one kind: `f64::min`.
macro_rules! min {
    ($t:ident) => {
        impl $t {
            /// The smaller of two (`f64::min`).
            pub(crate) fn min(self, other: $t) -> $t {
                $t(self.0.min(other.0))
            }
        }
    };
}

/// `$a + $b` of one kind.
macro_rules! add {
    ($t:ident) => {
        impl Add for $t {
            type Output = $t;
            fn add(self, rhs: $t) -> $t {
                $t(self.0 + rhs.0)
            }
        }
    };
}

/// `$a - $b` of one kind.
macro_rules! sub {
    ($t:ident) => {
        impl Sub for $t {
            type Output = $t;
            fn sub(self, rhs: $t) -> $t {
                $t(self.0 - rhs.0)
            }
        }
    };
}

/// `$a += $b` of one kind.
macro_rules! add_assign {
    ($t:ident) => {
        impl AddAssign for $t {
            fn add_assign(&mut self, rhs: $t) {
                self.0 += rhs.0;
            }
        }
    };
}

/// A dimensionless factor times a quantity, and the quantity times it (`2.0 * bytes`).
macro_rules! scale {
    (f64 * $t:ident) => {
        impl Mul<$t> for f64 {
            type Output = $t;
            fn mul(self, rhs: $t) -> $t {
                $t(self * rhs.0)
            }
        }
    };
    ($t:ident * f64) => {
        impl Mul<f64> for $t {
            type Output = $t;
            fn mul(self, rhs: f64) -> $t {
                $t(self.0 * rhs)
            }
        }
    };
    ($t:ident / f64) => {
        impl Div<f64> for $t {
            type Output = $t;
            fn div(self, rhs: f64) -> $t {
                $t(self.0 / rhs)
            }
        }
    };
}

/// `$a * $b` is `$out`.
macro_rules! product {
    ($a:ident * $b:ident = $out:ident) => {
        impl Mul<$b> for $a {
            type Output = $out;
            fn mul(self, rhs: $b) -> $out {
                $out(self.0 * rhs.0)
            }
        }
    };
}

// Of one kind: the larger or smaller, sums and differences.
max!(Bytes);
max!(Elements);
max!(Width);
max!(BytesPerElement);
max!(BytesPerToken);
min!(Tokens);
add!(Bytes);
add!(Elements);
add!(Width);
add!(BytesPerElement);
add!(BytesPerToken);
add!(BytesPerColumn);
sub!(Bytes);
sub!(BytesPerElement);
sub!(BytesPerToken);
add_assign!(Bytes);
add_assign!(BytesPerToken);
// A dimensionless factor: a number of tensors, heads or samples; a parallel degree.
scale!(f64 * Bytes);
scale!(f64 * Elements);
scale!(f64 * Tokens);
scale!(f64 * Width);
scale!(f64 * BytesPerElement);
scale!(f64 * BytesPerToken);
scale!(f64 * BytesPerColumn);
scale!(Bytes * f64);
scale!(Tokens * f64);
scale!(BytesPerElement * f64);
scale!(BytesPerToken * f64);
scale!(BytesPerColumn * f64);
scale!(Bytes / f64);
scale!(Elements / f64);
scale!(Tokens / f64);
scale!(Width / f64);
scale!(BytesPerElement / f64);
scale!(BytesPerToken / f64);
// Across kinds, both ways round where the planner writes both orders.
product!(Elements * BytesPerElement = Bytes);
product!(BytesPerElement * Elements = Bytes);
product!(Tokens * BytesPerToken = Bytes);
product!(BytesPerToken * Tokens = Bytes);
product!(Tokens * Width = Elements);
product!(Width * Tokens = Elements);
product!(BytesPerElement * Width = BytesPerToken);
product!(Width * BytesPerElement = BytesPerToken);
product!(Tokens * BytesPerElement = BytesPerColumn);
product!(BytesPerElement * Tokens = BytesPerColumn);
product!(BytesPerColumn * Width = Bytes);
// A weight matrix: its outputs by its inputs (the LM head's vocabulary by hidden width).
product!(Width * Width = Elements);

/// Tokens in units of other tokens: a bare ratio (chunks of a sequence).
impl Div for Tokens {
    type Output = f64;
    fn div(self, rhs: Tokens) -> f64 {
        self.0 / rhs.0
    }
}
