//! The one shape of an I/O failure on a named file or directory, shared by
//! every module's error type (`FifoError`, `SocketError`, `RotateError`,
//! `FollowError`): what was being done, on what kind of thing, where, and
//! the OS error, always worded `cannot <action> <what><path>: <error>`.
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
