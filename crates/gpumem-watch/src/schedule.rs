//! How long live commands watch and how often they look: the `--duration` and `--interval`
//! options, and the sampling loop that keeps to them.

use std::time::{Duration, Instant};

use crate::{Sample, SampleSource, WatchError};

/// The shortest `--duration`: 1 ms, the finest unit accepted; less would round to nothing.
pub const MIN_DURATION: Duration = Duration::from_millis(1);
/// The longest `--duration`: a year (365 days, 8760h).
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// The shortest `--interval`: 10 ms. NVML's utilisation figures cover a period of 1/6 s to 1 s
/// (`nvidia-smi --help-query-gpu`), so finer samples only repeat them and keep a core busy.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// The longest `--interval`: a day (24h).
pub const MAX_INTERVAL: Duration = Duration::from_secs(24 * 3600);

/// Reads how long to watch, such as `500ms`, `1.5s`, `2m` or `1h` (a bare number is seconds),
/// from [`MIN_DURATION`] to [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    parse_span(
        text,
        "a duration",
        MIN_DURATION,
        MAX_DURATION,
        "1ms to 8760h (a year)",
    )
}

/// Reads the time between samples, in [`parse_duration`]'s forms, from [`MIN_INTERVAL`] to
/// [`MAX_INTERVAL`].
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    parse_span(
        text,
        "an interval",
        MIN_INTERVAL,
        MAX_INTERVAL,
        "10ms to 24h (NVML's figures cover 1/6 s or more: finer samples only repeat them)",
    )
}

fn parse_span(
    text: &str,
    what: &str,
    min: Duration,
    max: Duration,
    range: &str,
) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    // Nanoseconds per unit, each exact in an f64.
    let nanos_per_unit = match unit.trim() {
        "ms" => 1e6,
        "" | "s" => 1e9,
        "m" | "min" => 6e10,
        "h" => 3.6e12,
        _ => f64::NAN,
    };
    let nanos = match number.parse::<f64>() {
        Ok(n) if n > 0.0 && n.is_finite() && nanos_per_unit.is_finite() => n * nanos_per_unit,
        _ => {
            return Err(format!(
                "{text:?} is not {what}; use a positive number with ms, s, m or h (e.g. 500ms, 1s, 2m), from {range}"
            ))
        }
    };
    // Compared as f64 before converting, so that no value is too large to convert.
    if nanos < min.as_nanos() as f64 || nanos > max.as_nanos() as f64 {
        return Err(format!(
            "{text:?} is out of range for {what}: accepted are {range}"
        ));
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
}

/// Takes a sample from `source` every `interval` until `duration` has passed, handing each to
/// `each` and each warning of the source ([`SampleSource::take_warnings`]) to `warn`. The first
/// sample is taken at once and the wait before the next is cut to the time left, so that the
/// whole ends after `duration` (plus the time a sample takes), however long `interval` is.
pub fn sample_for(
    source: &mut dyn SampleSource,
    duration: Duration,
    interval: Duration,
    mut each: impl FnMut(Sample) -> Result<(), WatchError>,
    mut warn: impl FnMut(WatchError),
) -> Result<(), WatchError> {
    let end = Instant::now() + duration;
    while Instant::now() < end {
        let tick = Instant::now();
        let sample = source.next_sample()?;
        source.take_warnings().into_iter().for_each(&mut warn);
        match sample {
            Some(sample) => each(sample)?,
            None => break,
        }
        let left = end.saturating_duration_since(Instant::now());
        std::thread::sleep(interval.saturating_sub(tick.elapsed()).min(left));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_units_and_refuse_the_rest() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "0s", "-1s", "5 parsecs", "s"] {
            let error = parse_duration(bad).unwrap_err();
            assert!(error.contains("not a duration"), "{bad}: {error}");
            assert!(error.contains("1ms to 8760h"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_range_ends_are_accepted_and_beyond_them_is_an_error_naming_the_range() {
        assert_eq!(parse_duration("1ms"), Ok(MIN_DURATION));
        assert_eq!(parse_duration("8760h"), Ok(MAX_DURATION));
        assert_eq!(parse_interval("10ms"), Ok(MIN_INTERVAL));
        assert_eq!(parse_interval("24h"), Ok(MAX_INTERVAL));
        for huge in ["99999999999999999999999h", "8761h", "1e400"] {
            let error = parse_duration(huge).unwrap_err();
            assert!(error.contains("1ms to 8760h (a year)"), "{huge}: {error}");
        }
        for tiny in ["0.000000001ms", "0.5ms", "0.0000001"] {
            let error = parse_duration(tiny).unwrap_err();
            assert!(error.contains("out of range"), "{tiny}: {error}");
        }
        for bad in ["9ms", "0.000000001ms", "25h", "99999999999999999999999h"] {
            let error = parse_interval(bad).unwrap_err();
            assert!(
                error.contains("out of range for an interval"),
                "{bad}: {error}"
            );
            assert!(error.contains("10ms"), "{bad}: {error}");
        }
    }

    /// A source that counts its samples and never ends.
    struct Counter(u64);

    impl SampleSource for Counter {
        fn next_sample(&mut self) -> Result<Option<Sample>, WatchError> {
            self.0 += 1;
            Ok(Some(Sample::default()))
        }
    }

    #[test]
    fn sampling_ends_on_time_even_when_the_interval_is_longer() {
        let start = Instant::now();
        let mut taken = 0;
        sample_for(
            &mut Counter(0),
            Duration::from_millis(200),
            Duration::from_secs(20),
            |_| {
                taken += 1;
                Ok(())
            },
            |e| panic!("{e}"),
        )
        .unwrap();
        assert_eq!(taken, 1);
        let took = start.elapsed();
        assert!(
            (Duration::from_millis(200)..Duration::from_secs(2)).contains(&took),
            "{took:?}"
        );
    }
}
