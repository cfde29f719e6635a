//! The names of a task's files in its log directory (docs/design.md §1, §11):
//! the task's name and its two streams, the log files
//! `<task>.<stream>.<N>`, their capture-time indexes
//! `.<task>.<stream>.<N>.idx` and the stream's high-water mark
//! `.<task>.<stream>.hwm`; with `run --compress zstd`, an older rotated
//! file's compressed form `<task>.<stream>.<N>.zst` and the temporary
//! name it is written under, `.<task>.<stream>.<N>.zst.tmp` (docs/design.md
//! §16). The daemon writes under these names, the
//! readers, the shipper and `ls` look for them: one place says what they
//! are, and which names a task may plant that are none of them (a
//! non-canonical number such as `007`, a number past [`MAX_INDEX`]).
//!
//! Tests: `tests::only_exact_names_are_ours` below; the index's
//! `names_never_look_like_log_files`; the rotator's planted names
//! (`crate::daemon::rotate`).

use std::fmt;
use std::io;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::shared::dir::Dir;
use crate::shared::error::ConfigError;

/// One of the two captured streams of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stream {
    /// The task's standard output.
    Stdout,
    /// The task's standard error.
    Stderr,
}

impl Stream {
    /// Both streams, stdout first.
    pub const ALL: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    /// The name used in file names (`stdout` / `stderr`).
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

impl fmt::Display for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A validated task name: non-empty, no `/`, no NUL, not `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TaskName(String);

impl TaskName {
    /// Validates `name` as a task name.
    ///
    /// ```
    /// use logmon::config::TaskName;
    /// assert!(TaskName::new("web-1").is_ok());
    /// assert!(TaskName::new("a/b").is_err());
    /// assert!(TaskName::new("..").is_err());
    /// ```
    pub fn new(name: &str) -> Result<Self, ConfigError> {
        let why = if name.is_empty() {
            Some("must not be empty")
        } else if name.contains('/') {
            Some("must not contain '/'")
        } else if name.contains('\0') {
            Some("must not contain NUL")
        } else if name == "." || name == ".." {
            Some("must not be '.' or '..'")
        } else if name.len() > 200 {
            // Leaves room for ".<task>.stdout.fifo" and ".<task>.stdout.<u64>"
            // inside NAME_MAX (255).
            Some("must be at most 200 bytes")
        } else {
            None
        };
        match why {
            Some(why) => Err(ConfigError::InvalidTask {
                name: name.to_owned(),
                why,
            }),
            None => Ok(TaskName(name.to_owned())),
        }
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for TaskName {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskName::new(s)
    }
}

impl TryFrom<String> for TaskName {
    type Error = ConfigError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        TaskName::new(&s)
    }
}

impl From<TaskName> for String {
    fn from(t: TaskName) -> String {
        t.0
    }
}

impl fmt::Display for TaskName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `<task>.<stream>.<N>` for `N`.
pub fn file_name(task: &TaskName, stream: Stream, index: u64) -> String {
    format!("{}.{}.{}", task.as_str(), stream.as_str(), index)
}

/// The largest index that is a stream's file. Rotation never gets near it
/// (2^63 files), but a task can plant a name with any number: one above
/// this is not a file of the stream, so resuming past a planted name never
/// overflows the numbering.
pub const MAX_INDEX: u64 = i64::MAX as u64;

/// Parses `name` as `<task>.<stream>.<N>` and returns N; `None` for any other
/// name, including non-canonical numbers such as `007` (never written by
/// logmon, so never purged by it).
pub fn parse_index(name: &str, task: &TaskName, stream: Stream) -> Option<u64> {
    let rest = name
        .strip_prefix(task.as_str())?
        .strip_prefix('.')?
        .strip_prefix(stream.as_str())?
        .strip_prefix('.')?;
    if rest.is_empty()
        || !rest.bytes().all(|b| b.is_ascii_digit())
        || (rest.len() > 1 && rest.starts_with('0'))
    {
        return None;
    }
    rest.parse().ok().filter(|&n| n <= MAX_INDEX)
}

/// The indices of `task`'s `stream` files in `dir`, ascending: opens the
/// directory once and lists it through its handle (`scan_indices_in`).
pub fn scan_indices(dir: &Path, task: &TaskName, stream: Stream) -> io::Result<Vec<u64>> {
    scan_indices_in(&Dir::open(dir)?, task, stream)
}

/// Whether `name` may be one of `task`'s `stream` files or their
/// dotfiles (`<task>.<stream>.…`, `.<task>.<stream>.…`): what listing a
/// shared directory for one stream keeps ([`Dir::list_matching`]).
pub fn of_stream(name: &[u8], task: &TaskName, stream: Stream) -> bool {
    let prefixed = |n: &[u8]| {
        n.strip_prefix(task.as_str().as_bytes())
            .and_then(|r| r.strip_prefix(b"."))
            .and_then(|r| r.strip_prefix(stream.as_str().as_bytes()))
            .is_some_and(|r| r.starts_with(b"."))
    };
    // A task's own name may start with a dot: both forms are tried.
    prefixed(name) || name.strip_prefix(b".").is_some_and(prefixed)
}

