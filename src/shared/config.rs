//! Configuration: task names, sizes, streams, limits and the default paths
//! derived from `--log-dir` and `--task` (DESIGN.md §1, §2, §4).
//!
//! Everything here is pure: validation happens before any file is touched,
//! so a bad flag never leaves half a daemon behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::shared::meta::Meta;

// Part of the public `config` API: the error of every check here, the
// task's name and its streams.
pub use crate::shared::error::ConfigError;
pub use crate::shared::names::{Stream, TaskName};

/// Default number of files kept per stream, the active one included.
pub const DEFAULT_MAX_FILES: u32 = 10;
/// Default size limit of one log file, in bytes.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 10 * 1024 * 1024;
/// Default pipe capacity requested for each FIFO.
pub const DEFAULT_PIPE_SIZE: u64 = 1024 * 1024;
/// The largest `--pipe-size` (the kernel takes an `int`).
pub const MAX_PIPE_SIZE: u64 = i32::MAX as u64;
/// Default `--max-delay`: how long the first bytes of a quiet stream may
/// wait in the pipe for more to join them in one drain (`capture::Pump`).
/// Chosen with `benches/scale.sh` (README, "Busy node").
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_millis(DEFAULT_MAX_DELAY_MS);
/// [`DEFAULT_MAX_DELAY`] in milliseconds (the flag's default text).
pub const DEFAULT_MAX_DELAY_MS: u64 = 50;
/// The largest `--max-delay`: past it a stream's lines would trail its
/// task by more than anyone reading them live would wait.
pub const MAX_MAX_DELAY: Duration = Duration::from_secs(60);

/// Parses a byte size: plain bytes (`4096`) or a number with a unit
/// (`512KiB`, `10MiB`, `1GiB`; SI units such as `10MB` are powers of 1000).
/// A size past `u64::MAX` bytes is refused, never cut down to it.
///
/// ```
/// use logmon::config::parse_size;
/// assert_eq!(parse_size("10MiB").unwrap(), 10 * 1024 * 1024);
/// assert_eq!(parse_size("4096").unwrap(), 4096);
/// assert!(parse_size("ten").is_err());
/// assert!(parse_size("99999999999GiB").is_err());
/// ```
pub fn parse_size(input: &str) -> Result<u64, ConfigError> {
    parse_size_up_to(input, u64::MAX, "16EiB - 1")
}

/// [`parse_size`] for a flag that takes at most `max` bytes (`max_human`
/// says it the way an operator would write it).
pub fn parse_size_up_to(
    input: &str,
    max: u64,
    max_human: &'static str,
) -> Result<u64, ConfigError> {
    let invalid = |why| ConfigError::InvalidSize {
        input: input.to_owned(),
        why,
    };
    let too_large = || ConfigError::SizeTooLarge {
        input: input.to_owned(),
        max,
        max_human,
    };
    let trimmed = input.trim();
    if trimmed.starts_with('-') {
        return Err(invalid("a size cannot be negative"));
    }
    let number_len = trimmed
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(number_len);
    let unit = unit.trim_start();
    let factor = if unit.is_empty() {
        Some(1)
    } else {
        // bytesize's table of units (KiB, MB, …), read off one of each.
        format!("1{unit}")
            .parse::<bytesize::ByteSize>()
            .ok()
            .map(|b| b.as_u64())
    };
    let (Some(factor), false) = (factor, number.is_empty()) else {
        return Err(invalid(
            "expected bytes or a unit such as 512KiB, 10MiB, 1GiB",
        ));
    };
    // Exact where it can be: bytesize saturates at u64::MAX instead of
    // failing, so the bound is checked here first.
    let exact = match number.parse::<u128>() {
        Ok(n) => n.checked_mul(u128::from(factor)),
        Err(_) => match number.parse::<f64>() {
            Ok(x) if x * (factor as f64) < u64::MAX as f64 => Some((x * factor as f64) as u128),
            Ok(_) => None,
            Err(_) => {
                return Err(invalid(
                    "expected bytes or a unit such as 512KiB, 10MiB, 1GiB",
                ))
            }
        },
    };
    match exact.map(u64::try_from) {
        Some(Ok(n)) if n <= max => Ok(n),
        _ => Err(too_large()),
    }
}

