//! Shape arithmetic shared by every array type: element counts and byte sizes, checked.

use crate::ArrayError;

/// The elements `shape` holds and the bytes they take as `T`s, or
/// [`ArrayError::ShapeOverflow`] when either does not fit. A shape of no dimensions holds one
/// element (a scalar); a zero dimension, none.
pub(crate) fn elements_and_bytes<T>(shape: &[usize]) -> Result<(usize, u64), ArrayError> {
    let elem_size = std::mem::size_of::<T>();
    let overflow = || ArrayError::ShapeOverflow {
        shape: shape.to_vec(),
        elem_size,
    };
    let elements = shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(overflow)?;
    let bytes = elements.checked_mul(elem_size).ok_or_else(overflow)?;
    Ok((elements, bytes as u64))
}

/// Checks that `shape` holds exactly `data_len` elements.
pub(crate) fn check_data_len<T>(shape: &[usize], data_len: usize) -> Result<(), ArrayError> {
    let (elements, _) = elements_and_bytes::<T>(shape)?;
    if elements != data_len {
        return Err(ArrayError::ShapeMismatch {
            shape: shape.to_vec(),
            elements,
            data_len,
        });
    }
    Ok(())
}

/// The shape and element offset of `range` of the outer dimension of `shape`.
pub(crate) fn outer_slice(
    shape: &[usize],
    range: std::ops::Range<usize>,
) -> Result<(Vec<usize>, usize), ArrayError> {
    let outer = shape.first().copied().unwrap_or(0);
    if shape.is_empty() || range.start > range.end || range.end > outer {
        return Err(ArrayError::OutOfBounds {
            start: range.start,
            end: range.end,
            len: outer,
        });
    }
    let row: usize = shape[1..].iter().product();
    let mut sliced = shape.to_vec();
    sliced[0] = range.end - range.start;
    Ok((sliced, range.start * row))
}
