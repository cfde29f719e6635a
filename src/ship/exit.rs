//! How `logmon-ship` ends: its exit codes (docs/design.md's policy: 2 for
//! what is checkable before connecting, 1 for a refusal, 75 for a server
//! that cannot be reached) and the one-line failure that each step of its
//! command line and `--status` returns. `cli` re-exports them.
//!
//! Tests: the shipper's error matrix (`tests/it/ship/mod.rs`,
//! `operator_errors_of_the_shipper_…`).

/// Exit code: bad flags or configuration.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: the server refused (credentials, TLS, missing stream), or
/// another shipper holds the state directory.
pub const EXIT_FAILURE: i32 = 1;
/// Exit code: the server could not be reached (try again later).
pub const EXIT_TEMPFAIL: i32 = 75;

/// A one-line error and its exit code.
#[derive(Debug)]
pub struct Failure {
    /// Exit code.
    pub code: i32,
    /// The line.
    pub message: String,
}

pub(super) fn fail(code: i32, message: impl Into<String>) -> Failure {
    Failure {
        code,
        message: message.into(),
    }
}
