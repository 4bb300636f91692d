//! Per-event values reduced for drawing: the lowest and highest value of each bucket of
//! consecutive events, so that a chart of 10⁶ events stays small and still shows every peak.
//! Only the drawing uses these; the figures a report prints come from the full replay.

use serde::Serialize;

/// A series of per-event values as buckets of `step` consecutive events, each with its lowest
/// and highest value. With no more events than buckets asked for, `step` is 1 and
/// `lo == hi` is the series itself.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Series<T> {
    /// Events the series covers.
    pub len: usize,
    /// Events per bucket; bucket `i` covers events `i * step .. (i + 1) * step`.
    pub step: usize,
    /// Lowest value of each bucket.
    pub lo: Vec<T>,
    /// Highest value of each bucket.
    pub hi: Vec<T>,
}

impl<T: Copy + PartialOrd> Series<T> {
    /// Reduces `values` to at most `buckets` buckets (at least one) of their lowest and
    /// highest values.
    pub fn downsample(values: &[T], buckets: usize) -> Self {
        Self::from_iter(values.len(), buckets, values.iter().copied())
    }

    /// Like [`Series::downsample`], over `len` values produced one by one (no per-event
    /// vector of the derived quantity is needed).
    pub fn from_iter(len: usize, buckets: usize, values: impl Iterator<Item = T>) -> Self {
        let step = len.div_ceil(buckets.max(1)).max(1);
        let mut series = Series {
            len,
            step,
            lo: Vec::with_capacity(len.div_ceil(step)),
            hi: Vec::with_capacity(len.div_ceil(step)),
        };
        for (i, v) in values.enumerate() {
            if i % step == 0 {
                series.lo.push(v);
                series.hi.push(v);
            } else if let (Some(lo), Some(hi)) = (series.lo.last_mut(), series.hi.last_mut()) {
                if v < *lo {
                    *lo = v;
                }
                if v > *hi {
                    *hi = v;
                }
            }
        }
        series
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_every_peak_and_trough() {
        let values: Vec<u64> = (0..1000)
            .map(|i| if i == 637 { 9999 } else { i % 7 })
            .collect();
        let s = Series::downsample(&values, 10);
        assert_eq!((s.len, s.step, s.hi.len()), (1000, 100, 10));
        assert_eq!(s.hi[6], 9999, "the single-event peak survives");
        assert_eq!(s.hi.iter().max(), values.iter().max());
        assert!(s.lo.iter().all(|&v| v == 0));
        let small = Series::downsample(&values[..5], 10);
        assert_eq!((small.step, small.lo.clone()), (1, small.hi.clone()));
        assert_eq!(small.hi, values[..5].to_vec());
        let uneven = Series::downsample(&values[..11], 3);
        assert_eq!((uneven.step, uneven.hi.len()), (4, 3));
        let empty = Series::<u64>::downsample(&[], 10);
        assert!(empty.hi.is_empty());
    }
}
