//! What the tests comparing plans with measurements share.

/// (median, max) of `errors`, which it sorts (the median of an even count is the mean of the
/// middle two).
pub fn median_and_max(errors: &mut [f64]) -> (f64, f64) {
    errors.sort_by(f64::total_cmp);
    let n = errors.len();
    let median = if n % 2 == 1 {
        errors[n / 2]
    } else {
        (errors[n / 2 - 1] + errors[n / 2]) / 2.0
    };
    (median, errors[n - 1])
}