/// [`scan_indices`] through a directory handle (no path walked).
pub fn scan_indices_in(dir: &Dir, task: &TaskName, stream: Stream) -> io::Result<Vec<u64>> {
    let mut out: Vec<u64> = dir
        .list_matching(|n| of_stream(n, task, stream))?
        .iter()
        .filter_map(|n| n.to_str().and_then(|s| parse_index(s, task, stream)))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// `<task>.<stream>.<N>.zst`: file N compressed (`run --compress zstd`).
/// It holds the same bytes as the plain file it replaced, and counts as
/// file N wherever files are counted: a stream's file N is either name,
/// and where both are there (a compression killed between its rename and
/// its unlink), one file.
pub fn zst_name(task: &TaskName, stream: Stream, index: u64) -> String {
    format!("{}.zst", file_name(task, stream, index))
}

/// `.<task>.<stream>.<N>.zst.tmp`: where file N's compressed form is
/// written before it is complete. Hidden, and no log file's name, so no
/// reader ever opens a partial one; removed at the daemon's next start.
pub fn zst_temp_name(task: &TaskName, stream: Stream, index: u64) -> String {
    format!(".{}.tmp", zst_name(task, stream, index))
}

/// Parses `name` as `<task>.<stream>.<N>.zst` and returns N (canonical,
/// at most [`MAX_INDEX`]).
pub fn parse_zst(name: &str, task: &TaskName, stream: Stream) -> Option<u64> {
    parse_index(name.strip_suffix(".zst")?, task, stream)
}

/// Parses `name` as `.<task>.<stream>.<N>.zst.tmp` and returns N.
pub fn parse_zst_temp(name: &str, task: &TaskName, stream: Stream) -> Option<u64> {
    parse_zst(name.strip_prefix('.')?.strip_suffix(".tmp")?, task, stream)
}

/// Parses `name` as file N of the stream under either of its names,
/// `<task>.<stream>.<N>` or `<task>.<stream>.<N>.zst`, and says which
/// (`true`: compressed).
pub fn parse_any(name: &str, task: &TaskName, stream: Stream) -> Option<(u64, bool)> {
    parse_index(name, task, stream)
        .map(|n| (n, false))
        .or_else(|| parse_zst(name, task, stream).map(|n| (n, true)))
}

/// The indices of `task`'s `stream` files in `dir` under either name
/// (plain or `.zst`), ascending, each once.
pub fn scan_any_in(dir: &Dir, task: &TaskName, stream: Stream) -> io::Result<Vec<u64>> {
    let mut out: Vec<u64> = dir
        .list()?
        .iter()
        .filter_map(|n| n.to_str().and_then(|s| parse_any(s, task, stream)))
        .map(|(n, _)| n)
        .collect();
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// `.<task>.<stream>.<N>.idx`: the index of file N.
pub fn index_name(task: &TaskName, stream: Stream, n: u64) -> String {
    format!(".{}.{}.{}.idx", task.as_str(), stream.as_str(), n)
}

/// `.<task>.<stream>.hwm`: the stream's high-water mark.
pub fn hwm_name(task: &TaskName, stream: Stream) -> String {
    format!(".{}.{}.hwm", task.as_str(), stream.as_str())
}

/// Parses `name` as `.<task>.<stream>.<N>.idx` and returns N (canonical
/// decimal, at most `MAX_INDEX`); `None` for any other name.
pub fn parse_index_name(name: &str, task: &TaskName, stream: Stream) -> Option<u64> {
    let file = name.strip_prefix('.')?.strip_suffix(".idx")?;
    parse_index(file, task, stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_stream_keeps_every_name_the_parsers_accept_and_not_other_tasks() {
        for t in ["web", ".hidden", "a.b"] {
            let task = TaskName::new(t).unwrap();
            for s in [Stream::Stdout, Stream::Stderr] {
                let file = file_name(&task, s, 7);
                let idx = index_name(&task, s, 7);
                assert_eq!(parse_index(&file, &task, s), Some(7));
                assert_eq!(parse_index_name(&idx, &task, s), Some(7));
                for n in [file, idx, hwm_name(&task, s)] {
                    assert!(of_stream(n.as_bytes(), &task, s), "{n}");
                }
                let other = TaskName::new("api").unwrap();
                assert!(!of_stream(file_name(&other, s, 7).as_bytes(), &task, s));
                assert!(!of_stream(index_name(&other, s, 7).as_bytes(), &task, s));
            }
        }
    }

    #[test]
    fn only_exact_names_are_ours() {
        let t = TaskName::new("web").unwrap();
        assert_eq!(parse_index("web.stdout.0", &t, Stream::Stdout), Some(0));
        assert_eq!(parse_index("web.stdout.12", &t, Stream::Stdout), Some(12));
        for other in [
            "web.stdout.",
            "web.stdout.007",
            "web.stdout.1x",
            "web.stderr.1",
            "web2.stdout.1",
            "web.stdout.stdout.1",
            ".web.stdout.fifo",
            "web.stdout.-1",
        ] {
            assert_eq!(parse_index(other, &t, Stream::Stdout), None, "{other}");
        }
    }

    #[test]
    fn compressed_names_are_file_n_and_the_temp_name_is_no_log_file() {
        let t = TaskName::new("web").unwrap();
        let s = Stream::Stdout;
        assert_eq!(zst_name(&t, s, 3), "web.stdout.3.zst");
        assert_eq!(parse_zst("web.stdout.3.zst", &t, s), Some(3));
        assert_eq!(parse_any("web.stdout.3.zst", &t, s), Some((3, true)));
        assert_eq!(parse_any("web.stdout.3", &t, s), Some((3, false)));
        let tmp = zst_temp_name(&t, s, 3);
        assert_eq!(tmp, ".web.stdout.3.zst.tmp");
        assert_eq!(parse_zst_temp(&tmp, &t, s), Some(3));
        assert_eq!(parse_any(&tmp, &t, s), None);
        for other in [
            "web.stdout.03.zst",
            "web.stdout.3.zst.tmp",
            "web.stdout.zst",
            "web.stdout.3.zstd",
        ] {
            assert_eq!(parse_any(other, &t, s), None, "{other}");
        }
    }
}
