//! Configuration: task names, sizes, streams, limits and the default paths
//! derived from `--log-dir` and `--task` (docs/design.md §1, §2, §4).
//!
//! Everything here is pure: validation happens before any file is touched,
//! so a bad flag never leaves half a daemon behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::shared::meta::Meta;
use crate::shared::time::DurationFlag;

// Part of the public `config` API: the error of every check here, the
// task's name and its streams.
pub use crate::shared::error::ConfigError;
use crate::shared::layout;
pub use crate::shared::layout::{Stream, TaskName};

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

/// `--max-delay` of `run`, `launch`, `ensure` and `exec`: whole
/// milliseconds from 0 (drain at once) to [`MAX_MAX_DELAY`], in the one
/// duration grammar (`shared::time`).
///
/// ```
/// use logmon::config::MAX_DELAY;
/// use std::time::Duration;
/// assert_eq!(MAX_DELAY.parse("50ms").unwrap(), Duration::from_millis(50));
/// assert_eq!(MAX_DELAY.parse("0").unwrap(), Duration::ZERO);
/// assert!(MAX_DELAY.parse("50").is_err());
/// assert!(MAX_DELAY.parse("1h").is_err());
/// ```
pub const MAX_DELAY: DurationFlag = DurationFlag::new(
    "--max-delay",
    Some("LOGMON_MAX_DELAY"),
    Duration::ZERO,
    MAX_MAX_DELAY,
)
.in_steps_of(Duration::from_millis(1));

/// The shipper's `--max-delay`: the same range as [`MAX_DELAY`], its own
/// variable.
pub const SHIP_MAX_DELAY: DurationFlag = DurationFlag {
    env: Some("LOGMON_SHIP_MAX_DELAY"),
    ..MAX_DELAY
};

/// Parses a `--max-delay` value ([`MAX_DELAY`]).
pub fn parse_delay(input: &str) -> Result<Duration, ConfigError> {
    Ok(MAX_DELAY.parse(input)?)
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

/// How rotated files are compressed (`--compress`, docs/design.md §16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// zstd frames (`<task>.<stream>.<N>.zst`) the `zstd` tool reads.
    Zstd,
}

impl Codec {
    /// The codec's name, as `--compress` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Codec::Zstd => "zstd",
        }
    }
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
    /// Run without self-confinement (`--no-sandbox`, docs/design.md §10): passed
    /// on to a launched daemon so the flag means the same by every route.
    pub no_sandbox: bool,
    /// Bytes per stream past `max_files` that purge holds for the node's
    /// shipper while it has not read them (`--keep-unshipped`, docs/design.md
    /// §12); 0: none.
    pub keep_unshipped: u64,
    /// Bytes per second each stream may write (`--rate-limit`,
    /// docs/design.md §16); `None`: no limit.
    pub rate_limit: Option<u64>,
    /// Depth of each stream's token bucket (`--rate-burst`); `None`: one
    /// second of the rate, at least [`MIN_RATE_BURST`].
    pub rate_burst: Option<u64>,
    /// Compress rotated files but the newest (`--compress`, docs/design.md
    /// §16); `None`: every file stays plain.
    pub compress: Option<Codec>,
    /// The task's metadata (`--meta KEY=VALUE`, docs/design.md §11): shown in
    /// `status`, written for readers to `.<task>.logmon.meta`. Empty given
    /// to [`crate::agent::hook::Hook`] means "keep the metadata in the state".
    pub meta: Meta,
}

/// Refuses a task name with a control character (ESC, a newline) for a
/// task logmon would capture: such a name is printed in tables, notes and
/// logs, where it could forge or hide output. Names already on disk are
/// still read (and printed escaped) by the readers and the shipper.
pub fn printable_task(task: &TaskName) -> Result<(), ConfigError> {
    match task.as_str().chars().any(char::is_control) {
        true => Err(ConfigError::InvalidTask {
            name: task.as_str().to_owned(),
            why: "must not contain control characters (such as ESC or a newline)",
        }),
        false => Ok(()),
    }
}

/// The flags whose value changes what a running logmon does, as `run`
/// takes them: the one list [`CaptureConfig::settings`] reports (the
/// daemon answers it over the control socket, `Request::Settings`), and
/// `ensure` compares before it trusts a running logmon. The paths (task,
/// log directory, FIFOs, socket) are the task's identity, compared
/// elsewhere. A flag added to `run` that changes behaviour is added here.
pub const SETTINGS: [&str; 11] = [
    "--max-files",
    "--max-file-size",
    "--on-write-error",
    "--pipe-size",
    "--max-delay",
    "--keep-unshipped",
    "--no-sandbox",
    "--meta",
    "--compress",
    "--rate-limit",
    "--rate-burst",
];

/// The flags a logmon from before them does not report, whose "none"
/// (off) is what such a logmon does: not a difference.
const ADDED_OFF: [&str; 3] = ["--compress", "--rate-limit", "--rate-burst"];

/// A logmon's effective settings: each flag of [`SETTINGS`] with its
/// value in one canonical text (sizes in bytes, delays in milliseconds),
/// so equal settings compare equal however they were written. A map of
/// names, so a setting added later is not a protocol change: a peer that
/// does not know a name ignores it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings(pub std::collections::BTreeMap<String, String>);

/// `--meta`'s value in [`Settings`] when there is none.
const NO_META: &str = "none";

/// `--compress`'s (and the rate limit's) value in [`Settings`] without it.
const NO_CODEC: &str = "none";

/// One setting that differs between a running logmon and a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The flag (`--keep-unshipped`).
    pub flag: String,
    /// The running logmon's value (`None`: it does not report the flag).
    pub running: Option<String>,
    /// The value asked for.
    pub wanted: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.running {
            Some(r) => write!(f, "{} {r}, not {}", self.flag, self.wanted),
            None => write!(f, "{} unknown, not {}", self.flag, self.wanted),
        }
    }
}

