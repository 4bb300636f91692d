//! Typed quantities for the planner's graph: byte counts, element counts, token counts, bytes
//! per element and bytes per token.
//!
//! Each is a plain `f64` underneath, and each operator is exactly the one `f64` operation it
//! wraps, in the same order, so typed arithmetic gives the same bits as the bare arithmetic it
//! replaces. Only the combinations that make sense exist: `Elements * BytesPerElement` is
//! `Bytes`, bytes add to bytes, and adding bytes to elements does not compile.

use std::ops::{Add, AddAssign, Div, Mul, Sub};

/// A number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub(crate) struct Bytes(pub(crate) f64);

/// A number of tensor elements.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub(crate) struct Elements(pub(crate) f64);

/// A number of tokens (sequence positions of a micro-batch).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub(crate) struct Tokens(pub(crate) f64);

/// Bytes per token: what a tensor with one row per token holds for each of its rows.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub(crate) struct BytesPerToken(pub(crate) f64);

/// The size of one element in bytes (summed over the tensors that exist per element, where a
/// tally adds several).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub(crate) struct BytesPerElement(pub(crate) f64);

impl Bytes {
    /// None: the tensor does not exist.
    pub(crate) const ZERO: Bytes = Bytes(0.0);

    /// The byte count as a bare number (what `Unit` takes).
    pub(crate) fn bytes(self) -> f64 {
        self.0
    }

    /// The larger of two byte counts (`f64::max`).
    pub(crate) fn max(self, other: Bytes) -> Bytes {
        Bytes(self.0.max(other.0))
    }
}

impl BytesPerElement {
    /// None: the tensor does not exist.
    pub(crate) const ZERO: BytesPerElement = BytesPerElement(0.0);

    /// A boolean mask's element (`torch.bool`).
    pub(crate) const BOOL: BytesPerElement = BytesPerElement(1.0);

    /// The larger of two sizes (`f64::max`).
    pub(crate) fn max(self, other: BytesPerElement) -> BytesPerElement {
        BytesPerElement(self.0.max(other.0))
    }
}

impl Add for Bytes {
    type Output = Bytes;
    fn add(self, rhs: Bytes) -> Bytes {
        Bytes(self.0 + rhs.0)
    }
}

impl Sub for Bytes {
    type Output = Bytes;
    fn sub(self, rhs: Bytes) -> Bytes {
        Bytes(self.0 - rhs.0)
    }
}

impl AddAssign for Bytes {
    fn add_assign(&mut self, rhs: Bytes) {
        self.0 += rhs.0;
    }
}

impl Add for BytesPerElement {
    type Output = BytesPerElement;
    fn add(self, rhs: BytesPerElement) -> BytesPerElement {
        BytesPerElement(self.0 + rhs.0)
    }
}

impl Mul<BytesPerElement> for Elements {
    type Output = Bytes;
    fn mul(self, rhs: BytesPerElement) -> Bytes {
        Bytes(self.0 * rhs.0)
    }
}

impl Mul<Elements> for BytesPerElement {
    type Output = Bytes;
    fn mul(self, rhs: Elements) -> Bytes {
        Bytes(self.0 * rhs.0)
    }
}

/// Scaling a count of elements (`3.0 * scores`: three tensors of that many elements).
impl Mul<Elements> for f64 {
    type Output = Elements;
    fn mul(self, rhs: Elements) -> Elements {
        Elements(self * rhs.0)
    }
}

impl Add for BytesPerToken {
    type Output = BytesPerToken;
    fn add(self, rhs: BytesPerToken) -> BytesPerToken {
        BytesPerToken(self.0 + rhs.0)
    }
}

impl AddAssign for BytesPerToken {
    fn add_assign(&mut self, rhs: BytesPerToken) {
        self.0 += rhs.0;
    }
}

/// Dividing bytes per token among GPUs (a parallel degree).
impl Div<f64> for BytesPerToken {
    type Output = BytesPerToken;
    fn div(self, rhs: f64) -> BytesPerToken {
        BytesPerToken(self.0 / rhs)
    }
}

impl Mul<BytesPerToken> for Tokens {
    type Output = Bytes;
    fn mul(self, rhs: BytesPerToken) -> Bytes {
        Bytes(self.0 * rhs.0)
    }
}