/// Parses `--max-delay`: whole milliseconds or seconds (`50ms`, `1s`),
/// or `0` (drain at once), at most [`MAX_MAX_DELAY`].
///
/// ```
/// use logmon::config::parse_delay;
/// use std::time::Duration;
/// assert_eq!(parse_delay("50ms").unwrap(), Duration::from_millis(50));
/// assert_eq!(parse_delay("0").unwrap(), Duration::ZERO);
/// assert!(parse_delay("50").is_err());
/// assert!(parse_delay("1h").is_err());
/// ```
pub fn parse_delay(input: &str) -> Result<Duration, ConfigError> {
    let invalid = |why| ConfigError::InvalidDelay {
        input: input.to_owned(),
        why,
    };
    const UNITS: &str =
        "expected whole milliseconds or seconds, at most 60s (such as 50ms or 1s), or 0 to drain at once";
    let s = input.trim();
    if s.starts_with('-') {
        return Err(invalid("a delay cannot be negative"));
    }
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    let Ok(n) = number.parse::<u64>() else {
        return Err(invalid(UNITS));
    };
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "" if n == 0 => Duration::ZERO,
        _ => return Err(invalid(UNITS)),
    };
    if d > MAX_MAX_DELAY {
        return Err(invalid(
            "at most 60s: longer, lines trail their task by more than a reader waits",
        ));
    }
    Ok(d)
}

/// `d` as [`parse_delay`] reads it back (whole milliseconds).
pub fn format_delay(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// What to do when writing a log file fails (disk full, I/O error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WriteErrorPolicy {
    /// Keep draining the pipe, count the dropped bytes, retry the file once a
    /// second and write a `logmon: dropped N bytes` marker when it works again.
    #[default]
    Drop,
    /// Stop draining so the task blocks on its full pipe; nothing is lost.
    Block,
}

/// The validated settings of one capture (`logmon run`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureConfig {
    /// The task whose streams are captured.
    pub task: TaskName,
    /// Directory holding the log files (and, by default, FIFOs, lock, socket).
    pub log_dir: PathBuf,
    /// FIFO the task writes its stdout into.
    pub stdout_fifo: PathBuf,
    /// FIFO the task writes its stderr into.
    pub stderr_fifo: PathBuf,
    /// Files kept per stream, the active one included (≥ 1).
    pub max_files: u32,
    /// Size limit of one log file in bytes (≥ 1).
    pub max_file_size: u64,
    /// Pipe capacity requested for each FIFO.
    pub pipe_size: u64,
    /// How long the first bytes of a quiet stream may wait in the pipe for
    /// more to join them (`--max-delay`; zero: drain at once). Bounds the
    /// time from a task's write to the file.
    pub max_delay: Duration,
    /// Write-error policy.
    pub on_write_error: WriteErrorPolicy,
    /// Control socket path.
    pub socket: PathBuf,
    /// Run without self-confinement (`--no-sandbox`, DESIGN.md §10): passed
    /// on to a launched daemon so the flag means the same by every route.
    pub no_sandbox: bool,
    /// Bytes per stream past `max_files` that purge holds for the node's
    /// shipper while it has not read them (`--keep-unshipped`, DESIGN.md
    /// §12); 0: none.
    pub keep_unshipped: u64,
    /// Bytes per second each stream may write (`--rate-limit`,
    /// docs/design.md §16); `None`: no limit.
    pub rate_limit: Option<u64>,
    /// Depth of each stream's token bucket (`--rate-burst`); `None`: one
    /// second of the rate, at least [`MIN_RATE_BURST`].
    pub rate_burst: Option<u64>,
    /// The task's metadata (`--meta KEY=VALUE`, DESIGN.md §11): shown in
    /// `status`, written for readers to `.<task>.logmon.meta`. Empty given
    /// to [`crate::agent::hook::Hook`] means "keep the metadata in the state".
    pub meta: Meta,
}

impl CaptureConfig {
    /// Builds a configuration with the defaults for everything but the task
    /// and the log directory.
    pub fn new(task: TaskName, log_dir: impl Into<PathBuf>) -> Self {
        let log_dir = log_dir.into();
        CaptureConfig {
            stdout_fifo: default_fifo(&log_dir, &task, Stream::Stdout),
            stderr_fifo: default_fifo(&log_dir, &task, Stream::Stderr),
            socket: default_socket(&log_dir, &task),
            task,
            log_dir,
            max_files: DEFAULT_MAX_FILES,
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            pipe_size: DEFAULT_PIPE_SIZE,
            max_delay: DEFAULT_MAX_DELAY,
            on_write_error: WriteErrorPolicy::Drop,
            no_sandbox: false,
            keep_unshipped: 0,
            rate_limit: None,
            rate_burst: None,
            meta: Meta::new(),
        }
    }

