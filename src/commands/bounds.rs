//! Value parsers shared by every option of a kind, so each kind has one documented range and
//! one message, and a value out of range stops the command at parse time (exit 2) instead of
//! overflowing a deadline after sandboxes were created.

use std::time::Duration;

/// Shortest duration an option takes: sandbox deadlines are whole seconds, so less would
/// round to an already-expired sandbox.
pub const MIN_DURATION: Duration = Duration::from_secs(1);
/// Longest: a week, beyond any sandbox's life (E2B allows 24 h) and far below where deadline
/// arithmetic overflows.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Slowest `--create-rate`: one create per 100 s.
pub const MIN_CREATE_RATE: f64 = 0.01;
/// Fastest `--create-rate`, far above what any backend admits.
pub const MAX_CREATE_RATE: f64 = 1000.0;

/// Every timeout option: `90s`, `10m`, `2h`, `1d`, from 1 s to 7 days.
pub fn duration(s: &str) -> Result<Duration, String> {
    duration_in(s, MIN_DURATION)
}

/// An age threshold (`reap --older-than`): as [`duration`], but `0s` (any age) is allowed.
pub fn age(s: &str) -> Result<Duration, String> {
    duration_in(s, Duration::ZERO)
}

fn duration_in(s: &str, min: Duration) -> Result<Duration, String> {
    let range = format!(
        "expected a duration from {} to {} (e.g. 90s, 10m, 2h)",
        humantime::format_duration(min),
        humantime::format_duration(MAX_DURATION)
    );
    let d = humantime::parse_duration(s).map_err(|e| format!("{e}; {range}"))?;
    if !(min..=MAX_DURATION).contains(&d) {
        return Err(format!("{s:?} is out of range; {range}"));
    }
    Ok(d)
}

/// The most a cap or price may say: beyond it a number is a typo, not a budget.
const MAX_AMOUNT: f64 = 1e12;

/// A cap or a price (`--max-cost`, `--price-in`, ...): a finite number from 0.
pub fn amount(s: &str) -> Result<f64, String> {
    let range = format!("expected a number from 0 to {MAX_AMOUNT:e}");
    let value: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number; {range}"))?;
    if !(0.0..=MAX_AMOUNT).contains(&value) {
        return Err(format!("{s:?} is out of range; {range}"));
    }
    Ok(value)
}

/// `--create-rate`: creates per second, a finite number from 0.01 to 1000.
pub fn create_rate(s: &str) -> Result<f64, String> {
    let range = format!("expected creates per second from {MIN_CREATE_RATE} to {MAX_CREATE_RATE}");
    let rate: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number; {range}"))?;
    // NaN is in no range, so it fails here too.
    if !(MIN_CREATE_RATE..=MAX_CREATE_RATE).contains(&rate) {
        return Err(format!("{s:?} is out of range; {range}"));
    }
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_bounded() {
        assert_eq!(duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("1s"), Ok(MIN_DURATION));
        assert_eq!(duration("7d"), Ok(MAX_DURATION));
        for bad in ["0s", "500ms", "8d", "500000000000years", "soon", ""] {
            let e = duration(bad).unwrap_err();
            assert!(e.contains("from 1s to 7days"), "{bad}: {e}");
        }
    }

    #[test]
    fn ages_may_be_zero() {
        assert_eq!(age("0s"), Ok(Duration::ZERO));
        let e = age("8d").unwrap_err();
        assert!(e.contains("from 0s to 7days"), "{e}");
    }

    #[test]
    fn create_rates_are_bounded() {
        assert_eq!(create_rate("4"), Ok(4.0));
        assert_eq!(create_rate("0.01"), Ok(0.01));
        for bad in [
            "1e-300", "NaN", "nan", "inf", "-inf", "0", "-1", "1001", "x",
        ] {
            let e = create_rate(bad).unwrap_err();
            assert!(e.contains("from 0.01 to 1000"), "{bad}: {e}");
        }
    }
}
