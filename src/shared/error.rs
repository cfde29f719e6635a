//! The one shape of an I/O failure on a named file or directory, shared by
//! every module's error type (`FifoError`, `SocketError`, `RotateError`,
//! `FollowError`): what was being done, on what kind of thing, where, and
//! the OS error, always worded `cannot <action> <what><path>: <error>`.
//!
//! And the one error of every flag and setting checked before anything is
//! started ([`ConfigError`], exit code 2), which the task's names and
//! metadata report too (`config`, `layout` and `meta` take it from here).
//!
//! Tests: the error matrix (`tests/it/cli/errors.rs`) checks the words a user
//! sees for each of them.

use std::io;
use std::path::PathBuf;

/// An I/O failure on a named file or directory.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {what}{}: {source}", path.display())]
pub struct PathIo {
    /// What was being done: "open", "stat", "bind"…
    pub action: &'static str,
    /// What kind of thing, with a trailing space ("FIFO ", "control
    /// socket "), or empty when the path says it.
    pub what: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

/// Why a pair without `=` is refused (also the cue for `LOGMON_META`'s
/// hint about commas).
pub const EXPECTED_PAIR: &str = "expected KEY=VALUE";

/// A configuration error: always the user's to fix (CLI exit code 2).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The task name cannot be used as a file-name component.
    #[error("invalid task name {name:?}: {why}")]
    InvalidTask {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        why: &'static str,
    },
    /// A size flag did not parse.
    #[error("{input:?} is not a valid size: {why}")]
    InvalidSize {
        /// The rejected text.
        input: String,
        /// Why.
        why: &'static str,
    },
    /// A size larger than the flag takes.
    #[error("size {input:?} is too large: the largest accepted is {max} bytes ({max_human})")]
    SizeTooLarge {
        /// The rejected text.
        input: String,
        /// The largest accepted, in bytes.
        max: u64,
        /// The same, in the unit an operator would write.
        max_human: &'static str,
    },
    /// A duration flag did not parse, or is out of range.
    #[error(transparent)]
    Duration(#[from] crate::shared::time::DurationError),
    /// A `--meta KEY=VALUE` pair cannot be used.
    #[error("invalid metadata {pair:?}: {why}")]
    InvalidMeta {
        /// The rejected pair.
        pair: String,
        /// Why it was rejected.
        why: &'static str,
    },
    /// A pair of the `LOGMON_META` variable cannot be used.
    #[error("invalid metadata {pair:?} in {var}: {why}{hint}", hint = if *.why == EXPECTED_PAIR { " (pairs are separated by ','; give a value containing ',' with --meta)" } else { "" })]
    InvalidMetaVar {
        /// The variable (`LOGMON_META`).
        var: &'static str,
        /// The rejected pair.
        pair: String,
        /// Why it was rejected.
        why: &'static str,
    },
    /// A `--meta` argument is not UTF-8 (shown with U+FFFD replacing
    /// what is not).
    #[error("invalid --meta {pair:?}: metadata must be UTF-8")]
    MetaNotUtf8 {
        /// The rejected pair, lossily decoded.
        pair: String,
    },
    /// A metadata key given twice.
    #[error("metadata key {key:?} is given twice in {given_in}: give each key once")]
    DuplicateMeta {
        /// The key.
        key: String,
        /// `--meta` or the variable.
        given_in: &'static str,
    },
    /// A numeric limit is out of range.
    #[error("invalid {what}: {why}")]
    OutOfRange {
        /// Which setting.
        what: &'static str,
        /// The accepted range.
        why: &'static str,
    },
    /// A `--rate-limit` that is not a size per second.
    #[error("{input:?} is not a valid rate: {why}; write bytes per second with its unit, e.g. 1MiB/s, 512KiB/s or 4096/s")]
    InvalidRate {
        /// The rejected text.
        input: String,
        /// Why.
        why: &'static str,
    },
}
