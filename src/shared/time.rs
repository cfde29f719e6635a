//! Time, in one place: the wall clock ([`now_ns`]), the one duration
//! grammar every flag takes ([`DurationFlag::parse`], humantime's: `500ms`,
//! `2s`, `1m`, `1h 30m`), each flag with its own range and one error
//! wording that names the flag, its variable and the range, and RFC 3339
//! ([`format_rfc3339`], [`parse_rfc3339`]).
//!
//! Guarantees: a duration a flag refuses is refused with the same sentence
//! whichever flag it is given to, a negative one (`-1s`) included; RFC 3339
//! round-trips to the nanosecond. Proved by this module's tests and by
//! `tests/it/cli/errors.rs` (`durations_are_refused_naming_the_flag_and_range`).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const NS: i64 = 1_000_000_000;

/// The wall clock (CLOCK_REALTIME) in nanoseconds since the epoch; a clock
/// before 1970 reads as 0 (index records only need non-decreasing times,
/// which their writer ensures).
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

// ------------------------------------------------------------- durations

/// A flag that takes a duration: its names and the range it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationFlag {
    /// The flag as typed (`--max-delay`).
    pub flag: &'static str,
    /// The environment variable that sets it, if any (`LOGMON_MAX_DELAY`).
    pub env: Option<&'static str>,
    /// The shortest accepted.
    pub min: Duration,
    /// The longest accepted.
    pub max: Duration,
    /// The finest step: a duration must be a whole number of these.
    pub step: Duration,
}

/// Why a duration was refused. Its `Display` is the one wording: the flag
/// (and its variable), what is wrong, and what to give instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag}: {input:?} {why}; give a duration from {min} to {max}{step}, such as 500ms, 2s, 1m or 1h", flag = self.names(), min = human(self.flag.min), max = human(self.flag.max), step = self.step_text())]
pub struct DurationError {
    /// The flag it was given to.
    pub flag: DurationFlag,
    /// What was given.
    pub input: String,
    /// What is wrong with it.
    pub why: Why,
}

/// What is wrong with a refused duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Not in the grammar at all.
    Syntax,
    /// Written with a minus (`-1s`): a duration cannot be negative.
    Negative,
    /// Written with a plus (`+1s`): a duration takes no sign.
    Signed,
    /// Shorter than the flag's minimum.
    TooShort,
    /// Longer than the flag's maximum (or than any duration).
    TooLong,
    /// Finer than the flag's step.
    TooFine,
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Why::Syntax => "is not a duration",
            Why::Negative => "is negative",
            Why::Signed => "has a sign",
            Why::TooShort => "is too short",
            Why::TooLong => "is too long",
            Why::TooFine => "is finer than the flag counts",
        })
    }
}

impl DurationError {
    fn names(&self) -> String {
        match self.flag.env {
            Some(env) => format!("{} (or {env})", self.flag.flag),
            None => self.flag.flag.to_owned(),
        }
    }

    fn step_text(&self) -> String {
        if self.flag.step <= Duration::from_nanos(1) {
            String::new()
        } else {
            format!(" in whole {}", unit_name(self.flag.step))
        }
    }
}

fn unit_name(step: Duration) -> String {
    match step {
        s if s == Duration::from_millis(1) => "milliseconds".into(),
        s if s == Duration::from_secs(1) => "seconds".into(),
        s => format!("steps of {}", human(s)),
    }
}

/// `d` the way the flags take it (`100ms`, `1m`, `0s`).
pub fn human(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    humantime::format_duration(d).to_string()
}

impl DurationFlag {
    /// A flag taking any duration from `min` to `max`, to the nanosecond.
    pub const fn new(
        flag: &'static str,
        env: Option<&'static str>,
        min: Duration,
        max: Duration,
    ) -> Self {
        DurationFlag {
            flag,
            env,
            min,
            max,
            step: Duration::from_nanos(1),
        }
    }

    /// The same flag counting in whole `step`s.
    pub const fn in_steps_of(self, step: Duration) -> Self {
        DurationFlag { step, ..self }
    }

    /// Parses `input` (surrounding whitespace ignored) as this flag's
    /// duration: humantime's grammar (`500ms`, `2s`, `1m`, `1h 30m`, `0`),
    /// inside the flag's range and a whole number of its steps.
    pub fn parse(&self, input: &str) -> Result<Duration, DurationError> {
        let refuse = |why| DurationError {
            flag: *self,
            input: input.to_owned(),
            why,
        };
        let s = input.trim();
        if let Some(rest) = s.strip_prefix('-') {
            if rest.starts_with(|c: char| c.is_ascii_digit()) {
                return Err(refuse(Why::Negative));
            }
        }
        if let Some(rest) = s.strip_prefix('+') {
            if humantime::parse_duration(rest).is_ok() {
                return Err(refuse(Why::Signed));
            }
        }
        let d = match humantime::parse_duration(s) {
            Ok(d) => d,
            Err(humantime::DurationError::NumberOverflow) => return Err(refuse(Why::TooLong)),
            Err(_) => return Err(refuse(Why::Syntax)),
        };
        if d < self.min {
            return Err(refuse(Why::TooShort));
        }
        if d > self.max {
            return Err(refuse(Why::TooLong));
        }
        if d.as_nanos() % self.step.as_nanos().max(1) != 0 {
            return Err(refuse(Why::TooFine));
        }
        Ok(d)
    }

    /// [`DurationFlag::parse`] for clap's `value_parser`.
    pub fn parser(
        self,
    ) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
        move |s| self.parse(s).map_err(|e| e.to_string())
    }
}

// ------------------------------------------------------------- RFC 3339