impl Settings {
    /// The settings of `wanted` that `self` (a running logmon's) does not
    /// have, in [`SETTINGS`] order. `--meta` is compared only when
    /// `wanted` has some: empty means "keep the running logmon's".
    pub fn differences(&self, wanted: &Settings) -> Vec<Difference> {
        SETTINGS
            .iter()
            .filter_map(|&flag| {
                let want = wanted.0.get(flag)?;
                if flag == "--meta" && want == NO_META {
                    return None;
                }
                let running = self.0.get(flag);
                // A logmon from before `--compress` (or the rate limit)
                // compresses (or limits) nothing.
                if ADDED_OFF.contains(&flag) && want == NO_CODEC && running.is_none() {
                    return None;
                }
                (running != Some(want)).then(|| Difference {
                    flag: flag.to_owned(),
                    running: running.cloned(),
                    wanted: want.clone(),
                })
            })
            .collect()
    }
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
            compress: None,
            meta: Meta::new(),
        }
    }

    /// The effective settings ([`SETTINGS`], each flag's value as text).
    pub fn settings(&self) -> Settings {
        let values = [
            self.max_files.to_string(),
            self.max_file_size.to_string(),
            match self.on_write_error {
                WriteErrorPolicy::Drop => "drop".to_owned(),
                WriteErrorPolicy::Block => "block".to_owned(),
            },
            self.pipe_size.to_string(),
            format_delay(self.max_delay),
            self.keep_unshipped.to_string(),
            self.no_sandbox.to_string(),
            // Meta's Display says "none" when empty: NO_META.
            self.meta.to_string(),
            self.compress.map_or(NO_CODEC, Codec::as_str).to_owned(),
            // Bytes per second, and the burst in effect (its default
            // follows the rate).
            self.rate()
                .map_or_else(|| NO_CODEC.to_owned(), |(r, _)| r.to_string()),
            self.rate()
                .map_or_else(|| NO_CODEC.to_owned(), |(_, b)| b.to_string()),
        ];
        Settings(
            SETTINGS
                .iter()
                .zip(values)
                .map(|(f, v)| ((*f).to_owned(), v))
                .collect(),
        )
    }

    /// Checks the task's name ([`printable_task`]) and the numeric limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        printable_task(&self.task)?;
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
        layout::name(&self.task, layout::Kind::Lock)
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
    log_dir.join(layout::name(task, layout::Kind::Fifo(stream)))
}

/// Default control socket path: `<log-dir>/.<task>.logmon.sock`.
pub fn default_socket(log_dir: &Path, task: &TaskName) -> PathBuf {
    log_dir.join(layout::name(task, layout::Kind::Socket))
}

/// A launched daemon's stderr: `<log-dir>/.<task>.logmon.log`.
pub fn daemon_log_path(log_dir: &Path, task: &TaskName) -> PathBuf {
    log_dir.join(layout::name(task, layout::Kind::DiagLog))
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
    fn delays_are_whole_milliseconds_up_to_a_minute() {
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
            "1.0005s",
            "61s",
            "60001ms",
            "1h",
            "ms",
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
    fn settings_name_every_flag_and_differ_only_where_they_differ() {
        let base = CaptureConfig::new(TaskName::new("t").unwrap(), "/tmp");
        let s = base.settings();
        assert_eq!(
            s.0.keys()
                .map(String::as_str)
                .collect::<std::collections::BTreeSet<_>>(),
            SETTINGS.into_iter().collect()
        );
        assert!(s.differences(&s).is_empty());
        let mut other = base.clone();
        other.keep_unshipped = 256 << 20;
        other.max_delay = Duration::from_secs(5);
        let d = s.differences(&other.settings());
        assert_eq!(
            d.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "--max-delay 50ms, not 5000ms",
                "--keep-unshipped 0, not 268435456"
            ]
        );
        // No metadata asked for: the running logmon's is kept, not a
        // difference; some asked for: compared.
        let mut running = base.clone();
        running.meta.insert_pair("job=web").unwrap();
        assert!(running.settings().differences(&s).is_empty());
        assert_eq!(
            s.differences(&running.settings())[0].to_string(),
            "--meta none, not job=web"
        );
        // A logmon that does not report a flag differs in it.
        let mut partial = s.clone();
        partial.0.remove("--pipe-size");
        assert_eq!(partial.differences(&s)[0].running, None);
        // --compress: a difference like any other, but a logmon from
        // before it (which compresses nothing) is not asked to restart
        // for a configuration without it.
        let mut zstd = base.clone();
        zstd.compress = Some(Codec::Zstd);
        assert_eq!(
            s.differences(&zstd.settings())[0].to_string(),
            "--compress none, not zstd"
        );
        let mut older = s.clone();
        older.0.remove("--compress");
        assert!(older.differences(&s).is_empty());
        assert_eq!(older.differences(&zstd.settings())[0].running, None);
        // --rate-limit and --rate-burst: compared like any other setting
        // (the burst in effect, its default following the rate); a logmon
        // from before them limits nothing.
        let mut limited = base.clone();
        limited.rate_limit = Some(1 << 20);
        let d = s.differences(&limited.settings());
        assert_eq!(
            d.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "--rate-limit none, not 1048576",
                format!("--rate-burst none, not {}", limited.rate().unwrap().1).as_str()
            ]
        );
        let mut older = s.clone();
        older.0.remove("--rate-limit");
        older.0.remove("--rate-burst");
        assert!(older.differences(&s).is_empty());
        assert_eq!(older.differences(&limited.settings())[0].running, None);
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