    /// Checks the numeric limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_files == 0 {
            return Err(ConfigError::OutOfRange {
                what: "--max-files",
                why: "must be at least 1",
            });
        }
        if self.max_file_size == 0 {
            return Err(ConfigError::OutOfRange {
                what: "--max-file-size",
                why: "must be at least 1 byte",
            });
        }
        if self.pipe_size == 0 || self.pipe_size > MAX_PIPE_SIZE {
            return Err(ConfigError::OutOfRange {
                what: "--pipe-size",
                why: "must be between 1 byte and 2147483647 bytes (2GiB - 1)",
            });
        }
        self.validate_rate()?;
        if self.max_delay > MAX_MAX_DELAY
            || !self.max_delay.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(ConfigError::OutOfRange {
                what: "--max-delay",
                why: "must be whole milliseconds, at most 60s",
            });
        }
        Ok(())
    }

    /// `--rate-limit` and `--rate-burst` together: a burst needs a rate,
    /// and must hold a line the kernel writes whole ([`MIN_RATE_BURST`]).
    fn validate_rate(&self) -> Result<(), ConfigError> {
        match (self.rate_limit, self.rate_burst) {
            (Some(0), _) => Err(ConfigError::OutOfRange {
                what: "--rate-limit",
                why: "must be at least 1 byte per second (leave it out for no limit)",
            }),
            (None, Some(_)) => Err(ConfigError::OutOfRange {
                what: "--rate-burst",
                why: "goes with --rate-limit",
            }),
            (_, Some(b)) if b < MIN_RATE_BURST => Err(ConfigError::OutOfRange {
                what: "--rate-burst",
                why: "must be at least 4KiB (PIPE_BUF: a burst smaller than a line the kernel writes whole would drop such lines for ever)",
            }),
            _ => Ok(()),
        }
    }

    /// The rate limit in force, as (bytes per second, burst), if any.
    pub fn rate(&self) -> Option<(u64, u64)> {
        let rate = self.rate_limit?;
        Some((rate, self.rate_burst.unwrap_or(rate.max(MIN_RATE_BURST))))
    }

    /// The FIFO path of `stream`.
    pub fn fifo(&self, stream: Stream) -> &Path {
        match stream {
            Stream::Stdout => &self.stdout_fifo,
            Stream::Stderr => &self.stderr_fifo,
        }
    }

    /// The lock file that makes one logmon per task (`.<task>.logmon.lock`).
    pub fn lock_path(&self) -> PathBuf {
        self.log_dir.join(self.lock_name())
    }

    /// The lock file's name in the log directory.
    pub fn lock_name(&self) -> String {
        format!(".{}.logmon.lock", self.task.as_str())
    }

    /// Where a launched daemon's own diagnostics go (`.<task>.logmon.log`).
    pub fn daemon_log_path(&self) -> PathBuf {
        daemon_log_path(&self.log_dir, &self.task)
    }
}

/// The smallest `--rate-burst`: PIPE_BUF, the largest write the kernel
/// keeps whole in a pipe. A line longer than the burst can never pass.
pub const MIN_RATE_BURST: u64 = 4096;

/// Parses `--rate-limit`: a size per second (`1MiB/s`, `4096/s`); a number
/// without `/s` is refused, so a rate is never mistaken for a size.
///
/// ```
/// use logmon::config::parse_rate;
/// assert_eq!(parse_rate("1MiB/s").unwrap(), 1 << 20);
/// assert!(parse_rate("1MiB").is_err());
/// assert!(parse_rate("-1KiB/s").is_err());
/// ```
pub fn parse_rate(input: &str) -> Result<u64, ConfigError> {
    let invalid = |why| ConfigError::InvalidRate {
        input: input.to_owned(),
        why,
    };
    let Some(size) = input.trim().strip_suffix("/s") else {
        return Err(invalid("it has no unit per second"));
    };
    match parse_size(size) {
        Ok(0) => Err(invalid("it must be at least 1 byte per second")),
        Ok(n) => Ok(n),
        Err(ConfigError::InvalidSize { why, .. }) => Err(invalid(why)),
        Err(_) => Err(invalid("it is too large")),
    }
}