/// Why a text is not an RFC 3339 time this code can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rfc3339Error {
    /// Not RFC 3339 (or not a real date).
    Syntax,
    /// A real time that nanoseconds since the epoch in an `i64` cannot hold.
    OutOfRange,
}

/// Parses an RFC 3339 date-time (any offset, any number of fraction
/// digits, nanoseconds kept) into nanoseconds since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    rfc3339(s).ok()
}

/// [`parse_rfc3339`], saying why not.
pub fn rfc3339(s: &str) -> Result<i64, Rfc3339Error> {
    let b = s.as_bytes();
    let num = |from: usize, to: usize| -> Result<i64, Rfc3339Error> {
        let t = b.get(from..to).ok_or(Rfc3339Error::Syntax)?;
        if !t.iter().all(u8::is_ascii_digit) {
            return Err(Rfc3339Error::Syntax);
        }
        std::str::from_utf8(t)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or(Rfc3339Error::Syntax)
    };
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, sec) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(Rfc3339Error::Syntax);
    }
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 60
    {
        return Err(Rfc3339Error::Syntax);
    }
    let (frac, i) = fraction(b, 19)?;
    let offset = match &b[i..] {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (oh, om) = (num(i + 1, i + 3)?, num(i + 4, i + 6)?);
            if oh > 23 || om > 59 {
                return Err(Rfc3339Error::Syntax);
            }
            let o = oh * 3600 + om * 60;
            if *sign == b'-' {
                -o
            } else {
                o
            }
        }
        _ => return Err(Rfc3339Error::Syntax),
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset;
    secs.checked_mul(NS)
        .and_then(|ns| ns.checked_add(frac))
        .ok_or(Rfc3339Error::OutOfRange)
}

/// The fraction of a second starting at `i` (`.5` → 500 ms in ns; none →
/// 0), and where the text after it starts.
fn fraction(b: &[u8], mut i: usize) -> Result<(i64, usize), Rfc3339Error> {
    let mut frac = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let digits = &b[start..i];
        if digits.is_empty() {
            return Err(Rfc3339Error::Syntax);
        }
        for k in 0..9 {
            frac = frac * 10 + digits.get(k).map_or(0, |c| i64::from(c - b'0'));
        }
    }
    Ok((frac, i))
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

// Howard Hinnant's civil-date algorithms (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `ns` as RFC 3339 in UTC with nine fraction digits
/// (`2026-11-23T15:04:05.123456789Z`), the form CRI runtimes write.
pub fn format_rfc3339(ns: i64) -> String {
    let secs = ns.div_euclid(NS);
    let frac = ns.rem_euclid(NS);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{frac:09}Z",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const DELAY: DurationFlag = DurationFlag::new(
        "--max-delay",
        Some("LOGMON_MAX_DELAY"),
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .in_steps_of(Duration::from_millis(1));

    #[test]
    fn one_grammar_for_every_flag() {
        for (s, d) in [
            ("50ms", Duration::from_millis(50)),
            ("2s", Duration::from_secs(2)),
            ("1m", Duration::from_secs(60)),
            (" 1s ", Duration::from_secs(1)),
            ("0", Duration::ZERO),
            ("0ms", Duration::ZERO),
            ("1s 500ms", Duration::from_millis(1500)),
        ] {
            assert_eq!(DELAY.parse(s), Ok(d), "{s:?}");
        }
    }

    #[test]
    fn refusals_name_the_flag_its_variable_and_the_range() {
        for (s, why) in [
            ("-1s", Why::Negative),
            ("-3", Why::Negative),
            ("+1s", Why::Signed),
            ("1h", Why::TooLong),
            ("50", Why::Syntax),
            ("-", Why::Syntax),
            ("forever", Why::Syntax),
            ("999999999999999999999s", Why::TooLong),
            ("1500us", Why::TooFine),
        ] {
            let e = DELAY.parse(s).unwrap_err();
            assert_eq!(e.why, why, "{s:?}");
            let text = e.to_string();
            assert!(
                text.starts_with("--max-delay (or LOGMON_MAX_DELAY): ")
                    && text.contains("from 0s to 1m in whole milliseconds"),
                "{text}"
            );
        }
        let short = DurationFlag::new(
            "--interval",
            None,
            Duration::from_millis(100),
            Duration::from_secs(60),
        );
        assert_eq!(
            short.parse("10ms").unwrap_err().to_string(),
            "--interval: \"10ms\" is too short; give a duration from 100ms to 1m, such as 500ms, 2s, 1m or 1h"
        );
    }

    #[test]
    fn rfc3339_round_trips_and_accepts_offsets() {
        for ns in [
            0,
            1,
            -1,
            1_795_446_245_123_456_789,
            951_782_400 * NS + 5,
            i64::MAX,
        ] {
            assert_eq!(parse_rfc3339(&format_rfc3339(ns)), Some(ns), "{ns}");
        }
        assert_eq!(
            format_rfc3339(1_795_446_245_123_456_789),
            "2026-11-23T15:04:05.123456789Z"
        );
        assert_eq!(
            parse_rfc3339("2026-11-23T16:04:05.5+01:00"),
            Some(1_795_446_245_500_000_000)
        );
        assert_eq!(parse_rfc3339("2026-02-29T00:00:00Z"), None);
        assert_eq!(parse_rfc3339("2026-11-23T15:04:05"), None);
        assert_eq!(format_rfc3339(i64::MAX), "2262-04-11T23:47:16.854775807Z");
        assert_eq!(
            rfc3339("2300-01-01T00:00:00Z"),
            Err(Rfc3339Error::OutOfRange)
        );
    }
}
