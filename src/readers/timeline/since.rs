//! `--since`/`--until`: the time flags parsed ([`parse_time`], each
//! refusal naming what is wrong: [`TimeError`]) and the position where
//! `--since` begins found by searching the indexes ([`locate_since`]),
//! never by reading the older files' data.
//!
//! Guarantee: with the lines then filtered by the very stamps printed, a
//! reader prints exactly the lines whose time is in `[since, until]`
//! (`tests/it/readers/timeline_props.rs`
//! `since_until_return_exactly_the_lines_of_the_range`; the unit test
//! below for the flags; `benches/since.sh` measures the bytes read).

use super::{Stamper, NS};
use std::io;
use std::time::Duration;

use crate::readers::follow::Position;
use crate::shared::dir::Dir;
use crate::shared::layout::scan_any_in;
use crate::shared::logfile::{LogFile, OpenedLog};
use crate::shared::time::{format_rfc3339, rfc3339, DurationFlag, Rfc3339Error, Why};

/// Why a `--since`/`--until` value was refused.
#[derive(Debug, thiserror::Error)]
pub enum TimeError {
    /// Neither RFC 3339 nor a duration.
    #[error("invalid time {0:?}: use RFC 3339 (2026-11-23T15:04:05Z, 2026-11-23T15:04:05.5+01:00) or a duration before now (90s, 10m, 2h, 1d)")]
    Invalid(String),
    /// A duration with a sign (`-5m`).
    #[error("invalid time {0:?}: a duration counts back from now and takes no sign (5m is five minutes ago), or use RFC 3339 (2026-11-23T15:04:05Z)")]
    Signed(String),
    /// A duration too long to count back from now.
    #[error(
        "duration {0:?} overflows: a duration goes back at most {MAX_DAYS}d (about 292 years)"
    )]
    Overflow(String),
    /// A valid RFC 3339 time that nanoseconds since the epoch cannot hold.
    #[error("time {0:?} is outside the supported range, {min} to {max}", min = format_rfc3339(i64::MIN), max = format_rfc3339(i64::MAX))]
    OutOfRange(String),
}

/// The longest duration, in days, whose nanoseconds an `i64` holds.
const MAX_DAYS: i64 = i64::MAX / (86_400 * NS);

/// The relative forms of `--since`/`--until`: any duration an `i64` of
/// nanoseconds holds, counted back from now.
const SINCE: DurationFlag = DurationFlag::new(
    "--since/--until",
    None,
    Duration::ZERO,
    Duration::from_secs(MAX_DAYS.unsigned_abs() * 86_400),
);

/// Parses `--since`/`--until`: RFC 3339 (any offset, any number of
/// fraction digits, nanoseconds kept), or a duration before `now_ns`
/// (the one duration grammar, `shared::time`: `500ms`, `90s`,
/// `10m`, `2h`, `1d`).
pub fn parse_time(s: &str, now_ns: i64) -> Result<i64, TimeError> {
    match SINCE.parse(s) {
        Ok(d) => {
            return i64::try_from(d.as_nanos())
                .map(|d| now_ns.saturating_sub(d))
                .map_err(|_| TimeError::Overflow(s.to_owned()))
        }
        Err(e) if e.why == Why::TooLong => return Err(TimeError::Overflow(s.to_owned())),
        Err(e) if matches!(e.why, Why::Negative | Why::Signed) => {
            return Err(TimeError::Signed(s.to_owned()))
        }
        Err(_) => {}
    }
    match rfc3339(s) {
        Ok(t) => Ok(t),
        Err(Rfc3339Error::OutOfRange) => Err(TimeError::OutOfRange(s.to_owned())),
        Err(Rfc3339Error::Syntax) => Err(TimeError::Invalid(s.to_owned())),
    }
}

/// The position where lines captured at or after `since` begin in
/// `stream` (see the module docs): the start of a line, found by walking
/// the files' indexes from the newest and a binary search in one index.
/// Only the file kept is held open.
pub fn locate_since(dir: &Dir, stamper: &mut Stamper, since: i64) -> io::Result<Position> {
    let trust = dir.trust()?;
    let files = scan_any_in(dir, &stamper.task, stamper.stream)?;
    let mut start = None;
    for &n in files.iter().rev() {
        let t = stamper.read(n);
        if t.upper() < since {
            break;
        }
        start = Some((n, t));
    }
    let Some((n, mut t)) = start else {
        // Everything is older: start at the end.
        return Ok(match files.last() {
            Some(&n) => Position {
                index: n,
                offset: stamper.file_stat(n).0,
            },
            None => Position::default(),
        });
    };
    // Bytes before the first record are stamped with its time: keep them
    // when it is in range. Past the last record: start at it and filter.
    let offset = match &mut t.index {
        Ok(ix) => ix.start_for_since(since),
        Err(_) => 0,
    };
    stamper.files.insert(n, t);
    let offset =
        match crate::shared::logfile::open_log(dir, &trust, &stamper.task, stamper.stream, n)? {
            OpenedLog::File(f, _) => line_start_at_or_after(&f, offset)?,
            OpenedLog::Gone | OpenedLog::Foreign(_) => 0,
        };
    Ok(Position { index: n, offset })
}

/// The first line start at or after `offset` in `f` (its length if none).
fn line_start_at_or_after(f: &LogFile, offset: u64) -> io::Result<u64> {
    if offset == 0 {
        return Ok(0);
    }
    let mut pos = offset - 1;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read_at(&mut buf, pos)?;
        if n == 0 {
            return Ok(pos);
        }
        if let Some(i) = memchr::memchr(b'\n', &buf[..n]) {
            return Ok(pos + i as u64 + 1);
        }
        pos += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_and_until_take_rfc3339_or_a_duration_back_from_now() {
        assert_eq!(parse_time("90s", 100 * NS).unwrap(), 10 * NS);
        assert_eq!(parse_time("2h", 0).unwrap(), -7200 * NS);
        assert!(matches!(parse_time("10x", 0), Err(TimeError::Invalid(_))));
        assert!(matches!(parse_time("-5m", 0), Err(TimeError::Signed(_))));
        assert!(matches!(parse_time("+5m", 0), Err(TimeError::Signed(_))));
        assert!(matches!(parse_time("-", 0), Err(TimeError::Invalid(_))));
        assert!(matches!(
            parse_time("99999999999d", 0),
            Err(TimeError::Overflow(_))
        ));
        assert_eq!(
            parse_time(&format!("{MAX_DAYS}d"), 0).unwrap(),
            -MAX_DAYS * 86_400 * NS
        );
        assert!(matches!(
            parse_time("2300-01-01T00:00:00Z", 0),
            Err(TimeError::OutOfRange(_))
        ));
        assert!(matches!(
            parse_time("1600-01-01T00:00:00Z", 0),
            Err(TimeError::OutOfRange(_))
        ));
    }
}