/// Default FIFO path: `<log-dir>/.<task>.<stream>.fifo`.
pub fn default_fifo(log_dir: &Path, task: &TaskName, stream: Stream) -> PathBuf {
    log_dir.join(format!(".{}.{}.fifo", task.as_str(), stream.as_str()))
}

/// Default control socket path: `<log-dir>/.<task>.logmon.sock`.
pub fn default_socket(log_dir: &Path, task: &TaskName) -> PathBuf {
    log_dir.join(format!(".{}.logmon.sock", task.as_str()))
}

/// A launched daemon's stderr: `<log-dir>/.<task>.logmon.log`.
pub fn daemon_log_path(log_dir: &Path, task: &TaskName) -> PathBuf {
    log_dir.join(format!(".{}.logmon.log", task.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_names_that_are_not_file_names_are_refused() {
        for bad in ["", "a/b", "/", ".", "..", "a\0b"] {
            assert!(TaskName::new(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["web", "web.1", "...", "a b", "ünïcode"] {
            assert!(TaskName::new(good).is_ok(), "{good:?} refused");
        }
        assert!(TaskName::new(&"x".repeat(201)).is_err());
    }

    #[test]
    fn sizes_parse_binary_units_and_plain_bytes() {
        assert_eq!(parse_size("10MiB"), Ok(10 << 20));
        assert_eq!(parse_size("512KiB"), Ok(512 << 10));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1234"), Ok(1234));
        assert_eq!(parse_size("10 MiB"), Ok(10 << 20));
        for bad in ["", "ten", "-1", "10XB", "MiB"] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(
            parse_size("16EiB - 1"),
            Err(ConfigError::InvalidSize {
                input: "16EiB - 1".into(),
                why: "expected bytes or a unit such as 512KiB, 10MiB, 1GiB"
            })
        );
    }

    #[test]
    fn sizes_past_the_largest_are_refused_never_cut_down() {
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        for big in [
            "18446744073709551616",
            "99999999999GiB",
            "16EiB",
            "17.5EiB",
            "20EB",
        ] {
            assert!(
                matches!(
                    parse_size(big),
                    Err(ConfigError::SizeTooLarge { max: u64::MAX, .. })
                ),
                "{big:?}: {:?}",
                parse_size(big)
            );
        }
        assert_eq!(
            parse_size_up_to("2GiB", MAX_PIPE_SIZE, "2GiB - 1").ok(),
            None
        );
        assert_eq!(
            parse_size_up_to("1GiB", MAX_PIPE_SIZE, "2GiB - 1"),
            Ok(1 << 30)
        );
        assert!(matches!(
            parse_size("-1"),
            Err(ConfigError::InvalidSize {
                why: "a size cannot be negative",
                ..
            })
        ));
    }

    #[test]
    fn delays_are_whole_milliseconds_or_seconds_up_to_a_minute() {
        assert_eq!(parse_delay("50ms"), Ok(Duration::from_millis(50)));
        assert_eq!(parse_delay("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_delay("0"), Ok(Duration::ZERO));
        assert_eq!(parse_delay("0ms"), Ok(Duration::ZERO));
        assert_eq!(parse_delay("60s"), Ok(MAX_MAX_DELAY));
        for bad in [
            "",
            "50",
            "-1",
            "-5ms",
            "1.5s",
            "61s",
            "60001ms",
            "1h",
            "ms",
            "5 ms",
            "99999999999999999999s",
        ] {
            assert!(parse_delay(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            parse_delay(&format_delay(DEFAULT_MAX_DELAY)),
            Ok(DEFAULT_MAX_DELAY)
        );
    }

    #[test]
    fn zero_limits_are_refused() {
        let mut c = CaptureConfig::new(TaskName::new("t").unwrap(), "/tmp");
        assert!(c.validate().is_ok());
        c.max_files = 0;
        assert!(c.validate().is_err());
        c.max_files = 1;
        c.max_file_size = 0;
        assert!(c.validate().is_err());
    }

    #[test]
    fn default_paths_follow_the_reference_layout() {
        let c = CaptureConfig::new(TaskName::new("web").unwrap(), "/l");
        assert_eq!(c.stdout_fifo, Path::new("/l/.web.stdout.fifo"));
        assert_eq!(c.stderr_fifo, Path::new("/l/.web.stderr.fifo"));
        assert_eq!(c.socket, Path::new("/l/.web.logmon.sock"));
        assert_eq!(c.lock_path(), Path::new("/l/.web.logmon.lock"));
    }
}
